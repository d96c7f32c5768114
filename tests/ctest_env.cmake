# Note [OpenMP threads sleep in the tests]: ctest includes this file (tests/CMakeLists.txt) before it runs a test,
# and every test inherits the environment set here. `ctest -j N` runs N tests at once, each with a thread per core;
# OpenMP's waiting threads spin by default, and a spinning thread holds a core that another test's thread needs:
# a CLI test of a small LSTM ran its 200 steps in 17.6 s against 0.87 s with sleeping threads, on 2 cores beside
# another test (bench/RESULTS.md, "The CI budget"). A training run alone on its machine keeps OpenMP's default.
# A variable the caller set wins.
if(NOT DEFINED ENV{OMP_WAIT_POLICY})
  set(ENV{OMP_WAIT_POLICY} passive)
endif()

# mixprec quick start: `make run` (set up, build, run the main job) and `make test` (set up, build, all tests).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release -DMP_WERROR=ON

.PHONY: setup configure build run test test-sanitize fuzz bench bench-suites clean

setup:
	./scripts/setup.sh

configure: setup
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job builds only what it runs (the library and the CLI) in its own folder, with the CUDA backend
# only where a GPU is present (override: make run RUN_CUDA=ON).
RUN_BUILD ?= build-run
RUN_CUDA ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo AUTO || echo OFF)
run: setup
	cmake -S . -B $(RUN_BUILD) $(CMAKE_FLAGS) -DMP_CUDA=$(RUN_CUDA) -DMP_BUILD_TESTS=OFF -DMP_BUILD_BENCH=OFF
	cmake --build $(RUN_BUILD) -j $(JOBS) --target mixprec_cli
	./$(RUN_BUILD)/apps/mixprec/mixprec compare --dataset fashion-mnist --model resnet8 --epochs 5 --no-augment \
	  --runs fp32,bf16 --report report/main

# MP_TESTS_REQUIRE_PYTHON=1: the PyTorch interchange tests fail, not skip, without the Python that setup installs
# (Note [tests that need Python] in tests/test_util.hpp).
test: build
	cd $(BUILD) && MP_TESTS_REQUIRE_PYTHON=1 ctest --output-on-failure -j $(JOBS) --timeout 900

# The sanitizer tier (CI runs it after `make test`): AddressSanitizer + UndefinedBehaviorSanitizer, CPU only,
# on the fast unit-test folders (the training, CLI and install tests run minutes even without sanitizers), which
# are the only tests it builds (MP_TEST_LABELS).
SAN_BUILD ?= build-sanitize
SAN_LABELS ?= core|tensor|autograd|ops|backend|nn|optim|amp|data|models
# -O1 -g1 (ASan's advice; line tables for the reports' stack traces, no variable info): the library compiles in
# about half the time of RelWithDebInfo's -O2 -g (bench/RESULTS.md, CI budget).
SAN_FLAGS ?= -O1 -g1 -DNDEBUG
test-sanitize: setup
	cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO='$(SAN_FLAGS)' -DMP_WERROR=ON -DMP_CUDA=OFF -DMP_BUILD_BENCH=OFF \
	  -DMP_BUILD_APPS=OFF -DMP_SANITIZE=address,undefined -DMP_TEST_LABELS='$(SAN_LABELS)'
	cmake --build $(SAN_BUILD) -j $(JOBS)
	# detect_leaks=0: the runtime state and kernel caches are leaked on purpose (freed by the OS at exit).
	# -E: the PyTorch name check builds every full-size model (20 s without sanitizers) to hand them to Python;
	# `make test` runs it, and its writer runs here (ModelsTorchNames.WriterFormat). The batch-norm accuracy
	# measurement runs ResNet-8 in f64 on the plain loops (5 s without sanitizers) and reads no new memory paths.
	# The two OptLevels runs train a CNN at every opt level (167 and 99 s under the sanitizers on Zen 3, a third of
	# the tier's test time); `make test` runs them, and the tier's amp and optim tests cover their parts.
	cd $(SAN_BUILD) && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j $(JOBS) --timeout 900 -L '$(SAN_LABELS)' \
	  -E 'NamesForThePyTorchCheck|FusedKernelsAndTheF64CompositeAgainstAnF64Model|OptLevels\.SmallCnnTrainsToTheSameAccuracyAtO0O1O2|OptLevels\.O3IsRunAndItsOutcomeReported'

# The fuzz tier (CI runs it after test-sanitize): a libFuzzer target per reader of outside bytes, under ASan and
# UBSan, FUZZ_SECONDS each, two at once (fuzz/run.sh). Built with clang in its own folder from the readers'
# sources only, not the whole library (Note [fuzz targets] in fuzz/CMakeLists.txt).
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 30
fuzz:
	./scripts/setup.sh --fuzz
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMP_WERROR=ON \
	  -DMP_CUDA=OFF -DMP_BUILD_TESTS=OFF -DMP_BUILD_BENCH=OFF -DMP_BUILD_APPS=OFF -DMP_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_targets
	./fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

bench: build
	./scripts/setup.sh --bench
	./bench/run_all.sh $(BUILD)

# The reference articles' experiments at --quick sizes, side by side with PyTorch where it applies;
# reports in report/bench-*. Full sizes are for a GPU: run the suites without --quick.
bench-suites: build
	./scripts/setup.sh --bench
	for s in op-breakdown lstm-impl lstm-sweep resnets opt-levels; do \
	  ./$(BUILD)/apps/mixprec/mixprec bench $$s --quick || exit 1; done
	./bench/compare_pytorch.sh $(BUILD) --quick

clean:
	rm -rf $(BUILD) $(RUN_BUILD) $(SAN_BUILD) $(FUZZ_BUILD)

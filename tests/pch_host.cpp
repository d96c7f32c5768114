// The host of the tests' precompiled header (Note [the tests' precompiled header] in tests/CMakeLists.txt): the
// header is compiled with this target's flags and every test reuses it. No tests here; ctest does not run it.

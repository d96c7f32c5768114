// Helpers shared by the test executables: scratch folders, whole-file reads and error messages.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "backend/cpu/bf16_policy.hpp"
#include "mp/mp.hpp"

namespace mp::test {

namespace detail {

/// The scratch folders made by this process, removed when it exits (a forked child that ends with
/// _Exit leaves them to its parent).
struct ScratchDirs {
  std::mutex mutex;
  std::vector<std::filesystem::path> dirs;
  ~ScratchDirs() {
    std::error_code ec;
    for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};

}  // namespace detail

/// A fresh empty folder <temp>/mp_<prefix>_<name>_<pid> (emptied if it exists), removed at process exit.
inline std::filesystem::path scratch_dir(const std::string& prefix, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("mp_" + prefix + "_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  static detail::ScratchDirs cleanup;
  const std::lock_guard<std::mutex> lock(cleanup.mutex);
  cleanup.dirs.push_back(d);
  return d;
}

/// The whole content of a file, byte for byte; throws std::runtime_error if it cannot be opened.
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("read_file: cannot open " + p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The message of the exception f() throws (an mp::Error or any std::exception), or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) { return e.what(); }
  return "(no error)";
}

/// Expect f() to throw (an mp::Error or any std::exception) with a message containing every one of `parts`.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error";
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

/// EXPECT_CONTAINS's predicate: success when `haystack` holds `needle`, else both texts in the failure.
inline ::testing::AssertionResult contains_format(const char* haystack_expr, const char* needle_expr,
                                                  const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << haystack_expr << " does not contain " << needle_expr
                                       << "\n  needle: " << needle << "\n  message: " << haystack;
}

/// Sets the CPU's bf16 path for a scope; restores the CPU's default when it ends, also by an exception.
struct ScopedBf16Path {
  explicit ScopedBf16Path(backend::cpu::Bf16Path path) { backend::cpu::set_bf16_path(path); }
  ~ScopedBf16Path() { backend::cpu::set_bf16_path(backend::cpu::Bf16Path::cpu_default); }
  ScopedBf16Path(const ScopedBf16Path&) = delete;
  ScopedBf16Path& operator=(const ScopedBf16Path&) = delete;
};

/// Runs `body` once per way a bf16 matmul or convolution can run on the CPU: oneDNN's bf16 primitives with the
/// small-convolution GEMM paths, without them, and through f32 (by default each shape's path is measured, or pinned
/// to oneDNN's kernels in the tests: Note [kernel paths chosen by measurement] in src/backend/cpu/kernel_paths.cpp),
/// so all are tested on any CPU that has oneDNN's bf16 primitives (AVX-512; without them, as on AMD Zen 3, only
/// through f32, the one path such a CPU runs); a trace names the pass. Restores the CPU's default afterwards, also
/// when `body` throws.
template <class Body>
void for_each_bf16_path(Body&& body) {
  using backend::cpu::Bf16Path;
  const ScopedBf16Path restore(Bf16Path::cpu_default);
  const bool native = backend::cpu::onednn_has_native(DType::bf16);
  for (const Bf16Path path : {Bf16Path::native_gemm, Bf16Path::native, Bf16Path::via_f32}) {
    if (!native && path != Bf16Path::via_f32) continue;
    backend::cpu::set_bf16_path(path);
    SCOPED_TRACE(std::string("bf16 path ") + backend::cpu::bf16_path_name(path));
    body();
  }
}

/// A random f64 tensor, uniform in [lo, hi], that requires grad: the input of a gradcheck.
inline Tensor leaf(const Shape& s, double lo = -1.0, double hi = 1.0) {
  return rand(s, {.dtype = DType::f64}, lo, hi).requires_grad_();
}

// Note [16-bit tolerance table]
// The CPU's 16-bit ops convert their inputs exactly to f32, run the f32 loops and round the result once. Each
// 16-bit result is compared with f32 two ways. "same input": the f32 op runs on the 16-bit input converted back to
// f32 (exact), so both do identical f32 arithmetic and only the final rounding differs: at most half an ulp, 2^-9
// (bf16) or 2^-11 (f16) relative; one ulp is allowed and no atol beyond 1e-6, so an op that computed its
// statistics or gate math in 16 bits fails. "end to end" (per test file, each entry with its bound): the f32 op
// runs on the unrounded input, so the input's rounding propagates; the bounds are first-order estimates for the
// data ranges of each test.
struct Tol16 {
  const char* what;
  DType dtype;
  double atol, rtol;
  const char* reason;
};
inline constexpr Tol16 kSameInput[] = {
    {"same input", DType::bf16, 1e-6, 1.0 / 256, "identical f32 math, one final rounding (<= 2^-9 rel)"},
    {"same input", DType::f16, 1e-6, 1.0 / 1024, "identical f32 math, one final rounding (<= 2^-11 rel)"},
};
/// The entry `what` for `dt`: "same input" from kSameInput, others from the test's own `table`.
inline const Tol16& tol16(std::span<const Tol16> table, const std::string& what, DType dt) {
  for (std::span<const Tol16> t : {std::span<const Tol16>(kSameInput), table})
    for (const Tol16& e : t)
      if (what == e.what && e.dtype == dt) return e;
  throw std::runtime_error("no 16-bit tolerance '" + what + "' for " + std::string(dtype_name(dt)));
}
/// max over i of |a_i - b_i| - (atol + rtol |b_i|); <= 0 means every element is within tolerance.
inline double excess(const Tensor& a, const Tensor& b, double atol, double rtol) {
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  EXPECT_EQ(va.size(), vb.size());
  double worst = -1e300;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i)
    worst = std::max(worst, std::abs(va[i] - vb[i]) - (atol + rtol * std::abs(vb[i])));
  return worst;
}

/// EXPECT that a gradcheck passed, printing its message when it did not.
inline void expect_ok(const autograd::GradcheckResult& r) { EXPECT_TRUE(r.ok) << r.message; }

/// t itself, now requiring grad (a leaf of the caller's values).
inline Tensor requires_grad(Tensor t) {
  t.requires_grad_(true);
  return t;
}

/// Whether a and b have one dtype, one shape and the same bytes.
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  const Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.raw_data(), y.raw_data(), static_cast<size_t>(x.numel()) * x.element_size()) == 0;
}

/// The largest |a - ref| / |ref| over the elements.
inline double max_rel_diff(const Tensor& a, const Tensor& ref) {
  const auto x = a.to_vector<double>(), y = ref.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]) / std::abs(y[i]));
  return m;
}

// Note [tests that need Python]
// The PyTorch interchange tests run Debian's python3 (MP_TEST_PYTHON, /usr/bin/python3 by default: the
// interpreter python3-torch installs for) with the project-local .deps/python on PYTHONPATH (Python's
// safetensors; scripts/setup.sh installs both). Without them a test skips, saying what to install; under
// MP_TESTS_REQUIRE_PYTHON=1, which `make test` (so CI) sets, it fails instead: CI cannot pass by skipping the
// interchange it is meant to check (as MP_CUDA_TESTS_REQUIRE_GPU does for gpu-check). The environment variable
// MP_TEST_PYTHON overrides the interpreter (ctest python_tests_fail_when_required points it at nothing).

/// A shell command's exit status (-1 when it did not exit normally or could not start) and its output.
struct ShellResult {
  int code = -1;
  std::string output;  // stdout and stderr together
};

/// Run `cmd` with /bin/sh, its stderr joined to its stdout.
inline ShellResult shell(const std::string& cmd) {
  ShellResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

/// The shell command that runs the tests' Python: PYTHONPATH=<.deps/python> <interpreter>.
inline std::string python_command() {
  const char* env = std::getenv("MP_TEST_PYTHON");
  const std::string py = env != nullptr && *env != '\0' ? env : MP_TEST_PYTHON;
  return "PYTHONPATH='" MP_TEST_PYTHONPATH "' '" + py + "'";
}

/// Why `import <modules>` fails in python_command() (its last line of output), or "" when it works.
inline std::string python_missing(const std::string& modules) {
  const ShellResult r = shell(python_command() + " -c 'import " + modules + "'");
  if (r.code == 0) return "";
  std::string out = r.output;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  const size_t nl = out.rfind('\n');
  return (nl == std::string::npos ? out : out.substr(nl + 1)) + " (" + python_command() + ")";
}

/// Whether the tests must fail rather than skip without their Python (MP_TESTS_REQUIRE_PYTHON=1).
inline bool python_required() {
  const char* e = std::getenv("MP_TESTS_REQUIRE_PYTHON");
  return e != nullptr && std::string(e) == "1";
}

}  // namespace mp::test

/// Skip the test when `import <modules>` fails in the tests' Python (fail instead under
/// MP_TESTS_REQUIRE_PYTHON=1), naming the error and what installs them (Note [tests that need Python]).
#define MP_SKIP_OR_FAIL_WITHOUT_PYTHON(modules)                                                                \
  if (const std::string mp_py_missing = ::mp::test::python_missing(modules); !mp_py_missing.empty()) {         \
    if (::mp::test::python_required())                                                                         \
      GTEST_FAIL() << "MP_TESTS_REQUIRE_PYTHON=1 but `import " << (modules) << "` fails: " << mp_py_missing    \
                   << "; run scripts/setup.sh (Debian's python3-torch, Python's safetensors in .deps/python)"; \
    GTEST_SKIP() << "`import " << (modules) << "` fails: " << mp_py_missing                                    \
                 << "; scripts/setup.sh installs Debian's python3-torch and Python's safetensors";             \
  }

/// Expect the string `haystack` to contain `needle` (each argument evaluated once).
#define EXPECT_CONTAINS(haystack, needle) EXPECT_PRED_FORMAT2(::mp::test::contains_format, haystack, needle)

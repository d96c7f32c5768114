// Helpers of the CUDA parity tests (tests/ops/test_op_table.cpp, tests/cuda/test_cuda_*.cpp): every op runs
// on the CPU and on the device with the same inputs, and the results are compared element by element
// with a tolerance whose reason is written beside it. A failure names the op, dtype and shape, how many
// elements differ, the first and the worst mismatching index with both values, and the largest
// absolute and relative error, so one run on a GPU machine says what is wrong.
//
// Without a CUDA device every test skips. MP_CUDA_TESTS_ON_CPU=1 runs the same tests with the CPU
// standing in for the device (the "device" results then equal the CPU's exactly): a self-check of the
// tests themselves (shapes, API use, the harness) on machines without a GPU. Adding
// MP_CUDA_TESTS_DEVICE_THREADS=k runs the "device" side of every OpCheck with k OpenMP threads, so
// reductions are partitioned (and rounded) differently from the reference: a check that the
// tolerances of the non-exact comparisons absorb a real change of summation order.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iomanip>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/runtime.hpp"
#include "mp/mp.hpp"
#include "test_util.hpp"

namespace mp::cuda_test {

// ============================================================================ the device under test

/// Whether MP_CUDA_TESTS_ON_CPU=1 asks for the self-check mode (the CPU plays the device).
inline bool self_check_mode() {
  const char* e = std::getenv("MP_CUDA_TESTS_ON_CPU");
  return e != nullptr && std::string(e) == "1";
}

/// The device under test when set (the op table runs its cases on the CPU this way, against the CPU in f64).
inline std::optional<Device>& device_override() {
  static std::optional<Device> d;
  return d;
}

/// The device the tests compare against the CPU: cuda:0, or the CPU in self-check mode (or device_override()).
inline Device dev() {
  if (device_override()) return *device_override();
  return self_check_mode() ? kCPU : Device(DeviceType::cuda, 0);
}

/// Whether the tests can run: a CUDA device exists, or the self-check mode is on.
inline bool device_available() { return self_check_mode() || backend::cuda::device_count() > 0; }

/// Whether MP_CUDA_TESTS_REQUIRE_GPU=1 (scripts/gpu-check sets it on the GPU machine): then a test that
/// needs a device FAILS when there is none, instead of skipping, so a machine whose GPU is not seen (a
/// driver mismatch, CUDA_VISIBLE_DEVICES) cannot pass every CUDA test by skipping them all.
inline bool gpu_required() {
  const char* e = std::getenv("MP_CUDA_TESTS_REQUIRE_GPU");
  return e != nullptr && std::string(e) == "1";
}

/// Skip the test unless `available` (fail instead when gpu_required()), saying why there is no device.
#define MP_SKIP_OR_FAIL_UNLESS(available)                                                                  \
  if (!(available)) {                                                                                      \
    if (::mp::cuda_test::gpu_required())                                                                   \
      GTEST_FAIL() << "MP_CUDA_TESTS_REQUIRE_GPU=1 but there is no CUDA device: "                          \
                   << ::mp::backend::cuda::no_device_reason();                                             \
    GTEST_SKIP() << "no CUDA device (" << ::mp::backend::cuda::no_device_reason()                          \
                 << "); MP_CUDA_TESTS_ON_CPU=1 runs the op tests with the CPU standing in for the device"; \
  }

/// Skip the test when there is neither a CUDA device nor the self-check mode (fail instead when
/// gpu_required()).
#define MP_SKIP_WITHOUT_GPU() MP_SKIP_OR_FAIL_UNLESS(::mp::cuda_test::device_available())

/// Stops the test binary after a test that left the CUDA context broken (a kernel faulted: every later CUDA
/// call of the process fails with the same sticky error), naming that test and the error, instead of
/// failing every later case for the same cause. ctest runs each case in its own process; this matters when
/// a binary runs whole (scripts/gpu-check, a developer's run).
class StopAtStickyCudaError : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (self_check_mode() || backend::cuda::device_count() == 0) return;
    const std::string e = backend::cuda::sticky_device_error();
    if (e.empty()) return;
    std::fprintf(stderr,
                 "\n%s.%s left the CUDA context broken (%s): stopping this test binary here; every later test "
                 "would fail for the same cause. Rerun that test with MP_CUDA_SYNC_CHECK=1 to name the kernel.\n",
                 info.test_suite_name(), info.name(), e.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  }
};
inline const bool kStopAtStickyCudaErrorRegistered = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new StopAtStickyCudaError);
  return true;
}();

/// The floating dtypes every op is checked in.
inline const std::vector<DType> kFloatTypes = {DType::f32, DType::f16, DType::bf16, DType::f64};
/// Every dtype.
inline const std::vector<DType> kAllTypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                             DType::i64, DType::i32, DType::u8,  DType::b8};

// ============================================================================ floating-point facts

/// Significant bits (with the implicit one) of a floating dtype: f32 24, f64 53, f16 11, bf16 8.
inline int precision_bits(DType dt) {
  switch (dt) {
    case DType::f32: return 24;
    case DType::f64: return 53;
    case DType::f16: return 11;
    case DType::bf16: return 8;
    default: return 0;
  }
}

/// Exponent of the smallest normal number: f32/bf16 -126, f64 -1022, f16 -14.
inline int min_exponent(DType dt) {
  switch (dt) {
    case DType::f64: return -1022;
    case DType::f16: return -14;
    default: return -126;
  }
}

/// Unit roundoff 2^-p of a floating dtype (the largest relative error of one rounding).
inline double unit_roundoff(DType dt) { return std::ldexp(1.0, -precision_bits(dt)); }

/// Unit roundoff of the accumulation type of dt: 2^-53 for f64, 2^-24 (f32) for f32/f16/bf16.
inline double acc_roundoff(DType dt) { return dt == DType::f64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24); }

/// Spacing of dt's representable values at magnitude |v| (subnormal spacing below the normal range);
/// 1 for integer dtypes.
inline double ulp(DType dt, double v) {
  if (!is_floating(dt)) return 1.0;
  const int emin = min_exponent(dt);
  int e = emin;
  v = std::fabs(v);
  if (v > 0 && std::isfinite(v)) {
    std::frexp(v, &e);  // v = m 2^e, m in [0.5, 1)
    e = std::max(e - 1, emin);
  }
  return std::ldexp(1.0, e - (precision_bits(dt) - 1));
}

// ============================================================================ tolerances

/// An element-wise tolerance: |device - cpu| <= ulps * ulp(dtype, max(|device|, |cpu|)) + rtol * |cpu|
/// + atol + scaled * scale[i] + normwise * max_j |cpu[j]| (scale: a CPU tensor passed to close(), e.g.
/// the sum of |terms| of a reduction; normwise: relative to the largest element, for results that are
/// differences of larger quantities). NaN matches only NaN, and infinities must match exactly. `why` is
/// printed on failure.
struct Tol {
  double ulps = 0;
  double rtol = 0;
  double atol = 0;
  double scaled = 0;
  double normwise = 0;
  std::string why = "bit-identical: the same IEEE operations on the same inputs";
};

/// Bit-identical values (IEEE basic operations: +, -, *, /, sqrt, comparisons, selections, casts).
inline Tol exact(std::string why =
                     "bit-identical: IEEE basic operations (correctly rounded on both devices) and "
                     "selections on the same inputs") {
  return Tol{.why = std::move(why)};
}

/// Tolerance `ulps_f32` (f32), `ulps_f64` (f64) or one 16-bit ulp (f16/bf16) for an element-wise op
/// whose f32/f64 results may differ by a few ulps between the devices' math libraries.
inline Tol libm_tol(DType dt, double ulps_f32, double ulps_f64, const std::string& why) {
  Tol t;
  if (dt == DType::f32)
    t.ulps = ulps_f32;
  else if (dt == DType::f64)
    t.ulps = ulps_f64;
  else
    t.ulps = 1;
  t.why = why + (is_low_precision(dt) ? "; 16-bit output: the f32 results differ by a few f32 ulps (one f16 ulp "
                                        "is 2^13 f32 ulps, one bf16 ulp 2^16), so the rounded outputs are equal or, "
                                        "near a rounding boundary, one 16-bit ulp apart"
                                      : "");
  return t;
}

/// Reduction tolerance: 2 sqrt(K) u_acc * sum|terms| (passed as close()'s scale) plus one ulp of the
/// output dtype. Each device's summation error is about sqrt(K) u sum|terms| for the blocked / tree
/// orders both use (rounding errors of random sign grow like sqrt(K); the worst case of a K-term
/// recursive sum is (K-1) u sum|terms|, never approached by blocked sums); two devices: 2x; plus the
/// final rounding to the output dtype. `c` multiplies the first term where a kernel adds rounding
/// beyond the plain sum (stated at the call).
inline Tol reduction_tol(DType dt, int64_t K, double c = 2.0, const std::string& extra = "") {
  Tol t;
  t.scaled = c * std::sqrt(static_cast<double>(std::max<int64_t>(K, 1))) * acc_roundoff(dt);
  t.ulps = 1;
  std::ostringstream os;
  os << c << " sqrt(K) u_acc sum|terms| (K = " << K << ", u_acc = 2^" << (dt == DType::f64 ? -53 : -24)
     << ": accumulation order differs between the devices) + 1 ulp of " << dtype_name(dt) << " (final rounding)"
     << extra;
  t.why = os.str();
  return t;
}

// ============================================================================ comparisons

namespace detail {

inline std::string index_str(int64_t flat, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    const int64_t s = std::max<int64_t>(shape[d], 1);
    idx[d] = flat % s;
    flat /= s;
  }
  std::ostringstream os;
  os << "[";
  for (size_t d = 0; d < idx.size(); ++d) os << (d ? ", " : "") << idx[d];
  os << "]";
  return os.str();
}

inline std::string describe(const Tensor& t) {
  std::ostringstream os;
  os << dtype_name(t.dtype()) << " " << shape_str(t.sizes()) << " on " << t.device().str();
  return os.str();
}

// Shape, dtype and device checks shared by close() and identical(); empty when fine.
inline std::string mismatch(const Tensor& got, const Tensor& want) {
  if (!want.defined()) return "the CPU reference is undefined";
  if (!got.defined()) return "the device result is undefined (the CPU's is " + describe(want) + ")";
  if (got.device() != dev()) return "expected the result on " + dev().str() + ", got " + describe(got);
  if (got.dtype() != want.dtype())
    return std::string("dtype differs: device ") + dtype_name(got.dtype()) + ", cpu " + dtype_name(want.dtype());
  if (got.sizes() != want.sizes())
    return "shape differs: device " + shape_str(got.sizes()) + ", cpu " + shape_str(want.sizes());
  return "";
}

// The elements of a tensor as doubles, on the host (device tensors are copied back first).
inline std::vector<double> values(const Tensor& t) { return t.detach().to(kCPU).to_vector<double>(); }

}  // namespace detail

namespace detail {
// close() and close_to_reference(): ulps are of dtype dt.
inline ::testing::AssertionResult close_in(const std::string& what, const Tensor& got, const Tensor& want,
                                           const Tol& tol, const Tensor& scale, DType dt);
}  // namespace detail

/// Compare a device result with the CPU reference under `tol` (see Tol). `what` names the op, dtype
/// and case; `scale` (a CPU tensor of want's numel, or undefined) feeds Tol::scaled.
inline ::testing::AssertionResult close(const std::string& what, const Tensor& got, const Tensor& want, const Tol& tol,
                                        const Tensor& scale = Tensor()) {
  const std::string bad_meta = detail::mismatch(got, want);
  if (!bad_meta.empty()) return ::testing::AssertionFailure() << what << ": " << bad_meta;
  return detail::close_in(what, got, want, tol, scale, want.dtype());
}

/// Compare a device result with a reference computed in a wider dtype (the CPU in f64): the shapes must agree,
/// the dtypes need not; `tol`'s ulps are of got's dtype.
inline ::testing::AssertionResult close_to_reference(const std::string& what, const Tensor& got, const Tensor& ref,
                                                     const Tol& tol, const Tensor& scale = Tensor()) {
  if (!got.defined() || !ref.defined())
    return ::testing::AssertionFailure() << what << ": " << (got.defined() ? "the reference" : "the result")
                                         << " is undefined";
  if (got.device() != dev())
    return ::testing::AssertionFailure() << what << ": the result is on " << got.device().str();
  if (got.sizes() != ref.sizes())
    return ::testing::AssertionFailure() << what << ": shape differs: " << shape_str(got.sizes()) << ", reference "
                                         << shape_str(ref.sizes());
  return detail::close_in(what, got, ref, tol, scale, got.dtype());
}

inline ::testing::AssertionResult detail::close_in(const std::string& what, const Tensor& got, const Tensor& want,
                                                   const Tol& tol, const Tensor& scale, DType dt) {
  const std::vector<double> g = detail::values(got), w = detail::values(want);
  const std::vector<double> s = scale.defined() ? detail::values(scale) : std::vector<double>();
  if (scale.defined() && s.size() != w.size())
    return ::testing::AssertionFailure() << what << ": the tolerance scale has " << s.size() << " elements, the result "
                                         << w.size() << " (test bug)";
  int64_t nbad = 0, first = -1, worst = -1;
  double worst_ratio = -1, max_abs = 0, max_rel = 0, max_want = 0;
  for (double b : w)
    if (std::isfinite(b)) max_want = std::max(max_want, std::fabs(b));
  std::vector<double> allowed(w.size(), 0.0);
  for (size_t i = 0; i < w.size(); ++i) {
    const double a = g[i], b = w[i];
    bool ok = true;
    double ratio = std::numeric_limits<double>::infinity();
    if (std::isnan(a) || std::isnan(b)) {
      ok = std::isnan(a) && std::isnan(b);
    } else if (std::isinf(a) || std::isinf(b)) {
      ok = a == b;
    } else {
      const double d = std::fabs(a - b);
      allowed[i] = tol.ulps * ulp(dt, std::max(std::fabs(a), std::fabs(b))) + tol.rtol * std::fabs(b) + tol.atol +
                   (s.empty() ? 0.0 : tol.scaled * std::fabs(s[i])) + tol.normwise * max_want;
      ok = d <= allowed[i];
      max_abs = std::max(max_abs, d);
      if (b != 0) max_rel = std::max(max_rel, d / std::fabs(b));
      if (allowed[i] > 0) ratio = d / allowed[i];
    }
    if (ok) continue;
    ++nbad;
    if (first < 0) first = static_cast<int64_t>(i);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = static_cast<int64_t>(i);
    }
  }
  if (nbad == 0) return ::testing::AssertionSuccess();
  auto at = [&](int64_t i) {
    std::ostringstream os;
    os << std::setprecision(10) << detail::index_str(i, want.sizes()) << ": device " << g[i] << ", cpu " << w[i]
       << " (|diff| " << std::fabs(g[i] - w[i]) << ", allowed " << allowed[i] << ")";
    return os.str();
  };
  return ::testing::AssertionFailure() << what << " [" << dtype_name(dt) << " " << shape_str(want.sizes()) << ", "
                                       << w.size() << " elements]: " << nbad
                                       << " element(s) differ beyond the tolerance\n  tolerance: ulps " << tol.ulps
                                       << ", rtol " << tol.rtol << ", atol " << tol.atol << ", scaled " << tol.scaled
                                       << ", normwise " << tol.normwise << " (max |cpu| " << max_want << ") -- "
                                       << tol.why << "\n  first mismatch at " << at(first) << "\n  worst mismatch at "
                                       << at(worst) << "\n  max abs err " << max_abs << ", max rel err " << max_rel;
}

/// Bit-identical elements (same dtype, shape, bytes; a NaN matches any NaN). For integer, bool and
/// cast results, masks and selections.
inline ::testing::AssertionResult identical(const std::string& what, const Tensor& got, const Tensor& want) {
  const std::string bad_meta = detail::mismatch(got, want);
  if (!bad_meta.empty()) return ::testing::AssertionFailure() << what << ": " << bad_meta;
  // want may live on the device too (the NCCL tests compare with device clones): both are read on the host.
  const Tensor a = got.detach().to(kCPU).contiguous(), b = want.detach().to(kCPU).contiguous();
  const size_t es = b.element_size();
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pb = static_cast<const unsigned char*>(b.raw_data());
  const int64_t n = b.numel();
  std::vector<double> va, vb;  // filled on the first mismatch
  int64_t nbad = 0, first = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(pa + i * es, pb + i * es, es) == 0) continue;
    if (is_floating(b.dtype())) {
      if (va.empty()) {
        va = detail::values(a);
        vb = detail::values(b);
      }
      if (std::isnan(va[static_cast<size_t>(i)]) && std::isnan(vb[static_cast<size_t>(i)])) continue;
    }
    ++nbad;
    if (first < 0) first = i;
  }
  if (nbad == 0) return ::testing::AssertionSuccess();
  if (va.empty()) {
    va = detail::values(a);
    vb = detail::values(b);
  }
  std::ostringstream os;
  os << std::setprecision(17) << what << " [" << dtype_name(b.dtype()) << " " << shape_str(b.sizes()) << ", " << n
     << " elements]: " << nbad << " element(s) differ, expected bit-identical results\n  first mismatch at "
     << detail::index_str(first, b.sizes()) << ": device " << va[static_cast<size_t>(first)] << ", cpu "
     << vb[static_cast<size_t>(first)];
  if (is_floating(b.dtype())) {
    const auto ui = static_cast<size_t>(first);
    os << " (" << std::fabs(va[ui] - vb[ui]) / ulp(b.dtype(), vb[ui]) << " ulp of " << dtype_name(b.dtype()) << ")";
  }
  return ::testing::AssertionFailure() << os.str();
}

/// Compare two host numbers (losses, norms) with a relative tolerance; `why` states it.
inline ::testing::AssertionResult near_rel(const std::string& what, double device_value, double cpu_value, double rtol,
                                           const std::string& why) {
  const double d = std::fabs(device_value - cpu_value);
  if (d <= rtol * std::max(std::fabs(cpu_value), 1e-30) || (std::isnan(device_value) && std::isnan(cpu_value)))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << std::setprecision(10) << what << ": device " << device_value << ", cpu "
                                       << cpu_value << ", relative difference " << d / std::fabs(cpu_value) << " > "
                                       << rtol << " (" << why << ")";
}

// ============================================================================ inputs

/// A fresh seed per call (the data only has to be the same for both devices within one run).
inline uint64_t next_seed() {
  static uint64_t s = 0x5eed;
  return ++s;
}

/// A CPU tensor of `shape`, dtype dt, from f64 values v (converted like Tensor::to).
inline Tensor make(const std::vector<double>& v, const Shape& shape, DType dt) {
  return from_vector<double>(v, shape, {.dtype = dt});
}

/// Values uniform in [lo, hi), rounded to dt (a CPU tensor).
inline Tensor uniform(const Shape& shape, double lo, double hi, DType dt = DType::f32) {
  std::mt19937_64 gen(next_seed());
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v) x = u(gen);
  return make(v, shape, dt);
}

/// Values offset + k / den for integers k uniform in [-kmax, kmax] (a CPU tensor): exact in every floating dtype
/// while the values need at most 8 significant bits, so products and sums of them are exact in an f32 accumulator
/// in any order. For cases whose result depends on a sign (a ReLU mask), which then no device can flip.
inline Tensor dyadic(const Shape& shape, int kmax, double den, double offset, DType dt) {
  std::mt19937_64 gen(next_seed());
  std::uniform_int_distribution<int> u(-kmax, kmax);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v) x = offset + u(gen) / den;
  return make(v, shape, dt);
}

/// Normal(mean, std) values rounded to dt (a CPU tensor).
inline Tensor normal(const Shape& shape, double mean, double stddev, DType dt = DType::f32) {
  std::mt19937_64 gen(next_seed());
  std::normal_distribution<double> n(mean, stddev);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v) x = n(gen);
  return make(v, shape, dt);
}

/// Integers uniform in [lo, hi) as dtype dt (a CPU tensor; any dtype, b8 gives v != 0).
inline Tensor integers(const Shape& shape, int64_t lo, int64_t hi, DType dt = DType::i64) {
  std::mt19937_64 gen(next_seed());
  std::uniform_int_distribution<int64_t> u(lo, hi - 1);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v) x = static_cast<double>(u(gen));
  return make(v, shape, dt);
}

/// Values drawn from `set` (so ties and equal elements occur), as dtype dt (a CPU tensor).
inline Tensor from_set(const Shape& shape, const std::vector<double>& set, DType dt = DType::f32) {
  std::mt19937_64 gen(next_seed());
  std::uniform_int_distribution<size_t> u(0, set.size() - 1);
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (double& x : v) x = set[u(gen)];
  return make(v, shape, dt);
}

/// A copy of t (no autograd history) with its own storage, in t's memory format (channels-last stays so).
inline Tensor layout_copy(const Tensor& t) {
  const MemoryFormat f = t.suggest_memory_format();
  const Tensor c = t.detach().clone();
  return f == MemoryFormat::contiguous ? c : c.contiguous(f);
}

/// t's values on the device under test, as a new tensor with its own storage in t's memory format (a leaf
/// requiring grad when asked).
inline Tensor on_dev(const Tensor& t, bool requires_grad = false) {
  if (!t.defined()) return t;
  Tensor d = t.detach().to(dev());
  if (d.is_alias_of(t)) d = layout_copy(d);  // self-check mode: the "device" copy must not share the CPU's storage
  if (requires_grad) d.requires_grad_(true);
  return d;
}

/// t's values on the CPU as a new leaf with its own storage in t's memory format (requiring grad when asked).
inline Tensor cpu_leaf(const Tensor& t, bool requires_grad = false) {
  if (!t.defined()) return t;
  Tensor c = layout_copy(t);
  if (requires_grad) c.requires_grad_(true);
  return c;
}

/// "op f16 [3, 4]" for messages.
inline std::string desc(const std::string& op, DType dt, const Shape& shape) {
  return op + " " + dtype_name(dt) + " " + shape_str(shape);
}

// ============================================================================ running a case

/// Run f; an exception becomes a test failure naming `what` (so one missing kernel does not hide
/// the other cases of a test).
inline void guarded(const std::string& what, const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) { ADD_FAILURE() << what << ": threw: " << e.what(); }
}

/// Whether an exception message says a dtype is not supported on the device (allowed for f64 in the
/// library-backed ops: cuBLASLt and cuDNN may not offer it).
inline bool says_unsupported_f64(const std::string& msg) {
  return msg.find("f64") != std::string::npos || msg.find("double") != std::string::npos;
}

/// RAII: in self-check mode with MP_CUDA_TESTS_DEVICE_THREADS=k, the scope runs with k OpenMP threads.
class DeviceThreads {
 public:
  DeviceThreads() {
    const char* e = std::getenv("MP_CUDA_TESTS_DEVICE_THREADS");
    if (!self_check_mode() || e == nullptr) return;
    saved_ = omp_get_max_threads();
    omp_set_num_threads(std::max(1, std::atoi(e)));
  }
  ~DeviceThreads() {
    if (saved_ > 0) omp_set_num_threads(saved_);
  }
  DeviceThreads(const DeviceThreads&) = delete;
  DeviceThreads& operator=(const DeviceThreads&) = delete;

 private:
  int saved_ = 0;
};

/// An op checked on both devices: the CPU inputs (those listed in grad_inputs, or every floating one
/// when empty, become leaves requiring grad), the op, the output tolerance and, for backward, the
/// gradient tolerance (the same upstream gradient, uniform in [-1, 1), on both devices).
struct OpCheck {
  std::string name;                                      ///< op, dtype and case for messages
  std::vector<Tensor> inputs;                            ///< CPU tensors
  std::function<Tensor(const std::vector<Tensor>&)> fn;  ///< the op (applied to leaves of either device)
  Tol out;                                               ///< forward tolerance
  std::optional<Tol> grad;                               ///< gradient tolerance; nullopt: forward only
  std::vector<size_t> grad_inputs;                       ///< inputs that get gradients (empty: floating ones)
  /// Optional per-element scale of the forward tolerance (Tol::scaled), from the CPU inputs.
  std::function<Tensor(const std::vector<Tensor>&)> out_scale;
  /// Optional per-element scale of the gradient tolerance (Tol::scaled) of input `i`, from the CPU inputs and the
  /// upstream gradient `go` (for bounds that follow the values, e.g. softmax's backward).
  std::function<Tensor(const std::vector<Tensor>& in, const Tensor& go, size_t i)> grad_scale;
  /// For ops linear in each floating input (matmul, conv, linear, sums, pools, embedding): the scale of
  /// Tol::scaled is the op applied to |inputs| in f64 (the sum of |terms| of every output element),
  /// and for each gradient the gradient of that f64 run under |upstream gradient| (the sum of |terms|
  /// of every gradient element). Overrides out_scale.
  bool abs_scales = false;
  bool f64_may_be_unsupported = false;  ///< a library-backed op may refuse f64 on cuda with a clear error
  bool bit_exact_output = false;        ///< compare the output with identical() instead of close()
};

/// Run an OpCheck: forward on both devices, compare, then backward with one upstream gradient and
/// compare every input's .grad.
inline void check_op(const OpCheck& c) {
  std::vector<size_t> gi = c.grad_inputs;
  if (c.grad && gi.empty())
    for (size_t i = 0; i < c.inputs.size(); ++i)
      if (c.inputs[i].defined() && is_floating(c.inputs[i].dtype())) gi.push_back(i);
  auto needs_grad = [&](size_t i) { return c.grad && std::find(gi.begin(), gi.end(), i) != gi.end(); };
  std::vector<Tensor> cin, din;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    cin.push_back(cpu_leaf(c.inputs[i], needs_grad(i)));
    din.push_back(on_dev(c.inputs[i], needs_grad(i)));
  }
  Tensor want, got;
  try {
    want = c.fn(cin);
  } catch (const std::exception& e) {
    ADD_FAILURE() << c.name << ": the CPU reference threw (test bug?): " << e.what();
    return;
  }
  try {
    DeviceThreads threads;
    got = c.fn(din);
  } catch (const std::exception& e) {
    bool f64 = false;
    for (const Tensor& t : c.inputs) f64 = f64 || (t.defined() && t.dtype() == DType::f64);
    if (c.f64_may_be_unsupported && f64 && dev().is_cuda() && says_unsupported_f64(e.what())) {
      std::printf("[   NOTE   ] %s: f64 is not supported on %s: %s\n", c.name.c_str(), dev().str().c_str(), e.what());
      return;
    }
    ADD_FAILURE() << c.name << ": the device run threw: " << e.what();
    return;
  }
  // The |terms| scales of a multilinear op: the op on |inputs| in f64, and its gradients under |go|.
  std::vector<Tensor> abs_in;
  Tensor abs_out;
  if (c.abs_scales) {
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor& t = c.inputs[i];
      abs_in.push_back(t.defined() && is_floating(t.dtype()) ? cpu_leaf(abs(t.to(DType::f64)), needs_grad(i))
                                                             : cpu_leaf(t));
    }
    abs_out = c.fn(abs_in);
  }
  if (c.bit_exact_output) {
    EXPECT_TRUE(identical(c.name + " forward", got, want));
  } else {
    const Tensor scale = c.abs_scales ? abs_out : c.out_scale ? c.out_scale(cin) : Tensor();
    EXPECT_TRUE(close(c.name + " forward", got, want, c.out, scale));
  }
  if (!c.grad || !want.defined() || !is_floating(want.dtype())) return;
  const Tensor go = uniform(want.sizes(), -1.0, 1.0, want.dtype());
  if (c.abs_scales) abs_out.backward(abs(go.to(DType::f64)));
  try {
    want.backward(cpu_leaf(go));
  } catch (const std::exception& e) {
    ADD_FAILURE() << c.name << ": the CPU backward threw (test bug?): " << e.what();
    return;
  }
  try {
    DeviceThreads threads;
    got.backward(on_dev(go));
  } catch (const std::exception& e) {
    ADD_FAILURE() << c.name << ": the device backward threw: " << e.what();
    return;
  }
  for (size_t i : gi) {
    const Tensor cg = cin[i].grad(), dg = din[i].grad();
    if (!cg.defined() && !dg.defined()) continue;
    const Tensor gs = c.abs_scales ? abs_in[i].grad() : c.grad_scale ? c.grad_scale(cin, go, i) : Tensor();
    EXPECT_TRUE(close(c.name + " grad of input " + std::to_string(i), dg, cg, *c.grad, gs));
  }
}

}  // namespace mp::cuda_test

// The vectorised float transcendentals of src/backend/fast_math.hpp (Note [fast float
// transcendentals]) and the kernels built on them:
//  * fast_exp/log/tanh/sigmoid/erf against double-precision std:: on a dense sweep of all 2^32 bit
//    patterns (every 193rd pattern, plus dense windows at the worst cases, branch switches and
//    saturation thresholds; every pattern with MP_FAST_MATH_EXHAUSTIVE=1, a few minutes), through the
//    baseline (SSE2) loop and the AVX-512 loop the kernels use (Note [AVX-512 element-wise loops]):
//    the documented ulp bounds, special values, exact saturation, monotonicity;
//  * the ops: mp::exp/log/tanh/sigmoid/gelu (+ gelu backward), softmax, log_softmax, cross_entropy
//    (forward and backward, rows and columns) and the fused LSTM gates, with set_avx512_loops(false)
//    (baseline loops) and true (AVX-512 loops), each against a double reference with a derived
//    tolerance, f32 and bf16.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/fast_math.hpp"
#include "backend/pointwise.hpp"
#include "backend/pointwise_kernels.hpp"
#include "mp/mp.hpp"

namespace mp::backend {
namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of f32

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ulp of the float nearest v: 2^(e - 23) for 2^e <= |v| < 2^(e+1), 2^-149 in the subnormal range.
double ulp_of(double v) {
  const double a = std::fabs(v);
  if (a < 0x1p-126) return 0x1p-149;
  int e;
  std::frexp(a, &e);
  return std::ldexp(1.0, e - 24);
}

bool avx512_available() {
  const bool was = cpu::set_avx512_loops(true);
  const bool on = cpu::avx512_loops_enabled();
  cpu::set_avx512_loops(was);
  return on;
}

// ---------------------------------------------------------------- functions, both loop builds

struct ErfF {
  MP_FORCE_INLINE float operator()(float x) const { return fast_erf(x); }
};

enum class Path { baseline, avx512 };
const char* name(Path p) { return p == Path::baseline ? "baseline" : "avx512"; }

// y[j] = F(x[j]) through the kernels' own inner loop (SimdBlock), compiled for the baseline or AVX-512.
template <class F>
void run_loop(Path path, const float* x, float* y, int64_t n) {
  const cpu::SimdBlock<1, F> block{F{}};
  cpu::call_isa(path == Path::avx512, block, y, static_cast<const float* const*>(&x), n);
}

struct Case {
  const char* name;
  double bound;  // documented max error in ulp
  void (*loop)(Path, const float*, float*, int64_t);
  double (*ref)(double);
  // The exact result where the function is documented to saturate/overflow/underflow (else NaN).
  float (*exact)(float);
};

float no_exact(float) { return NAN; }
// Thresholds of Note [fast float transcendentals]: the correctly rounded ones, except erf's (a few
// floats early; the AVX-512 build saturates 2 floats after the baseline one, kErfLastBelowOne).
constexpr float kExpInfFrom = 0x1.62e43p+6f;        // 88.72284: exp is inf from here
constexpr float kExpZeroBelow = -0x1.9fe368p+6f;    // -103.97208: exp and sigmoid are 0 below
constexpr float kTanhOneAbove = 0x1.205966p+3f;     // 9.0109129
constexpr float kSigmoidOneAbove = 0x1.154244p+4f;  // 17.328678
constexpr float kErfOneAbove = 0x1.f5a424p+1f;      // 3.9190717
constexpr float kErfLastBelowOne = 0x1.f5a42p+1f;   // 3.9190712: erf < 1 here in both builds

const Case kCases[] = {
    {"exp", kFastExpMaxUlp, run_loop<ExpFn<float>>, [](double x) { return std::exp(x); },
     [](float x) { return x >= kExpInfFrom ? INFINITY : (x < kExpZeroBelow ? 0.0f : NAN); }},
    {"log", kFastLogMaxUlp, run_loop<LogFn<float>>, [](double x) { return std::log(x); }, no_exact},
    {"tanh", kFastTanhMaxUlp, run_loop<TanhFn<float>>, [](double x) { return std::tanh(x); },
     [](float x) { return x > kTanhOneAbove ? 1.0f : (x < -kTanhOneAbove ? -1.0f : NAN); }},
    {"sigmoid", kFastSigmoidMaxUlp, run_loop<SigmoidFn<float>>, [](double x) { return 1.0 / (1.0 + std::exp(-x)); },
     [](float x) { return x > kSigmoidOneAbove ? 1.0f : (x < kExpZeroBelow ? 0.0f : NAN); }},
    {"erf", kFastErfMaxUlp, run_loop<ErfF>, [](double x) { return std::erf(x); },
     [](float x) { return x > kErfOneAbove ? 1.0f : (x < -kErfOneAbove ? -1.0f : NAN); }},
};

struct Stats {
  double max_ulp = 0;
  float worst_x = 0;
  int64_t failures = 0;  // special value, saturation or sign-of-zero mismatches
  std::string first_failure;
  int64_t count = 0;
};

// Checks y = f(x) for the n inputs x against the double reference; accumulates into s.
void check_values(const Case& c, const float* x, const float* y, int64_t n, Stats& s) {
  for (int64_t j = 0; j < n; ++j) {
    const double r = c.ref(static_cast<double>(x[j]));
    const float rf = static_cast<float>(r);
    const float want = c.exact(x[j]);
    bool ok = true;
    double err = 0;
    if (std::isnan(r)) {
      ok = std::isnan(y[j]);
    } else if (std::isinf(rf)) {
      ok = y[j] == rf;  // exact infinities (log(0), exp(inf), overflow of the rounded result)
    } else if (!std::isfinite(y[j])) {
      ok = false;
    } else {
      err = std::fabs(static_cast<double>(y[j]) - r) / ulp_of(r);
      if (rf == 0 && y[j] == 0) ok = std::signbit(rf) == std::signbit(y[j]);  // tanh(-0) = -0, ...
    }
    if (!std::isnan(want) && to_bits(y[j]) != to_bits(want)) ok = false;  // exact saturation, including +0
    ++s.count;
    if (!ok) {
      if (s.failures++ == 0) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "x = %a: got %a, reference %a", x[j], y[j], r);
        s.first_failure = buf;
      }
    }
    if (err > s.max_ulp) {
      s.max_ulp = err;
      s.worst_x = x[j];
    }
  }
}

// Evaluates c on the bit patterns first, first + stride, ... <= last (parallel) and checks them.
Stats sweep(const Case& c, Path path, uint64_t first, uint64_t last, uint64_t stride) {
  constexpr int64_t kChunk = 4096;
  const uint64_t count = (last - first) / stride + 1;
  const int64_t chunks = static_cast<int64_t>((count + kChunk - 1) / kChunk);
  Stats total;
#pragma omp parallel
  {
    Stats s;
    std::vector<float> x(kChunk), y(kChunk);
#pragma omp for schedule(dynamic, 8)
    for (int64_t k = 0; k < chunks; ++k) {
      const uint64_t i0 = static_cast<uint64_t>(k) * kChunk;
      const int64_t n = static_cast<int64_t>(std::min<uint64_t>(kChunk, count - i0));
      for (int64_t j = 0; j < n; ++j) x[j] = from_bits(static_cast<uint32_t>(first + (i0 + j) * stride));
      c.loop(path, x.data(), y.data(), n);
      check_values(c, x.data(), y.data(), n, s);
    }
#pragma omp critical
    {
      if (s.max_ulp > total.max_ulp) {
        total.max_ulp = s.max_ulp;
        total.worst_x = s.worst_x;
      }
      if (s.failures && !total.failures) total.first_failure = s.first_failure;
      total.failures += s.failures;
      total.count += s.count;
    }
  }
  return total;
}

std::vector<Path> paths() {
  std::vector<Path> p{Path::baseline};
  if (avx512_available()) p.push_back(Path::avx512);
  return p;
}

// Every 193rd bit pattern (193 is prime, so every mantissa residue and every exponent is hit; 22M
// inputs per function and path, 5-8 s in all on 2 cores), or all of them with
// MP_FAST_MATH_EXHAUSTIVE=1 (10-20 minutes).
uint64_t sweep_stride() {
  const char* e = std::getenv("MP_FAST_MATH_EXHAUSTIVE");
  return e && std::string(e) == "1" ? 1 : 193;
}

TEST(FastMath, ErrorBoundsOverAllFloats) {
  const uint64_t stride = sweep_stride();
  for (const Case& c : kCases) {
    for (Path p : paths()) {
      const Stats s = sweep(c, p, 0, 0xffffffffu, stride);
      EXPECT_EQ(s.failures, 0) << c.name << " " << name(p) << ": " << s.first_failure;
      EXPECT_LE(s.max_ulp, c.bound) << c.name << " " << name(p) << " at x = " << s.worst_x;
      // The bounds are nearly tight: the sweep finds errors above 0.75 ulp for every function.
      EXPECT_GT(s.max_ulp, 0.75) << c.name << " " << name(p);
      std::printf("%-8s %-8s max error %.4f ulp at x = %a (%lld inputs)\n", c.name, name(p), s.max_ulp, s.worst_x,
                  static_cast<long long>(s.count));
    }
  }
}

// Dense windows (every float) where errors peak or behaviour switches: the worst inputs of the
// exhaustive sweeps, the branch switches (tanh 0.625, erf 0.9, the reduction boundaries of exp at odd
// multiples of ln2/2, log at 2/3 and 4/3), subnormal inputs and the saturation thresholds. Also checks
// monotonicity there for exp, log, tanh and erf (Note: they are monotone; sigmoid is not).
TEST(FastMath, DenseWindows) {
  struct Window {
    int fn;  // index into kCases
    float center;
  };
  const Window windows[] = {
      {0, 0x1.199cc6p+6f},
      {0, -0x1.76da64p+2f},
      {0, 0x1.62e43p-2f},
      {0, -0x1.62e43p-2f},
      {0, 0x1.0a2b24p+0f},
      {0, 0x1.bb9d3cp+0f},
      {0, kExpInfFrom},
      {0, kExpZeroBelow},
      {0, -0x1.5d58ap+6f},  // -126 ln 2: subnormal results start
      {1, 0x1.55d47cp+0f},
      {1, 0x1.4665f2p+0f},
      {1, 0x1.555556p-1f},
      {1, 0x1.555556p+0f},
      {1, 0x1p-126f},
      {1, 1.0f},
      {1, 0x1p-149f},
      {2, 0x1.896ba2p-1f},
      {2, 0.625f},
      {2, -0.625f},
      {2, kTanhOneAbove},
      {2, -kTanhOneAbove},
      {3, -0x1.430482p+6f},
      {3, -0x1.0fb91cp+4f},
      {3, 0.0f},
      {3, kSigmoidOneAbove},
      {3, kExpZeroBelow},
      {4, 0x1.bffa1cp-1f},
      {4, 0x1.0ef86ep+0f},
      {4, 0.9f},
      {4, -0.9f},
      {4, kErfOneAbove},
      {4, -kErfOneAbove},
  };
  constexpr int64_t kHalf = 1 << 15;
  for (const Window& w : windows) {
    const Case& c = kCases[w.fn];
    for (Path p : paths()) {
      // 2^16 consecutive floats in increasing order around the centre (walking the bits of |x|).
      std::vector<float> x(2 * kHalf), y(2 * kHalf);
      float v = w.center;
      for (int64_t k = 0; k < kHalf; ++k) v = std::nextafter(v, -INFINITY);
      for (auto& xi : x) {
        xi = v;
        v = std::nextafter(v, INFINITY);
      }
      c.loop(p, x.data(), y.data(), static_cast<int64_t>(x.size()));
      Stats s;
      check_values(c, x.data(), y.data(), static_cast<int64_t>(x.size()), s);
      EXPECT_EQ(s.failures, 0) << c.name << " " << name(p) << " near " << w.center << ": " << s.first_failure;
      EXPECT_LE(s.max_ulp, c.bound) << c.name << " " << name(p) << " at x = " << s.worst_x;
      if (w.fn != 3) {
        for (size_t j = 1; j < x.size(); ++j) {
          if (std::isnan(y[j - 1]) || std::isnan(y[j])) continue;
          ASSERT_LE(y[j - 1], y[j]) << c.name << " " << name(p) << " is not monotone at x = " << x[j];
        }
      }
    }
  }
}

TEST(FastMath, SpecialValues) {
  const float inf = INFINITY, qnan = std::numeric_limits<float>::quiet_NaN(), tiny = 0x1p-149f;
  struct Expect {
    int fn;
    float x, want;  // want NaN: result must be NaN
  };
  const Expect table[] = {
      {0, 0.0f, 1.0f},       {0, -0.0f, 1.0f},         {0, inf, inf},
      {0, -inf, 0.0f},       {0, qnan, qnan},          {0, -qnan, qnan},
      {0, kExpInfFrom, inf}, {0, kExpZeroBelow, tiny}, {0, std::nextafter(kExpZeroBelow, -inf), 0.0f},
      {0, -1e30f, 0.0f},     {0, 1e30f, inf},          {1, 1.0f, 0.0f},
      {1, 0.0f, -inf},       {1, -0.0f, -inf},         {1, -1.0f, qnan},
      {1, -tiny, qnan},      {1, -inf, qnan},          {1, inf, inf},
      {1, qnan, qnan},       {2, 0.0f, 0.0f},          {2, -0.0f, -0.0f},
      {2, inf, 1.0f},        {2, -inf, -1.0f},         {2, qnan, qnan},
      {2, 20.0f, 1.0f},      {2, -20.0f, -1.0f},       {2, tiny, tiny},
      {2, -tiny, -tiny},     {3, 0.0f, 0.5f},          {3, -0.0f, 0.5f},
      {3, inf, 1.0f},        {3, -inf, 0.0f},          {3, qnan, qnan},
      {3, 1e30f, 1.0f},      {3, -1e30f, 0.0f},        {3, kExpZeroBelow, tiny},
      {4, 0.0f, 0.0f},       {4, -0.0f, -0.0f},        {4, inf, 1.0f},
      {4, -inf, -1.0f},      {4, qnan, qnan},          {4, 10.0f, 1.0f},
      {4, -10.0f, -1.0f},
  };
  for (Path p : paths()) {
    for (const Expect& e : table) {
      const Case& c = kCases[e.fn];
      float y;
      c.loop(p, &e.x, &y, 1);
      if (std::isnan(e.want)) {
        EXPECT_TRUE(std::isnan(y)) << c.name << "(" << e.x << ") = " << y << " (" << name(p) << ")";
      } else {
        EXPECT_EQ(to_bits(y), to_bits(e.want))
            << c.name << "(" << std::hexfloat << e.x << ") = " << y << ", want " << e.want << " (" << name(p) << ")";
      }
    }
    // Saturation is tight: just before each threshold the result is not yet saturated.
    float y;
    const float below[] = {kTanhOneAbove, kSigmoidOneAbove, kErfLastBelowOne};
    const int fns[] = {2, 3, 4};
    for (int k = 0; k < 3; ++k) {
      kCases[fns[k]].loop(p, &below[k], &y, 1);
      EXPECT_LT(y, 1.0f) << kCases[fns[k]].name << " saturates before " << below[k] << " (" << name(p) << ")";
    }
  }
}

// The double instantiations are std:: (f64 gradchecks stay exact), the float ones the fast functions.
TEST(FastMath, MathHelpersPickByType) {
  EXPECT_EQ(math_exp(0.5), std::exp(0.5));
  EXPECT_EQ(math_log(3.0), std::log(3.0));
  EXPECT_EQ(math_tanh(0.3), std::tanh(0.3));
  EXPECT_EQ(math_erf(0.7), std::erf(0.7));
  EXPECT_EQ(math_sigmoid(-2.0), std::exp(-2.0) / (1.0 + std::exp(-2.0)));
  EXPECT_EQ(math_exp(0.5f), fast_exp(0.5f));
  EXPECT_EQ(math_sigmoid(0.5f), fast_sigmoid(0.5f));
}

// ---------------------------------------------------------------- ops, both loop builds

// Runs body() with the AVX-512 loops forbidden, then (where the CPU has them) allowed.
void for_each_isa(const std::function<void(const char*)>& body) {
  const bool was = cpu::set_avx512_loops(false);
  body("baseline");
  if (avx512_available()) {
    cpu::set_avx512_loops(true);
    body("avx512");
  }
  cpu::set_avx512_loops(was);
}

// n floats spread over [lo, hi] with all mantissa patterns mixed in (deterministic).
std::vector<float> spread(int64_t n, float lo, float hi) {
  std::vector<float> v(n);
  uint32_t s = 12345;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = lo + (hi - lo) * static_cast<float>(s >> 8) * 0x1p-24f;
  }
  return v;
}

Tensor f32(const std::vector<float>& v, Shape shape) { return from_vector(v, std::move(shape)); }

// Element-wise op results against the double reference: within the function's bound (f32), within
// half a bf16 ulp plus the f32 bound (bf16 output: the f32 result is rounded once more).
TEST(FastMathOps, PointwiseBothLoops) {
  struct Op {
    const char* name;
    Tensor (*op)(const Tensor&);
    double (*ref)(double);
    double bound;
    float lo, hi;
  };
  const Op ops[] = {
      {"exp", &mp::exp, [](double x) { return std::exp(x); }, kFastExpMaxUlp, -110, 88},  // no overflow
      {"log", &mp::log, [](double x) { return std::log(x); }, kFastLogMaxUlp, 1e-3f, 1e6f},
      {"tanh", &mp::tanh, [](double x) { return std::tanh(x); }, kFastTanhMaxUlp, -12, 12},
      {"sigmoid", &mp::sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, kFastSigmoidMaxUlp, -110, 30},
  };
  const int64_t n = 100003;  // odd: exercises the vector tails; above kParallelGrain: the threaded loop
  for (const Op& o : ops) {
    const std::vector<float> xv = spread(n, o.lo, o.hi);
    const Tensor x = f32(xv, {n});
    const Tensor xb = x.to(DType::bf16);
    const std::vector<float> xbv = xb.to_vector<float>();
    std::vector<std::vector<float>> results;
    for_each_isa([&](const char* isa) {
      const std::vector<float> y = o.op(x).to_vector<float>();
      const std::vector<float> yb = o.op(xb).to_vector<float>();
      for (int64_t i = 0; i < n; ++i) {
        const double r = o.ref(xv[i]);
        ASSERT_LE(std::fabs(y[i] - r), o.bound * ulp_of(r)) << o.name << "(" << xv[i] << ") " << isa;
        // bf16 output: rounding the f32 result costs at most half a bf16 ulp (2^15 f32 ulps); a
        // subnormal reference is compared with bf16's own spacing there (also 2^-133 granularity).
        const double rb = o.ref(xbv[i]);
        const double ulp_b = std::max(ulp_of(rb) * 0x1p16, 0x1p-133);
        ASSERT_LE(std::fabs(yb[i] - rb), 0.5 * ulp_b + o.bound * ulp_of(rb)) << o.name << " bf16 " << isa;
      }
      results.push_back(y);
    });
    // The two loops agree within twice the bound (each is within the bound of the same exact value),
    // and they are different code: with FMA contraction some results differ in the last bit.
    if (results.size() == 2) {
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_LE(std::fabs(results[0][i] - results[1][i]), 2 * o.bound * ulp_of(results[0][i])) << o.name;
        differ += results[0][i] != results[1][i];
      }
      EXPECT_GT(differ, 0) << o.name << ": set_avx512_loops() did not switch the loop";
    }
  }
}

// GELU x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)) and its derivative Phi(x) + x phi(x), in f32.
// Tolerance: u = x / sqrt2 carries two roundings (relative 2 * 2^-24), which move erf by at most
// (2/sqrt pi) e^-u^2 |u| 2^-23 <= 0.97 * 2^-24; erf errs by <= kFastErfMaxUlp ulp <= 2^-24 absolute
// (|erf| < 1); 1 + erf rounds by <= 2^-24: the bracket is off by <= 3 * 2^-24 absolute, i.e.
// 1.5 |x| 2^-24 in the result, plus the final product's rounding: 2^-24 (1.5 |x| + 2 |y|).
// Derivative: Phi is off by half the bracket's error (1.5 * 2^-24); x phi(x) by 2^-24 (2.06 + 3)
// relative (exp's bound, three roundings) plus 2 |v| 2^-24 relative from rounding v = -x^2/2, and
// |x|^3 phi(x) <= 0.47; the sum rounds once: 2^-24 (5 + 8 |y'|) covers it.
TEST(FastMathOps, GeluForwardBackwardBothLoops) {
  const int64_t n = 65537;
  const std::vector<float> xv = spread(n, -12, 12);
  const Tensor x = f32(xv, {n});
  const Tensor g = ones({n});
  const auto pointwise = pointwise_kernel.get(kCPU);
  for_each_isa([&](const char* isa) {
    const std::vector<float> y = mp::gelu(x).to_vector<float>();
    Tensor dx = empty({n});
    const std::vector<Tensor> ins = {g, x};
    pointwise(PointwiseOp::gelu_backward, dx, ins, DType::f32, {});
    const std::vector<float> d = dx.to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      const double xi = xv[i], cdf = 0.5 * (1 + std::erf(xi / std::sqrt(2.0)));
      const double r = xi * cdf, rd = cdf + xi * std::exp(-0.5 * xi * xi) / std::sqrt(2 * M_PI);
      ASSERT_LE(std::fabs(y[i] - r), kU * (1.5 * std::fabs(xi) + 2 * std::fabs(r)) + 0x1p-149) << xi << " " << isa;
      ASSERT_LE(std::fabs(d[i] - rd), kU * (5 + 8 * std::fabs(rd))) << xi << " " << isa;
    }
  });
}

// Softmax / log-softmax in f32 against double, along the last dim (row kernels) and along dim 0 of
// the transposed layout (column kernels). The reference starts from the kernels' own shifted logits
// d = fl(x - m) (m the row max, so d is what any f32 implementation computes) and is exact from there.
//  * softmax y = e^d / S: exp's 1.03 ulp (relative 2.06 * 2^-24) in the numerator and in every term
//    of S, the n-term sum (n - 1) 2^-24 (worst case, any order), 1/S and the product 2^-24 each:
//    relative 2^-24 (n + 5.2).
//  * log-softmax y = d - log S: S's relative error (n + 1.06) 2^-24 becomes absolute in log S, log's
//    0.97 ulp <= 1.94 * 2^-24 |log S|, the subtraction 2^-24 |y|.
// Those worst cases grow with n (263 * 2^-24 here), so a systematic error of 1e-6 would pass them; the
// mean signed error catches it: rounding errors are unbiased, a row's sum errs with a standard
// deviation of about 2^-24 sqrt(n / 3) = 9 * 2^-24, so the mean over 300 rows is within about
// 0.5 * 2^-24 of 0 (up to 1.1 * 2^-24 measured here); we allow 4 * 2^-24 (1e-6 is 17 * 2^-24).
TEST(FastMathOps, SoftmaxBothLoops) {
  const int64_t rows = 300, n = 257;
  const std::vector<float> xv = spread(rows * n, -30, 30);
  const Tensor x = f32(xv, {rows, n});
  const Tensor xt = x.transpose(0, 1).contiguous();  // [n, rows]: softmax over dim 0 = column kernels
  for (bool log : {false, true}) {
    std::vector<double> ref(rows * n), tol(rows * n);
    for (int64_t i = 0; i < rows; ++i) {
      float m = -INFINITY;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, xv[i * n + j]);
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(xv[i * n + j] - m));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t k = i * n + j;
        const double d = xv[k] - m;  // exact in float
        ref[k] = log ? d - std::log(s) : std::exp(d) / s;
        tol[k] = log ? kU * (n + 1.06 + 1.94 * std::log(s) + std::fabs(ref[k])) : kU * (n + 5.2) * ref[k] + 0x1p-149;
      }
    }
    const char* what = log ? "log_softmax" : "softmax";
    for_each_isa([&](const char* isa) {
      const std::vector<float> y = (log ? log_softmax(x, 1) : softmax(x, 1)).to_vector<float>();
      const std::vector<float> yc =
          (log ? log_softmax(xt, 0) : softmax(xt, 0)).transpose(0, 1).contiguous().to_vector<float>();
      double bias = 0, bias_c = 0;  // mean signed error, relative (softmax) or absolute (log-softmax)
      for (int64_t k = 0; k < rows * n; ++k) {
        ASSERT_LE(std::fabs(y[k] - ref[k]), tol[k]) << what << " rows " << isa;
        ASSERT_LE(std::fabs(yc[k] - ref[k]), tol[k]) << what << " cols " << isa;
        const double scale = log ? 1.0 : ref[k];
        bias += (y[k] - ref[k]) / scale;
        bias_c += (yc[k] - ref[k]) / scale;
      }
      EXPECT_LE(std::fabs(bias / (rows * n)), 4 * kU) << what << " rows " << isa;
      EXPECT_LE(std::fabs(bias_c / (rows * n)), 4 * kU) << what << " cols " << isa;
    });
  }
}

// Cross entropy (mean over rows, label smoothing 0.1, one ignored row) and its gradient, f32, rows
// ([N, C]) and columns ([N, C, L]), against double; |x| <= 15, so shifted logits |d| <= 30.
//  * Gradient w (p_c - [c == t](1 - eps) - eps/C), w = 1/valid: p_c = exp((d - lse')) with lse' =
//    log S off by (C + 2.06) 2^-24 (the sum, exp) + 2^-24 |lse'| (log, lse' <= log C < 5), d by
//    30 * 2^-24 and the subtraction by 35 * 2^-24: exp's argument is off by (C + 72) 2^-24, p_c
//    relatively by that + 2.06 * 2^-24; two roundings of values <= 1 and the scaling by w: absolute
//    2^-24 (C + 80) w.
//  * Loss: per row, lse' - d_t and lse' - mean(d) are off by (C + 72) 2^-24 as above plus the mean of
//    C values |d| <= 30 (worst case C * 30 * 2^-24, weighted by eps = 0.1); the mean over R rows of
//    values <= 40 adds R * 40 * 2^-24 (worst case for any summation order): 2^-24 (4 C + 80 + 40 R).
TEST(FastMathOps, CrossEntropyBothLoops) {
  const int64_t N = 64, C = 100;
  const double eps = 0.1;
  // L = 1: [N, C] (row kernels); 3: narrow column blocks (baseline lanes); 37: column blocks wide
  // enough for the AVX-512 lanes (kMinAvx512Cols in softmax.cpp).
  for (int64_t L : {1, 3, 37}) {
    const bool cols = L > 1;
    const int64_t R = N * L;
    const std::vector<float> xv = spread(N * C * L, -15, 15);
    std::vector<int64_t> tv(R);
    for (int64_t r = 0; r < R; ++r) tv[r] = (r * 37) % C;
    tv[5] = -100;  // ignored
    const Tensor x = cols ? f32(xv, {N, C, L}) : f32(xv, {N, C});
    const Tensor t = cols ? from_vector(tv, {N, L}) : from_vector(tv, {N});
    // Reference: per row (n, l) of classes c at xv[(n * C + c) * L + l].
    auto at = [&](int64_t r, int64_t c) { return xv[((r / L) * C + c) * L + r % L]; };
    double ref_loss = 0;
    int64_t valid = 0;
    std::vector<double> ref_grad(xv.size(), 0.0);
    for (int64_t r = 0; r < R; ++r) {
      if (tv[r] == -100) continue;
      ++valid;
    }
    for (int64_t r = 0; r < R; ++r) {
      if (tv[r] == -100) continue;
      double m = -INFINITY, s = 0, sx = 0;
      for (int64_t c = 0; c < C; ++c) m = std::max(m, static_cast<double>(at(r, c)));
      for (int64_t c = 0; c < C; ++c) {
        s += std::exp(at(r, c) - m);
        sx += at(r, c);
      }
      const double lse = m + std::log(s);
      ref_loss += ((1 - eps) * (lse - at(r, tv[r])) + eps * (lse - sx / C)) / valid;
      for (int64_t c = 0; c < C; ++c) {
        const double g = (std::exp(at(r, c) - lse) - (c == tv[r] ? 1 - eps : 0) - eps / C) / valid;
        ref_grad[((r / L) * C + c) * L + r % L] = g;
      }
    }
    for_each_isa([&](const char* isa) {
      const Tensor leaf = x.detach().requires_grad_();
      const Tensor loss = cross_entropy(leaf, t, {.label_smoothing = eps});
      const double tol = kU * (4.0 * C + 80 + 40.0 * R);
      EXPECT_LE(std::fabs(loss.item<float>() - ref_loss), tol) << "L = " << L << " " << isa;
      loss.backward();
      const std::vector<float> g = leaf.grad().to_vector<float>();
      for (size_t i = 0; i < g.size(); ++i)
        ASSERT_LE(std::fabs(g[i] - ref_grad[i]), kU * (C + 80.0) / valid) << "L = " << L << " " << isa;
    });
  }
}

// Fused LSTM gates (forward and backward) in f32 against double. Forward: each activation is within
// 1.46 ulp (relative 2.92 * 2^-24; tanh 2.16), so c' = f c + i g errs by 2^-24 (3.92 |f c| +
// 6.08 |i g| + |c'|) <= 2^-24 * 7.1 (|f c| + |i g|) (activations, products, the sum), and
// h = o tanh(c') by |o| times that (tanh' <= 1) plus 2^-24 (2.92 + 2.16 + 1) |h|.
// Backward: dc_t = dcn + dh o (1 - tanh(c')^2), where tanh(c') carries c' 's error (<= 7.1 (|c| + 1)
// 2^-24) plus its own 2.16 * 2^-24, so 1 - tanh^2 is off by <= 2^-24 (14.2 |c| + 19) and dc_t by
// |dh| 2^-24 (14.2 |c| + 22) <= 36 |dh| max(1, |c|) 2^-24. Each gate gradient multiplies dc_t (or dh)
// by factors bounded by max(1, |c|) with relative errors of a few 2^-24 (activations, complements
// 1 - a with absolute error 1.5 * 2^-24, three products): 2^-24 * 40 * (|dh| + |dcn|) max(1, |c|).
TEST(FastMathOps, LstmGatesBothLoops) {
  const int64_t B = 33, H = 130;  // H > kBlock / 4: several row blocks, ragged tails
  const std::vector<float> gv = spread(B * 4 * H, -12, 12), cv = spread(B * H, -3, 3);
  const std::vector<float> dhv = spread(B * H, -1, 1), dcv = spread(B * H, -1, 1);
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  for_each_isa([&](const char* isa) {
    const Tensor gates = f32(gv, {B, 4 * H}).requires_grad_(), c = f32(cv, {B, H}).requires_grad_();
    auto [h1, c1] = lstm_gates(gates, c);
    const std::vector<float> hv = h1.to_vector<float>(), c1v = c1.to_vector<float>();
    Tensor obj = add(sum(mul(h1, f32(dhv, {B, H}))), sum(mul(c1, f32(dcv, {B, H}))));
    obj.backward();
    const std::vector<float> dg = gates.grad().to_vector<float>(), dc = c.grad().to_vector<float>();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < H; ++j) {
        const int64_t k = b * H + j, g0 = b * 4 * H + j;
        const double i = sig(gv[g0]), f = sig(gv[g0 + H]), g = std::tanh(gv[g0 + 2 * H]), o = sig(gv[g0 + 3 * H]);
        const double cn = f * cv[k] + i * g, tc = std::tanh(cn), h = o * tc;
        const double tol_c = kU * 7.1 * (std::fabs(f * cv[k]) + std::fabs(i * g)) + 0x1p-149;
        ASSERT_LE(std::fabs(c1v[k] - cn), tol_c) << isa;
        ASSERT_LE(std::fabs(hv[k] - h), std::fabs(o) * tol_c + kU * 6.1 * std::fabs(h) + 0x1p-149) << isa;
        const double dh = dhv[k], dct = dcv[k] + dh * o * (1 - tc * tc);
        const double want[5] = {dct * g * i * (1 - i), dct * cv[k] * f * (1 - f), dct * i * (1 - g * g),
                                dh * tc * o * (1 - o), dct * f};
        const float got[5] = {dg[g0], dg[g0 + H], dg[g0 + 2 * H], dg[g0 + 3 * H], dc[k]};
        const double scale = (std::fabs(dh) + std::fabs(dcv[k])) * std::max(1.0, std::fabs(static_cast<double>(cv[k])));
        for (int q = 0; q < 5; ++q) ASSERT_LE(std::fabs(got[q] - want[q]), kU * 40 * scale) << q << " " << isa;
      }
    }
  });
}

}  // namespace
}  // namespace mp::backend

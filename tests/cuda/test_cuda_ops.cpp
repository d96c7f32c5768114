// CUDA against the CPU, part 1: the Tensor methods that compute (casts between every dtype pair,
// contiguous / clone / to of strided views, copy_ into strided destinations, fill_, factories) and
// element-wise ops (every unary and binary op, forward and backward, in f32/f16/bf16/f64, on
// contiguous, transposed and broadcast (stride 0) operands, vector tails, misaligned large tensors,
// special values, integers, in-place ops). Reductions: test_cuda_ops_reduce.cpp.
//
// Every tolerance states its reason (cuda_test_util.hpp: Tol, libm_tol, reduction_tol). Tests skip
// without a CUDA device; MP_CUDA_TESTS_ON_CPU=1 runs them with the CPU as the device (self-check).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"

using namespace mp;
using namespace mp::cuda_test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Values every dtype holds (integers and dyadic fractions), non-negative (casting a negative float to
// u8 is undefined in C++, so the CPU reference has no defined answer there) or signed.
Tensor cast_sample(DType dt, bool negatives, const Shape& shape) {
  if (dt == DType::b8) return integers(shape, 0, 2, DType::b8);
  if (dt == DType::u8) return integers(shape, 0, 256, DType::u8);
  if (!is_floating(dt)) return integers(shape, negatives ? -120 : 0, 120, dt);
  // Fractions that truncate to integers when cast to integer types: k/8 in [-120, 120) or [0, 120).
  Tensor k = integers(shape, negatives ? -960 : 0, 960, DType::f64);
  return mul(k, 0.125).to(dt);
}

// Float values that exercise the conversions: infinities, NaN, signed zero, f16 overflow and
// subnormals, bf16 and f16 ties (round to nearest even), f32 max (rounds to inf in bf16 and f16), a
// value whose f64 -> f16 conversion through f32 rounds twice (1 + 2^-11 + 2^-40 becomes the tie
// 1 + 2^-11 in f32, then 1.0 in f16: the CPU's scalar_cast goes through float, so must the GPU).
std::vector<double> special_floats() {
  return {0.0,
          -0.0,
          kInf,
          -kInf,
          kNaN,
          1.0,
          -1.5,
          65504.0,
          65519.0,
          65520.0,
          -70000.0,
          1e-8,
          3e-5,
          -6.1e-5,
          5.9604645e-8,
          1.0 + std::ldexp(1.0, -8),
          1.0 + 3 * std::ldexp(1.0, -8),
          1.0 + std::ldexp(1.0, -11),
          1.0 + 3 * std::ldexp(1.0, -11),
          3.4028234663852886e38,
          -3.4028234663852886e38,
          1e-40,
          1e300,
          -1e-300,
          1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40),
          1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -35),
          0.1,
          -0.2,
          1.0 / 3.0};
}

// A view of a leaf (applied on both devices), so ops see strided or broadcast operands.
struct View {
  const char* name;
  Shape leaf_shape;
  std::function<Tensor(const Tensor&)> apply;
};

// 1037 = 17 * 61: not a multiple of 8 (vector tails); the transposed and the broadcast (stride 0)
// views go through the general strided path.
const std::vector<View>& unary_views() {
  static const std::vector<View> v = {
      {"contiguous [1037]", {1037}, [](const Tensor& t) { return t; }},
      {"transposed [61, 17]^T", {61, 17}, [](const Tensor& t) { return t.t(); }},
      {"broadcast [8, 1, 9] -> [8, 5, 9]",
       {8, 1, 9},
       [](const Tensor& t) {
         return t.expand({8, 5, 9});
       }},
  };
  return v;
}

// A 16-bit result computed from the same f32 values on both devices rounds identically; f32 results
// that differ by a few ulps round to equal or adjacent 16-bit values.
Tol per_dtype(DType dt, double f32_ulps, double f64_ulps, double ulps16, double atol_f32, double atol_f64,
              double atol16, const std::string& why) {
  Tol t;
  t.ulps = dt == DType::f32 ? f32_ulps : dt == DType::f64 ? f64_ulps : ulps16;
  t.atol = dt == DType::f32 ? atol_f32 : dt == DType::f64 ? atol_f64 : atol16;
  t.why = why;
  return t;
}

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> fn;
  double lo, hi;
  std::function<Tol(DType)> fwd, bwd;
};

// The unary ops with their tolerances. CUDA's documented maximum errors (CUDA C++ Programming Guide,
// "Mathematical Functions", default flags: -prec-div=true, -prec-sqrt=true, no fast math): expf 2,
// logf 1, tanhf 2, erff 2, powf 4 ulp; +, -, *, /, sqrt correctly rounded (0 ulp). The CPU's float
// transcendentals (fast_math.hpp, Note [fast float transcendentals]): fast_exp 1.03, fast_log 0.97,
// fast_tanh 1.08, fast_sigmoid 1.46, fast_erf 1.0 ulp; glibc powf < 1 ulp. Two results each within
// e1 and e2 ulps of the exact value are within e1 + e2 of each other: that sum, rounded up, is the
// f32 allowance. f64: CUDA's double exp/log 1, tanh/erf/pow 2 ulp, glibc < 1 ulp.
std::vector<UnaryCase> unary_cases() {
  auto ex = [](DType) { return exact(); };
  const double u = std::ldexp(1.0, -24), u64 = std::ldexp(1.0, -53);
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, -4, 4, ex, ex},
      {"abs", [](const Tensor& x) { return abs(x); }, -4, 4, ex, ex},
      {"relu", [](const Tensor& x) { return relu(x); }, -4, 4, ex, ex},
      {"square", [](const Tensor& x) { return square(x); }, -4, 4, ex, ex},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.1, 4, ex, ex},
      {"clamp(-1, 1.5)", [](const Tensor& x) { return clamp(x, -1.0, 1.5); }, -4, 4, ex, ex},
      {"x + 2.5", [](const Tensor& x) { return x + 2.5; }, -4, 4, ex, ex},
      {"x * -1.5", [](const Tensor& x) { return x * -1.5; }, -4, 4, ex, ex},
      {"2 - x", [](const Tensor& x) { return 2.0 - x; }, -4, 4, ex, ex},
      {"x / 3", [](const Tensor& x) { return x / 3.0; }, -4, 4, ex, ex},
      {"pow(x, 3)", [](const Tensor& x) { return pow(x, 3.0); }, -2, 2,
       [](DType dt) { return libm_tol(dt, 6, 3, "powf: CUDA 4 ulp + glibc < 1 ulp"); },
       [](DType) { return exact("backward 3 g x^2 uses x*x (PowScalarFn's p == 2 path): exact"); }},
      {"pow(x, 0.5)", [](const Tensor& x) { return pow(x, 0.5); }, 0.1, 4, ex,
       [](DType dt) {
         Tol t = libm_tol(dt, 7, 4, "backward g * 0.5 x^-0.5: powf (CUDA 4 + glibc < 1 ulp) and the products");
         if (is_low_precision(dt)) t.ulps = 2;  // pow's 16-bit value may differ by 1 ulp, the products round again
         return t;
       }},
      {"pow(x, 1.7)", [](const Tensor& x) { return pow(x, 1.7); }, 0.1, 4,
       [](DType dt) { return libm_tol(dt, 6, 3, "powf: CUDA 4 ulp + glibc < 1 ulp"); },
       [](DType dt) {
         Tol t = libm_tol(dt, 7, 4, "backward g * 1.7 x^0.7: powf (CUDA 4 + glibc < 1 ulp) and two products");
         if (is_low_precision(dt)) t.ulps = 2;  // pow's 16-bit value may differ by 1 ulp, the products round again
         return t;
       }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.1, 4,
       [](DType dt) {
         return libm_tol(dt, 2, 1,
                         "1/sqrt(x): correctly rounded sqrt and division on both (exact), but CUDA's "
                         "rsqrtf (2 ulp) may stand in for 1/sqrtf under other flags");
       },
       [](DType dt) {
         return per_dtype(dt, 8, 4, 4, 0, 0, 0,
                          "backward -g y^3 / 2 from y = rsqrt(x): y may differ by 2 ulp (f32) "
                          "or 1 ulp (16-bit), cubed: 3x, plus the products' roundings");
       }},
      {"exp", [](const Tensor& x) { return exp(x); }, -4, 4,
       [](DType dt) { return libm_tol(dt, 4, 2, "expf: CUDA 2 ulp + fast_exp 1.03 ulp"); },
       [](DType dt) {
         return per_dtype(dt, 5, 3, 2, 0, 0, 0, "backward g * exp(x): the forward's difference plus one product");
       }},
      {"log", [](const Tensor& x) { return log(x); }, 0.1, 4,
       [](DType dt) {
         return libm_tol(dt, 3, 2, "logf: CUDA 1 ulp + fast_log 0.97 ulp (both relative to the result)");
       },
       [](DType) { return exact("backward g / x: one correctly rounded division"); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -4, 4,
       [](DType dt) { return libm_tol(dt, 4, 3, "tanhf: CUDA 2 ulp + fast_tanh 1.08 ulp"); },
       [u, u64](DType dt) {
         // g (1 - y^2): y may differ by 4 f32 ulps (<= 4 * 2^-24 absolute, |y| < 1), so 1 - y^2 by 8 * 2^-24 plus
         // an FMA contraction's 2^-24: absolute, as 1 - y^2 cancels near |y| = 1. 16-bit: y may differ by one
         // 16-bit ulp (<= 2^-p below 1), so 1 - y^2 by 2 * 2^-p (|g| < 1).
         return per_dtype(
             dt, 2, 2, 1, 10 * u, 10 * u64, 2 * unit_roundoff(dt),
             "backward g (1 - y^2) with y = tanh(x) from the forward: absolute, 1 - y^2 cancels near |y| = 1");
       }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -6, 6,
       [](DType dt) {
         return libm_tol(dt, 5, 3,
                         "GPU sigmoid = expf(-|x|) (2 ulp), e / (1 + e) and 1 - q: <= 3.5 ulp; CPU "
                         "fast_sigmoid 1.46 ulp");
       },
       [u, u64](DType dt) {
         return per_dtype(dt, 3, 2, 1, 7 * u, 7 * u64, 2 * unit_roundoff(dt),
                          "backward g y (1 - y): y may differ by 5 f32 ulps (16-bit: 1 ulp <= 2^-p), absolute as 1 - y "
                          "cancels near y = 1");
       }},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -4, 4,
       [u, u64](DType dt) {
         // x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)): erff CUDA 2 + fast_erf 1 ulp (<= 3 * 2^-24 absolute, |erf| < 1)
         // and the rounding of 1 + erf on each device (2 * 2^-24): 5 * 2^-24, times 0.5 |x| <= 2 -> 10 * 2^-24
         // absolute (1 + erf cancels for x < 0), plus the products' roundings. 16-bit: one ulp after rounding
         // plus the same absolute term where the result is tiny.
         return per_dtype(dt, 3, 3, 1, 16 * u, 16 * u64, 16 * u,
                          "erf of CUDA (2 ulp) vs fast_erf (1 ulp), absolute: 1 + erf(x / sqrt 2) cancels for x < 0");
       },
       [u, u64](DType dt) {
         return per_dtype(dt, 3, 3, 1, 16 * u, 16 * u64, 16 * u,
                          "backward g (Phi(x) + x phi(x)): the erf difference as in the forward (absolute), expf "
                          "(CUDA 2 + fast_exp 1.03 ulp) in phi, all in f32 from the same 16-bit inputs");
       }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApproximate::tanh); }, -4, 4,
       [u, u64](DType dt) {
         // 0.5 x (1 + tanh(k (x + a x^3))): tanhf CUDA 2 + fast_tanh 1.08 ulp (<= 4 * 2^-24 absolute, |tanh| < 1),
         // the inner polynomial's roundings (FMA contraction differs), and 1 + tanh cancels for x < 0: absolute,
         // times 0.5 |x| <= 2, as for the exact gelu above.
         return per_dtype(dt, 3, 3, 1, 16 * u, 16 * u64, 16 * u,
                          "tanh of CUDA (2 ulp) vs fast_tanh (1.08 ulp), absolute: 1 + tanh(...) cancels for x < 0");
       },
       [u, u64](DType dt) {
         return per_dtype(dt, 3, 3, 1, 16 * u, 16 * u64, 16 * u,
                          "backward 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2): the tanh difference as in the "
                          "forward (absolute: 1 + t and 1 - t^2 cancel), all in f32 from the same 16-bit inputs");
       }},
  };
}

// Gradient of a broadcast input: the sum over K broadcast positions of per-element gradients of
// magnitude <= M that may each differ by elem_ulps ulps of dt (ulp <= 2 u M); the f32 (f64)
// accumulation order differs (2 sqrt(K) u_acc K M); then one rounding to dt.
Tol broadcast_grad_tol(DType dt, int64_t K, double M, double elem_ulps) {
  Tol t;
  t.ulps = std::max(1.0, elem_ulps);
  t.atol = static_cast<double>(K) * M * elem_ulps * 2 * unit_roundoff(dt) +
           2 * std::sqrt(static_cast<double>(K)) * acc_roundoff(dt) * static_cast<double>(K) * M;
  t.why = "gradient of a broadcast input: a sum of " + std::to_string(K) +
          " per-element gradients (summation order differs), rounded once to the input's dtype";
  return t;
}

}  // namespace

// =============================================================================== tensor methods

TEST(CudaTensor, CastsBetweenEveryDtypePair) {
  MP_SKIP_WITHOUT_GPU();
  // 1037 = 17 * 61 elements: a vector tail; the transposed view goes through the strided path.
  for (DType src : kAllTypes) {
    for (bool negatives : {false, true}) {
      const Tensor x = cast_sample(src, negatives, {17, 61});
      const Tensor xd = on_dev(x);
      for (DType dst : kAllTypes) {
        if (negatives && dst == DType::u8) continue;  // undefined in C++ for negative floats: no reference
        const std::string what =
            std::string("cast ") + dtype_name(src) + " -> " + dtype_name(dst) + (negatives ? " (signed values)" : "");
        guarded(what, [&] {
          EXPECT_TRUE(identical(what, xd.to(dst), x.to(dst)));
          EXPECT_TRUE(identical(what + " of a transposed view", xd.t().to(dst), x.t().to(dst)));
          EXPECT_TRUE(identical(what + " of a broadcast view", xd.narrow(0, 0, 1).expand({5, 61}).to(dst),
                                x.narrow(0, 0, 1).expand({5, 61}).to(dst)));
        });
      }
    }
  }
  // Special values between the floating types (value comparison for NaN: payloads may differ).
  const std::vector<double> sv = special_floats();
  for (DType src : {DType::f64, DType::f32, DType::f16, DType::bf16}) {
    const Tensor x = make(sv, {static_cast<int64_t>(sv.size())}, src);
    for (DType dst : {DType::f64, DType::f32, DType::f16, DType::bf16, DType::b8}) {
      const std::string what = std::string("special values ") + dtype_name(src) + " -> " + dtype_name(dst);
      guarded(what, [&] { EXPECT_TRUE(identical(what, on_dev(x).to(dst), x.to(dst))); });
    }
  }
}

TEST(CudaTensor, ContiguousCloneAndToOfStridedViews) {
  MP_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> views = {
      {"transpose(0, 2)", [](const Tensor& t) { return t.transpose(0, 2); }},
      {"permute(1, 2, 0)",
       [](const Tensor& t) {
         return t.permute({1, 2, 0});
       }},
      {"slice(2, 1, 9, 3)", [](const Tensor& t) { return t.slice(2, 1, 9, 3); }},
      {"select(1, 4)", [](const Tensor& t) { return t.select(1, 4); }},
      {"narrow(0, 1, 3) (offset, contiguous)", [](const Tensor& t) { return t.narrow(0, 1, 3); }},
      {"narrow(2, 3, 1).expand (stride 0)",
       [](const Tensor& t) {
         return t.narrow(2, 3, 1).expand({6, 7, 5});
       }},
      {"slice(0, 0, 6, 2).transpose(1, 2)", [](const Tensor& t) { return t.slice(0, 0, 6, 2).transpose(1, 2); }},
      {"select(0, 2).unsqueeze(0).expand",
       [](const Tensor& t) {
         return t.select(0, 2).unsqueeze(0).expand({4, 7, 10});
       }},
  };
  for (DType dt : kAllTypes) {
    const Tensor x = cast_sample(dt, dt != DType::u8, {6, 7, 10});
    const Tensor xd = on_dev(x);
    for (const auto& [name, v] : views) {
      const std::string what = std::string(name) + " " + dtype_name(dt);
      guarded(what, [&, &v = v] {
        const Tensor c = v(xd).contiguous();
        EXPECT_TRUE(c.is_contiguous()) << what;
        EXPECT_TRUE(identical(what + " contiguous()", c, v(x).contiguous()));
        EXPECT_TRUE(identical(what + " clone()", v(xd).clone(), v(x).clone()));
        const DType other = dt == DType::f32 ? DType::bf16 : DType::f32;
        EXPECT_TRUE(identical(what + " to(" + dtype_name(other) + ")", v(xd).to(other), v(x).to(other)));
      });
    }
  }
}

TEST(CudaTensor, CopyIntoStridedDestinationsAndAcrossDevices) {
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : kAllTypes) {
    const std::string what = std::string("copy_ ") + dtype_name(dt);
    guarded(what, [&] {
      // A strided destination (every other column of a transposed tensor) from a broadcast source of
      // another dtype: the whole destination tensor must match (untouched elements included).
      const Tensor base = cast_sample(dt, dt != DType::u8, {12, 9});
      const Tensor src = cast_sample(DType::f32, false, {1, 6});
      Tensor cb = base.clone(), db = on_dev(base);
      cb.t().slice(1, 0, 12, 2).copy_(src);
      db.t().slice(1, 0, 12, 2).copy_(on_dev(src));
      EXPECT_TRUE(identical(what + " into a strided view", db, cb));
      // From a CPU source into a device tensor and back (copy_ moves the source first, then converts).
      Tensor d2 = on_dev(zeros({12, 9}, {.dtype = dt}));
      d2.copy_(base.to(DType::f64));
      EXPECT_TRUE(identical(what + " from a host source", d2, base));
      Tensor host = zeros({9, 12}, {.dtype = DType::f32});
      host.copy_(d2.t());
      EXPECT_TRUE(host.device().is_cpu());
      EXPECT_TRUE(identical(what + " into a host destination", on_dev(host), base.t().to(DType::f32)));
    });
  }
}

TEST(CudaTensor, FillFactoriesAndRandomStreams) {
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : kAllTypes) {
    const std::string what = std::string("fill ") + dtype_name(dt);
    guarded(what, [&] {
      const double v = dt == DType::b8 ? 1.0 : dt == DType::u8 ? 200.0 : is_floating(dt) ? -2.5 : -7.0;
      EXPECT_TRUE(
          identical(what + " full", full({3, 37}, v, {.dtype = dt, .device = dev()}), full({3, 37}, v, {.dtype = dt})));
      EXPECT_TRUE(
          identical(what + " zeros", zeros({1037}, {.dtype = dt, .device = dev()}), zeros({1037}, {.dtype = dt})));
      EXPECT_TRUE(
          identical(what + " ones", ones({5, 0, 3}, {.dtype = dt, .device = dev()}), ones({5, 0, 3}, {.dtype = dt})));
      // fill_ through a strided view leaves the other elements alone.
      const Tensor base = cast_sample(dt, false, {10, 11});
      Tensor cb = base.clone(), db = on_dev(base);
      cb.t().slice(0, 1, 11, 3).fill_(v);
      db.t().slice(0, 1, 11, 3).fill_(v);
      EXPECT_TRUE(identical(what + " fill_ of a strided view", db, cb));
      cb.zero_();
      db.zero_();
      EXPECT_TRUE(identical(what + " zero_", db, cb));
    });
  }
  // Random factories on the device draw the same stream as on the CPU (counter-based Philox).
  guarded("random factories", [] {
    for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
      manual_seed(42);
      const Tensor a = rand({3, 333}, {.dtype = dt});
      const Tensor b = randn({1037}, {.dtype = dt});
      manual_seed(42);
      EXPECT_TRUE(identical("rand", rand({3, 333}, {.dtype = dt, .device = dev()}), a));
      EXPECT_TRUE(identical("randn", randn({1037}, {.dtype = dt, .device = dev()}), b));
    }
    manual_seed(7);
    const Tensor c = randint(-5, 9, {1037});
    const Tensor r = arange(-3.0, 5.0, 0.5, {.dtype = DType::f32});
    manual_seed(7);
    EXPECT_TRUE(identical("randint", randint(-5, 9, {1037}, {.dtype = DType::i64, .device = dev()}), c));
    EXPECT_TRUE(identical("arange", arange(-3.0, 5.0, 0.5, {.dtype = DType::f32, .device = dev()}), r));
  });
}

TEST(CudaTensor, EmptyTensors) {
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (const Shape& s : {Shape{0}, Shape{3, 0}, Shape{0, 4, 5}}) {
      const std::string what = desc("empty", dt, s);
      guarded(what, [&] {
        const Tensor x = zeros(s, {.dtype = dt});
        const Tensor xd = on_dev(x);
        EXPECT_TRUE(identical(what + " add", add(xd, xd), add(x, x)));
        EXPECT_TRUE(identical(what + " exp", exp(xd), exp(x)));
        EXPECT_TRUE(identical(what + " cast", xd.to(DType::f64), x.to(DType::f64)));
        EXPECT_TRUE(identical(what + " contiguous of transpose", xd.transpose(0, -1).contiguous(),
                              x.transpose(0, -1).contiguous()));
        EXPECT_TRUE(identical(what + " sum (= 0)", sum(xd), sum(x)));
        EXPECT_TRUE(identical(what + " sum over dim 0", sum(xd, {0}), sum(x, {0})));
        EXPECT_TRUE(identical(what + " mean (NaN)", mean(xd), mean(x)));
      });
    }
  }
}

// =============================================================================== element-wise

TEST(CudaPointwise, UnaryOpsForwardAndBackwardEveryFloatDtype) {
  MP_SKIP_WITHOUT_GPU();
  for (const UnaryCase& c : unary_cases()) {
    for (DType dt : kFloatTypes) {
      for (const View& v : unary_views()) {
        const bool broadcast = v.leaf_shape.size() == 3;
        OpCheck chk;
        chk.name = c.name + " " + dtype_name(dt) + " " + v.name;
        chk.inputs = {uniform(v.leaf_shape, c.lo, c.hi, dt)};
        chk.fn = [&c, &v](const std::vector<Tensor>& in) { return c.fn(v.apply(in[0])); };
        chk.out = c.fwd(dt);
        // The broadcast view's gradient is a sum over 5 copies (the reduction tests cover that path):
        // forward only there.
        if (!broadcast) chk.grad = c.bwd(dt);
        check_op(chk);
      }
    }
  }
}

TEST(CudaPointwise, BinaryOpsWithBroadcastingAndPromotion) {
  MP_SKIP_WITHOUT_GPU();
  struct BinaryCase {
    std::string name;
    std::function<Tensor(const Tensor&, const Tensor&)> fn;
    double alo, ahi, blo, bhi;
    double grad_bound;  // bound of |per-element gradient| for |g| < 1 (for broadcast sums)
    std::function<Tol(DType)> fwd;
    double grad_elem_ulps_f32, grad_elem_ulps16;  // per-element gradient differences in ulps
  };
  const double u = std::ldexp(1.0, -24);
  auto ex = [](DType) { return exact(); };
  const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, -2, 2, -2, 2, 1, ex, 0, 0},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, -2, 2, -2, 2, 1, ex, 0, 0},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, -2, 2, -2, 2, 2, ex, 0, 0},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, -2, 2, 0.5, 2, 8, ex, 0, 0},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, -2, 2, -2, 2, 1, ex, 0, 0},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, -2, 2, -2, 2, 1, ex, 0, 0},
      {"add(alpha = 0.3)", [](const Tensor& a, const Tensor& b) { return add(a, b, 0.3); }, -2, 2, -2, 2, 1,
       [u](DType dt) {
         // a + 0.3 b: either device may fuse it into one FMA (nvcc does by default, GCC in the AVX-512 loops):
         // the product's rounding (<= 2^-24 |0.3 b| <= 0.6 * 2^-24) may be missing on one side.
         return per_dtype(dt, 1, 1, 1, 2 * u, 2 * std::ldexp(1.0, -53), 2 * u,
                          "a + alpha b may be one FMA on one device and two roundings on the other");
       },
       0, 0},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, 0.5, 2, -1.5, 1.5, 10,
       [](DType dt) { return libm_tol(dt, 6, 3, "powf: CUDA 4 ulp + glibc < 1 ulp"); }, 12, 3},
  };
  struct Shapes {
    const char* name;
    Shape a, b;
    bool transpose_a;  // a's leaf is stored transposed
    int64_t K;         // the largest number of broadcast positions summed in a gradient
  };
  const std::vector<Shapes> shapes = {
      {"same shape [1037]", {1037}, {1037}, false, 1},
      {"[16, 33] + [33]", {16, 33}, {33}, false, 16},
      {"[5, 1, 7] + [1, 6, 1]", {5, 1, 7}, {1, 6, 1}, false, 35},
      {"[16, 33] (transposed leaf) + [16, 33]", {33, 16}, {16, 33}, true, 1},
      {"[] (0-dim) + [40, 3]", {}, {40, 3}, false, 120},
  };
  for (const BinaryCase& c : cases) {
    for (DType dt : kFloatTypes) {
      for (const Shapes& s : shapes) {
        OpCheck chk;
        chk.name = c.name + " " + dtype_name(dt) + " " + s.name;
        chk.inputs = {uniform(s.a, c.alo, c.ahi, dt), uniform(s.b, c.blo, c.bhi, dt)};
        const bool tr = s.transpose_a;
        chk.fn = [&c, tr](const std::vector<Tensor>& in) { return c.fn(tr ? in[0].t() : in[0], in[1]); };
        chk.out = c.fwd(dt);
        const double eu = is_low_precision(dt) ? c.grad_elem_ulps16 : c.grad_elem_ulps_f32;
        if (s.K > 1)
          chk.grad = broadcast_grad_tol(dt, s.K, c.grad_bound, eu);
        else if (eu == 0)
          chk.grad = exact("element-wise gradients of IEEE operations");
        else
          chk.grad = Tol{.ulps = eu, .why = "element-wise gradients through powf/logf (CUDA vs glibc) and products"};
        check_op(chk);
      }
    }
  }
  // Mixed dtypes: the result has the promoted dtype and is computed in it; the gradients come back in
  // each input's dtype.
  const std::vector<std::pair<DType, DType>> mixes = {
      {DType::f16, DType::f32}, {DType::bf16, DType::f16}, {DType::f32, DType::f64}, {DType::bf16, DType::f32}};
  for (const auto& [da, db] : mixes) {
    for (const char* op : {"add", "mul", "maximum"}) {
      OpCheck chk;
      chk.name = std::string(op) + " " + dtype_name(da) + " x " + dtype_name(db) + " [16, 33] with [33]";
      chk.inputs = {uniform({16, 33}, -2, 2, da), uniform({33}, -2, 2, db)};
      const std::string o = op;
      chk.fn = [o](const std::vector<Tensor>& in) {
        return o == "add" ? in[0] + in[1] : o == "mul" ? in[0] * in[1] : maximum(in[0], in[1]);
      };
      chk.out = exact("one IEEE operation in the promoted dtype on exactly converted inputs");
      chk.grad = broadcast_grad_tol(da == DType::f64 || db == DType::f64 ? DType::f64 : DType::bf16, 16, 2, 0);
      check_op(chk);
    }
  }
  // Integer and float mixes: i64 with f32 computes in f32; i32 with i64 in i64 (exact integers).
  OpCheck ints;
  ints.name = "add f32 x i64 [16, 33] with [33]";
  ints.inputs = {uniform({16, 33}, -2, 2, DType::f32), integers({33}, -50, 50, DType::i64)};
  ints.fn = [](const std::vector<Tensor>& in) { return in[0] + in[1]; };
  ints.out = exact();
  check_op(ints);
}

TEST(CudaPointwise, TiesOfMaximumMinimumSplitTheGradient) {
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : kFloatTypes) {
    for (const char* op : {"maximum", "minimum"}) {
      OpCheck chk;
      chk.name = std::string(op) + " with ties " + dtype_name(dt);
      chk.inputs = {from_set({300}, {-1, 0, 0.5, 2}, dt), from_set({300}, {-1, 0, 0.5, 2}, dt)};
      const bool is_max = std::string(op) == "maximum";
      chk.fn = [is_max](const std::vector<Tensor>& in) {
        return is_max ? maximum(in[0], in[1]) : minimum(in[0], in[1]);
      };
      chk.out = exact("a selection");
      chk.grad = exact("g, 0 or g / 2 (ties): exact");
      check_op(chk);
    }
  }
}

TEST(CudaPointwise, ComparisonsWhereAndIntegerArithmetic) {
  MP_SKIP_WITHOUT_GPU();
  using Cmp = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<const char*, Cmp>> cmps = {
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }}};
  // Small value sets, so equal elements occur; NaN in the float sets (every comparison with NaN is
  // false, except ne).
  const std::vector<std::pair<DType, DType>> pairs = {
      {DType::f32, DType::f32}, {DType::f16, DType::f16}, {DType::bf16, DType::bf16}, {DType::f64, DType::f64},
      {DType::f16, DType::f32}, {DType::i64, DType::i64}, {DType::i32, DType::i64},   {DType::f32, DType::i64},
      {DType::u8, DType::u8},   {DType::b8, DType::b8}};
  for (const auto& [da, db] : pairs) {
    auto sample = [](DType dt, const Shape& s) {
      if (dt == DType::b8) return integers(s, 0, 2, DType::b8);
      if (!is_floating(dt)) return integers(s, 0, 3, dt);
      return from_set(s, {-1, 0, 1.5, 2, kNaN}, dt);
    };
    const Tensor a = sample(da, {16, 33}), b = sample(db, {33});
    const Tensor ad = on_dev(a), bd = on_dev(b);
    for (const auto& [name, f] : cmps) {
      const std::string what = std::string(name) + " " + dtype_name(da) + " x " + dtype_name(db);
      guarded(what, [&, &f = f] {
        EXPECT_TRUE(identical(what, f(ad, bd), f(a, b)));
        EXPECT_TRUE(identical(what + " (transposed operands)", f(ad.t(), bd.unsqueeze(1)), f(a.t(), b.unsqueeze(1))));
      });
    }
  }
  // where(cond, a, b): cond of any dtype (nonzero = true), broadcasting, promotion; gradients to a and b.
  for (DType cdt : {DType::b8, DType::f32, DType::i64}) {
    for (DType dt : kFloatTypes) {
      OpCheck chk;
      chk.name = std::string("where cond ") + dtype_name(cdt) + ", " + dtype_name(dt) + " [16, 33] / [33]";
      chk.inputs = {integers({16, 1}, 0, 2, cdt), uniform({16, 33}, -2, 2, dt), uniform({33}, -2, 2, DType::f32)};
      chk.fn = [](const std::vector<Tensor>& in) { return where(in[0], in[1], in[2]); };
      chk.out = exact("a selection");
      chk.grad = broadcast_grad_tol(dt, 16, 1, 0);
      chk.grad_inputs = {1, 2};
      check_op(chk);
    }
  }
  // Integer arithmetic is exact; integer division gives f32.
  for (DType dt : {DType::i64, DType::i32, DType::u8}) {
    const Tensor a = integers({16, 33}, 0, 15, dt), b = integers({33}, 1, 9, dt);
    const Tensor ad = on_dev(a), bd = on_dev(b);
    const std::string n = dtype_name(dt);
    guarded("integer ops " + n, [&] {
      EXPECT_TRUE(identical("add " + n, ad + bd, a + b));
      EXPECT_TRUE(identical("sub " + n, ad - bd, a - b));
      EXPECT_TRUE(identical("mul " + n, ad * bd, a * b));
      EXPECT_TRUE(identical("div " + n + " (-> f32)", ad / bd, a / b));
      EXPECT_TRUE(identical("maximum " + n, maximum(ad, bd), maximum(a, b)));
      EXPECT_TRUE(identical("x * 3 " + n, ad * 3.0, a * 3.0));
      if (dt != DType::u8) {
        EXPECT_TRUE(identical("neg " + n, neg(ad), neg(a)));
        EXPECT_TRUE(identical("abs " + n, abs(ad - bd), abs(a - b)));
      }
      EXPECT_TRUE(close("exp " + n + " (-> f32)", exp(ad), exp(a),
                        libm_tol(DType::f32, 4, 2, "expf: CUDA 2 + fast_exp 1.03 ulp")));
    });
  }
}

TEST(CudaPointwise, InPlaceOpsOnStridedTargets) {
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : kFloatTypes) {
    const std::string what = std::string("in-place ") + dtype_name(dt);
    guarded(what, [&] {
      const Tensor base = uniform({20, 13}, -2, 2, dt);
      const Tensor other = uniform({13}, -2, 2, DType::f32);
      Tensor cb = base.clone(), db = on_dev(base);
      Tensor cv = cb.t().slice(1, 1, 20, 2), dv = db.t().slice(1, 1, 20, 2);  // [13, 10] strided targets
      add_(cv, other.unsqueeze(1));
      add_(dv, on_dev(other).unsqueeze(1));
      EXPECT_TRUE(identical(what + " add_ (broadcast, f32 source)", db, cb));
      add_(cv, other.unsqueeze(1), 0.5);
      add_(dv, on_dev(other).unsqueeze(1), 0.5);
      EXPECT_TRUE(identical(what + " add_ alpha 0.5 (a power of two: exact)", db, cb));
      mul_(cv, -3.0);
      mul_(dv, -3.0);
      EXPECT_TRUE(identical(what + " mul_", db, cb));
    });
  }
}

TEST(CudaPointwise, SpecialValuesPropagate) {
  MP_SKIP_WITHOUT_GPU();
  const std::vector<double> sv = {kNaN, kInf, -kInf, 0.0, -0.0, 1.0, -1.0, 100.0, -100.0, 1e-30};
  const int64_t n = static_cast<int64_t>(sv.size());
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    const Tensor x = make(sv, {n}, dt);
    const Tensor xd = on_dev(x);
    const Tensor y = make(std::vector<double>(sv.rbegin(), sv.rend()), {n}, dt), yd = on_dev(y);
    const std::string d = dtype_name(dt);
    guarded("special values " + d, [&] {
      // Selections and IEEE operations: identical (NaN matches NaN).
      EXPECT_TRUE(identical("relu " + d, relu(xd), relu(x)));
      EXPECT_TRUE(identical("maximum " + d, maximum(xd, yd), maximum(x, y)));
      EXPECT_TRUE(identical("minimum " + d, minimum(xd, yd), minimum(x, y)));
      EXPECT_TRUE(identical("clamp " + d, clamp(xd, -2.0, 3.0), clamp(x, -2.0, 3.0)));
      EXPECT_TRUE(identical("div " + d, xd / yd, x / y));
      EXPECT_TRUE(identical("sqrt " + d, sqrt(xd), sqrt(x)));
      // Transcendentals at inf, 0, +-100 (over/underflow) and NaN: the special results are exact on both
      // (exp(inf) = inf, exp(-100) = 0 in f32, log(0) = -inf, log(-1) = NaN, sigmoid/tanh saturate).
      const Tol t = libm_tol(dt, 5, 3, "as the unary tests; the special values themselves must match exactly");
      EXPECT_TRUE(close("exp " + d, exp(xd), exp(x), t));
      EXPECT_TRUE(close("log " + d, log(xd), log(x), t));
      EXPECT_TRUE(close("tanh " + d, tanh(xd), tanh(x), t));
      EXPECT_TRUE(close("sigmoid " + d, sigmoid(xd), sigmoid(x), t));
    });
  }
}

TEST(CudaPointwise, LargeAndMisalignedTensors) {
  MP_SKIP_WITHOUT_GPU();
  // 2^20 + 3 elements: many blocks of the vectorised path plus a tail; narrow(0, 1, ...) starts one
  // element past a 16-byte boundary (the vector path must check alignment or fall back).
  const int64_t n = (int64_t{1} << 20) + 3;
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    const std::string d = dtype_name(dt);
    guarded("large " + d, [&] {
      const Tensor a = uniform({n}, -2, 2, dt), b = uniform({n}, -2, 2, dt);
      const Tensor ad = on_dev(a), bd = on_dev(b);
      EXPECT_TRUE(identical("add " + d + " [2^20 + 3]", ad + bd, a + b));
      const Tensor am = a.narrow(0, 1, n - 1), bm = b.narrow(0, 0, n - 1);
      EXPECT_TRUE(identical("mul " + d + " misaligned", ad.narrow(0, 1, n - 1) * bd.narrow(0, 0, n - 1), am * bm));
      EXPECT_TRUE(close("exp " + d + " misaligned", exp(ad.narrow(0, 1, n - 1)), exp(am),
                        libm_tol(dt, 4, 2, "expf: CUDA 2 + fast_exp 1.03 ulp")));
      EXPECT_TRUE(identical("cast " + d + " -> f32 misaligned", ad.narrow(0, 3, n - 3).to(DType::f32),
                            a.narrow(0, 3, n - 3).to(DType::f32)));
      // A misaligned in-place target.
      Tensor ac = a.clone(), adc = on_dev(a);
      Tensor cv = ac.narrow(0, 1, n - 1), dv = adc.narrow(0, 1, n - 1);
      add_(cv, bm);
      add_(dv, bd.narrow(0, 0, n - 1));
      EXPECT_TRUE(identical("add_ " + d + " misaligned target", adc, ac));
    });
  }
}

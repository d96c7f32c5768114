// CUDA against the CPU, part 1: the Tensor methods that compute (casts between every dtype pair,
// contiguous / clone / to of strided views, copy_ into strided destinations, fill_, factories). The
// element-wise ops are cases of the op table (tests/ops/op_cases_pointwise.cpp).
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

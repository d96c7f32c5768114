// Each op in f16 and bf16 against f32. The f32 reference runs on the SAME rounded inputs
// (x.to(dt).to(f32)), so what is measured is the low-precision compute path itself: loading,
// f32 compute, and the final rounding of the output. Every tolerance below states its reason.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "mp/mp.hpp"

using namespace mp;

namespace {

// Unit roundoff of the output format: the largest relative error of one round-to-nearest,
// 2^-8 for bf16 (8 significant bits) and 2^-11 for f16 (11 significant bits).
double half_ulp(DType dt) { return dt == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11); }

struct Case {
  std::string op;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  std::vector<Shape> shapes;
  double lo = -2.0, hi = 2.0;
  double rtol_ulps;  // tolerance in half-ulps of the output format, relative to |reference|
  double atol_ulps;  // absolute part, in half-ulps times the output scale `abs_scale`
  double abs_scale;
  const char* reason;
};

std::vector<Case> cases() {
  using V = const std::vector<Tensor>&;
  return {
      {"add",
       [](V x) { return x[0] + x[1]; },
       {{64, 33}, {33}},
       -2,
       2,
       1,
       0,
       0,
       "f32 add of exactly representable inputs, one rounding of the output: <= 1 half-ulp"},
      {"mul", [](V x) { return x[0] * x[1]; }, {{64, 33}, {64, 33}}, -2, 2, 1, 0, 0, "one rounding: <= 1 half-ulp"},
      {"div", [](V x) { return x[0] / x[1]; }, {{64, 33}, {64, 33}}, 0.5, 2, 1, 0, 0, "one rounding: <= 1 half-ulp"},
      {"exp",
       [](V x) { return exp(x[0]); },
       {{1000}},
       -4,
       4,
       1,
       0,
       0,
       "f32 expf is within 1 f32 ulp (2^-23 << bf16/f16 half-ulp), then one rounding"},
      {"log",
       [](V x) { return log(x[0]); },
       {{1000}},
       0.1,
       4,
       1,
       1,
       1,
       "one rounding; near log(1)=0 absolute 1 half-ulp"},
      {"tanh", [](V x) { return tanh(x[0]); }, {{1000}}, -3, 3, 1, 0, 0, "one rounding"},
      {"sigmoid", [](V x) { return sigmoid(x[0]); }, {{1000}}, -6, 6, 1, 0, 0, "one rounding"},
      {"gelu",
       [](V x) { return gelu(x[0]); },
       {{1000}},
       -3,
       3,
       1,
       1,
       1,
       "one rounding; absolute near the zero crossing"},
      {"relu", [](V x) { return relu(x[0]); }, {{1000}}, -3, 3, 0, 0, 0, "exact: selects a representable input"},
      {"sum(dim=1)",
       [](V x) { return sum(x[0], {1}); },
       {{16, 4096}},
       -1,
       1,
       1,
       1,
       64,
       "f32 accumulation in both paths (blocked order may differ: ~k*2^-24 relative, negligible) then one "
       "rounding; absolute part for sums near zero scaled by sqrt(4096)=64"},
      {"mean(dim=0)",
       [](V x) { return mean(x[0], {0}); },
       {{4096, 16}},
       -1,
       1,
       1,
       1,
       1.0 / 64,
       "as sum, divided by 4096: one rounding, absolute part scaled by 64/4096"},
      {"amax", [](V x) { return amax(x[0], {1}); }, {{16, 100}}, -1, 1, 0, 0, 0, "exact: selects an input"},
      {"matmul",
       [](V x) { return matmul(x[0], x[1]); },
       {{48, 256}, {256, 40}},
       -1,
       1,
       1,
       1,
       16,
       "f32 accumulation (AMX for bf16; f16 via f32) over k=256; order differences ~256*2^-24 relative; one "
       "rounding of the output; absolute part for outputs near zero scaled by sqrt(256)"},
      {"linear",
       [](V x) { return linear(x[0], x[1], x[2]); },
       {{32, 128}, {24, 128}, {24}},
       -1,
       1,
       1,
       1,
       16,
       "as matmul (bias added in f32 before the rounding); absolute scale sqrt(128) ~ 11 -> 16"},
  };
}

}  // namespace

class Precision : public ::testing::TestWithParam<DType> {};

TEST_P(Precision, OpMatchesF32OnRoundedInputs) {
  const DType dt = GetParam();
  manual_seed(99);
  for (const Case& c : cases()) {
    std::vector<Tensor> lp, ref;
    for (const Shape& s : c.shapes) {
      Tensor x = rand(s, {}, c.lo, c.hi).to(dt);
      lp.push_back(x);
      ref.push_back(x.to(DType::f32));
    }
    Tensor y_lp = c.fn(lp);
    Tensor y_ref = c.fn(ref);
    ASSERT_EQ(y_lp.dtype(), dt) << c.op << ": low-precision inputs should give a " << dtype_name(dt) << " result";
    auto a = y_lp.to_vector<float>();
    auto r = y_ref.to_vector<float>();
    ASSERT_EQ(a.size(), r.size());
    const double u = half_ulp(dt);
    for (size_t i = 0; i < a.size(); ++i) {
      // Results in the subnormal range of the format round to an absolute grid: half its spacing is
      // 2^-25 for f16 (subnormals below 2^-14) and 2^-134 for bf16.
      const double subnormal = dt == DType::f16 ? std::ldexp(1.0, -25) : std::ldexp(1.0, -134);
      const double tol = c.rtol_ulps * u * std::abs(r[i]) + c.atol_ulps * u * c.abs_scale + subnormal;
      ASSERT_LE(std::abs(a[i] - r[i]), tol * 1.0000001 + 1e-30)
          << c.op << " in " << dtype_name(dt) << " element " << i << ": got " << a[i] << ", f32 gives " << r[i]
          << " (tolerance reason: " << c.reason << ")";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(LowPrecision, Precision, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

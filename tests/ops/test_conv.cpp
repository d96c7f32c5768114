// conv2d: values against a naive double-precision reference, gradient checks (f64) for every geometry,
// f32 forward/backward against f64, bf16 and f16 against f32 with a reasoned tolerance table, dtype promotion,
// the gradients that are (not) computed, and error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using autograd::gradcheck;

namespace {
using mp::test::expect_ok;
using mp::test::leaf;

// A naive reference written independently of the library: out[n, o, y, x] = b[o] + sum over the group's
// channels and the kernel taps. Also returns, per output, the sum of |terms| (for cancellation-proof bounds).
struct Ref {
  std::vector<double> value, scale;
};
Ref ref_conv(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w, const Shape& ws,
             const std::vector<double>& b, const Conv2dOptions& o) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0], cpg = ws[1], KH = ws[2], KW = ws[3];
  const int64_t OH = (H + 2 * o.padding[0] - o.dilation[0] * (KH - 1) - 1) / o.stride[0] + 1;
  const int64_t OW = (W + 2 * o.padding[1] - o.dilation[1] * (KW - 1) - 1) / o.stride[1] + 1;
  const int64_t opg = O / o.groups;
  Ref r{std::vector<double>(N * O * OH * OW), std::vector<double>(N * O * OH * OW)};
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oc = 0; oc < O; ++oc)
      for (int64_t y = 0; y < OH; ++y)
        for (int64_t xo = 0; xo < OW; ++xo) {
          double s = b.empty() ? 0.0 : b[oc], a = b.empty() ? 0.0 : std::abs(b[oc]);
          for (int64_t ci = 0; ci < cpg; ++ci)
            for (int64_t ky = 0; ky < KH; ++ky)
              for (int64_t kx = 0; kx < KW; ++kx) {
                const int64_t iy = y * o.stride[0] - o.padding[0] + ky * o.dilation[0];
                const int64_t ix = xo * o.stride[1] - o.padding[1] + kx * o.dilation[1];
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                const int64_t c = (oc / opg) * cpg + ci;
                const double t = x[((n * C + c) * H + iy) * W + ix] * w[((oc * cpg + ci) * KH + ky) * KW + kx];
                s += t;
                a += std::abs(t);
              }
          r.value[((n * O + oc) * OH + y) * OW + xo] = s;
          r.scale[((n * O + oc) * OH + y) * OW + xo] = a;
        }
  (void)C;
  return r;
}

struct Geometry {
  const char* name;
  Shape x, w;
  bool bias;
  Conv2dOptions opt;
};

// The geometries every test runs (small: the f64 paths are plain loops).
std::vector<Geometry> geometries() {
  return {
      {"3x3 stride 2 pad 1", {2, 3, 7, 6}, {4, 3, 3, 3}, true, {.stride = {2, 2}, .padding = {1, 1}}},
      {"dilation 2", {1, 2, 7, 7}, {3, 2, 3, 3}, true, {.padding = {2, 1}, .dilation = {2, 2}}},
      {"groups 2", {2, 4, 5, 5}, {6, 2, 3, 3}, true, {.padding = {1, 1}, .groups = 2}},
      {"depthwise", {2, 3, 5, 6}, {3, 1, 3, 3}, true, {.padding = {1, 1}, .groups = 3}},
      {"no bias, rectangular", {1, 2, 6, 5}, {3, 2, 2, 3}, false, {.stride = {1, 2}}},
      // Stride 1: the data gradient runs as a forward convolution with flipped weights (Note [backward data
      // as a forward convolution]); an even kernel side, and padding beyond the kernel (which may not).
      {"rectangular stride 1 pad (1, 2)", {2, 3, 6, 5}, {4, 3, 2, 3}, true, {.padding = {1, 2}}},
      {"3x3 pad 3 (wider than the kernel)", {1, 2, 4, 5}, {3, 2, 3, 3}, false, {.padding = {3, 3}}},
      {"1x1", {2, 5, 4, 3}, {4, 5, 1, 1}, true, {}},
  };
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) { return e.what(); }
  return "<no error>";
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  const std::string msg = what_of(f);
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
}

// Kernel paths pinned to their defaults for one test (paths adopted explicitly), the caller's mode restored after.
struct PinnedKernelPaths {
  KernelPathMode mode = kernel_path_mode();
  PinnedKernelPaths() { set_kernel_path_mode(KernelPathMode::pinned); }
  PinnedKernelPaths(const PinnedKernelPaths&) = delete;
  PinnedKernelPaths& operator=(const PinnedKernelPaths&) = delete;
  ~PinnedKernelPaths() {
    reset_kernel_paths();
    set_kernel_path_mode(mode);
  }
};

}  // namespace

TEST(Conv2d, KnownValuesAndShape) {
  // Ones 4x4 input, ones 3x3 kernel, padding 1: each output counts the in-bounds taps (4 corner, 6 edge, 9
  // inside), plus the bias 0.5.
  Tensor y = conv2d(ones({1, 1, 4, 4}), ones({1, 1, 3, 3}), full({1}, 0.5), {.padding = {1, 1}});
  ASSERT_EQ(y.sizes(), (Shape{1, 1, 4, 4}));
  const std::vector<float> expect{4.5, 6.5, 6.5, 4.5, 6.5, 9.5, 9.5, 6.5, 6.5, 9.5, 9.5, 6.5, 4.5, 6.5, 6.5, 4.5};
  EXPECT_EQ(y.to_vector<float>(), expect);
  EXPECT_EQ(conv2d(ones({2, 4, 9, 8}), ones({6, 2, 3, 2}), Tensor(), {.stride = {2, 3}, .groups = 2}).sizes(),
            (Shape{2, 6, 4, 3}));
  // An empty batch gives an empty output of the right shape.
  EXPECT_EQ(conv2d(ones({0, 3, 5, 5}), ones({2, 3, 3, 3})).sizes(), (Shape{0, 2, 3, 3}));
}

TEST(Conv2d, F64AndF32MatchNaiveReference) {
  manual_seed(5);
  for (const Geometry& g : geometries()) {
    Tensor x = randn(g.x, {.dtype = DType::f64}), w = randn(g.w, {.dtype = DType::f64});
    Tensor b = g.bias ? randn({g.w[0]}, {.dtype = DType::f64}) : Tensor();
    const Ref r = ref_conv(x.to_vector<double>(), g.x, w.to_vector<double>(), g.w,
                           g.bias ? b.to_vector<double>() : std::vector<double>{}, g.opt);
    // f64 loops: the same sums in another order; error ~ taps * 2^-53 * scale, bounded by 1e-13 * scale.
    auto y64 = conv2d(x, w, b, g.opt).to_vector<double>();
    // f32 oneDNN on the f32-rounded inputs: input rounding 2 * 2^-24 relative per product, f32 accumulation
    // over taps <= 45 terms (45 * 2^-24 of the sum of |terms|), output rounding: (2 + 45 + 1) * 2^-24 < 2^-18.
    Tensor x32 = x.to(DType::f32), w32 = w.to(DType::f32);
    auto y32 = conv2d(x32, w32, g.bias ? b.to(DType::f32) : Tensor(), g.opt).to_vector<float>();
    ASSERT_EQ(y64.size(), r.value.size()) << g.name;
    ASSERT_EQ(y32.size(), r.value.size()) << g.name;
    for (size_t i = 0; i < r.value.size(); ++i) {
      ASSERT_NEAR(y64[i], r.value[i], 1e-13 * r.scale[i] + 1e-300) << g.name << " f64 element " << i;
      ASSERT_NEAR(y32[i], r.value[i], std::ldexp(r.scale[i], -18)) << g.name << " f32 element " << i;
    }
  }
}

TEST(Conv2d, NonContiguousInputAndWeight) {
  manual_seed(6);
  Tensor x = randn({2, 3, 6, 5}), w = randn({4, 3, 3, 3});
  Tensor xt = x.permute({0, 1, 3, 2}).contiguous().permute({0, 1, 3, 2});  // same values, strided
  Tensor wt = w.permute({1, 0, 2, 3}).contiguous().permute({1, 0, 2, 3});
  ASSERT_FALSE(xt.is_contiguous());
  ASSERT_FALSE(wt.is_contiguous());
  // The kernel makes strided operands contiguous: bit-identical results.
  EXPECT_EQ(conv2d(xt, wt, Tensor(), {.padding = {1, 1}}).to_vector<float>(),
            conv2d(x, w, Tensor(), {.padding = {1, 1}}).to_vector<float>());
}

TEST(Gradcheck, Conv2dGeometries) {
  manual_seed(7);
  for (const Geometry& g : geometries()) {
    SCOPED_TRACE(g.name);
    const Conv2dOptions opt = g.opt;
    if (g.bias) {
      expect_ok(gradcheck([opt](auto& in) { return std::vector<Tensor>{conv2d(in[0], in[1], in[2], opt)}; },
                          {leaf(g.x), leaf(g.w), leaf({g.w[0]})}));
    } else {
      expect_ok(gradcheck([opt](auto& in) { return std::vector<Tensor>{conv2d(in[0], in[1], Tensor(), opt)}; },
                          {leaf(g.x), leaf(g.w)}));
    }
  }
}

TEST(Conv2d, OnlyNeededGradientsAndPartialCombinations) {
  manual_seed(8);
  Tensor x = randn({2, 3, 5, 5}, {.dtype = DType::f64}), w = randn({4, 3, 3, 3}, {.dtype = DType::f64});
  Tensor b = randn({4}, {.dtype = DType::f64});
  Tensor gy = randn({2, 4, 3, 3}, {.dtype = DType::f64});
  // Full reference: all three gradients.
  Tensor xa = x.clone().requires_grad_(), wa = w.clone().requires_grad_(), ba = b.clone().requires_grad_();
  conv2d(xa, wa, ba).backward(gy);
  // Each subset alone gets the same values and leaves the others untouched.
  for (int mask = 1; mask < 8; ++mask) {
    Tensor xs = x.clone(), ws = w.clone(), bs = b.clone();
    if (mask & 1) xs.requires_grad_();
    if (mask & 2) ws.requires_grad_();
    if (mask & 4) bs.requires_grad_();
    conv2d(xs, ws, bs).backward(gy);
    const std::pair<Tensor, Tensor> pairs[3] = {{xs, xa}, {ws, wa}, {bs, ba}};
    for (int k = 0; k < 3; ++k) {
      if (!(mask & (1 << k))) {
        EXPECT_FALSE(pairs[k].first.grad().defined()) << "mask " << mask << " input " << k;
        continue;
      }
      ASSERT_TRUE(pairs[k].first.grad().defined()) << "mask " << mask << " input " << k;
      auto got = pairs[k].first.grad().to_vector<double>(), want = pairs[k].second.grad().to_vector<double>();
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << "mask " << mask << " input " << k;
    }
  }
}

TEST(Conv2d, F32GradientsMatchF64) {
  manual_seed(9);
  for (const Geometry& g : geometries()) {
    SCOPED_TRACE(g.name);
    Tensor x = randn(g.x, {.dtype = DType::f64}), w = randn(g.w, {.dtype = DType::f64});
    Tensor b = g.bias ? randn({g.w[0]}, {.dtype = DType::f64}) : Tensor();
    Tensor y64 = conv2d(x, w, b, g.opt);
    Tensor gy = randn(y64.sizes(), {.dtype = DType::f64});
    auto grads = [&](DType dt, bool absolute) {
      auto cv = [&](const Tensor& t) { return (absolute ? abs(t) : t).to(dt).detach().requires_grad_(); };
      Tensor xi = cv(x), wi = cv(w), bi = g.bias ? cv(b) : Tensor();
      conv2d(xi, wi, bi, g.opt).backward((absolute ? abs(gy) : gy).to(dt));
      std::vector<std::vector<double>> r{xi.grad().to_vector<double>(), wi.grad().to_vector<double>()};
      if (g.bias) r.push_back(bi.grad().to_vector<double>());
      return r;
    };
    const auto g32 = grads(DType::f32, false), g64 = grads(DType::f64, false);
    // Per element the sum of |terms| of each gradient: the same sums on absolute values.
    const auto scale = grads(DType::f64, true);
    // f32 inputs (rounding 2^-24 per operand), f32 accumulation (oneDNN; at most N*OH*OW = 84 terms per dweight
    // element and at most 45 per dx element), f32 output: (2 + 84 + 1) * 2^-24 < 2^-17 of the sum of |terms|.
    for (size_t k = 0; k < g32.size(); ++k)
      for (size_t i = 0; i < g32[k].size(); ++i)
        ASSERT_NEAR(g32[k][i], g64[k][i], std::ldexp(scale[k][i], -17)) << "gradient " << k << " element " << i;
  }
}

TEST(Conv2d, DtypePromotionAndBiasDtype) {
  manual_seed(10);
  Tensor x = randn({1, 2, 4, 4}), w = randn({3, 2, 3, 3}, {.dtype = DType::f64});
  Tensor y = conv2d(x, w, randn({3}, {.dtype = DType::bf16}));
  EXPECT_EQ(y.dtype(), DType::f64);  // f32 input with f64 weight: promoted to f64
  EXPECT_EQ(conv2d(x.to(DType::bf16), w.to(DType::f32)).dtype(), DType::f32);
  EXPECT_EQ(conv2d(x.to(DType::bf16), w.to(DType::bf16), ones({3})).dtype(), DType::bf16);  // f32 bias is fine
  EXPECT_EQ(conv2d(x.to(DType::f16), w.to(DType::bf16)).dtype(), DType::f32);
  // Gradients reach a bf16 weight through the promotion as a bf16 gradient.
  Tensor wb = w.to(DType::bf16).requires_grad_();
  sum(conv2d(x, wb)).backward();
  ASSERT_TRUE(wb.grad().defined());
  EXPECT_EQ(wb.grad().dtype(), DType::bf16);
}

TEST(Conv2d, Bf16AccumulatesInF32) {
  // 512 channels x 3x3 taps of bf16 ones: 4608 terms. A bf16 accumulator stalls at 256 (256 + 1 rounds back to
  // 256); f32 accumulation gives 4608 exactly, which bf16 represents (1.125 * 2^12).
  Tensor y = conv2d(ones({1, 512, 3, 3}, {.dtype = DType::bf16}), ones({2, 512, 3, 3}, {.dtype = DType::bf16}));
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{4608.0f, 4608.0f}));
  Tensor h = conv2d(ones({1, 512, 3, 3}, {.dtype = DType::f16}), ones({2, 512, 3, 3}, {.dtype = DType::f16}));
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.to_vector<float>(), (std::vector<float>{4608.0f, 4608.0f}));
}

// Note [conv2d low-precision tolerances]
// The low-precision result is compared with f32 on the UNROUNDED inputs, per element against S = the sum of
// |terms| of that element (the same convolution on absolute values) and the reference value r:
//   |lp - f32| <= (2u + u^2 + 2 k 2^-24) S + u (|r| + (2u + u^2 + 2 k 2^-24) S)
// with u the unit roundoff of the format (bf16: 8 significant bits, u = 2^-8; f16: 11 bits, u = 2^-11):
// each product of two rounded operands is off by at most (2u + u^2) of |product|; both sides accumulate k terms
// in f32 (at most k 2^-24 S each, any order); the low-precision output is rounded once more (u of its value).
// For dweight the result is rounded to the weight's dtype by the engine, so the same final u applies.
struct LowPrecisionCase {
  const char* quantity;
  int index;  // 0 = y, 1 = dx, 2 = dweight, 3 = dbias
  const char* reason;
};
const LowPrecisionCase kLowPrecisionTable[] = {
    {"y", 0, "x and w rounded (2u+u^2 per product), k f32-accumulated taps, output rounded (u)"},
    {"dx", 1, "dy and w rounded (2u+u^2 per product), k f32-accumulated terms, dx rounded to the input dtype (u)"},
    {"dweight", 2, "x and dy rounded (2u+u^2 per product), k f32-accumulated terms, rounded to the weight dtype (u)"},
    {"dbias", 3, "dy rounded (u per term, within 2u+u^2), k f32-accumulated terms, rounded to the bias dtype (u)"},
};

// A geometry with, per quantity of kLowPrecisionTable, an upper bound on the terms accumulated per element.
struct LowPrecisionGeometry {
  Geometry g;
  Shape y;
  int64_t k[4];
};

class Conv2dLowPrecision : public ::testing::TestWithParam<DType> {};

TEST_P(Conv2dLowPrecision, ForwardAndBackwardMatchF32) {
  const DType dt = GetParam();
  const double u = dt == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const LowPrecisionGeometry geos[] = {
      // y: 16 channels * 9 taps; dx: 8 output channels * 9 taps; dweight and dbias: N*OH*OW = 2*5*4.
      {{"dense 3x3 stride 2 pad 1", {2, 16, 9, 8}, {8, 16, 3, 3}, true, {.stride = {2, 2}, .padding = {1, 1}}},
       {2, 8, 5, 4},
       {144, 72, 40, 40}},
      // Depthwise: y and dx 9 taps; dweight and dbias N*OH*OW = 2*9*8.
      {{"depthwise 3x3 pad 1", {2, 16, 9, 8}, {16, 1, 3, 3}, true, {.padding = {1, 1}, .groups = 16}},
       {2, 16, 9, 8},
       {9, 9, 144, 144}},
      // Outputs of <= 16 pixels: bf16 forward, data gradient (stride 1) and weight gradient take the im2col +
      // GEMM paths (Notes [bf16 weight gradient as one GEMM] and [small convolutions as one GEMM] in
      // src/backend/cpu/conv.cpp). 4x4 output: dweight/dbias N*OH*OW = 2*16.
      {{"3x3 pad 1 on 4x4 (GEMM forward, data and weight gradients)",
        {2, 16, 4, 4},
        {8, 16, 3, 3},
        true,
        {.padding = {1, 1}}},
       {2, 8, 4, 4},
       {144, 72, 32, 32}},
      // Rectangular kernel, stride 2, dilation (2, 1), uneven padding: 4x3 output, padding taps are zeros
      // in the unfolded input. y 6*3*2 taps; dx at most 4 outputs * 6 taps; dweight N*OH*OW = 3*12.
      {{"3x2 stride 2 dilation (2,1) pad (2,1) (GEMM weight gradient)",
        {3, 6, 7, 5},
        {4, 6, 3, 2},
        true,
        {.stride = {2, 2}, .padding = {2, 1}, .dilation = {2, 1}}},
       {3, 4, 4, 3},
       {36, 24, 36, 36}},
      // Stride 3 on 9x9: few outputs per input pixel, so the unfold marks padding taps instead of copying to a
      // zero-bordered buffer. y [2, 8, 4, 4] (GEMM forward and weight gradient); y 16*4 taps; dx at most 8
      // output channels * 4 taps; dweight and dbias N*OH*OW = 2*16.
      {{"2x2 stride 3 pad 1 on 9x9 (GEMM forward and weight gradient, strided unfold)",
        {2, 16, 9, 9},
        {8, 16, 2, 2},
        true,
        {.stride = {3, 3}, .padding = {1, 1}}},
       {2, 8, 4, 4},
       {64, 32, 32, 32}},
      // A 4x4 input, dilation (1, 2), pad (1, 2): y [2, 8, 4, 6] (24 pixels: oneDNN), dx 16 pixels (GEMM on the
      // flipped weights). y 16*6 taps; dx at most 8 output channels * 6 taps; dweight and dbias N*OH*OW = 2*24.
      {{"3x2 dilation (1,2) pad (1,2) on 4x4 (GEMM data gradient)",
        {2, 16, 4, 4},
        {8, 16, 3, 2},
        true,
        {.padding = {1, 2}, .dilation = {1, 2}}},
       {2, 8, 4, 6},
       {96, 48, 48, 48}},
      // Stride 1 with dilation (1, 2): dx is a forward convolution of dy with flipped weights. y [2, 8, 8, 7];
      // y 16*6 taps; dx at most 8 output channels * 6 taps; dweight and dbias N*OH*OW = 2*56.
      {{"3x2 stride 1 dilation (1,2) pad (2,2) (dx as a forward convolution)",
        {2, 16, 6, 5},
        {8, 16, 3, 2},
        true,
        {.padding = {2, 2}, .dilation = {1, 2}}},
       {2, 8, 8, 7},
       {96, 48, 112, 112}},
  };
  // bf16 convolutions every way on every CPU: oneDNN's bf16 primitives, im2col + one GEMM, through f32.
  test::for_each_bf16_path([&] {
    manual_seed(21);
    for (const LowPrecisionGeometry& lg : geos) {
      const Geometry& g = lg.g;
      SCOPED_TRACE(g.name);
      Tensor x = randn(g.x), w = randn(g.w), b = randn({g.w[0]});
      Tensor gy = randn(lg.y);
      auto run = [&](DType d, bool absolute) {
        auto cv = [&](const Tensor& t) { return (absolute ? abs(t) : t).to(d).detach().requires_grad_(); };
        Tensor xi = cv(x), wi = cv(w), bi = cv(b);
        Tensor y = conv2d(xi, wi, bi, g.opt);
        EXPECT_EQ(y.dtype(), d);
        y.backward((absolute ? abs(gy) : gy).to(d));
        return std::vector<std::vector<float>>{y.to_vector<float>(), xi.grad().to_vector<float>(),
                                               wi.grad().to_vector<float>(), bi.grad().to_vector<float>()};
      };
      const auto lp = run(dt, false), ref = run(DType::f32, false), scale = run(DType::f32, true);
      for (const LowPrecisionCase& c : kLowPrecisionTable) {
        const auto &a = lp[c.index], &r = ref[c.index], &s = scale[c.index];
        ASSERT_EQ(a.size(), r.size()) << c.quantity;
        const double prod = 2 * u + u * u + 2.0 * static_cast<double>(lg.k[c.index]) * std::ldexp(1.0, -24);
        double worst = 0.0;
        for (size_t i = 0; i < a.size(); ++i) {
          const double tol = prod * s[i] + u * (std::abs(r[i]) + prod * s[i]);
          ASSERT_LE(std::abs(a[i] - r[i]), tol)
              << c.quantity << " in " << dtype_name(dt) << " element " << i << ": got " << a[i] << ", f32 gives "
              << r[i] << " (tolerance reason: " << c.reason << ")";
          worst = std::max(worst, std::abs(a[i] - r[i]) / tol);
        }
        // The comparison is not vacuous: the low-precision path does differ from f32 by a visible fraction.
        EXPECT_GT(worst, 0.01) << c.quantity << ": suspiciously exact for " << dtype_name(dt);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(LowPrecision, Conv2dLowPrecision, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Conv2d, ErrorMessages) {
  const Tensor x = ones({2, 4, 5, 5}), w = ones({6, 4, 3, 3});
  expect_error([&] { conv2d(ones({4, 5, 5}), w); }, {"conv2d", "expected input [N, C, H, W]", "unsqueeze(0)"});
  expect_error([&] { conv2d(x, ones({6, 4, 3})); }, {"conv2d", "expected weight", "4 dims", "[6, 4, 3]"});
  expect_error(
      [&] {
        conv2d(x, ones({6, 3, 3, 3}));
      },
      {"conv2d", "expected weight [6, 4, kH, kW]", "input channels 4", "[6, 3, 3, 3]"});
  expect_error(
      [&] {
        conv2d(x, ones({6, 2, 3, 3}), Tensor(), {.groups = 3});
      },
      {"conv2d", "input channels (4) must be divisible by groups (3)"});
  expect_error(
      [&] {
        conv2d(x, ones({5, 2, 3, 3}), Tensor(), {.groups = 2});
      },
      {"conv2d", "output channels", "= 5) must be divisible by groups (2)"});
  expect_error([&] { conv2d(x, w, Tensor(), {.groups = 0}); }, {"conv2d", "groups >= 1", "got 0"});
  expect_error([&] { conv2d(x, ones({6, 4, 7, 3})); }, {"conv2d", "output of at least 1x1", "got 0x3"});
  expect_error([&] { conv2d(x, w, Tensor(), {.dilation = {3, 1}}); }, {"conv2d", "at least 1x1", "dilation=(3, 1)"});
  expect_error([&] { conv2d(x, w, ones({5})); }, {"conv2d", "expected bias [6]", "[5]"});
  expect_error([&] { conv2d(x, w, Tensor(), {.stride = {0, 1}}); }, {"conv2d", "stride >= 1", "stride=(0, 1)"});
  expect_error([&] { conv2d(x, w, Tensor(), {.padding = {-1, 0}}); }, {"conv2d", "padding >= 0"});
  expect_error([&] { conv2d(ones({2, 4, 5, 5}, {.dtype = DType::i64}), w); }, {"conv2d", "expected floating", "i64"});
}

// f32 convolutions with few output pixels may run as im2col + one f32 GEMM (Note [small convolutions as one GEMM],
// chosen per shape by measurement): every pass of that path against oneDNN's convolution, NCHW and channels-last,
// stride 1 and 2, 3x3 and 1x1. The tests pin the paths (their defaults: oneDNN), so the GEMM path is adopted by key,
// the keys being those the pinned run recorded. Tolerance: the same f32 products summed in another order over
// C kH kW terms (and N oh ow for the weight gradient): 1e-5 relative to the largest value.
TEST(Conv2d, F32GemmPathMatchesOneDnn) {
  struct Case {
    const char* name;
    Shape x, w;
    Conv2dOptions opt;
    bool channels_last;
  };
  const Case cases[] = {
      {"3x3 s1 4x4", {4, 16, 4, 4}, {8, 16, 3, 3}, {.padding = {1, 1}}, false},
      {"3x3 s1 4x4 channels-last", {4, 16, 4, 4}, {8, 16, 3, 3}, {.padding = {1, 1}}, true},
      {"3x3 s2 8x8", {3, 8, 8, 8}, {12, 8, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}, true},
      {"1x1 s2 8x8", {3, 8, 8, 8}, {12, 8, 1, 1}, {.stride = {2, 2}}, false},
  };
  const PinnedKernelPaths pinned;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    manual_seed(31);
    const MemoryFormat fmt = c.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
    const Tensor x = randn(c.x).contiguous(fmt), w = randn(c.w), b = randn({c.w[0]});
    auto run = [&] {
      Tensor xi = x.detach().requires_grad_(), wi = w.detach().requires_grad_(), bi = b.detach().requires_grad_();
      Tensor y = conv2d(xi, wi, bi, c.opt);
      y.backward(ones(y.sizes()) + y.detach());
      return std::vector<Tensor>{y.detach(), xi.grad(), wi.grad(), bi.grad()};
    };
    reset_kernel_paths();
    const std::vector<Tensor> native = run();
    std::map<std::string, std::string> gemm;
    for (const auto& [key, path] : kernel_path_record().choices)
      if (key.starts_with("conv_") && key.find(" f32 ") != std::string::npos) gemm[key] = "gemm";
    ASSERT_FALSE(gemm.empty()) << "no f32 convolution pass is a GEMM candidate here";
    reset_kernel_paths();
    adopt_kernel_paths(gemm);
    const std::vector<Tensor> via_gemm = run();
    EXPECT_EQ(kernel_path_record().from_record, static_cast<int>(gemm.size()));
    const char* names[] = {"y", "dx", "dw", "db"};
    auto maxabs = [](const Tensor& t) {
      Shape all;
      for (int64_t d = 0; d < t.dim(); ++d) all.push_back(d);
      return amax(abs(t), all).item<double>();
    };
    for (size_t i = 0; i < native.size(); ++i) {
      const double scale = maxabs(native[i]);
      const double err = maxabs(via_gemm[i] - native[i]);
      EXPECT_LE(err, 1e-5 * scale) << names[i] << ": " << err << " of " << scale;
    }
  }
}

// Note [through f32 on f32's path]: a bf16 convolution through f32 runs the f32 path its shape chose; with the f32
// passes pinned to the GEMM it computes what it computes with them on oneDNN, up to the order of the f32 sums
// (then one bf16 rounding of y and dx: a result next to a rounding boundary may move by one bf16 ulp, 2^-8).
TEST(Conv2d, Bf16ThroughF32TakesTheF32GemmPath) {
  const PinnedKernelPaths pinned;
  manual_seed(37);
  const MemoryFormat fmt = MemoryFormat::channels_last;
  const Tensor x = randn({4, 16, 4, 4}).to(DType::bf16).contiguous(fmt), w = randn({8, 16, 3, 3}).to(DType::bf16);
  auto run = [&] {
    Tensor xi = x.detach().requires_grad_(), wi = w.detach().requires_grad_();
    Tensor y = conv2d(xi, wi, Tensor(), {.padding = {1, 1}});
    y.backward(ones(y.sizes(), {.dtype = DType::bf16}));
    return std::vector<Tensor>{y.detach().to(DType::f32), xi.grad().to(DType::f32), wi.grad().to(DType::f32)};
  };
  reset_kernel_paths();
  (void)run();
  std::map<std::string, std::string> on_gemm, on_onednn;
  for (const auto& [key, path] : kernel_path_record().choices) {
    if (!key.starts_with("conv_")) continue;
    const bool f32 = key.find(" f32 ") != std::string::npos;
    on_gemm[key] = f32 ? "gemm" : "via_f32";
    on_onednn[key] = f32 ? "native" : "via_f32";
  }
  // The three f32 copies always; the three bf16 passes too where bf16 has candidates of its own (without bf16
  // instructions it computes through f32 with no choice to record).
  ASSERT_EQ(std::count_if(on_gemm.begin(), on_gemm.end(), [](const auto& kv) { return kv.second == "gemm"; }), 3);
  reset_kernel_paths();
  adopt_kernel_paths(on_onednn);
  const std::vector<Tensor> onednn = run();
  reset_kernel_paths();
  adopt_kernel_paths(on_gemm);
  const std::vector<Tensor> gemm = run();
  EXPECT_EQ(kernel_path_record().from_record, static_cast<int>(on_gemm.size())) << "each pass read its adopted path";
  const char* names[] = {"y", "dx", "dw"};
  const double tol[] = {0x1p-8, 0x1p-8, 1e-5};  // y, dx rounded to bf16; dw stays f32
  for (size_t i = 0; i < gemm.size(); ++i) {
    const double scale = amax(abs(onednn[i]), {0, 1, 2, 3}).item<double>();
    const double err = amax(abs(gemm[i] - onednn[i]), {0, 1, 2, 3}).item<double>();
    EXPECT_LE(err, tol[i] * scale) << names[i] << ": " << err << " of " << scale;
    EXPECT_GT(scale, 0.0) << names[i];
  }
}

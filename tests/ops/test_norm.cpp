// batch_norm and layer_norm: gradient checks (f64), values against hand computations, running
// statistics, 16-bit precision against f32 (tolerance table below), mixed-dtype parameters, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using autograd::gradcheck;

namespace {
using mp::test::excess;
using mp::test::expect_ok;
using mp::test::leaf;

using mp::test::expect_error;

// Note [16-bit tolerance table] (tests/test_util.hpp); this file's end-to-end bounds:
const mp::test::Tol16 kEndToEnd[] = {
    // batch_norm / layer_norm end to end with x = 1 + 2 randn (|x - mean| / std <= ~3.5, |mean| / std
    // ~0.5), w in [0.5, 1.5], b in [-0.5, 0.5], all rounded to 16 bits: x rounding moves xhat by
    // (0.5 + 3.5) u, times |w| -> 6 u; w rounding |w xhat| u -> 5.3 u; output rounding |y| u -> 5.8 u;
    // b rounding 0.5 u: ~18 u in the worst alignment, allowed 24 u.
    {"norm end to end", DType::bf16, 24.0 / 512, 0.0, "x, w, b and y each rounded once (first-order bound 18 u)"},
    {"norm end to end", DType::f16, 24.0 / 2048, 0.0, "x, w, b and y each rounded once (first-order bound 18 u)"},
};
const mp::test::Tol16& tol(const std::string& what, DType dt) { return mp::test::tol16(kEndToEnd, what, dt); }

std::vector<double> vec(const Tensor& t) { return t.to_vector<double>(); }

}  // namespace

// ------------------------------------------------------------------------------ batch_norm

TEST(BatchNorm, ForwardMatchesHandComputationAndUpdatesRunningStats) {
  // x [2, 2, 3]: channel 0 holds {1,2,3,7,8,9}, channel 1 holds {0,0,0,0,0,6}.
  Tensor x = from_vector<double>({1, 2, 3, 0, 0, 0, 7, 8, 9, 0, 0, 6}, {2, 2, 3});
  Tensor rm = from_vector<double>({0.5, -1.0}, {2}), rv = from_vector<double>({2.0, 3.0}, {2});
  Tensor w = from_vector<double>({2.0, 0.5}, {2}), b = from_vector<double>({1.0, -1.0}, {2});
  const double eps = 1e-5, m = 0.1;
  Tensor y = batch_norm(x, rm, rv, w, b, /*training=*/true, m, eps);
  const double mean0 = 5.0, var0 = (16 + 9 + 4 + 4 + 9 + 16) / 6.0;  // biased
  const double mean1 = 1.0, var1 = (5 * 1.0 + 25.0) / 6.0;
  const auto yv = vec(y);
  EXPECT_NEAR(yv[0], 2.0 * (1 - mean0) / std::sqrt(var0 + eps) + 1.0, 1e-12);
  EXPECT_NEAR(yv[8], 2.0 * (9 - mean0) / std::sqrt(var0 + eps) + 1.0, 1e-12);
  EXPECT_NEAR(yv[11], 0.5 * (6 - mean1) / std::sqrt(var1 + eps) - 1.0, 1e-12);
  // Running stats: (1 - m) old + m batch, unbiased variance n / (n - 1) with n = 6.
  EXPECT_NEAR(vec(rm)[0], 0.9 * 0.5 + 0.1 * mean0, 1e-12);
  EXPECT_NEAR(vec(rm)[1], 0.9 * -1.0 + 0.1 * mean1, 1e-12);
  EXPECT_NEAR(vec(rv)[0], 0.9 * 2.0 + 0.1 * var0 * 6.0 / 5.0, 1e-12);
  EXPECT_NEAR(vec(rv)[1], 0.9 * 3.0 + 0.1 * var1 * 6.0 / 5.0, 1e-12);
  // Eval uses the (updated) running statistics and leaves them alone.
  const double rm0 = vec(rm)[0], rv0 = vec(rv)[0];
  Tensor ye = batch_norm(x, rm, rv, w, b, /*training=*/false, m, eps);
  EXPECT_NEAR(vec(ye)[0], 2.0 * (1 - rm0) / std::sqrt(rv0 + eps) + 1.0, 1e-12);
  EXPECT_EQ(vec(rm)[0], rm0);
  EXPECT_EQ(ye.sizes(), x.sizes());
}

TEST(BatchNorm, TwoDimInputRunningStatsMatchHand) {
  // [N, C] = [4, 3] takes the channels-contiguous path; f32 as in real training.
  std::vector<float> xs = {1, -2, 0.5f, 3, 4, 0.25f, -1, 0, 2, 5, 1, -3};
  Tensor x = from_vector<float>(xs, {4, 3});
  Tensor rm = zeros({3}), rv = ones({3});
  Tensor y = batch_norm(x, rm, rv, Tensor(), Tensor(), true, 0.25);
  for (int c = 0; c < 3; ++c) {
    double mu = 0, q = 0;
    for (int n = 0; n < 4; ++n) mu += xs[n * 3 + c] / 4.0;
    for (int n = 0; n < 4; ++n) q += (xs[n * 3 + c] - mu) * (xs[n * 3 + c] - mu);
    EXPECT_NEAR(vec(rm)[c], 0.25 * mu, 1e-6);
    EXPECT_NEAR(vec(rv)[c], 0.75 + 0.25 * q / 3.0, 1e-6);
    EXPECT_NEAR(vec(y)[c], (xs[c] - mu) / std::sqrt(q / 4.0 + 1e-5), 1e-5);
  }
}

TEST(BatchNorm, GradcheckTrainingAffine) {
  Tensor rm = zeros({3}, {.dtype = DType::f64}), rv = ones({3}, {.dtype = DType::f64});
  expect_ok(gradcheck(
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{batch_norm(in[0], rm, rv, in[1], in[2], true)}; },
      {leaf({2, 3, 2, 3}), leaf({3}, 0.5, 1.5), leaf({3})}));
  // [N, C] path.
  expect_ok(gradcheck(
      [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{batch_norm(in[0], rm, rv, in[1], in[2], true)}; },
      {leaf({5, 3}), leaf({3}, 0.5, 1.5), leaf({3})}));
}

TEST(BatchNorm, GradcheckTrainingNoAffine) {
  Tensor rm = zeros({4}, {.dtype = DType::f64}), rv = ones({4}, {.dtype = DType::f64});
  expect_ok(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{batch_norm(in[0], rm, rv, Tensor(), Tensor(), true)};
      },
      {leaf({3, 4, 5})}));
  // No running statistics at all: batch statistics in both modes.
  expect_ok(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), false)};
      },
      {leaf({6, 2})}));
}

TEST(BatchNorm, GradcheckEval) {
  Tensor rm = rand({3}, {.dtype = DType::f64}, -1, 1), rv = rand({3}, {.dtype = DType::f64}, 0.5, 2);
  expect_ok(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{batch_norm(in[0], rm, rv, in[1], in[2], false)};
      },
      {leaf({2, 3, 4}), leaf({3}, 0.5, 1.5), leaf({3})}));
  expect_ok(gradcheck(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{batch_norm(in[0], rm, rv, in[1], Tensor(), false)};
      },
      {leaf({4, 3}), leaf({3}, 0.5, 1.5)}));
}

TEST(BatchNorm, LargeShapesMatchCompositeReference) {
  // Big enough for the parallel paths; f64 against the same formulas built from generic ops.
  for (const Shape& s : {Shape{4, 16, 24, 30}, Shape{512, 96}}) {  // S = 720 > one block; C = 96 > one channel block
    const int64_t C = s[1];
    Tensor x = randn(s, {.dtype = DType::f64}, 3.0, 2.0).requires_grad_();
    Tensor w = rand({C}, {.dtype = DType::f64}, 0.5, 1.5).requires_grad_();
    Tensor b = rand({C}, {.dtype = DType::f64}).requires_grad_();
    Tensor dy = randn(s, {.dtype = DType::f64});
    Tensor y = batch_norm(x, Tensor(), Tensor(), w, b, true);
    auto g = autograd::grad({y}, {x, w, b}, {dy});
    Tensor xr = x.detach().requires_grad_(), wr = w.detach().requires_grad_(), br = b.detach().requires_grad_();
    Shape dims = {0}, cs(s.size(), 1);
    for (size_t d = 2; d < s.size(); ++d) dims.push_back(static_cast<int64_t>(d));
    cs[1] = C;
    Tensor mu = mean(xr, dims, true), v = var(xr, dims, 0, true);
    Tensor yr = (xr - mu) * rsqrt(v + 1e-5) * wr.reshape(cs) + br.reshape(cs);
    auto gr = autograd::grad({yr}, {xr, wr, br}, {dy});
    EXPECT_LE(excess(y, yr, 1e-10, 1e-10), 0.0);
    EXPECT_LE(excess(g[0], gr[0], 1e-10, 1e-8), 0.0);
    EXPECT_LE(excess(g[1], gr[1], 1e-9, 1e-9), 0.0);
    EXPECT_LE(excess(g[2], gr[2], 1e-9, 1e-9), 0.0);
  }
}

TEST(BatchNorm, F32StatisticsSurviveLargeMean) {
  // mean 1e4, std 1: a one-pass E[x^2] - E[x]^2 in f32 would lose the variance entirely
  // (f32 spacing at 1e8 is 8); two-pass statistics with double sums stay within 2e-3 of f64.
  Tensor x64 = randn({16, 4, 64}, {.dtype = DType::f64}, 1e4, 1.0);
  Tensor x32 = x64.to(DType::f32);
  Tensor y32 = batch_norm(x32, Tensor(), Tensor(), Tensor(), Tensor(), true);
  Tensor y64 = batch_norm(x32.to(DType::f64), Tensor(), Tensor(), Tensor(), Tensor(), true);
  // What remains is the f32 rounding of the mean: half an ulp of 1e4 (2^-11 ~ 5e-4) over std 1.
  // (An f32 running sum of the values errs by ~1e-3 std already: sums must accumulate in double.)
  EXPECT_LE(excess(y32, y64, 2e-3, 0.0), 0.0);
}

TEST(BatchNorm, BadPivotAndFarOutliersMatchF64) {
  // Note [normalisation statistics on the CPU]: the shifted sums use the mean of a channel's first block
  // (kBlock = 512 values) as pivot. Channel 0 starts with 512 values of 100 among 32768 N(0, 1) values: the
  // pivot sits ~8 std from the channel mean (mean 1.56, std 12.4), past the 4-std bound, so the kernel redoes
  // the channel about its mean. Channel 1 has single outliers at +-50 sigma among S = 16384 > 2048 values per
  // plane; channel 2 is plain. Against the f64 computation on the same f32 values: f32 partial sums about a
  // pivot within 4 std err by ~sqrt(512 / lanes) 2^-24 (var + d^2) ~ 1e-6 of var, plus the output rounding:
  // allowed 1e-4 absolute on the normalised output.
  const int64_t N = 2, C = 3, S = 16384;
  Tensor x = randn({N, C, S});
  x.select(1, 0).select(0, 0).narrow(0, 0, 512).fill_(100.0);
  x.select(1, 1).select(0, 0).narrow(0, 100, 1).fill_(50.0);
  x.select(1, 1).select(0, 1).narrow(0, 3000, 1).fill_(-50.0);
  Tensor y32 = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  Tensor y64 = batch_norm(x.to(DType::f64), Tensor(), Tensor(), Tensor(), Tensor(), true);
  EXPECT_LE(excess(y32, y64, 1e-4, 0.0), 0.0);
  // Not vacuous: the far block normalises to ~7.9 std and the outliers to ~+-50.
  EXPECT_GT(y32.select(1, 0).select(0, 0).narrow(0, 0, 512).to_vector<float>()[0], 7.0f);
  EXPECT_GT(y32.select(1, 1).select(0, 0).narrow(0, 100, 1).item<float>(), 40.0f);
}

TEST(BatchNorm, LowPrecisionAgainstF32) {
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = randn({4, 3, 5, 7}, {}, 1.0, 2.0), w = rand({3}, {}, 0.5, 1.5), b = rand({3}, {}, -0.5, 0.5);
    Tensor dy = randn({4, 3, 5, 7}).to(dt);
    Tensor xl = x.to(dt).requires_grad_(), xs = x.to(dt).to(DType::f32).requires_grad_();
    Tensor wl = w.to(dt).requires_grad_(), ws = w.to(dt).to(DType::f32).requires_grad_();
    Tensor bl = b.to(dt), bs = b.to(dt).to(DType::f32);
    Tensor yl = batch_norm(xl, Tensor(), Tensor(), wl, bl, true);
    Tensor ys = batch_norm(xs, Tensor(), Tensor(), ws, bs, true);
    EXPECT_EQ(yl.dtype(), dt);
    const auto& same = tol("same input", dt);
    EXPECT_LE(excess(yl, ys, same.atol, same.rtol), 0.0) << same.reason;
    auto gl = autograd::grad({yl}, {xl, wl}, {dy});
    auto gs = autograd::grad({ys}, {xs, ws}, {dy.to(DType::f32)});
    EXPECT_EQ(gl[0].dtype(), dt);
    EXPECT_LE(excess(gl[0], gs[0], same.atol, same.rtol), 0.0) << same.reason;
    EXPECT_LE(excess(gl[1], gs[1], same.atol, same.rtol), 0.0) << same.reason;
    // End to end: the f32 op on the unrounded input.
    Tensor y32 = batch_norm(x, Tensor(), Tensor(), w, b, true);
    const auto& e2e = tol("norm end to end", dt);
    EXPECT_LE(excess(yl, y32, e2e.atol, e2e.rtol), 0.0) << e2e.reason;
  }
}

TEST(BatchNorm, LowPrecisionInputWithF32ParametersAndStats) {
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    // amp O2: the model is 16-bit but batch norm keeps f32 weight, bias and running statistics.
    Tensor x = randn({6, 4, 3, 3}, {}, 0.5, 1.5).to(dt).requires_grad_();
    Tensor w = rand({4}, {}, 0.5, 1.5).requires_grad_(), b = rand({4}).requires_grad_();
    Tensor rm = zeros({4}), rv = ones({4});
    Tensor y = batch_norm(x, rm, rv, w, b, true, 0.1);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(rm.dtype(), DType::f32);
    // Reference: everything in f32 on the same (16-bit-valued) input.
    Tensor xr = x.detach().to(DType::f32).requires_grad_();
    Tensor wr = w.detach().requires_grad_(), br = b.detach().requires_grad_();
    Tensor rmr = zeros({4}), rvr = ones({4});
    Tensor yr = batch_norm(xr, rmr, rvr, wr, br, true, 0.1);
    const auto& same = tol("same input", dt);
    EXPECT_LE(excess(y, yr, same.atol, same.rtol), 0.0) << same.reason;
    // The running statistics see the same f32 batch statistics: identical arithmetic.
    EXPECT_EQ(rm.to_vector<float>(), rmr.to_vector<float>());
    EXPECT_EQ(rv.to_vector<float>(), rvr.to_vector<float>());
    Tensor dy = randn({6, 4, 3, 3}).to(dt);
    y.backward(dy);
    yr.backward(dy.to(DType::f32));
    EXPECT_EQ(x.grad().dtype(), dt);
    EXPECT_EQ(w.grad().dtype(), DType::f32);
    EXPECT_EQ(b.grad().dtype(), DType::f32);
    // dweight/dbias are f32 sums computed from the same values in the same order: equal.
    EXPECT_LE(excess(w.grad(), wr.grad(), 1e-6, 1e-6), 0.0);
    EXPECT_LE(excess(b.grad(), br.grad(), 1e-6, 1e-6), 0.0);
    EXPECT_LE(excess(x.grad(), xr.grad(), same.atol, same.rtol), 0.0) << same.reason;
    // Eval with f32 running statistics on 16-bit input.
    Tensor ye = batch_norm(x.detach(), rm, rv, w.detach(), b.detach(), false);
    Tensor yer = batch_norm(xr.detach(), rm, rv, w.detach(), b.detach(), false);
    EXPECT_EQ(ye.dtype(), dt);
    EXPECT_LE(excess(ye, yer, same.atol, same.rtol), 0.0) << same.reason;
  }
}

TEST(BatchNorm, ErrorsNameExpectedAndGot) {
  Tensor x = randn({2, 4, 3});
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), ones({5}), Tensor(), true); },
               {"batch_norm", "weight", "expected", "[4]", "got [5]"});
  expect_error([&] { batch_norm(x, zeros({3}), ones({4}), Tensor(), Tensor(), true); },
               {"batch_norm", "running_mean", "[4]", "got [3]"});
  expect_error([&] { batch_norm(x, Tensor(), Tensor(), Tensor(), ones({2, 2}), true); }, {"bias", "[4]", "got [2, 2]"});
  expect_error([&] { batch_norm(randn({4}), Tensor(), Tensor(), Tensor(), Tensor(), true); },
               {"batch_norm", "[N, C, ...]", "got [4]"});
  expect_error(
      [&] {
        batch_norm(randn({1, 4}), Tensor(), Tensor(), Tensor(), Tensor(), true);
      },
      {"more than 1 value per channel", "[1, 4]"});
  expect_error([&] { batch_norm(x, zeros({4}), Tensor(), Tensor(), Tensor(), false); },
               {"running_mean and running_var"});
}

// ------------------------------------------------------------------------------ layer_norm

TEST(LayerNorm, ForwardMatchesHandComputation) {
  Tensor x = from_vector<double>({1, 2, 3, 4, -1, 0, 0, 5}, {2, 4});
  Tensor w = from_vector<double>({1, 2, 3, 4}, {4}), b = from_vector<double>({0, 0, 1, 1}, {4});
  Tensor y = layer_norm(x, {4}, w, b, 1e-5);
  const double v0 = 1.25, v1 = (4.0 + 1.0 + 1.0 + 16.0) / 4.0;  // means 2.5 and 1
  const auto yv = vec(y);
  EXPECT_NEAR(yv[0], (1 - 2.5) / std::sqrt(v0 + 1e-5), 1e-12);
  EXPECT_NEAR(yv[3], 4 * (4 - 2.5) / std::sqrt(v0 + 1e-5) + 1, 1e-12);
  EXPECT_NEAR(yv[7], 4 * (5 - 1.0) / std::sqrt(v1 + 1e-5) + 1, 1e-12);
  Tensor y2 = layer_norm(x.reshape({1, 2, 4}), {2, 4});  // one row of 8 values
  EXPECT_NEAR(sum(y2).item<double>(), 0.0, 1e-12);
  EXPECT_EQ(y2.sizes(), (Shape{1, 2, 4}));
}

TEST(LayerNorm, GradcheckOneNormalizedDim) {
  expect_ok(
      gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{layer_norm(in[0], {5}, in[1], in[2])}; },
                {leaf({3, 5}), leaf({5}, 0.5, 1.5), leaf({5})}));
  expect_ok(gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{layer_norm(in[0], {5})}; },
                      {leaf({2, 3, 5})}));
}

TEST(LayerNorm, GradcheckTwoNormalizedDims) {
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{layer_norm(in[0], {3, 4}, in[1], in[2])};
      },
      {leaf({2, 3, 4}), leaf({3, 4}, 0.5, 1.5), leaf({3, 4})}));
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{layer_norm(in[0], {3, 4})};
      },
      {leaf({2, 3, 4})}));
  // Weight only.
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{layer_norm(in[0], {2, 3}, in[1])};
      },
      {leaf({2, 2, 3}), leaf({2, 3}, 0.5, 1.5)}));
}

TEST(LayerNorm, LargeShapesMatchCompositeReference) {
  // Parallel rows, rows longer than one block, per-thread weight-gradient partials.
  Tensor x = randn({96, 1100}, {.dtype = DType::f64}, -2.0, 3.0).requires_grad_();
  Tensor w = rand({1100}, {.dtype = DType::f64}, 0.5, 1.5).requires_grad_();
  Tensor b = rand({1100}, {.dtype = DType::f64}).requires_grad_();
  Tensor dy = randn({96, 1100}, {.dtype = DType::f64});
  Tensor y = layer_norm(x, {1100}, w, b);
  auto g = autograd::grad({y}, {x, w, b}, {dy});
  Tensor xr = x.detach().requires_grad_(), wr = w.detach().requires_grad_(), br = b.detach().requires_grad_();
  Tensor yr = (xr - mean(xr, {1}, true)) * rsqrt(var(xr, {1}, 0, true) + 1e-5) * wr + br;
  auto gr = autograd::grad({yr}, {xr, wr, br}, {dy});
  EXPECT_LE(excess(y, yr, 1e-10, 1e-10), 0.0);
  EXPECT_LE(excess(g[0], gr[0], 1e-10, 1e-8), 0.0);
  EXPECT_LE(excess(g[1], gr[1], 1e-9, 1e-9), 0.0);
  EXPECT_LE(excess(g[2], gr[2], 1e-9, 1e-9), 0.0);
}

TEST(LayerNorm, F32StatisticsSurviveLargeMean) {
  // See BatchNorm.F32StatisticsSurviveLargeMean; rows of 512 values with mean 1e4 and std 1.
  Tensor x32 = randn({8, 512}, {.dtype = DType::f64}, 1e4, 1.0).to(DType::f32);
  Tensor y32 = layer_norm(x32, {512});
  Tensor y64 = layer_norm(x32.to(DType::f64), {512});
  EXPECT_LE(excess(y32, y64, 2e-3, 0.0), 0.0);
}

TEST(LayerNorm, LowPrecisionAgainstF32) {
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = randn({6, 7, 40}, {}, 1.0, 2.0), w = rand({40}, {}, 0.5, 1.5), b = rand({40}, {}, -0.5, 0.5);
    Tensor dy = randn({6, 7, 40}).to(dt);
    Tensor xl = x.to(dt).requires_grad_(), xs = x.to(dt).to(DType::f32).requires_grad_();
    Tensor wl = w.to(dt).requires_grad_(), ws = w.to(dt).to(DType::f32).requires_grad_();
    Tensor bl = b.to(dt), bs = b.to(dt).to(DType::f32);
    Tensor yl = layer_norm(xl, {40}, wl, bl), ys = layer_norm(xs, {40}, ws, bs);
    EXPECT_EQ(yl.dtype(), dt);
    const auto& same = tol("same input", dt);
    EXPECT_LE(excess(yl, ys, same.atol, same.rtol), 0.0) << same.reason;
    auto gl = autograd::grad({yl}, {xl, wl}, {dy});
    auto gs = autograd::grad({ys}, {xs, ws}, {dy.to(DType::f32)});
    EXPECT_LE(excess(gl[0], gs[0], same.atol, same.rtol), 0.0) << same.reason;
    EXPECT_LE(excess(gl[1], gs[1], same.atol, same.rtol), 0.0) << same.reason;
    Tensor y32 = layer_norm(x, {40}, w, b);
    const auto& e2e = tol("norm end to end", dt);
    EXPECT_LE(excess(yl, y32, e2e.atol, e2e.rtol), 0.0) << e2e.reason;
  }
}

TEST(LayerNorm, Bf16InputWithF32Parameters) {
  Tensor x = randn({5, 16}).to(DType::bf16).requires_grad_();
  Tensor w = rand({16}, {}, 0.5, 1.5).requires_grad_(), b = rand({16}).requires_grad_();
  Tensor y = layer_norm(x, {16}, w, b);
  EXPECT_EQ(y.dtype(), DType::bf16);
  Tensor xr = x.detach().to(DType::f32);
  Tensor yr = layer_norm(xr, {16}, w.detach(), b.detach());
  const auto& same = tol("same input", DType::bf16);
  EXPECT_LE(excess(y, yr, same.atol, same.rtol), 0.0) << same.reason;
  sum(y).backward();
  EXPECT_EQ(x.grad().dtype(), DType::bf16);
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  // d/db sum(y) = number of rows for every element.
  for (float v : b.grad().to_vector<float>()) EXPECT_EQ(v, 5.0f);
}

TEST(LayerNorm, ErrorsNameExpectedAndGot) {
  Tensor x = randn({2, 3, 4});
  expect_error([&] { layer_norm(x, {3}); }, {"layer_norm", "normalized_shape [3]", "got input [2, 3, 4]"});
  expect_error([&] { layer_norm(x, {2, 3, 4, 5}); }, {"layer_norm", "[2, 3, 4, 5]"});
  expect_error([&] { layer_norm(x, {4}, ones({5})); }, {"weight", "expected", "[4]", "got [5]"});
  expect_error([&] { layer_norm(x, {3, 4}, Tensor(), ones({12})); }, {"bias", "[3, 4]", "got [12]"});
  expect_error([&] { layer_norm(x, {}); }, {"non-empty normalized_shape"});
}

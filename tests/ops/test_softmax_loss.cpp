// Softmax, log-softmax, cross entropy, NLL and MSE: values against references built from basic ops,
// f64 gradient checks, 16-bit precision against f32, large-logit stability and error messages.
#include <gtest/gtest.h>

#include <cmath>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using autograd::gradcheck;

namespace {
using mp::test::expect_ok;
// The losses and softmax are checked on inputs in [-2, 2].
Tensor leaf(const Shape& s, double lo = -2.0, double hi = 2.0) { return mp::test::leaf(s, lo, hi); }

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

// Log-softmax from basic ops only (independent of the fused kernel): x - max - log(sum(exp(x - max))).
Tensor ref_log_softmax(const Tensor& x, int64_t dim) {
  Tensor sh = sub(x, amax(x, {dim}, true));
  return sub(sh, log(sum(exp(sh), {dim}, true)));
}

// Per-row cross-entropy reference for logits [N, C] from basic ops (Note [class loss with label smoothing]):
// (1 - eps) * (-log p_t) + eps * mean_c(-log p_c); ignored rows give 0.
Tensor ref_ce_rows(const Tensor& x, const Tensor& t, double eps, int64_t ignore) {
  const int64_t C = x.sizes()[1];
  Tensor lp = ref_log_softmax(x.to(DType::f64), 1);
  Tensor onehot = eq(arange(C).reshape({1, C}), t.reshape({-1, 1})).to(DType::f64);
  Tensor nll = neg(sum(mul(lp, onehot), {1}));
  Tensor smooth = neg(mean(lp, {1}));
  Tensor rows = add(mul(nll, 1.0 - eps), mul(smooth, eps));
  Tensor valid = ne(t, full({}, static_cast<double>(ignore), {.dtype = DType::i64})).to(DType::f64);
  return mul(rows, valid);
}

Tensor targets(std::vector<int64_t> v) { return from_vector(v, {static_cast<int64_t>(v.size())}); }

}  // namespace

// ------------------------------------------------------------------------------------------ softmax

TEST(Softmax, HandComputedRow) {
  Tensor x = from_vector<double>({1, 2, 3}, {1, 3});
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  auto y = softmax(x, -1).to_vector<double>();
  EXPECT_NEAR(y[0], std::exp(1.0) / z, 1e-15);
  EXPECT_NEAR(y[1], std::exp(2.0) / z, 1e-15);
  EXPECT_NEAR(y[2], std::exp(3.0) / z, 1e-15);
  auto ly = log_softmax(x, 1).to_vector<double>();
  EXPECT_NEAR(ly[2], 3.0 - std::log(z), 1e-14);
}

TEST(Softmax, MatchesBasicOpsAlongEveryDim) {
  Tensor x = rand({3, 4, 5}, {.dtype = DType::f64}, -3, 3);
  for (int64_t d : {0, 1, 2, -1, -3}) {
    // f64 against an f64 reference: only rounding of a few operations differs.
    EXPECT_LT(max_abs_diff(log_softmax(x, d), ref_log_softmax(x, d)), 1e-13) << "dim " << d;
    EXPECT_LT(max_abs_diff(softmax(x, d), exp(ref_log_softmax(x, d))), 1e-14) << "dim " << d;
  }
  // f32: compute in float; 1e-6 covers a few float roundings of values of magnitude <= ~8.
  Tensor xf = x.to(DType::f32);
  EXPECT_LT(max_abs_diff(log_softmax(xf, 1), ref_log_softmax(x, 1)), 1e-5);
  EXPECT_LT(max_abs_diff(softmax(xf, 0), exp(ref_log_softmax(x, 0))), 1e-6);
}

TEST(Softmax, WideInnerAndParallelShapes) {
  // inner = 300 spans several column blocks; [64, 1024] and [256, 3, 64] pass the parallel threshold.
  for (const auto& [shape, dim] :
       std::vector<std::pair<Shape, int64_t>>{{{2, 3, 300}, 1}, {{64, 1024}, 1}, {{256, 3, 64}, 1}, {{64, 1024}, 0}}) {
    Tensor x = rand(shape, {.dtype = DType::f32}, -4, 4);
    Tensor ref = ref_log_softmax(x.to(DType::f64), dim);
    // f32 compute: log-sum-exp over up to 1024 terms, values of magnitude <= ~12.
    EXPECT_LT(max_abs_diff(log_softmax(x, dim), ref), 2e-5) << shape_str(shape) << " dim " << dim;
    EXPECT_LT(max_abs_diff(softmax(x, dim), exp(ref)), 1e-6) << shape_str(shape) << " dim " << dim;
  }
}

TEST(Softmax, NonContiguousInputAndScalar) {
  Tensor base = rand({4, 6}, {.dtype = DType::f64}, -1, 1);
  Tensor xt = base.t();  // [6, 4], strided
  EXPECT_LT(max_abs_diff(softmax(xt, 1), exp(ref_log_softmax(xt, 1))), 1e-14);
  Tensor s = scalar_tensor(3.0, {.dtype = DType::f64});
  EXPECT_DOUBLE_EQ(softmax(s, 0).item<double>(), 1.0);
  EXPECT_DOUBLE_EQ(log_softmax(s, -1).item<double>(), 0.0);
}

TEST(Softmax, LargeLogitsDoNotOverflow) {
  // exp(1e4) overflows every float type; max-subtraction makes the result shift-invariant.
  Tensor small = from_vector<float>({0, -1, -2, -3, 1, 0, 2, -5}, {2, 4});
  Tensor big = add(small, 1e4), neg_big = add(small, -1e4);
  for (const Tensor& x : {big, neg_big}) {
    Tensor y = softmax(x, 1), ly = log_softmax(x, 1);
    for (double v : y.to_vector<double>()) EXPECT_TRUE(std::isfinite(v));
    for (double v : ly.to_vector<double>()) EXPECT_TRUE(std::isfinite(v));
    // 1e4 + v in f32 has spacing 2^-10: the shifted logits are exact for these integers.
    EXPECT_LT(max_abs_diff(y, softmax(small, 1)), 1e-6);
    EXPECT_LT(max_abs_diff(ly, log_softmax(small, 1)), 1e-5);
  }
  Tensor t = targets({2, 3});
  const double ce = cross_entropy(big, t).item<double>();
  EXPECT_TRUE(std::isfinite(ce));
  // The loss is evaluated on max-shifted logits (exact here), so it is as accurate as for the small logits;
  // 1e-6 covers f32 rounding of a loss of magnitude ~3.
  EXPECT_NEAR(ce, cross_entropy(small, t).item<double>(), 1e-6);
  Tensor bg = big.clone().requires_grad_(), sg = small.clone().requires_grad_();
  cross_entropy(bg, t, {.label_smoothing = 0.1}).backward();
  cross_entropy(sg, t, {.label_smoothing = 0.1}).backward();
  EXPECT_LT(max_abs_diff(bg.grad(), sg.grad()), 1e-7);  // f32 rounding of probabilities <= 1, divided by N = 2
  Tensor t3 = from_vector<int64_t>({2, 3}, {1, 2});
  EXPECT_NEAR(cross_entropy(big.t().unsqueeze(0), t3).item<double>(), cross_entropy(small, t).item<double>(), 1e-6);
  // Along a non-last dim too (column loop).
  Tensor yc = softmax(big.t(), 0);
  EXPECT_LT(max_abs_diff(yc, softmax(small, 1).t()), 1e-6);
}

TEST(Softmax, Gradcheck) {
  for (int64_t d : {0, 1, -1}) {
    Tensor x = leaf({3, 4, 2});
    expect_ok(gradcheck([d](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax(in[0], d)}; }, {x}));
    expect_ok(
        gradcheck([d](const std::vector<Tensor>& in) { return std::vector<Tensor>{log_softmax(in[0], d)}; }, {x}));
  }
  Tensor x2 = leaf({5, 7});
  expect_ok(gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax(in[0], 0)}; }, {x2}));
  expect_ok(gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax(in[0], -1)}; }, {x2}));
}

TEST(Softmax, Errors) {
  EXPECT_THROW(softmax(ones({2, 3}), 2), Error);
  EXPECT_THROW(softmax(ones({2, 3}), -3), Error);
  try {
    softmax(ones({2, 3}, {.dtype = DType::i64}), 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("softmax"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("floating"), std::string::npos) << e.what();
  }
}

// ------------------------------------------------------------------------------ 16-bit precision

namespace {
// Note [16-bit tolerance table] (tests/test_util.hpp): against the f32 op on the SAME rounded inputs (x16.to(f32)).
// The softmax family's output-rounding bounds, with the f32 row sums' reordering on top:
using mp::test::Tol16;
constexpr double kF32Noise = 4e-6;  // f32 sums may be ordered differently (buffer alignment changes simd peeling)
const Tol16 kOutputRounding[] = {
    {"output rounding", DType::bf16, 1e-7, 0x1p-8 + kF32Noise,
     "bf16 output rounding: relative 2^-8 (8 significant bits)"},
    {"output rounding", DType::f16, 0x1p-25, 0x1p-11 + kF32Noise,
     "f16 output rounding: relative 2^-11 (11 significant bits); absolute 2^-25 below 2^-14 (subnormal spacing 2^-24)"},
};
// The class losses return f32 computed from exactly converted inputs: only summation order differs.
constexpr double kLossRel = 1e-5;  // "f32 loss of the same values: reordering of C <= 64 exp terms"

void expect_close(const Tensor& got, const Tensor& ref, const Tol16& tol, const char* what) {
  auto g = got.to_vector<double>(), r = ref.to_vector<double>();
  ASSERT_EQ(g.size(), r.size());
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_LE(std::abs(g[i] - r[i]), tol.rtol * std::abs(r[i]) + tol.atol)
        << what << " " << dtype_name(tol.dtype) << " element " << i << ": " << g[i] << " vs " << r[i] << " ("
        << tol.reason << ")";
}
}  // namespace

TEST(SoftmaxPrecision, LowPrecisionMatchesF32OnSameInputs) {
  for (const Tol16& tol : kOutputRounding) {
    for (int64_t d : {1, 0}) {
      Tensor x16 = rand({16, 40}, {.dtype = DType::f32}, -6, 6).to(tol.dtype);
      Tensor x32 = x16.to(DType::f32);
      Tensor y = softmax(x16, d), ly = log_softmax(x16, d);
      EXPECT_EQ(y.dtype(), tol.dtype);
      EXPECT_EQ(ly.dtype(), tol.dtype);
      expect_close(y, softmax(x32, d), tol, "softmax");
      expect_close(ly, log_softmax(x32, d), tol, "log_softmax");
    }
  }
}

TEST(SoftmaxPrecision, LowPrecisionBackwardRoundsOnce) {
  for (const Tol16& tol : kOutputRounding) {
    for (bool log : {false, true}) {
      Tensor x16 = rand({8, 33}, {.dtype = DType::f32}, -3, 3).to(tol.dtype).requires_grad_();
      Tensor g16 = rand({8, 33}, {.dtype = DType::f32}, -1, 1).to(tol.dtype);
      Tensor y16 = log ? log_softmax(x16, 1) : softmax(x16, 1);
      y16.backward(g16);
      ASSERT_EQ(x16.grad().dtype(), tol.dtype);
      // Reference from the rounded y and g (what the backward sees), in f64.
      Tensor y = y16.detach().to(DType::f64), g = g16.to(DType::f64);
      Tensor ref = log ? sub(g, mul(exp(y), sum(g, {1}, true))) : mul(y, sub(g, sum(mul(g, y), {1}, true)));
      // The f32 formula cancels (g - sum(g y)): its rounding is relative to |g| ~ 1, hence an absolute 1e-6.
      Tol16 t = tol;
      t.atol += 1e-6;
      expect_close(x16.grad(), ref, t, log ? "log_softmax backward" : "softmax backward");
    }
  }
}

TEST(CrossEntropyPrecision, LowPrecisionLogitsGiveF32LossAndInputDtypeGrad) {
  for (const Tol16& tol : kOutputRounding) {
    Tensor x16 = rand({12, 64}, {.dtype = DType::f32}, -8, 8).to(tol.dtype).requires_grad_();
    Tensor t = randint(0, 64, {12});
    t.data_ptr<int64_t>()[3] = -100;
    const CrossEntropyOptions opt{.label_smoothing = 0.1};
    Tensor loss = cross_entropy(x16, t, opt);
    EXPECT_EQ(loss.dtype(), DType::f32);
    Tensor x32 = x16.detach().to(DType::f32).requires_grad_();
    Tensor ref = cross_entropy(x32, t, opt);
    EXPECT_NEAR(loss.item<double>(), ref.item<double>(), kLossRel * std::abs(ref.item<double>()));
    Tensor none16 = cross_entropy(x16, t, {.label_smoothing = 0.1, .reduction = Reduction::none});
    Tensor none32 = cross_entropy(x32, t, {.label_smoothing = 0.1, .reduction = Reduction::none});
    expect_close(none16, none32, {"f32 loss", tol.dtype, 1e-7, kLossRel, "f32 loss of the same values"},
                 "cross_entropy none");
    loss.backward();
    ref.backward();
    EXPECT_EQ(x16.grad().dtype(), tol.dtype);
    // Gradient: same f32 computation, rounded once to 16 bits.
    expect_close(x16.grad(), x32.grad(), tol, "cross_entropy backward");
  }
}

// ------------------------------------------------------------------------------------ cross entropy

TEST(CrossEntropy, HandComputed) {
  // logits [1, 2]: loss of target 1 = log(e^0 + e^1) - 1 = log(1 + e) - 1.
  Tensor x = from_vector<double>({0, 1}, {1, 2});
  EXPECT_NEAR(cross_entropy(x, targets({1})).item<double>(), std::log(1 + std::exp(1.0)) - 1, 1e-15);
  EXPECT_NEAR(cross_entropy(x, targets({0})).item<double>(), std::log(1 + std::exp(1.0)), 1e-15);
  // Label smoothing 0.2 with C = 2: 0.8 * nll_t + 0.2 * mean(-log p).
  const double lse = std::log(1 + std::exp(1.0));
  const double want = 0.8 * (lse - 1) + 0.2 * 0.5 * ((lse - 0) + (lse - 1));
  EXPECT_NEAR(cross_entropy(x, targets({1}), {.label_smoothing = 0.2}).item<double>(), want, 1e-15);
}

TEST(CrossEntropy, EqualsMeanOfGatheredLogSoftmax) {
  Tensor x = rand({9, 6}, {.dtype = DType::f64}, -3, 3);
  Tensor t = targets({0, 5, 2, 2, 3, 1, 4, 0, 5});
  Tensor rows = ref_ce_rows(x, t, 0.0, -100);
  EXPECT_NEAR(cross_entropy(x, t).item<double>(), mean(rows).item<double>(), 1e-14);
  EXPECT_NEAR(cross_entropy(x, t, {.reduction = Reduction::sum}).item<double>(), sum(rows).item<double>(), 1e-13);
  EXPECT_LT(max_abs_diff(cross_entropy(x, t, {.reduction = Reduction::none}), rows), 1e-14);
  // f32 logits: same values to f32 accuracy, f32 loss.
  Tensor l32 = cross_entropy(x.to(DType::f32), t);
  EXPECT_EQ(l32.dtype(), DType::f32);
  EXPECT_NEAR(l32.item<double>(), mean(rows).item<double>(), 1e-5);
}

TEST(CrossEntropy, IgnoreIndexAndLabelSmoothing) {
  Tensor x = rand({7, 5}, {.dtype = DType::f64}, -3, 3);
  Tensor t = targets({0, 4, -1, 2, -1, 3, 1});
  const double eps = 0.25;
  Tensor rows = ref_ce_rows(x, t, eps, -1);
  const CrossEntropyOptions opt{.ignore_index = -1, .label_smoothing = eps};
  // The mean divides by the 5 non-ignored targets, not by N = 7.
  EXPECT_NEAR(cross_entropy(x, t, opt).item<double>(), sum(rows).item<double>() / 5.0, 1e-14);
  Tensor none = cross_entropy(x, t, {.ignore_index = -1, .label_smoothing = eps, .reduction = Reduction::none});
  EXPECT_LT(max_abs_diff(none, rows), 1e-14);
  EXPECT_EQ(none.to_vector<double>()[2], 0.0);
  // nll_loss(log_softmax(x)) is the same loss under every option.
  for (Reduction r : {Reduction::none, Reduction::mean, Reduction::sum}) {
    const CrossEntropyOptions o{.ignore_index = -1, .label_smoothing = eps, .reduction = r};
    EXPECT_LT(max_abs_diff(nll_loss(log_softmax(x, 1), t, o), cross_entropy(x, t, o)), 1e-14);
  }
  // Every target ignored: the mean is 0/0 = NaN, as in PyTorch.
  EXPECT_TRUE(std::isnan(cross_entropy(x, full({7}, -1.0, {.dtype = DType::i64}), opt).item<double>()));
}

TEST(CrossEntropy, SpatialFormMatchesFlattenedRows) {
  // [N, C, d1, d2] with class dim 1 equals the [N*d1*d2, C] form after moving C last.
  Tensor x = rand({2, 4, 3, 5}, {.dtype = DType::f64}, -3, 3);
  Tensor t = randint(0, 4, {2, 3, 5});
  t.data_ptr<int64_t>()[7] = 9;  // ignored below
  const CrossEntropyOptions opt{.ignore_index = 9, .label_smoothing = 0.1, .reduction = Reduction::none};
  Tensor spatial = cross_entropy(x, t, opt);
  EXPECT_EQ(spatial.sizes(), (Shape{2, 3, 5}));
  Tensor flat = cross_entropy(x.permute({0, 2, 3, 1}).reshape({-1, 4}), t.reshape({-1}), opt);
  EXPECT_LT(max_abs_diff(spatial.reshape({-1}), flat), 1e-14);
  EXPECT_LT(max_abs_diff(flat, ref_ce_rows(x.permute({0, 2, 3, 1}).reshape({-1, 4}), t.reshape({-1}), 0.1, 9)), 1e-14);
  // Wide spatial dim (several column blocks) and the parallel threshold, in f32.
  Tensor xw = rand({4, 10, 1000}, {.dtype = DType::f32}, -3, 3);
  Tensor tw = randint(0, 10, {4, 1000});
  Tensor ref = mean(ref_ce_rows(xw.permute({0, 2, 1}).reshape({-1, 10}), tw.reshape({-1}), 0.0, -100));
  EXPECT_NEAR(cross_entropy(xw, tw).item<double>(), ref.item<double>(), 1e-5);  // f32 mean of 4000 losses
}

TEST(CrossEntropy, SingleSampleForm) {
  Tensor x = from_vector<double>({0.5, -1, 2}, {3});
  Tensor t = full({}, 2.0, {.dtype = DType::i64});
  const double lse = std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(2.0));
  EXPECT_NEAR(cross_entropy(x, t).item<double>(), lse - 2.0, 1e-15);
  EXPECT_EQ(cross_entropy(x, t, {.reduction = Reduction::none}).dim(), 0);
}

TEST(CrossEntropy, I32TargetsAccepted) {
  Tensor x = rand({4, 3}, {.dtype = DType::f64});
  Tensor t64 = targets({0, 2, 1, 1});
  EXPECT_DOUBLE_EQ(cross_entropy(x, t64.to(DType::i32)).item<double>(), cross_entropy(x, t64).item<double>());
}

TEST(CrossEntropy, GradientIsSoftmaxMinusOneHot) {
  Tensor x = rand({3, 4}, {.dtype = DType::f64}).requires_grad_();
  Tensor t = targets({1, 3, 0});
  cross_entropy(x, t).backward();
  Tensor p = softmax(x.detach(), 1);
  Tensor onehot = eq(arange(4).reshape({1, 4}), t.reshape({3, 1})).to(DType::f64);
  EXPECT_LT(max_abs_diff(x.grad(), div(sub(p, onehot), full({}, 3.0, {.dtype = DType::f64}))), 1e-15);
}

TEST(CrossEntropy, Gradcheck) {
  Tensor t = targets({0, 4, 2, 2, 1, 3});
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
    Tensor x = leaf({6, 5});
    expect_ok(gradcheck(
        [t, r](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{cross_entropy(in[0], t, {.reduction = r})};
        },
        {x}));
  }
  // ignore_index + label smoothing.
  Tensor ti = targets({0, -100, 2, 2, -100, 3});
  Tensor x = leaf({6, 5});
  expect_ok(gradcheck(
      [ti](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{cross_entropy(in[0], ti, {.label_smoothing = 0.3})};
      },
      {x}));
  // [N, C, d] form with ignore_index and smoothing, every reduction.
  Tensor ts = from_vector<int64_t>({0, 2, 7, 1, 1, 0, 7, 2}, {2, 4});
  for (Reduction r : {Reduction::mean, Reduction::none}) {
    Tensor xs = leaf({2, 3, 4});
    expect_ok(gradcheck(
        [ts, r](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{
              cross_entropy(in[0], ts, {.ignore_index = 7, .label_smoothing = 0.2, .reduction = r})};
        },
        {xs}));
  }
}

TEST(NllLoss, ValuesAndGradcheck) {
  Tensor lp = log_softmax(rand({4, 3}, {.dtype = DType::f64}), 1);
  Tensor t = targets({2, 0, 1, 2});
  auto v = lp.to_vector<double>();
  const double want = -(v[2] + v[3] + v[7] + v[11]) / 4;
  EXPECT_NEAR(nll_loss(lp, t).item<double>(), want, 1e-15);
  Tensor x = leaf({4, 3}, -3, -0.1);
  Tensor ti = targets({2, -100, 1, 2});
  expect_ok(gradcheck(
      [ti](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{nll_loss(in[0], ti, {.label_smoothing = 0.1})};
      },
      {x}));
  Tensor xs = leaf({2, 3, 2}, -3, -0.1);
  Tensor ts = from_vector<int64_t>({0, 2, 1, -100}, {2, 2});
  expect_ok(gradcheck(
      [ts](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{nll_loss(in[0], ts, {.reduction = Reduction::sum})};
      },
      {xs}));
}

TEST(CrossEntropy, Errors) {
  Tensor x = rand({3, 5});
  auto expect_msg = [](const std::function<void()>& f, std::vector<std::string> parts) {
    try {
      f();
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  // Out-of-range target: names the target value and C.
  expect_msg([&] { cross_entropy(x, targets({0, 7, 1})); }, {"cross_entropy", "target 7", "5 classes"});
  expect_msg([&] { cross_entropy(x, targets({0, -3, 1})); }, {"target -3", "5 classes"});
  expect_msg([&] { nll_loss(x, targets({5, 0, 1})); }, {"nll_loss", "target 5", "5 classes"});
  // Spatial form reports it too.
  expect_msg(
      [&] {
        cross_entropy(rand({1, 2, 3}), from_vector<int64_t>({0, 1, 2}, {1, 3}));
      },
      {"target 2", "2 classes"});
  expect_msg([&] { cross_entropy(x, targets({0, 1})); }, {"cross_entropy", "[3]", "[2]"});
  expect_msg([&] { cross_entropy(x, rand({3})); }, {"i64", "f32"});
  expect_msg([&] { cross_entropy(x, targets({0, 1, 2}), {.label_smoothing = 1.5}); }, {"label_smoothing", "1.5"});
  expect_msg([&] { cross_entropy(x.to(DType::i64), targets({0, 1, 2})); }, {"floating"});
}

// ------------------------------------------------------------------------------------------ mse

TEST(MseLoss, ValuesReductionsAndErrors) {
  Tensor a = from_vector<double>({1, 2, 3, 4}, {2, 2});
  Tensor b = from_vector<double>({0, 2, 5, 1}, {2, 2});
  EXPECT_DOUBLE_EQ(mse_loss(a, b).item<double>(), (1 + 0 + 4 + 9) / 4.0);
  EXPECT_DOUBLE_EQ(mse_loss(a, b, Reduction::sum).item<double>(), 14.0);
  EXPECT_EQ(mse_loss(a, b, Reduction::none).to_vector<double>(), (std::vector<double>{1, 0, 4, 9}));
  try {
    mse_loss(a, ones({2, 1}, {.dtype = DType::f64}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 2]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 1]"), std::string::npos) << e.what();
  }
}

TEST(MseLoss, SixteenBitComputesInF32) {
  // A difference of 300 squares to 90000 > 65504, the f16 maximum: f32 compute keeps it finite.
  Tensor a = full({4}, 300.0, {.dtype = DType::f16}).requires_grad_();
  Tensor b = zeros({4}, {.dtype = DType::f16});
  Tensor l = mse_loss(a, b);
  EXPECT_EQ(l.dtype(), DType::f32);
  EXPECT_DOUBLE_EQ(l.item<double>(), 90000.0);
  l.backward();
  EXPECT_EQ(a.grad().dtype(), DType::f16);
  EXPECT_DOUBLE_EQ(a.grad().to_vector<double>()[0], 150.0);  // 2 * 300 / 4
}

TEST(MseLoss, Gradcheck) {
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
    Tensor a = leaf({3, 4}), b = leaf({3, 4});
    expect_ok(gradcheck([r](const std::vector<Tensor>& in) { return std::vector<Tensor>{mse_loss(in[0], in[1], r)}; },
                        {a, b}));
  }
}

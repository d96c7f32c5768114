// scaled_dot_product_attention: the fused CPU kernel against a naive f64 loop and the composite of other ops
// (forward values and the three gradients), f64 gradient checks, the causal rule for Tq != Tk, masks, 16-bit
// tolerances, dropout (determinism, keep rate, gradients under the forward's mask), memory O(T), autocast and
// every refusal's message.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "mp/mp.hpp"
#include "ops/attention_composite.hpp"
#include "test_util.hpp"

using namespace mp;
using autograd::gradcheck;

namespace {
using mp::test::expect_error;
using mp::test::expect_ok;
using mp::test::leaf;

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class MaskKind { none, keep, additive };

struct Case {
  int64_t B, H, Tq, Tk, D;
  bool causal = false;
  MaskKind mask = MaskKind::none;
  Shape mask_shape = {};
};

std::string name_of(const Case& c) {
  std::ostringstream os;
  os << "B" << c.B << " H" << c.H << " Tq" << c.Tq << " Tk" << c.Tk << " D" << c.D << (c.causal ? " causal" : "");
  if (c.mask != MaskKind::none)
    os << (c.mask == MaskKind::keep ? " bool mask " : " additive mask ") << shape_str(c.mask_shape);
  return os.str();
}

// Sizes that cover: one tile and several, T not a multiple of the tile (64), Tq != Tk both ways, T = 1,
// D = 8, 64, 80 (not a multiple of the 16 f32 lanes), broadcast masks of every rank.
std::vector<Case> cases() {
  return {
      {2, 3, 5, 7, 8},
      {2, 3, 5, 7, 8, true},
      {1, 2, 70, 130, 64, false, MaskKind::keep, {70, 130}},
      {1, 2, 130, 70, 64, true},
      {1, 2, 70, 130, 64, true},
      {2, 1, 65, 64, 80, false, MaskKind::additive, {2, 1, 65, 64}},
      {1, 1, 1, 1, 8},
      {1, 1, 1, 1, 8, true},
      {1, 2, 129, 1, 16, false, MaskKind::additive, {1, 2, 1, 1}},
      {2, 2, 33, 97, 24, false, MaskKind::keep, {2, 1, 33, 97}},
  };
}

// The mask of a case: a random keep pattern (about 70% kept) or random additive values with about 20% -inf.
Tensor make_mask(const Case& c, DType dt = DType::f32) {
  if (c.mask == MaskKind::none) return Tensor();
  Tensor u = rand(c.mask_shape, {.dtype = DType::f64});
  if (c.mask == MaskKind::keep) return gt(u, full({}, 0.3, {.dtype = DType::f64}));
  Tensor vals = randn(c.mask_shape, {.dtype = DType::f64});
  return where(gt(u, full({}, 0.2, {.dtype = DType::f64})), vals, full({}, -kInf, {.dtype = DType::f64})).to(dt);
}

// softmax(q k^T scale + mask) v by loops in double, from the definition (PyTorch's rules: causal masks key j > i;
// a row with every key masked gives 0). q [B, H, Tq, D], k/v [B, H, Tk, D]; mask undefined or broadcastable.
std::vector<double> naive(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                          double scale) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3), Tk = k.size(2);
  const auto Q = q.to_vector<double>(), K = k.to_vector<double>(), V = v.to_vector<double>();
  std::vector<double> M;
  if (mask.defined()) {
    Tensor m4 = mask.expand({B, H, Tq, Tk}).contiguous();
    M = m4.to(DType::f64).to_vector<double>();
    if (mask.dtype() == DType::b8)
      for (double& x : M) x = x != 0 ? 0.0 : -kInf;
  }
  std::vector<double> out(static_cast<size_t>(B * H * Tq * D), 0.0), s(static_cast<size_t>(Tk));
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < Tq; ++i) {
      double mx = -kInf;
      for (int64_t j = 0; j < Tk; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) acc += Q[(bh * Tq + i) * D + d] * K[(bh * Tk + j) * D + d];
        acc *= scale;
        if (!M.empty()) acc += M[(bh * Tq + i) * Tk + j];
        if (causal && j > i) acc = -kInf;
        s[j] = acc;
        mx = std::max(mx, acc);
      }
      if (mx == -kInf) continue;
      double sum = 0;
      for (int64_t j = 0; j < Tk; ++j) sum += (s[j] = std::exp(s[j] - mx));
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t d = 0; d < D; ++d) out[(bh * Tq + i) * D + d] += s[j] / sum * V[(bh * Tk + j) * D + d];
    }
  return out;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}
double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return max_abs_diff(a.to_vector<double>(), b.to_vector<double>());
}
double max_abs(const Tensor& a) {
  double m = 0;
  for (double x : a.to_vector<double>()) m = std::max(m, std::abs(x));
  return m;
}

struct Grads {
  Tensor out, dq, dk, dv;
};

// Output and gradients of `fn` for q, k, v (copied into fresh leaves) and upstream gradient g.
template <class Fn>
Grads run(const Fn& fn, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g) {
  Tensor ql = q.detach().clone().requires_grad_(), kl = k.detach().clone().requires_grad_(),
         vl = v.detach().clone().requires_grad_();
  Tensor out = fn(ql, kl, vl);
  out.backward(g);
  return {out.detach(), ql.grad(), kl.grad(), vl.grad()};
}

AttentionOptions opts_of(const Case& c, const Tensor& mask) { return {.causal = c.causal, .mask = mask}; }

}  // namespace

// ------------------------------------------------------------------------------- values and gradients

TEST(Attention, ForwardMatchesNaiveLoopsInF64) {
  manual_seed(1);
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    const TensorOptions f64{.dtype = DType::f64};
    Tensor q = randn({c.B, c.H, c.Tq, c.D}, f64), k = randn({c.B, c.H, c.Tk, c.D}, f64),
           v = randn({c.B, c.H, c.Tk, c.D}, f64);
    Tensor mask = make_mask(c, DType::f64);
    const auto ref = naive(q, k, v, mask, c.causal, 1.0 / std::sqrt(static_cast<double>(c.D)));
    // f64 throughout: only summation order differs from the loops.
    EXPECT_LT(max_abs_diff(scaled_dot_product_attention(q, k, v, opts_of(c, mask)).to_vector<double>(), ref), 1e-12);
    EXPECT_LT(max_abs_diff(detail::sdpa_composite(q, k, v, opts_of(c, mask)).to_vector<double>(), ref), 1e-12);
  }
}

TEST(Attention, F32ForwardMatchesNaiveLoops) {
  manual_seed(2);
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    Tensor q = randn({c.B, c.H, c.Tq, c.D}), k = randn({c.B, c.H, c.Tk, c.D}), v = randn({c.B, c.H, c.Tk, c.D});
    Tensor mask = make_mask(c);
    const auto ref = naive(q, k, v, mask, c.causal, 1.0 / std::sqrt(static_cast<double>(c.D)));
    // f32 products over D <= 80 and sums over Tk <= 130 of randn values, and fast_exp (~1 ulp): a few 1e-6.
    EXPECT_LT(max_abs_diff(scaled_dot_product_attention(q, k, v, opts_of(c, mask)).to_vector<double>(), ref), 2e-5);
  }
}

TEST(Attention, GradientsMatchTheCompositeInF64) {
  manual_seed(3);
  for (const Case& c : cases()) {
    SCOPED_TRACE(name_of(c));
    const TensorOptions f64{.dtype = DType::f64};
    Tensor q = randn({c.B, c.H, c.Tq, c.D}, f64), k = randn({c.B, c.H, c.Tk, c.D}, f64),
           v = randn({c.B, c.H, c.Tk, c.D}, f64), g = randn({c.B, c.H, c.Tq, c.D}, f64);
    Tensor mask = make_mask(c, DType::f64);
    const AttentionOptions o = opts_of(c, mask);
    const Grads fused =
        run([&](auto& a, auto& b, auto& d) { return scaled_dot_product_attention(a, b, d, o); }, q, k, v, g);
    const Grads comp = run([&](auto& a, auto& b, auto& d) { return detail::sdpa_composite(a, b, d, o); }, q, k, v, g);
    EXPECT_LT(max_abs_diff(fused.out, comp.out), 1e-12);
    EXPECT_LT(max_abs_diff(fused.dq, comp.dq), 1e-11);
    EXPECT_LT(max_abs_diff(fused.dk, comp.dk), 1e-11);
    EXPECT_LT(max_abs_diff(fused.dv, comp.dv), 1e-11);
  }
}

TEST(Attention, GradcheckOfTheFusedKernel) {
  manual_seed(4);
  for (const Case& c : std::vector<Case>{{1, 2, 3, 5, 4},
                                         {1, 1, 6, 4, 3, true},
                                         {1, 1, 70, 67, 2, true},
                                         {2, 1, 4, 66, 3, false, MaskKind::additive, {2, 1, 4, 66}},
                                         {1, 2, 5, 3, 4, false, MaskKind::keep, {5, 3}}}) {
    SCOPED_TRACE(name_of(c));
    Tensor mask = make_mask(c, DType::f64);
    const AttentionOptions o = opts_of(c, mask);
    expect_ok(gradcheck(
        [&](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], o)};
        },
        {leaf({c.B, c.H, c.Tq, c.D}), leaf({c.B, c.H, c.Tk, c.D}), leaf({c.B, c.H, c.Tk, c.D})}));
  }
}

TEST(Attention, ExplicitScaleAndThreeDInputs) {
  manual_seed(5);
  const TensorOptions f64{.dtype = DType::f64};
  Tensor q = randn({2, 9, 8}, f64), k = randn({2, 11, 8}, f64), v = randn({2, 11, 8}, f64);
  Tensor out = scaled_dot_product_attention(q, k, v, {.causal = true, .scale = 0.3});
  EXPECT_EQ(out.sizes(), (Shape{2, 9, 8}));
  const auto ref = naive(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), Tensor(), true, 0.3);
  EXPECT_LT(max_abs_diff(out.to_vector<double>(), ref), 1e-12);
  // A 3-D mask [B, Tq, Tk] lines up with 3-D inputs.
  Tensor mask = gt(rand({2, 9, 11}, f64), full({}, 0.5, f64));
  const auto ref_m = naive(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), mask.unsqueeze(1), false, 0.3);
  EXPECT_LT(
      max_abs_diff(scaled_dot_product_attention(q, k, v, {.mask = mask, .scale = 0.3}).to_vector<double>(), ref_m),
      1e-12);
}

// PyTorch's is_causal is top-left aligned (torch.ones(Tq, Tk).tril()): query i sees keys 0..i, whatever Tk.
TEST(Attention, CausalIsTopLeftAlignedForTqNotTk) {
  const TensorOptions f64{.dtype = DType::f64};
  // v's rows are one-hot, so each output row is the query's weights over the keys.
  Tensor q = zeros({1, 1, 3, 5}, f64), k = zeros({1, 1, 5, 5}, f64);
  Tensor v = from_vector(std::vector<double>{1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1},
                         {1, 1, 5, 5});
  const auto w = scaled_dot_product_attention(q, k, v, {.causal = true}).to_vector<double>();
  const std::vector<double> expect{1, 0, 0, 0, 0, 0.5, 0.5, 0, 0, 0, 1.0 / 3, 1.0 / 3, 1.0 / 3, 0, 0};
  EXPECT_LT(max_abs_diff(w, expect), 1e-15);
  // Tq > Tk: rows from Tk on see every key.
  Tensor q5 = zeros({1, 1, 5, 2}, f64), k2 = zeros({1, 1, 2, 2}, f64);
  Tensor v2 = from_vector(std::vector<double>{1, 0, 0, 1}, {1, 1, 2, 2});
  const auto w2 = scaled_dot_product_attention(q5, k2, v2, {.causal = true}).to_vector<double>();
  EXPECT_LT(max_abs_diff(w2, std::vector<double>{1, 0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5}), 1e-15);
}

// A query row whose keys are all masked gives 0 and passes no gradient (PyTorch >= 2.5); the others are finite.
TEST(Attention, FullyMaskedRowGivesZeroAndFiniteGradients) {
  manual_seed(6);
  const TensorOptions f64{.dtype = DType::f64};
  std::vector<double> pattern(4 * 70, 1.0);
  std::fill(pattern.begin() + 2 * 70, pattern.begin() + 3 * 70, 0.0);
  const Tensor keep = gt(from_vector(pattern, {4, 70}), full({}, 0.5, f64));
  for (bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "composite");
    Tensor q = randn({1, 1, 4, 8}, f64), k = randn({1, 1, 70, 8}, f64), v = randn({1, 1, 70, 8}, f64);
    const auto fn = [&](auto& a, auto& b, auto& d) {
      return fused ? scaled_dot_product_attention(a, b, d, {.mask = keep})
                   : detail::sdpa_composite(a, b, d, {.mask = keep});
    };
    const Grads r = run(fn, q, k, v, ones({1, 1, 4, 8}, f64));
    EXPECT_EQ(max_abs(r.out.select(2, 2)), 0.0);
    EXPECT_EQ(max_abs(r.dq.select(2, 2)), 0.0);
    for (const Tensor& t : {r.out, r.dq, r.dk, r.dv})
      for (double x : t.to_vector<double>()) ASSERT_TRUE(std::isfinite(x));
  }
}

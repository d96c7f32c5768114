// scaled_dot_product_attention: the fused CPU kernel against a naive f64 loop and the composite of other ops
// (forward values and the three gradients), f64 gradient checks, the causal rule for Tq != Tk, masks, 16-bit
// tolerances, dropout (determinism, keep rate, gradients under the forward's mask), memory O(T), autocast and
// every refusal's message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

#include "backend/cpu/loops.hpp"
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

// ------------------------------------------------------------------------------------------- 16-bit

// Against the f64 result of the same (already 16-bit) inputs. f16 inputs (and bf16 without AVX512-BF16) are
// widened exactly, everything runs in f32 and each output is rounded once: at most the unit roundoff u (2^-8
// relative for bf16, 2^-11 for f16) plus f32 error (~1e-6 relative), bounded here per tensor by u times the
// tensor's largest magnitude; dv likewise, dq and dk two roundings (below). bf16 on VDPBF16PS also rounds each
// weight P and each dS to bf16 before the products with them (Note [fused attention]): out_i gains
// sum_j P_ij e_ij v_j with |e| <= u, at most u (P |v|)_i, and dv_j at most u (P^T |dO|)_j, which the f64
// attention of |v| and its gradient for |dO| give; both bounds are checked per element. The per-tensor bounds
// still hold there: the roundings' signs vary, so their sums stay near one rounding.
TEST(Attention, SixteenBitIsOneRoundingOfTheF64Result) {
  manual_seed(7);
  // Both ways of forming the bf16 products: VDPBF16PS on bf16 pairs (AVX512-BF16 CPUs) and f32 products of
  // the widened operands (with the AVX-512 loops off); D = 7 pads the last pair, odd T the last row pair.
  for (bool avx512 : {true, false}) {
    const bool before = backend::cpu::set_avx512_loops(avx512);
    for (DType dt : {DType::bf16, DType::f16}) {
      const double tol = dt == DType::bf16 ? 0x1p-8 : 0x1p-11;
      for (const Case& c : std::vector<Case>{{2, 2, 70, 130, 64, true},
                                             {1, 3, 33, 65, 80, false, MaskKind::keep, {33, 65}},
                                             {1, 2, 67, 70, 7, true}}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + name_of(c) + (avx512 ? "" : " without AVX-512"));
        Tensor q = randn({c.B, c.H, c.Tq, c.D}).to(dt), k = randn({c.B, c.H, c.Tk, c.D}).to(dt),
               v = randn({c.B, c.H, c.Tk, c.D}).to(dt), g = randn({c.B, c.H, c.Tq, c.D}).to(dt);
        Tensor mask = make_mask(c);
        const AttentionOptions o = opts_of(c, mask);
        const auto fn = [&](auto& a, auto& b, auto& d) { return scaled_dot_product_attention(a, b, d, o); };
        const Grads low = run(fn, q, k, v, g);
        const Tensor q64 = q.to(DType::f64), k64 = k.to(DType::f64), v64 = v.to(DType::f64), g64 = g.to(DType::f64);
        const Grads ref = run(fn, q64, k64, v64, g64);
        EXPECT_EQ(low.out.dtype(), dt);
        EXPECT_EQ(low.dq.dtype(), dt);
        EXPECT_LE(max_abs_diff(low.out, ref.out), tol * max_abs(ref.out));
        // dq and dk also carry the output's rounding: the backward reads the stored 16-bit O in
        // D_i = rowsum(dO o O) (as FlashAttention does), a second term of the size of one rounding.
        EXPECT_LE(max_abs_diff(low.dq, ref.dq), 2 * tol * max_abs(ref.dq));
        EXPECT_LE(max_abs_diff(low.dk, ref.dk), 2 * tol * max_abs(ref.dk));
        EXPECT_LE(max_abs_diff(low.dv, ref.dv), tol * max_abs(ref.dv));
        if (dt == DType::bf16) {  // per element: the output's rounding and the weights'
          const Grads wabs = run(fn, q64, k64, abs(v64), abs(g64));
          const auto within = [](const Tensor& got, const Tensor& want, const Tensor& weighted) {
            const auto a = got.to_vector<double>(), b = want.to_vector<double>(), w = weighted.to_vector<double>();
            double worst = 0;  // largest error / bound
            for (size_t i = 0; i < a.size(); ++i)
              worst = std::max(worst, std::abs(a[i] - b[i]) / (0x1p-8 * (1.01 * (std::abs(b[i]) + w[i])) + 1e-30));
            return worst;
          };
          EXPECT_LE(within(low.out, ref.out, wabs.out), 1.0);
          EXPECT_LE(within(low.dv, ref.dv, wabs.dv), 1.0);
        }
      }
    }
    backend::cpu::set_avx512_loops(before);
  }
}

// With dropout the 16-bit kernel keeps the f64 kernel's mask (the same stream positions) and its bounds.
TEST(Attention, SixteenBitDropoutKeepsTheMaskAndTheBounds) {
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const double tol = dt == DType::bf16 ? 0x1p-8 : 0x1p-11;
    manual_seed(9);
    Tensor q = randn({2, 2, 75, 32}).to(dt), k = randn({2, 2, 75, 32}).to(dt), v = randn({2, 2, 75, 32}).to(dt),
           g = randn({2, 2, 75, 32}).to(dt);
    const auto fn = [&](auto& a, auto& b, auto& d) {
      return scaled_dot_product_attention(a, b, d, {.causal = true, .dropout_p = 0.25});
    };
    manual_seed(21);
    const Grads low = run(fn, q, k, v, g);
    manual_seed(21);
    const Grads ref = run(fn, q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), g.to(DType::f64));
    // A dropped weight is exactly 0 on both sides (another mask would miss by O(1)); kept ones are 1 / (1 - p)
    // times the weight. Bounds as in the test above: out one rounding, dq and dk two; dv two, because on
    // VDPBF16PS each kept weight is also rounded and with fewer, larger weights their errors average less
    // (measured in units of tol: out 0.86 / 0.51, dq 1.53 / 1.47, dk 1.68 / 1.21, dv 1.08 / 0.80 for bf16 / f16).
    EXPECT_LE(max_abs_diff(low.out, ref.out), tol * max_abs(ref.out));
    EXPECT_LE(max_abs_diff(low.dq, ref.dq), 2 * tol * max_abs(ref.dq));
    EXPECT_LE(max_abs_diff(low.dk, ref.dk), 2 * tol * max_abs(ref.dk));
    EXPECT_LE(max_abs_diff(low.dv, ref.dv), 2 * tol * max_abs(ref.dv));
  }
}

// The composite rounds the scores and the weights to 16 bits before its second matmul (as PyTorch's math
// path does); the fused kernel forms the scores in f32 (and rounds only the weights, on VDPBF16PS), so it is
// at least as close to f64 as the composite is.
TEST(Attention, FusedBf16IsAtLeastAsCloseToF64AsTheComposite) {
  manual_seed(8);
  Tensor q = randn({2, 2, 100, 64}).to(DType::bf16), k = randn({2, 2, 100, 64}).to(DType::bf16),
         v = randn({2, 2, 100, 64}).to(DType::bf16);
  const AttentionOptions o{.causal = true};
  const Tensor ref = scaled_dot_product_attention(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), o);
  const double fused = max_abs_diff(scaled_dot_product_attention(q, k, v, o), ref);
  const double comp = max_abs_diff(detail::sdpa_composite(q, k, v, o), ref);
  EXPECT_LE(fused, comp);
  EXPECT_GT(comp, 0.0);
}

// --------------------------------------------------------------------------------------------- dropout

TEST(Attention, DropoutIsReproducibleFromTheSeed) {
  Tensor q = randn({2, 3, 70, 16}), k = randn({2, 3, 90, 16}), v = randn({2, 3, 90, 16});
  const AttentionOptions o{.dropout_p = 0.3};
  manual_seed(11);
  const Tensor a = scaled_dot_product_attention(q, k, v, o);
  const Tensor b = scaled_dot_product_attention(q, k, v, o);  // the stream moved on: another mask
  manual_seed(11);
  const Tensor c = scaled_dot_product_attention(q, k, v, o);
  EXPECT_TRUE(mp::test::bitwise_equal(a, c));
  EXPECT_GT(max_abs_diff(a, b), 0.1);
  // Without dropout the stream is not touched.
  manual_seed(11);
  (void)scaled_dot_product_attention(q, k, v);
  EXPECT_EQ(default_generator().offset(), 0u);
}

// With equal scores every weight is 1 / Tk, and v = identity makes the output the weights themselves: each
// is 0 (dropped) or 1 / (Tk (1 - p)). Over 4 * 128 * 128 = 65536 weights the kept share has standard deviation
// sqrt(p (1 - p) / 65536) = 0.0018 at p = 0.3; 0.01 is more than 5 of them.
TEST(Attention, DropoutKeepsAboutOneMinusP) {
  manual_seed(12);
  const int64_t T = 128;
  const double p = 0.3;
  Tensor q = zeros({4, 1, T, T}), k = zeros({4, 1, T, T});
  std::vector<float> eye(static_cast<size_t>(T * T), 0.0f);
  for (int64_t i = 0; i < T; ++i) eye[static_cast<size_t>(i * T + i)] = 1.0f;
  Tensor v = from_vector(eye, {1, 1, T, T}).expand({4, 1, T, T});
  const auto w = scaled_dot_product_attention(q, k, v, {.dropout_p = p}).to_vector<double>();
  const double kept_value = 1.0 / (static_cast<double>(T) * (1.0 - p));
  int64_t kept = 0;
  for (double x : w) {
    if (x != 0.0) {
      ++kept;
      EXPECT_NEAR(x, kept_value, 1e-6 * kept_value);
    }
  }
  EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(w.size()), 1.0 - p, 0.01);
}

// The fused kernel and the composite (dropout of the [B, H, Tq, Tk] weights) draw the same mask from the same
// stream position (Note [fused attention]), so at one seed their outputs and all gradients agree in f64: the
// backward regenerates exactly the forward's mask.
TEST(Attention, DropoutGradientsUseTheForwardsMask) {
  for (const Case& c :
       std::vector<Case>{{2, 3, 70, 67, 8, true}, {1, 2, 5, 130, 16, false, MaskKind::keep, {5, 130}}}) {
    SCOPED_TRACE(name_of(c));
    manual_seed(13);
    const TensorOptions f64{.dtype = DType::f64};
    Tensor q = randn({c.B, c.H, c.Tq, c.D}, f64), k = randn({c.B, c.H, c.Tk, c.D}, f64),
           v = randn({c.B, c.H, c.Tk, c.D}, f64), g = randn({c.B, c.H, c.Tq, c.D}, f64);
    AttentionOptions o = opts_of(c, make_mask(c, DType::f64));
    o.dropout_p = 0.25;
    manual_seed(14);
    const Grads fused =
        run([&](auto& a, auto& b, auto& d) { return scaled_dot_product_attention(a, b, d, o); }, q, k, v, g);
    manual_seed(14);
    const Grads comp = run([&](auto& a, auto& b, auto& d) { return detail::sdpa_composite(a, b, d, o); }, q, k, v, g);
    EXPECT_LT(max_abs_diff(fused.out, comp.out), 1e-12);
    EXPECT_LT(max_abs_diff(fused.dq, comp.dq), 1e-11);
    EXPECT_LT(max_abs_diff(fused.dk, comp.dk), 1e-11);
    EXPECT_LT(max_abs_diff(fused.dv, comp.dv), 1e-11);
    // And the mask did something: without dropout the output differs.
    manual_seed(14);
    EXPECT_GT(max_abs_diff(fused.out, scaled_dot_product_attention(q, k, v, opts_of(c, o.mask))), 1e-3);
  }
}

// A central-difference check of the fused kernel with dropout: each evaluation reseeds, so every one of
// gradcheck's forward passes draws the same mask as the one it differentiates.
TEST(Attention, DropoutGradcheckAtAFixedSeed) {
  const AttentionOptions o{.causal = true, .dropout_p = 0.4};
  expect_ok(gradcheck(
      [&](const std::vector<Tensor>& in) {
        manual_seed(15);
        return std::vector<Tensor>{scaled_dot_product_attention(in[0], in[1], in[2], o)};
      },
      {leaf({1, 2, 6, 3}), leaf({1, 2, 6, 3}), leaf({1, 2, 6, 3})}));
}

// ---------------------------------------------------------------------------------------------- memory

// The fused forward allocates its output and one logsumexp per row: at T = 4096 that is ~1 MiB, against the
// 64 MiB of one T x T f32 matrix (which the composite allocates several times over, as the check below shows,
// so the bound can fail).
TEST(Attention, FusedForwardMemoryIsLinearInT) {
  manual_seed(16);
  const int64_t T = 4096, D = 64;
  const double tt_bytes = static_cast<double>(T * T) * 4.0;
  Tensor q = randn({1, 1, T, D}).requires_grad_(), k = randn({1, 1, T, D}).requires_grad_(),
         v = randn({1, 1, T, D}).requires_grad_();
  const auto peak_of = [&](const std::function<Tensor()>& fn) {
    const int64_t before = memory::memory_stats().allocated;
    memory::reset_peak_memory_stats();
    Tensor out = fn();
    return static_cast<double>(memory::memory_stats().peak_allocated - before);
  };
  // Forward with the graph recorded (what training keeps until backward): out, lse and nothing T x T.
  const double fused = peak_of([&] { return scaled_dot_product_attention(q, k, v, {.causal = true}); });
  EXPECT_LE(fused, 2.0 * static_cast<double>(T * D * 4 + T * 4));
  EXPECT_LT(fused, tt_bytes / 32);
  // The backward's allocations are the three gradients (plus its T x D scratch outside the allocator).
  Tensor out = scaled_dot_product_attention(q, k, v, {.causal = true});
  const int64_t before = memory::memory_stats().allocated;
  memory::reset_peak_memory_stats();
  out.backward(ones_like(out));
  EXPECT_LT(static_cast<double>(memory::memory_stats().peak_allocated - before), tt_bytes / 8);
  // The composite at a quarter of the length already exceeds the fused bound at the full length.
  const int64_t Tc = T / 4;
  Tensor qc = q.detach().narrow(2, 0, Tc), kc = k.detach().narrow(2, 0, Tc), vc = v.detach().narrow(2, 0, Tc);
  EXPECT_GT(peak_of([&] { return detail::sdpa_composite(qc, kc, vc, {.causal = true}); }),
            static_cast<double>(Tc * Tc) * 4.0);
}

// ------------------------------------------------------------------------------------------- autocast

TEST(Attention, AutocastRunsInTheLowDtype) {
  manual_seed(17);
  Tensor q = randn({2, 2, 40, 16}), k = randn({2, 2, 40, 16}), v = randn({2, 2, 40, 16});
  const Tensor ref = scaled_dot_product_attention(q, k, v, {.causal = true});
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    amp::Autocast guard({.dtype = low});
    const Tensor out = scaled_dot_product_attention(q, k, v, {.causal = true});
    EXPECT_EQ(out.dtype(), low);
    // q, k, v rounded to 16 bits (relative 2^-8 / 2^-11 each at most), the weights too on VDPBF16PS, and the
    // output rounded once: a few 2^-8 (bf16) or 2^-11 (f16) of the output's scale (|out| <= max |v| ~ 4).
    EXPECT_LT(max_abs_diff(out, ref), (low == DType::bf16 ? 0x1p-8 : 0x1p-11) * 8 * max_abs(ref));
  }
  // f64 is left alone by "lower" ops.
  amp::Autocast guard({.dtype = DType::bf16});
  EXPECT_EQ(scaled_dot_product_attention(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64)).dtype(), DType::f64);
}

// --------------------------------------------------------------------------------------------- refusals

TEST(Attention, RefusalsSayWhatWasExpectedAndWhatToDo) {
  const Tensor q = randn({2, 3, 5, 8}), k = randn({2, 3, 7, 8}), v = randn({2, 3, 7, 8});
  const auto sdpa = [](const Tensor& a, const Tensor& b, const Tensor& c, const AttentionOptions& o = {}) {
    return [=] { (void)scaled_dot_product_attention(a, b, c, o); };
  };
  expect_error(sdpa(randn({5, 8}), k, v),
               {"scaled_dot_product_attention", "expected q [B, H, Tq, D]", "Tensor[5, 8]", "reshape the heads"});
  expect_error(sdpa(q, randn({2, 7, 8}), v), {"expected q [B, H, Tq, D]", "Tensor[2, 7, 8]"});
  expect_error(sdpa(q, randn({2, 4, 7, 8}), randn({2, 4, 7, 8})),
               {"expected k and v with q's batch and heads (2, 3)", "Tensor[2, 4, 7, 8]", "same [B, H] split"});
  expect_error(sdpa(q, randn({2, 3, 7, 4}), v), {"head size D = 8", "Tensor[2, 3, 7, 4]", "same head size"});
  expect_error(sdpa(q, k, randn({2, 3, 6, 8})), {"as many keys as k (Tk = 7)", "Tensor[2, 3, 6, 8]"});
  expect_error(sdpa(q, k.to(DType::bf16), v), {"expected q, k, v of one dtype", "f32, bf16, f32", "autocast"});
  expect_error(sdpa(q.to(DType::i64), k, v), {"expected a floating q", "i64", ".to(mp::DType::f32)"});
  expect_error(sdpa(q, k, v, {.dropout_p = 1.0}), {"expected dropout_p in [0, 1), got 1", "pass 0"});
  expect_error(sdpa(q, k, v, {.dropout_p = -0.1}), {"expected dropout_p in [0, 1), got -0.1"});
  expect_error(sdpa(q, k, v, {.causal = true, .mask = ones({5, 7})}),
               {"either causal = true or a mask, got both", "fold the causal rule into the mask"});
  expect_error(sdpa(q, k, v, {.mask = ones({5, 6})}),
               {"expected a mask broadcastable to [2, 3, 5, 7]", "Tensor[5, 6]", "size 1 or the full size"});
  expect_error(sdpa(q, k, v, {.mask = ones({1, 2, 3, 5, 7})}), {"broadcastable to [2, 3, 5, 7]"});
  expect_error(sdpa(q, k, v, {.mask = ones({5, 7}, {.dtype = DType::i64})}),
               {"expected a bool mask (true = attend) or a floating additive mask", "i64", "compare it"});
  expect_error(sdpa(q, k, v, {.scale = std::nan("")}), {"expected a finite scale"});
  expect_error(sdpa(q, k, Tensor()), {"got an undefined tensor among q, k, v"});
  // 3-D inputs take a 3-D target for the mask.
  expect_error(sdpa(randn({2, 5, 8}), randn({2, 7, 8}), randn({2, 7, 8}), {.mask = ones({3, 5, 7})}),
               {"broadcastable to [2, 5, 7]"});
}

// MP_ATTENTION picks the fused kernels (unset or "fused") or the composite of separate ops ("composite"; ctest runs
// this test again with it: tests/CMakeLists.txt), seen in the autograd node the result hangs from; both compute the
// same values.
TEST(Attention, MpAttentionChoosesFusedOrComposite) {
  manual_seed(9);
  const Tensor q = randn({1, 2, 5, 8}).requires_grad_(true), k = randn({1, 2, 7, 8}), v = randn({1, 2, 7, 8});
  const Tensor out = scaled_dot_product_attention(q, k, v, {.causal = true});
  const char* e = std::getenv("MP_ATTENTION");
  const bool composite = e != nullptr && std::string(e) == "composite";
  ASSERT_NE(out.grad_fn(), nullptr);
  if (composite)
    EXPECT_NE(out.grad_fn()->name(), "ScaledDotProductAttentionBackward");
  else
    EXPECT_EQ(out.grad_fn()->name(), "ScaledDotProductAttentionBackward");
  const Tensor ref = detail::sdpa_composite(q.detach(), k, v, {.causal = true});
  EXPECT_LT(amax(abs(out.detach() - ref), {0, 1, 2, 3}).item<double>(), 1e-5);
}

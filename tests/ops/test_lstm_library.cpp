// mp::lstm_layer_library (oneDNN's LSTM on the CPU) against the composite it replaces,
// linear(x, w_ih, b_ih) followed by mp::lstm_layer: forward values and every gradient in f32 and bf16,
// T = 1 and 7, B = 1 and 5, I != H, with and without biases; one bias, partial gradients, the inference
// primitive; a second backward through one forward (retain_graph); autocast; two stacked layers; nn::LSTM
// with LstmImpl::library against LstmImpl::fused; and the error messages.
//
// Note [library LSTM test tolerances]
//  * f32: both sides compute the same function in f32; they differ only in the order the GEMMs
//    accumulate (the reference forms x W_ih^T + b_ih and h W_hh^T + b_hh as two GEMMs and adds them;
//    oneDNN runs its own blocking). A gate pre-activation sums K = I + H + 2 = 16 terms with
//    sum|terms| <~ 6 (|x|, |h| <= 1, |w| <= 0.35); rounding errors of random sign give ~sqrt(K) u sum|terms|
//    = 4 * 6e-8 * 6 ~ 1.5e-6 per order (u = 2^-24), the activations have slope <= 1, and over T = 7 steps
//    (not even counting the forget gate's contraction) that is <= 1e-5: allowed 1e-5 absolute on y, h_T,
//    c_T (measured: <= 1.2e-7). Gradients: the same argument on the backward's sums, normwise: 1e-5 of
//    the largest element of each gradient (measured: <= 3.4e-7).
//  * bf16: the operands are bf16 on both sides, but the composite rounds the input projection and the
//    per-step gate pre-activations to bf16 (u = 2^-9) where oneDNN keeps them in f32; both round h to bf16
//    every step and keep c in f32. Per step: the two extra roundings of |gate| <~ 2 move a gate by
//    <= 2 * 2 u through slopes <= 1 (4 u), plus the final rounding of y / h_T (1 u at |h| < 1), and the
//    forget gate (< 1) keeps the steps from adding up fully: allowed 8 u = 8 / 512 absolute (measured:
//    <= 1 u = 0.002). Gradients: the composite's backward rounds dG, dh and the weight gradients to bf16
//    at every step where oneDNN keeps f32 diffs, ~8 roundings on a path: allowed 20 u = 0.04 of the
//    largest element (measured: <= 0.0094).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "mp/mp.hpp"
#include "mp/ops/rnn_library.hpp"
#include "test_util.hpp"

using namespace mp;

namespace {

using mp::test::expect_error;

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

// max |a - b| over the elements (same shape required).
double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  const auto va = a.to_vector<double>(), vb = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < va.size() && i < vb.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

// The composite lstm_layer_library replaces.
std::tuple<Tensor, Tensor, Tensor> composite(const Tensor& x, const Tensor& h0, const Tensor& c0, const Tensor& w_ih,
                                             const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh) {
  return lstm_layer(linear(x, w_ih, b_ih), h0, c0, w_hh, b_hh);
}

struct Case {
  int64_t T, B, I, H;
  bool bias;
  DType dt;
  std::string name() const {
    return "T " + std::to_string(T) + " B " + std::to_string(B) + " I " + std::to_string(I) + " H " +
           std::to_string(H) + (bias ? " with biases " : " without biases ") + dtype_name(dt);
  }
};

// Leaves of one case: x, h0, c0 (f32), w_ih, w_hh, b_ih, b_hh (undefined without biases).
std::vector<Tensor> make_inputs(const Case& c, bool grad) {
  const TensorOptions o{.dtype = c.dt};
  std::vector<Tensor> in{rand({c.T, c.B, c.I}, o, -1, 1),
                         rand({c.B, c.H}, o, -1, 1),
                         rand({c.B, c.H}, {}, -1, 1),
                         rand({4 * c.H, c.I}, o, -0.35, 0.35),
                         rand({4 * c.H, c.H}, o, -0.35, 0.35),
                         c.bias ? rand({4 * c.H}, o, -0.35, 0.35) : Tensor(),
                         c.bias ? rand({4 * c.H}, o, -0.35, 0.35) : Tensor()};
  if (grad)
    for (Tensor& t : in)
      if (t.defined()) t.requires_grad_();
  return in;
}

// The same leaves again (fresh tensors with the same values) for the other side of a comparison.
std::vector<Tensor> copies(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (const Tensor& t : in) out.push_back(t.defined() ? t.detach().clone().requires_grad_(t.requires_grad()) : t);
  return out;
}

using LayerFn = std::tuple<Tensor, Tensor, Tensor> (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                       const Tensor&, const Tensor&, const Tensor&);

// Outputs and the gradients of every defined input under loss = <y, dy> + <h_T, dh> + <c_T, dc>.
struct LayerRun {
  Tensor y, h, c;
  std::vector<Tensor> grads;  // aligned with the inputs; undefined for undefined inputs
};
LayerRun run_layer(LayerFn f, const std::vector<Tensor>& in, const Tensor& dy, const Tensor& dh, const Tensor& dc) {
  LayerRun r;
  std::tie(r.y, r.h, r.c) = f(in[0], in[1], in[2], in[3], in[4], in[5], in[6]);
  const Tensor loss =
      add(add(sum(mul(r.y.to(DType::f32), dy)), sum(mul(r.h.to(DType::f32), dh))), sum(mul(r.c.to(DType::f32), dc)));
  std::vector<Tensor> wrt;
  for (const Tensor& t : in)
    if (t.defined()) wrt.push_back(t);
  const std::vector<Tensor> g = autograd::grad({loss}, wrt);
  size_t k = 0;
  for (const Tensor& t : in) r.grads.push_back(t.defined() ? g[k++] : Tensor());
  return r;
}

const char* kInputNames[] = {"x", "h0", "c0", "w_ih", "w_hh", "b_ih", "b_hh"};

void compare(const Case& c, double out_atol, double grad_normwise) {
  SCOPED_TRACE(c.name());
  const std::vector<Tensor> in = make_inputs(c, true);
  const Tensor dy = rand({c.T, c.B, c.H}, {}, -1, 1);
  const Tensor dh = rand({c.B, c.H}, {}, -1, 1), dc = rand({c.B, c.H}, {}, -1, 1);
  const LayerRun lib = run_layer(&lstm_layer_library, in, dy, dh, dc);
  const LayerRun ref = run_layer(&composite, copies(in), dy, dh, dc);
  EXPECT_EQ(lib.y.dtype(), c.dt);
  EXPECT_EQ(lib.h.dtype(), c.dt);
  EXPECT_EQ(lib.c.dtype(), DType::f32);  // the cell state is f32 whatever the compute dtype
  EXPECT_EQ(lib.y.sizes(), ref.y.sizes());
  EXPECT_EQ(lib.h.dtype(), ref.h.dtype());
  EXPECT_EQ(lib.c.dtype(), ref.c.dtype());
  EXPECT_LE(max_diff(lib.y, ref.y), out_atol) << "y";
  EXPECT_LE(max_diff(lib.h, ref.h), out_atol) << "h_T";
  EXPECT_LE(max_diff(lib.c, ref.c), out_atol) << "c_T";
  // The last output step is h_T exactly (one buffer on both sides).
  EXPECT_EQ(max_diff(lib.y.select(0, c.T - 1), lib.h), 0.0);
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].defined()) continue;
    ASSERT_TRUE(lib.grads[i].defined()) << kInputNames[i];
    EXPECT_EQ(lib.grads[i].dtype(), in[i].dtype()) << kInputNames[i];
    const double scale = std::max(max_abs(ref.grads[i]), 1e-3);
    EXPECT_LE(max_diff(lib.grads[i], ref.grads[i]), grad_normwise * scale) << "gradient of " << kInputNames[i];
  }
}

// Note [library LSTM test tolerances].
constexpr double kF32Out = 1e-5, kF32Grad = 1e-5;
constexpr double kBf16Out = 8.0 / 512, kBf16Grad = 20.0 / 512;

}  // namespace

TEST(LstmLibrary, F32MatchesLinearPlusLstmLayer) {
  manual_seed(1);
  for (int64_t T : {1, 7})
    for (int64_t B : {1, 5})
      for (bool bias : {true, false}) compare({T, B, 6, 8, bias, DType::f32}, kF32Out, kF32Grad);
}

TEST(LstmLibrary, Bf16MatchesLinearPlusLstmLayer) {
  manual_seed(2);
  for (int64_t T : {1, 7})
    for (int64_t B : {1, 5})
      for (bool bias : {true, false}) compare({T, B, 6, 8, bias, DType::bf16}, kBf16Out, kBf16Grad);
}

TEST(LstmLibrary, WiderLayerMatchesInF32) {
  // Sizes where oneDNN may pick other kernels and blocked weight layouts (H not a multiple of 16).
  manual_seed(3);
  // K = 77 terms per gate with sum|terms| ~ 28: sqrt(77/16) * 28/6 ~ 10x the bound above, over 5 steps.
  compare({5, 3, 40, 35, true, DType::f32}, 10 * kF32Out, 10 * kF32Grad);
}

TEST(LstmLibrary, OneBiasAndPartialGradients) {
  // Only b_ih defined; only w_hh and x require gradients: the others get none.
  manual_seed(4);
  const int64_t T = 4, B = 3, I = 5, H = 6;
  Tensor x = rand({T, B, I}, {}, -1, 1).requires_grad_(), h0 = rand({B, H}, {}, -1, 1), c0 = rand({B, H}, {}, -1, 1);
  Tensor w_ih = rand({4 * H, I}, {}, -0.35, 0.35), w_hh = rand({4 * H, H}, {}, -0.35, 0.35).requires_grad_();
  Tensor b_ih = rand({4 * H}, {}, -0.35, 0.35);
  auto [y, h, c] = lstm_layer_library(x, h0, c0, w_ih, w_hh, b_ih);
  auto [yr, hr, cr] = composite(x, h0, c0, w_ih, w_hh, b_ih, Tensor());
  EXPECT_LE(max_diff(y, yr), kF32Out);
  EXPECT_LE(max_diff(c, cr), kF32Out);
  const auto g = autograd::grad({sum(y)}, {x, w_hh});
  const auto gr = autograd::grad({sum(yr)}, {x, w_hh});
  for (size_t i = 0; i < 2; ++i) EXPECT_LE(max_diff(g[i], gr[i]), kF32Grad * std::max(max_abs(gr[i]), 1e-3));
  // No input requires grad: the inference primitive (no workspace) gives the training one's values: bit for bit
  // on AVX-512 CPUs; on AVX2 (AMD Zen 3) oneDNN 3.2's two kernels differ by rounding (3.0e-8 measured on |y| < 1),
  // so the bound is 1e-6: a few ulps, far below any wrong gate or state (>= 1e-2).
  autograd::NoGradGuard ng;
  auto [y2, h2, c2] = lstm_layer_library(x, h0, c0, w_ih, w_hh, b_ih);
  EXPECT_FALSE(y2.requires_grad());
  EXPECT_LE(max_diff(y2, y), 1e-6);
  EXPECT_LE(max_diff(c2, c), 1e-6);
}

TEST(LstmLibrary, BackwardTwiceWithRetainGraphGivesTheSameGradients) {
  // oneDNN's backward only reads the forward's workspace, so the graph can be back-propagated twice.
  manual_seed(9);
  for (DType dt : {DType::f32, DType::bf16}) {
    const std::vector<Tensor> in = make_inputs({4, 3, 5, 6, true, dt}, true);
    auto [y, h, c] = lstm_layer_library(in[0], in[1], in[2], in[3], in[4], in[5], in[6]);
    const Tensor loss = add(sum(y.to(DType::f32)), sum(c));
    const auto g1 = autograd::grad({loss}, in, {}, true), g2 = autograd::grad({loss}, in, {}, true);
    for (size_t i = 0; i < in.size(); ++i)
      EXPECT_EQ(max_diff(g1[i], g2[i]), 0.0) << dtype_name(dt) << " " << kInputNames[i];
  }
}

TEST(LstmLibrary, TwoStackedLayersBackpropagateThroughBoth) {
  // Layer 2 reads layer 1's y: gradients of the first layer's inputs pass through the second node.
  manual_seed(5);
  const Case c1{6, 4, 7, 5, true, DType::f32}, c2{6, 4, 5, 9, true, DType::f32};
  const std::vector<Tensor> l1 = make_inputs(c1, true), l2 = make_inputs(c2, true);
  const std::vector<Tensor> r1 = copies(l1), r2 = copies(l2);
  auto stack2 = [](LayerFn f, const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    auto [y1, h1, c1_] = f(a[0], a[1], a[2], a[3], a[4], a[5], a[6]);
    auto [y2, h2, c2_] = f(y1, b[1], b[2], b[3], b[4], b[5], b[6]);
    return add(add(sum(mul(y2, y2)), sum(h1)), sum(mul(c2_, 0.5)));
  };
  std::vector<Tensor> wrt, wrt_r;
  for (size_t i = 0; i < l1.size(); ++i) {
    wrt.push_back(l1[i]);
    wrt_r.push_back(r1[i]);
  }
  for (size_t i = 1; i < l2.size(); ++i) {  // l2[0] (the second layer's x) is unused: y1 feeds it
    wrt.push_back(l2[i]);
    wrt_r.push_back(r2[i]);
  }
  const Tensor loss = stack2(&lstm_layer_library, l1, l2), loss_r = stack2(&composite, r1, r2);
  EXPECT_NEAR(loss.item<double>(), loss_r.item<double>(), 1e-4 * std::abs(loss_r.item<double>()));
  const auto g = autograd::grad({loss}, wrt), gr = autograd::grad({loss_r}, wrt_r);
  ASSERT_EQ(g.size(), gr.size());
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_LE(max_diff(g[i], gr[i]), 2 * kF32Grad * std::max(max_abs(gr[i]), 1e-3)) << "gradient " << i;
}

TEST(LstmLibrary, AutocastRunsInBf16AndKeepsStateF32) {
  // Under bf16 autocast the f32 leaves are cast (GEMM operands "lower"), c0 keeps f32, and the
  // gradients flow back through the casts to the f32 leaves: the same as the autocast composite.
  manual_seed(6);
  const Case c{5, 3, 6, 8, true, DType::f32};
  const std::vector<Tensor> in = make_inputs(c, true), in_r = copies(in);
  const Tensor dy = rand({c.T, c.B, c.H}, {}, -1, 1);
  const Tensor dh = rand({c.B, c.H}, {}, -1, 1), dc = rand({c.B, c.H}, {}, -1, 1);
  LayerRun lib, ref;
  {
    amp::Autocast ac({.dtype = DType::bf16});
    lib = run_layer(&lstm_layer_library, in, dy, dh, dc);
    ref = run_layer(&composite, in_r, dy, dh, dc);
  }
  EXPECT_EQ(lib.y.dtype(), DType::bf16);
  EXPECT_EQ(lib.h.dtype(), DType::bf16);
  EXPECT_EQ(lib.c.dtype(), DType::f32);
  EXPECT_LE(max_diff(lib.y, ref.y), kBf16Out);
  EXPECT_LE(max_diff(lib.c, ref.c), kBf16Out);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(lib.grads[i].dtype(), DType::f32) << kInputNames[i];
    EXPECT_LE(max_diff(lib.grads[i], ref.grads[i]), kBf16Grad * std::max(max_abs(ref.grads[i]), 1e-3))
        << "gradient of " << kInputNames[i];
  }
}

TEST(LstmLibrary, Bf16InitialCellStateIsWidened) {
  // O2 models create zero states in the parameters' dtype: a bf16 c0 is accepted, c_T is still f32.
  manual_seed(7);
  const int64_t T = 3, B = 2, I = 4, H = 5;
  const TensorOptions bf{.dtype = DType::bf16};
  Tensor x = rand({T, B, I}, bf, -1, 1), h0 = rand({B, H}, bf, -1, 1), c0 = rand({B, H}, bf, -1, 1);
  Tensor w_ih = rand({4 * H, I}, bf, -0.35, 0.35), w_hh = rand({4 * H, H}, bf, -0.35, 0.35);
  auto [y, h, c] = lstm_layer_library(x, h0, c0, w_ih, w_hh);
  auto [yr, hr, cr] = lstm_layer_library(x, h0, c0.to(DType::f32), w_ih, w_hh);
  EXPECT_EQ(c.dtype(), DType::f32);
  EXPECT_EQ(max_diff(y, yr), 0.0);  // bf16 -> f32 is exact: the same computation
  EXPECT_EQ(max_diff(c, cr), 0.0);
}

TEST(LstmLibrary, NnLstmLibraryMatchesFused) {
  // nn::LSTM with LstmImpl::library (one lstm_layer_library call per layer) against the default fused
  // implementation with the same parameters: outputs, states and every gradient (f32 tolerances above;
  // two layers, so the second layer's error includes the first's: 2x).
  manual_seed(8);
  nn::LSTM fused(nn::LSTMOptions{.input_size = 5, .hidden_size = 7, .num_layers = 2});
  nn::LSTM lib(nn::LSTMOptions{.input_size = 5, .hidden_size = 7, .num_layers = 2, .impl = nn::LstmImpl::library});
  lib.load_state_dict(fused.state_dict());
  EXPECT_NE(lib.extra_repr().find("impl=library"), std::string::npos) << lib.extra_repr();
  const int64_t T = 6, B = 3;
  Tensor x = rand({T, B, 5}, {}, -1, 1).requires_grad_();
  const Tensor h0 = rand({2, B, 7}, {}, -1, 1), c0 = rand({2, B, 7}, {}, -1, 1);
  auto [of, sf] = fused.forward(x, {h0, c0});
  auto [ol, sl] = lib.forward(x, {h0, c0});
  EXPECT_LE(max_diff(ol, of), 2 * kF32Out);
  EXPECT_LE(max_diff(sl.h, sf.h), 2 * kF32Out);
  EXPECT_LE(max_diff(sl.c, sf.c), 2 * kF32Out);
  const Tensor dy = rand({T, B, 7}, {}, -1, 1);
  auto loss = [&](const Tensor& o, const nn::LSTMState& s) { return add(sum(mul(o, dy)), sum(add(s.h, s.c))); };
  std::vector<Tensor> in_f{x}, in_l{x};
  for (const Tensor& p : fused.parameters()) in_f.push_back(p);
  for (const Tensor& p : lib.parameters()) in_l.push_back(p);
  const auto gf = autograd::grad({loss(of, sf)}, in_f), gl = autograd::grad({loss(ol, sl)}, in_l);
  ASSERT_EQ(gf.size(), gl.size());
  for (size_t i = 0; i < gf.size(); ++i)
    EXPECT_LE(max_diff(gl[i], gf[i]), 2 * kF32Grad * std::max(max_abs(gf[i]), 1e-3)) << "gradient " << i;
}

TEST(LstmLibrary, ErrorsNameExpectedAndGot) {
  const Tensor x = zeros({4, 2, 3}), h = zeros({2, 5}), wi = zeros({20, 3}), wh = zeros({20, 5});
  expect_error(
      [&] {
        lstm_layer_library(zeros({4, 3}), h, h, wi, wh);
      },
      {"lstm_layer_library", "[T, B, I]", "got [4, 3]"});
  expect_error([&] { lstm_layer_library(zeros({0, 2, 3}), h, h, wi, wh); }, {"lstm_layer_library", "non-empty"});
  expect_error(
      [&] {
        lstm_layer_library(x, zeros({3, 5}), h, wi, wh);
      },
      {"lstm_layer_library", "h0", "[2, H]", "got [3, 5]"});
  expect_error(
      [&] {
        lstm_layer_library(x, h, zeros({2, 4}), wi, wh);
      },
      {"lstm_layer_library", "c0", "[2, 5]", "got [2, 4]"});
  expect_error(
      [&] {
        lstm_layer_library(x, h, h, zeros({20, 4}), wh);
      },
      {"lstm_layer_library", "w_ih", "[20, 3]", "got [20, 4]"});
  expect_error(
      [&] {
        lstm_layer_library(x, h, h, wi, zeros({16, 5}));
      },
      {"lstm_layer_library", "w_hh", "[20, 5]", "got [16, 5]"});
  expect_error([&] { lstm_layer_library(x, h, h, wi, wh, zeros({20}), zeros({5})); },
               {"lstm_layer_library", "b_hh", "[20]", "got [5]"});
  expect_error([&] { lstm_layer_library(x.to(DType::bf16), h, h, wi, wh); },
               {"lstm_layer_library", "one dtype", "bf16", "f32", "autocast"});
  expect_error(
      [&] {
        lstm_layer_library(zeros({4, 2, 3}, {.dtype = DType::i64}), h, h, wi, wh);
      },
      {"lstm_layer_library", "floating", "i64"});
  // Dtypes oneDNN's LSTM lacks: the message names the ones that work.
  for (DType dt : {DType::f16, DType::f64}) {
    const TensorOptions o{.dtype = dt};
    expect_error(
        [&] {
          lstm_layer_library(zeros({4, 2, 3}, o), zeros({2, 5}, o), h, zeros({20, 3}, o), zeros({20, 5}, o));
        },
        {"lstm_layer_library on cpu", dtype_name(dt), "f32 or bf16", "mp::lstm_layer"});
  }
}

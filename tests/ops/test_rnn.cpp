// Recurrent cells: lstm_gates (fused kernels) against hand computations, gradient checks (f64),
// 16-bit precision against f32 (tolerance table below); lstm_cell, gru_cell and rnn_tanh_cell
// against loops written out here and gradient checks; error messages.
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
    {"lstm end to end", DType::bf16, 12.0 / 512, 0.0, "gate and cell rounding through the sigmoid/tanh slopes"},
    {"lstm end to end", DType::f16, 12.0 / 2048, 0.0, "gate and cell rounding through the sigmoid/tanh slopes"},
};
const mp::test::Tol16& tol(const std::string& what, DType dt) { return mp::test::tol16(kEndToEnd, what, dt); }

double sigm(double v) { return 1.0 / (1.0 + std::exp(-v)); }

// Row-major helpers for the hand references.
std::vector<double> vec(const Tensor& t) { return t.to_vector<double>(); }
// y[b][o] = sum_i x[b][i] w[o][i] + bias[o] (bias may be empty).
std::vector<double> affine(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& bias,
                           int64_t B, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<size_t>(B * out), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t o = 0; o < out; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int64_t i = 0; i < in; ++i) s += x[b * in + i] * w[o * in + i];
      y[b * out + o] = s;
    }
  return y;
}

// Forward of the fused gates by hand: returns (h', c').
std::pair<std::vector<double>, std::vector<double>> lstm_ref(const std::vector<double>& gates,
                                                             const std::vector<double>& c, int64_t B, int64_t H) {
  std::vector<double> h1(c.size()), c1(c.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < H; ++j) {
      const double* g = gates.data() + b * 4 * H;
      const double i = sigm(g[j]), f = sigm(g[H + j]), gg = std::tanh(g[2 * H + j]), o = sigm(g[3 * H + j]);
      c1[b * H + j] = f * c[b * H + j] + i * gg;
      h1[b * H + j] = o * std::tanh(c1[b * H + j]);
    }
  return {h1, c1};
}

void expect_near_vec(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tol) << "element " << i;
}

}  // namespace

// ------------------------------------------------------------------------------ lstm_gates

TEST(LstmGates, ForwardMatchesHandComputation) {
  const int64_t B = 2, H = 3;
  Tensor gates = rand({B, 4 * H}, {.dtype = DType::f64}, -3, 3), c = rand({B, H}, {.dtype = DType::f64}, -2, 2);
  auto [h1, c1] = lstm_gates(gates, c);
  auto [rh, rc] = lstm_ref(vec(gates), vec(c), B, H);
  expect_near_vec(vec(h1), rh, 1e-14);
  expect_near_vec(vec(c1), rc, 1e-14);
  EXPECT_EQ(h1.sizes(), (Shape{B, H}));
  // Extreme pre-activations saturate without overflow (sigmoid never evaluates exp(+large)).
  Tensor big = full({1, 4}, 200.0), c0 = zeros({1, 1});
  auto [hb, cb] = lstm_gates(big, c0);
  EXPECT_FLOAT_EQ(cb.item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(hb.item<float>(), std::tanh(1.0f));
  auto [hn, cn] = lstm_gates(neg(big), c0);
  EXPECT_EQ(cn.item<float>(), 0.0f);
  EXPECT_FALSE(std::isnan(hn.item<float>()));
}

TEST(LstmGates, Gradcheck) {
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto [h, c] = lstm_gates(in[0], in[1]);
        return std::vector<Tensor>{h, c};
      },
      {leaf({3, 8}, -2, 2), leaf({3, 2}, -1.5, 1.5)}));
  // Only h' used (c' receives a zero gradient from the engine).
  expect_ok(gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{lstm_gates(in[0], in[1]).first}; },
                      {leaf({2, 12}, -2, 2), leaf({2, 3})}));
  // Only c' used; gates only (c constant).
  Tensor c = rand({2, 3}, {.dtype = DType::f64});
  expect_ok(gradcheck([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{lstm_gates(in[0], c).second}; },
                      {leaf({2, 12}, -2, 2)}));
}

TEST(LstmGates, WideHiddenMatchesCompositeOps) {
  // H = 600 spans two blocks of the kernel loop; reference built from sigmoid/tanh ops, f64.
  const int64_t B = 5, H = 600;
  Tensor gates = rand({B, 4 * H}, {.dtype = DType::f64}, -3, 3).requires_grad_();
  Tensor c = rand({B, H}, {.dtype = DType::f64}, -2, 2).requires_grad_();
  Tensor dh = randn({B, H}, {.dtype = DType::f64}), dc = randn({B, H}, {.dtype = DType::f64});
  auto [h1, c1] = lstm_gates(gates, c);
  auto g = autograd::grad({h1, c1}, {gates, c}, {dh, dc});
  Tensor gr = gates.detach().requires_grad_(), cr = c.detach().requires_grad_();
  Tensor i = sigmoid(gr.narrow(1, 0, H)), f = sigmoid(gr.narrow(1, H, H));
  Tensor gg = tanh(gr.narrow(1, 2 * H, H)), o = sigmoid(gr.narrow(1, 3 * H, H));
  Tensor c1r = f * cr + i * gg, h1r = o * tanh(c1r);
  auto gref = autograd::grad({h1r, c1r}, {gr, cr}, {dh, dc});
  EXPECT_LE(excess(h1, h1r, 1e-14, 0), 0.0);
  EXPECT_LE(excess(c1, c1r, 1e-14, 0), 0.0);
  EXPECT_LE(excess(g[0], gref[0], 1e-13, 0), 0.0);
  EXPECT_LE(excess(g[1], gref[1], 1e-13, 0), 0.0);
}

TEST(LstmGates, LowPrecisionAgainstF32) {
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t B = 7, H = 70;
    Tensor gates = rand({B, 4 * H}, {}, -4, 4), c = rand({B, H}, {}, -2, 2);
    Tensor dh = randn({B, H}).to(dt), dc = randn({B, H}).to(dt);
    Tensor gl = gates.to(dt).requires_grad_(), cl = c.to(dt).requires_grad_();
    Tensor gs = gates.to(dt).to(DType::f32).requires_grad_(), cs = c.to(dt).to(DType::f32).requires_grad_();
    auto [hl, c1l] = lstm_gates(gl, cl);
    auto [hs, c1s] = lstm_gates(gs, cs);
    EXPECT_EQ(hl.dtype(), dt);
    EXPECT_EQ(c1l.dtype(), dt);
    const auto& same = tol("same input", dt);
    EXPECT_LE(excess(hl, hs, same.atol, same.rtol), 0.0) << same.reason;
    EXPECT_LE(excess(c1l, c1s, same.atol, same.rtol), 0.0) << same.reason;
    auto grl = autograd::grad({hl, c1l}, {gl, cl}, {dh, dc});
    auto grs = autograd::grad({hs, c1s}, {gs, cs}, {dh.to(DType::f32), dc.to(DType::f32)});
    EXPECT_EQ(grl[0].dtype(), dt);
    EXPECT_LE(excess(grl[0], grs[0], same.atol, same.rtol), 0.0) << same.reason;
    EXPECT_LE(excess(grl[1], grs[1], same.atol, same.rtol), 0.0) << same.reason;
    auto [h32, c32] = lstm_gates(gates, c);
    const auto& e2e = tol("lstm end to end", dt);
    EXPECT_LE(excess(hl, h32, e2e.atol, e2e.rtol), 0.0) << e2e.reason;
    EXPECT_LE(excess(c1l, c32, e2e.atol, e2e.rtol), 0.0) << e2e.reason;
  }
}

TEST(LstmGates, Bf16GatesWithF32CellStateKeepF32State) {
  Tensor gates = rand({3, 16}, {}, -2, 2).to(DType::bf16).requires_grad_();
  Tensor c = rand({3, 4}, {}, -1, 1).requires_grad_();
  auto [h1, c1] = lstm_gates(gates, c);
  EXPECT_EQ(h1.dtype(), DType::f32);
  EXPECT_EQ(c1.dtype(), DType::f32);
  // Exactly the f32 computation on the bf16 gate values (no rounding anywhere: outputs are f32).
  auto [hr, cr] = lstm_gates(gates.detach().to(DType::f32), c.detach());
  EXPECT_EQ(h1.to_vector<float>(), hr.to_vector<float>());
  EXPECT_EQ(c1.to_vector<float>(), cr.to_vector<float>());
  sum(h1 + c1).backward();
  EXPECT_EQ(gates.grad().dtype(), DType::bf16);
  EXPECT_EQ(c.grad().dtype(), DType::f32);
}

TEST(LstmGates, ErrorsNameExpectedAndGot) {
  expect_error([] { lstm_gates(zeros({2, 10}), zeros({2, 3})); }, {"lstm_gates", "[2, 12]", "got [2, 10]"});
  expect_error([] { lstm_gates(zeros({3, 12}), zeros({2, 3})); }, {"lstm_gates", "[2, 12]", "got [3, 12]"});
  expect_error([] { lstm_gates(zeros({2, 12}), zeros({6})); }, {"lstm_gates", "[B, H]", "got [6]"});
  expect_error([] { lstm_gates(zeros({2, 12}, {.dtype = DType::i64}), zeros({2, 3})); }, {"lstm_gates", "i64"});
}

// ------------------------------------------------------------------------------ cells

TEST(LstmCell, MatchesHandComputation) {
  const int64_t B = 2, I = 3, H = 4;
  Tensor x = rand({B, I}, {.dtype = DType::f64}), h = rand({B, H}, {.dtype = DType::f64});
  Tensor c = rand({B, H}, {.dtype = DType::f64});
  Tensor wi = rand({4 * H, I}, {.dtype = DType::f64}), wh = rand({4 * H, H}, {.dtype = DType::f64});
  Tensor bi = rand({4 * H}, {.dtype = DType::f64}), bh = rand({4 * H}, {.dtype = DType::f64});
  auto [h1, c1] = lstm_cell(x, h, c, wi, wh, bi, bh);
  std::vector<double> gi = affine(vec(x), vec(wi), vec(bi), B, I, 4 * H);
  std::vector<double> gh = affine(vec(h), vec(wh), vec(bh), B, H, 4 * H);
  for (size_t k = 0; k < gi.size(); ++k) gi[k] += gh[k];
  auto [rh, rc] = lstm_ref(gi, vec(c), B, H);
  expect_near_vec(vec(h1), rh, 1e-12);
  expect_near_vec(vec(c1), rc, 1e-12);
  // Without biases, and unbatched.
  auto [h2, c2] = lstm_cell(x.select(0, 1), h.select(0, 1), c.select(0, 1), wi, wh);
  std::vector<double> g2 = affine(vec(x.select(0, 1)), vec(wi), {}, 1, I, 4 * H);
  std::vector<double> g2h = affine(vec(h.select(0, 1)), vec(wh), {}, 1, H, 4 * H);
  for (size_t k = 0; k < g2.size(); ++k) g2[k] += g2h[k];
  auto [rh2, rc2] = lstm_ref(g2, vec(c.select(0, 1)), 1, H);
  EXPECT_EQ(h2.sizes(), (Shape{H}));
  expect_near_vec(vec(h2), rh2, 1e-12);
  expect_near_vec(vec(c2), rc2, 1e-12);
}

TEST(LstmCell, Gradcheck) {
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto [h, c] = lstm_cell(in[0], in[1], in[2], in[3], in[4], in[5], in[6]);
        return std::vector<Tensor>{h, c};
      },
      {leaf({2, 3}), leaf({2, 2}), leaf({2, 2}), leaf({8, 3}), leaf({8, 2}), leaf({8}), leaf({8})}));
}

TEST(GruCell, MatchesHandComputation) {
  const int64_t B = 3, I = 2, H = 4;
  Tensor x = rand({B, I}, {.dtype = DType::f64}, -2, 2), h = rand({B, H}, {.dtype = DType::f64});
  Tensor wi = rand({3 * H, I}, {.dtype = DType::f64}), wh = rand({3 * H, H}, {.dtype = DType::f64});
  Tensor bi = rand({3 * H}, {.dtype = DType::f64}), bh = rand({3 * H}, {.dtype = DType::f64});
  Tensor h1 = gru_cell(x, h, wi, wh, bi, bh);
  const auto gi = affine(vec(x), vec(wi), vec(bi), B, I, 3 * H), gh = affine(vec(h), vec(wh), vec(bh), B, H, 3 * H);
  const auto hv = vec(h);
  std::vector<double> ref(static_cast<size_t>(B * H));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < H; ++j) {
      const int64_t o = b * 3 * H;
      const double r = sigm(gi[o + j] + gh[o + j]);
      const double z = sigm(gi[o + H + j] + gh[o + H + j]);
      const double n = std::tanh(gi[o + 2 * H + j] + r * gh[o + 2 * H + j]);
      ref[b * H + j] = (1 - z) * n + z * hv[b * H + j];
    }
  expect_near_vec(vec(h1), ref, 1e-12);
  EXPECT_EQ(gru_cell(x.select(0, 0), h.select(0, 0), wi, wh, bi, bh).sizes(), (Shape{H}));
}

TEST(GruCell, Gradcheck) {
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{gru_cell(in[0], in[1], in[2], in[3], in[4], in[5])};
      },
      {leaf({2, 3}), leaf({2, 2}), leaf({6, 3}), leaf({6, 2}), leaf({6}), leaf({6})}));
  expect_ok(
      gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{gru_cell(in[0], in[1], in[2], in[3])}; },
                {leaf({2, 3}), leaf({2, 2}), leaf({6, 3}), leaf({6, 2})}));
}

TEST(RnnTanhCell, MatchesHandComputationAndGradcheck) {
  const int64_t B = 2, I = 3, H = 2;
  Tensor x = rand({B, I}, {.dtype = DType::f64}), h = rand({B, H}, {.dtype = DType::f64});
  Tensor wi = rand({H, I}, {.dtype = DType::f64}), wh = rand({H, H}, {.dtype = DType::f64});
  Tensor bi = rand({H}, {.dtype = DType::f64}), bh = rand({H}, {.dtype = DType::f64});
  const auto gi = affine(vec(x), vec(wi), vec(bi), B, I, H), gh = affine(vec(h), vec(wh), vec(bh), B, H, H);
  std::vector<double> ref(gi.size());
  for (size_t k = 0; k < gi.size(); ++k) ref[k] = std::tanh(gi[k] + gh[k]);
  expect_near_vec(vec(rnn_tanh_cell(x, h, wi, wh, bi, bh)), ref, 1e-12);
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{rnn_tanh_cell(in[0], in[1], in[2], in[3], in[4], in[5])};
      },
      {leaf({2, 3}), leaf({2, 2}), leaf({2, 3}), leaf({2, 2}), leaf({2}), leaf({2})}));
}

TEST(Cells, ErrorsNameExpectedAndGot) {
  Tensor x = zeros({2, 3}), h = zeros({2, 4}), c = zeros({2, 4});
  expect_error(
      [&] {
        lstm_cell(x, h, c, zeros({16, 5}), zeros({16, 4}));
      },
      {"lstm_cell", "w_ih", "[16, 3]", "got [16, 5]"});
  expect_error(
      [&] {
        lstm_cell(x, h, c, zeros({16, 3}), zeros({12, 4}));
      },
      {"lstm_cell", "w_hh", "[16, 4]", "got [12, 4]"});
  expect_error(
      [&] {
        lstm_cell(x, h, zeros({2, 5}), zeros({16, 3}), zeros({16, 4}));
      },
      {"lstm_cell", "cell state", "[2, 4]", "got [2, 5]"});
  expect_error(
      [&] {
        lstm_cell(x, zeros({3, 4}), c, zeros({16, 3}), zeros({16, 4}));
      },
      {"lstm_cell", "batch size 2", "got [3, 4]"});
  expect_error(
      [&] {
        gru_cell(x, h, zeros({12, 3}), zeros({12, 4}), zeros({16}));
      },
      {"gru_cell", "b_ih", "[12]", "got [16]"});
  expect_error(
      [&] {
        rnn_tanh_cell(zeros({2, 3, 1}), h, zeros({4, 3}), zeros({4, 4}));
      },
      {"rnn_tanh_cell", "[B, I]", "got [2, 3, 1]"});
}

// ------------------------------------------------------------------------------ lstm_layer

namespace {

// The basic per-step graph lstm_layer replaces: lstm_gates(gx_t + h W_hh^T + b_hh, c) for t = 0..T-1.
std::tuple<Tensor, Tensor, Tensor> lstm_layer_ref(const Tensor& gx, const Tensor& h0, const Tensor& c0,
                                                  const Tensor& w_hh, const Tensor& b_hh) {
  Tensor h = h0, c = c0;
  std::vector<Tensor> ys;
  for (const Tensor& g : unbind(gx, 0)) {
    std::tie(h, c) = lstm_gates(add(g, linear(h, w_hh, b_hh)), c);
    ys.push_back(h);
  }
  return {stack(ys, 0), h, c};
}

}  // namespace

TEST(LstmLayer, Gradcheck) {
  const int64_t T = 4, B = 3, H = 5;
  Tensor gx = leaf({T, B, 4 * H}, -2, 2), h0 = leaf({B, H}), c0 = leaf({B, H}), w = leaf({4 * H, H}, -0.5, 0.5),
         b = leaf({4 * H});
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto [y, h, c] = lstm_layer(in[0], in[1], in[2], in[3], in[4]);
        return std::vector<Tensor>{y, h, c};
      },
      {gx, h0, c0, w, b}));
  // Only y used (h_T, c_T get zero gradients from the engine), and no bias.
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{std::get<0>(lstm_layer(in[0], in[1], in[2], in[3]))};
      },
      {gx, h0, c0, w}));
}

TEST(LstmLayer, F64MatchesPerStepGraphAndF32CellState) {
  const int64_t T = 6, B = 4, H = 9;
  for (DType dt : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor gx = rand({T, B, 4 * H}, {.dtype = dt}, -2, 2).requires_grad_();
    Tensor h0 = rand({B, H}, {.dtype = dt}, -1, 1).requires_grad_(),
           c0 = rand({B, H}, {.dtype = dt}, -1, 1).requires_grad_();
    Tensor w = rand({4 * H, H}, {.dtype = dt}, -0.4, 0.4).requires_grad_(),
           b = rand({4 * H}, {.dtype = dt}).requires_grad_();
    auto [y, h, c] = lstm_layer(gx, h0, c0, w, b);
    auto [yr, hr, cr] = lstm_layer_ref(gx, h0, c0, w, b);
    EXPECT_EQ(y.sizes(), (Shape{T, B, H}));
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(c.dtype(), dt);  // f32 or f64 state: the input precision already
    // Same arithmetic in the forward (same GEMM shapes, same kernel): equal to rounding of the GEMM.
    const double tol = dt == DType::f64 ? 1e-12 : 2e-6;
    EXPECT_LE(excess(y, yr, tol, tol), 0.0);
    EXPECT_LE(excess(c, cr, tol, tol), 0.0);
    Tensor dy = randn({T, B, H}, {.dtype = dt}), dh = randn({B, H}, {.dtype = dt}), dc = randn({B, H}, {.dtype = dt});
    auto g = autograd::grad({y, h, c}, {gx, h0, c0, w, b}, {dy, dh, dc});
    auto gr = autograd::grad({yr, hr, cr}, {gx, h0, c0, w, b}, {dy, dh, dc});
    // The weight gradient is summed in a different order (one GEMM over T*B rows vs T GEMMs added).
    const double gtol = dt == DType::f64 ? 1e-11 : 2e-5;
    for (size_t i = 0; i < g.size(); ++i) EXPECT_LE(excess(g[i], gr[i], gtol, gtol), 0.0) << "gradient " << i;
  }
}

TEST(LstmLayer, Bf16KeepsF32CellStateAndTracksF32) {
  const int64_t T = 8, B = 5, H = 24;
  Tensor gx = rand({T, B, 4 * H}, {}, -2, 2), h0 = rand({B, H}, {}, -1, 1), c0 = rand({B, H}, {}, -1, 1);
  Tensor w = rand({4 * H, H}, {}, -0.3, 0.3), b = rand({4 * H}, {}, -0.5, 0.5);
  auto [y32, h32, c32] = lstm_layer(gx, h0, c0, w, b);
  auto [y, h, c] = lstm_layer(gx.to(DType::bf16), h0.to(DType::bf16), c0, w.to(DType::bf16), b.to(DType::bf16));
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_EQ(c.dtype(), DType::f32);  // the cell state never rounds to bf16
  // Each step rounds its gates (u = 2^-9, ~12 u through the activations, Note [16-bit tolerance
  // table]) and the recurrent GEMM reads bf16 h; the error does not grow over 8 steps because the
  // forget gate (sigma in (0.12, 0.88)) contracts it. Allowed 3x the one-step bound.
  EXPECT_LE(excess(y, y32, 36.0 / 512, 0.0), 0.0);
  EXPECT_LE(excess(c, c32, 36.0 / 512, 0.0), 0.0);
}

TEST(LstmLayer, WideningTheWeightOnceIsTheKernelsOwnWidening) {
  // Where the matmul computes bf16 through f32 (KernelPath::via_f32, chosen per shape), lstm_layer widens the
  // recurrent weight once per pass and rounds each f32 product itself (Note [lstm_layer]). That is bit for bit
  // what the kernel does when it widens the operands itself, for the forward's linear and the backward's matmul.
  manual_seed(19);
  const int64_t B = 20, H = 650;  // the word LM's sizes (oneDNN picks its kernels by shape)
  const Tensor h = randn({B, H}).to(DType::bf16), w = randn({4 * H, H}).to(DType::bf16);
  const Tensor b = randn({4 * H}).to(DType::bf16), dg = randn({B, 4 * H}).to(DType::bf16);
  const test::ScopedBf16Path via_f32(backend::cpu::Bf16Path::via_f32);
  const Tensor f = linear(h, w, b),
               fw = linear(h.to(DType::f32), w.t().to(DType::f32).t(), b.to(DType::f32)).to(DType::bf16);
  const Tensor d = matmul(dg, w), dw = matmul(dg.to(DType::f32), w.to(DType::f32)).to(DType::bf16);
  EXPECT_EQ(f.to_vector<float>(), fw.to_vector<float>());
  EXPECT_EQ(d.to_vector<float>(), dw.to_vector<float>());
}

TEST(LstmLayer, Bf16ForwardMatchesAStepByStepReferenceOnEveryPath) {
  // The fused layer's forward against the same steps as separate ops with the same rounding points (the gates'
  // GEMM rounded to bf16, gx added in bf16, h stored in bf16, c in f32), on each CPU bf16 path: equal.
  const int64_t T = 7, B = 3, H = 20;
  manual_seed(17);
  const Tensor gx = rand({T, B, 4 * H}, {}, -2, 2).to(DType::bf16), h0 = rand({B, H}, {}, -1, 1).to(DType::bf16);
  const Tensor c0 = rand({B, H}, {}, -1, 1), w = rand({4 * H, H}, {}, -0.4, 0.4).to(DType::bf16);
  const Tensor b = rand({4 * H}, {}, -0.5, 0.5).to(DType::bf16);
  test::for_each_bf16_path([&] {
    auto [y, hT, cT] = lstm_layer(gx, h0, c0, w, b);
    Tensor h = h0, c = c0;
    std::vector<Tensor> ys;
    for (int64_t t = 0; t < T; ++t) {
      auto [h1, c1] = lstm_gates(add(linear(h, w, b), gx.select(0, t)), c);
      h = h1.to(DType::bf16);
      c = c1;
      ys.push_back(h);
    }
    EXPECT_EQ(y.to_vector<float>(), stack(ys, 0).to_vector<float>());
    EXPECT_EQ(cT.to_vector<float>(), c.to_vector<float>());
  });
}

TEST(LstmLayer, AutocastRunsGemmsInBf16AndKeepsStateF32) {
  const int64_t T = 3, B = 2, H = 4;
  Tensor gx = rand({T, B, 4 * H}), h0 = zeros({B, H}), c0 = zeros({B, H});
  Tensor w = rand({4 * H, H}, {}, -0.5, 0.5).requires_grad_(), b = zeros({4 * H}).requires_grad_();
  amp::Autocast ac({.dtype = DType::bf16});
  auto [y, h, c] = lstm_layer(gx, h0, c0, w, b);
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(c.dtype(), DType::f32);
  sum(y).backward();
  EXPECT_EQ(w.grad().dtype(), DType::f32);  // gradient flows back through the autocast cast
  EXPECT_GT(sum(abs(w.grad())).item<double>(), 0.0);
}

TEST(LstmLayer, ErrorsNameExpectedAndGot) {
  Tensor h = zeros({2, 3}), w = zeros({12, 3});
  expect_error([&] { lstm_layer(zeros({4, 2, 10}), h, h, w); }, {"lstm_layer", "[T, B, 4H]", "got [4, 2, 10]"});
  expect_error(
      [&] {
        lstm_layer(zeros({4, 2, 12}), zeros({3, 3}), h, w);
      },
      {"lstm_layer", "h0", "[2, 3]", "got [3, 3]"});
  expect_error([&] { lstm_layer(zeros({4, 2, 12}), h, zeros({2, 4}), w); }, {"lstm_layer", "c0", "got [2, 4]"});
  expect_error([&] { lstm_layer(zeros({4, 2, 12}), h, h, zeros({12, 4})); }, {"lstm_layer", "w_hh", "[12, 3]"});
  expect_error([&] { lstm_layer(zeros({4, 2, 12}), h, h, w, zeros({3})); }, {"lstm_layer", "b_hh", "[12]", "got [3]"});
  expect_error([&] { lstm_layer(zeros({0, 2, 12}), h, h, w); }, {"lstm_layer", "at least one step"});
  expect_error(
      [&] {
        lstm_layer(zeros({4, 2, 12}, {.dtype = DType::bf16}), h, h, w);
      },
      {"lstm_layer", "one dtype", "bf16", "f32", "autocast"});
}

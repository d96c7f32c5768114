// LSTM / GRU / RNN modules against step-by-step loops over the cell ops.
// Tolerance kTol = 1e-5: the modules compute the input projection of all steps in one matmul while
// the reference does one per step, so f32 dot products of <= 16 terms (|terms| < 1) may be summed
// in another order (differences ~1e-7 per gate), then pass through saturating gates over <= 5 steps.
#include <gtest/gtest.h>

#include <cmath>

#include "mp/core/philox.hpp"
#include "mp/autograd/node.hpp"
#include "mp/nn/nn.hpp"
#include "mp/ops/ops.hpp"

using namespace mp;
using namespace mp::nn;

namespace {

constexpr double kTol = 1e-5;

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e30;
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

std::vector<std::string> names_of(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, t] : m.named_parameters()) out.push_back(n);
  return out;
}

}  // namespace

TEST(NnRnn, ParameterNamesShapesAndPrinting) {
  LSTM lstm(LSTMOptions{.input_size = 3, .hidden_size = 5, .num_layers = 2});
  EXPECT_EQ(names_of(lstm), (std::vector<std::string>{"weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                                                      "weight_ih_l1", "weight_hh_l1", "bias_ih_l1", "bias_hh_l1"}));
  EXPECT_EQ(lstm.weight_ih(0).sizes(), (Shape{20, 3}));
  EXPECT_EQ(lstm.weight_ih(1).sizes(), (Shape{20, 5}));
  EXPECT_EQ(lstm.weight_hh(1).sizes(), (Shape{20, 5}));
  EXPECT_EQ(lstm.to_string(), "LSTM(3, 5, num_layers=2)");
  GRU gru(GRUOptions{.input_size = 3, .hidden_size = 5, .bias = false});
  EXPECT_EQ(names_of(gru), (std::vector<std::string>{"weight_ih_l0", "weight_hh_l0"}));
  EXPECT_EQ(gru.weight_hh(0).sizes(), (Shape{15, 5}));
  RNN rnn(RNNOptions{.input_size = 3, .hidden_size = 5});
  EXPECT_EQ(rnn.weight_ih(0).sizes(), (Shape{5, 3}));
  EXPECT_THROW(LSTM(LSTMOptions{.input_size = 0, .hidden_size = 5}), Error);
}

TEST(NnRnn, LstmMatchesCellLoop) {
  manual_seed(5);
  LSTM lstm(LSTMOptions{.input_size = 4, .hidden_size = 6, .num_layers = 2});
  const int64_t T = 5, B = 3;
  Tensor x = randn({T, B, 4});
  Tensor h0 = randn({2, B, 6}), c0 = randn({2, B, 6});
  auto [out, state] = lstm.forward(x, {h0, c0});
  ASSERT_EQ(out.sizes(), (Shape{T, B, 6}));
  ASSERT_EQ(state.h.sizes(), (Shape{2, B, 6}));
  // Reference: layer by layer, step by step with lstm_cell.
  Tensor layer_in = x;
  for (int64_t l = 0; l < 2; ++l) {
    Tensor h = h0.select(0, l), c = c0.select(0, l);
    std::vector<Tensor> outs;
    for (int64_t t = 0; t < T; ++t) {
      std::tie(h, c) = lstm_cell(layer_in.select(0, t), h, c, lstm.weight_ih(l), lstm.weight_hh(l), lstm.bias_ih(l),
                                 lstm.bias_hh(l));
      outs.push_back(h);
    }
    EXPECT_LT(max_diff(state.h.select(0, l), h), kTol) << "h_n layer " << l;
    EXPECT_LT(max_diff(state.c.select(0, l), c), kTol) << "c_n layer " << l;
    layer_in = stack(outs, 0);
  }
  EXPECT_LT(max_diff(out, layer_in), kTol);
  // The last output step is h_n of the last layer.
  EXPECT_EQ(max_diff(out.select(0, T - 1), state.h.select(0, 1)), 0.0);
}

TEST(NnRnn, FusedLayerMatchesBasicPerStepGraph) {
  // LstmImpl::fused (default) runs each layer as one lstm_layer node; LstmImpl::basic builds the basic
  // per-step graph. Outputs, states and every gradient agree (the weight gradient is summed in a
  // different order: one GEMM over T*B rows against T per-step GEMMs).
  manual_seed(11);
  LSTM fused(LSTMOptions{.input_size = 5, .hidden_size = 7, .num_layers = 2});
  LSTM basic(LSTMOptions{.input_size = 5, .hidden_size = 7, .num_layers = 2, .impl = LstmImpl::basic});
  basic.load_state_dict(fused.state_dict());
  const int64_t T = 6, B = 3;
  Tensor x = randn({T, B, 5}).requires_grad_();
  Tensor h0 = randn({2, B, 7}), c0 = randn({2, B, 7});
  auto [of, sf] = fused.forward(x, {h0, c0});
  auto [ob, sb] = basic.forward(x, {h0, c0});
  EXPECT_LT(max_diff(of, ob), kTol);
  EXPECT_LT(max_diff(sf.h, sb.h), kTol);
  EXPECT_LT(max_diff(sf.c, sb.c), kTol);
  Tensor dy = randn({T, B, 7});
  auto loss = [&](const Tensor& o, const LSTMState& s) { return add(sum(mul(o, dy)), sum(add(s.h, mul(s.c, 0.5)))); };
  auto pf = fused.parameters(), pb = basic.parameters();
  std::vector<Tensor> in_f{x}, in_b{x};
  for (const Tensor& p : pf) in_f.push_back(p);
  for (const Tensor& p : pb) in_b.push_back(p);
  auto gf = autograd::grad({loss(of, sf)}, in_f);
  auto gb = autograd::grad({loss(ob, sb)}, in_b);
  ASSERT_EQ(gf.size(), gb.size());
  for (size_t i = 0; i < gf.size(); ++i) EXPECT_LT(max_diff(gf[i], gb[i]), 1e-4) << "gradient " << i;
}

TEST(NnRnn, LstmDefaultStateBatchFirstAndUnbatched) {
  manual_seed(6);
  LSTM tm(LSTMOptions{.input_size = 2, .hidden_size = 3});
  LSTM bf(LSTMOptions{.input_size = 2, .hidden_size = 3, .batch_first = true});
  bf.load_state_dict(tm.state_dict());
  Tensor x = randn({4, 2, 2});    // [T, B, I]
  auto [o1, s1] = tm.forward(x);  // zero initial state
  auto [o2, s2] = bf.forward(x.transpose(0, 1).contiguous());
  EXPECT_EQ(o2.sizes(), (Shape{2, 4, 3}));
  EXPECT_LT(max_diff(o1, o2.transpose(0, 1)), kTol);
  EXPECT_LT(max_diff(s1.h, s2.h), kTol);
  auto [o3, s3] = tm.forward(x, {zeros({1, 2, 3}), zeros({1, 2, 3})});
  EXPECT_EQ(max_diff(o1, o3), 0.0);  // undefined state = zeros
  // Unbatched [T, I]: the same as batch 1.
  auto [o4, s4] = tm.forward(x.select(1, 0));
  EXPECT_EQ(o4.sizes(), (Shape{4, 3}));
  EXPECT_EQ(s4.h.sizes(), (Shape{1, 3}));
  EXPECT_LT(max_diff(o4, o1.select(1, 0)), kTol);
  EXPECT_THROW(tm.forward(randn({4, 2, 5})), Error);                         // wrong input size
  EXPECT_THROW(tm.forward(x, {zeros({2, 2, 3}), zeros({2, 2, 3})}), Error);  // wrong layer count
}

TEST(NnRnn, GruAndRnnMatchCellLoops) {
  manual_seed(7);
  GRU gru(GRUOptions{.input_size = 3, .hidden_size = 4, .num_layers = 2, .batch_first = true});
  RNN rnn(RNNOptions{.input_size = 3, .hidden_size = 4});
  Tensor x = randn({2, 5, 3});  // [B, T, I] for the GRU
  auto [go, gh] = gru.forward(x);
  EXPECT_EQ(go.sizes(), (Shape{2, 5, 4}));
  EXPECT_EQ(gh.sizes(), (Shape{2, 2, 4}));
  Tensor layer_in = x.transpose(0, 1);
  for (int64_t l = 0; l < 2; ++l) {
    Tensor h = zeros({2, 4});
    std::vector<Tensor> outs;
    for (int64_t t = 0; t < 5; ++t) {
      h = gru_cell(layer_in.select(0, t), h, gru.weight_ih(l), gru.weight_hh(l), gru.bias_ih(l), gru.bias_hh(l));
      outs.push_back(h);
    }
    EXPECT_LT(max_diff(gh.select(0, l), h), kTol);
    layer_in = stack(outs, 0);
  }
  EXPECT_LT(max_diff(go, layer_in.transpose(0, 1)), kTol);

  Tensor xr = randn({5, 2, 3}), h0 = randn({1, 2, 4});
  auto [ro, rh] = rnn.forward(xr, h0);
  Tensor h = h0.select(0, 0);
  for (int64_t t = 0; t < 5; ++t)
    h = rnn_tanh_cell(xr.select(0, t), h, rnn.weight_ih(0), rnn.weight_hh(0), rnn.bias_ih(0), rnn.bias_hh(0));
  EXPECT_LT(max_diff(rh.select(0, 0), h), kTol);
  EXPECT_LT(max_diff(ro.select(0, 4), h), kTol);
}

TEST(NnRnn, DropoutBetweenLayersOnlyWhenTraining) {
  manual_seed(8);
  LSTM lstm(LSTMOptions{.input_size = 3, .hidden_size = 8, .num_layers = 2, .dropout = 0.5});
  Tensor x = randn({6, 2, 3});
  lstm.eval();
  auto [e1, s1] = lstm.forward(x);
  auto [e2, s2] = lstm.forward(x);
  EXPECT_EQ(max_diff(e1, e2), 0.0);  // deterministic in eval
  lstm.train();
  auto [t1, st1] = lstm.forward(x);
  EXPECT_GT(max_diff(t1, e1), 1e-3);  // dropout on layer 0's output changes layer 1
}

TEST(NnRnn, BackwardReachesEveryParameterAndInput) {
  manual_seed(9);
  LSTM lstm(LSTMOptions{.input_size = 3, .hidden_size = 4, .num_layers = 2});
  Tensor x = randn({4, 2, 3}).requires_grad_();
  auto [out, state] = lstm.forward(x);
  sum(out).backward();
  EXPECT_TRUE(x.grad().defined());
  for (const auto& [name, p] : lstm.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_GT(sum(abs(p.grad())).item<float>(), 0.0f) << name;
  }
}

// Outside autocast a recurrent layer computes in the promotion of its input's and weights' dtypes, as Linear does
// (amp's automatic precision moves single layers to f32: Note [automatic precision]): 16-bit weights given an f32 input
// give the f32 layer's output with the weights rounded to 16-bit, and their gradients reach the 16-bit weights; an f32
// layer given a 16-bit input likewise. Every implementation and the single-state cells.
TEST(NnRnn, MixedInputAndWeightDtypesComputeInThePromotedDtype) {
  for (const LstmImpl impl : {LstmImpl::fused, LstmImpl::basic}) {
    manual_seed(12);
    LSTM half(LSTMOptions{.input_size = 5, .hidden_size = 7, .num_layers = 2, .impl = impl});
    half.to(DType::f16);
    LSTM wide(LSTMOptions{.input_size = 5, .hidden_size = 7, .num_layers = 2, .impl = impl});
    wide.load_state_dict(half.state_dict());  // f32 copies of the rounded weights
    const Tensor x = randn({4, 3, 5});
    auto [oh, sh] = half.forward(x, {});
    auto [ow, sw] = wide.forward(x, {});
    EXPECT_EQ(oh.dtype(), DType::f32);
    EXPECT_EQ(max_diff(oh, ow), 0.0);  // the same f32 computation
    EXPECT_EQ(max_diff(sh.h, sw.h), 0.0);
    sum(oh).backward();
    for (const Tensor& p : half.parameters()) {
      ASSERT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().dtype(), DType::f16);
    }
    auto [o16, s16] = wide.forward(x.to(DType::f16), {});  // f32 weights, f16 input
    EXPECT_EQ(o16.dtype(), DType::f32);
    EXPECT_EQ(max_diff(o16, wide.forward(x.to(DType::f16).to(DType::f32), {}).first), 0.0);
  }
  manual_seed(13);
  GRU gru(GRUOptions{.input_size = 5, .hidden_size = 7});
  gru.to(DType::f16);
  const auto [y, h] = gru.forward(randn({4, 3, 5}), Tensor());
  EXPECT_EQ(y.dtype(), DType::f32);
  EXPECT_EQ(h.dtype(), DType::f32);
}

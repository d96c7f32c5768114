// mp::models::WordLM: PyTorch's names and counts, shapes, state carried across calls, truncated BPTT
// (detach), tied weights (one tensor, one gradient), dropout and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "mp/amp/diagnostics.hpp"
#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"
#include "mp/models/word_lm.hpp"
#include "mp/ops/ops.hpp"
#include "test_util.hpp"

using namespace mp;
using namespace mp::models;
using mp::test::error_of;

namespace {

WordLMOptions small(const std::string& cell, bool tie = false, double dropout = 0.0) {
  return {.vocab_size = 100,
          .embed_size = 32,
          .hidden_size = 32,
          .num_layers = 2,
          .cell = cell,
          .dropout = dropout,
          .tie_weights = tie};
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(sub(a.to(DType::f64), b.to(DType::f64))),
              [&] {
                Shape d;
                for (int64_t i = 0; i < a.dim(); ++i) d.push_back(i);
                return d;
              }())
      .item<double>();
}

}  // namespace

TEST(ModelsWordLM, NamesCountsAndInit) {
  // Counts from torch for RNNModel(ntoken=100, ninp=32, nhid=32, nlayers=2) (bench/pytorch/models.py WordLM).
  const std::map<std::pair<std::string, bool>, int64_t> counts{{{"lstm", false}, 23396}, {{"lstm", true}, 20196},
                                                               {{"gru", false}, 19172},  {{"gru", true}, 15972},
                                                               {{"rnn", false}, 10724},  {{"rnn", true}, 7524}};
  manual_seed(1);
  for (const auto& [key, count] : counts) {
    const auto& [cell, tie] = key;
    WordLM lm(small(cell, tie));
    EXPECT_EQ(lm.num_parameters(), count) << cell << tie;
    const int64_t gates = cell == "lstm" ? 4 : cell == "gru" ? 3 : 1;
    std::map<std::string, Shape> s;
    for (const auto& [n, p] : lm.named_parameters()) s[n] = p.sizes();
    EXPECT_EQ(s.at("encoder.weight"), (Shape{100, 32}));
    EXPECT_EQ(s.at("rnn.weight_ih_l0"), (Shape{gates * 32, 32}));
    EXPECT_EQ(s.at("rnn.weight_hh_l1"), (Shape{gates * 32, 32}));
    EXPECT_EQ(s.at("rnn.bias_ih_l1"), (Shape{gates * 32}));
    EXPECT_EQ(s.count("decoder.weight"), tie ? 0u : 1u);  // tied: listed once, as encoder.weight
    EXPECT_EQ(s.at("decoder.bias"), (Shape{100}));
    EXPECT_EQ(lm.named_parameters().front().first, "encoder.weight");  // PyTorch's order
    // init_weights: U(-0.1, 0.1) for encoder and decoder weights, zero decoder bias.
    EXPECT_LE(amax(abs(lm.encoder().weight()), {0, 1}).item<double>(), 0.1);
    EXPECT_GT(amax(abs(lm.encoder().weight()), {0, 1}).item<double>(), 0.09);  // 3200 draws fill the range
    EXPECT_LE(amax(abs(lm.decoder().weight()), {0, 1}).item<double>(), 0.1);
    EXPECT_EQ(amax(abs(lm.decoder().bias()), {0}).item<double>(), 0.0);
  }
}

TEST(ModelsWordLM, ShapesAndZeroState) {
  manual_seed(2);
  const Tensor tokens = randint(0, 100, {5, 3});
  for (const char* cell : {"lstm", "gru", "rnn"}) {
    WordLM lm(small(cell));
    lm.eval();
    autograd::NoGradGuard ng;
    auto [logits, state] = lm.forward(tokens);
    EXPECT_EQ(logits.sizes(), (Shape{15, 100})) << cell;
    EXPECT_EQ(state.h.sizes(), (Shape{2, 3, 32})) << cell;
    EXPECT_EQ(state.c.defined(), std::string(cell) == "lstm") << cell;
    if (state.c.defined()) { EXPECT_EQ(state.c.sizes(), (Shape{2, 3, 32})); }
    // An undefined state is the zero state.
    auto [logits0, state0] = lm.forward(tokens, lm.init_state(3));
    EXPECT_EQ(max_abs_diff(logits, logits0), 0.0) << cell;
    // i32 tokens work too.
    EXPECT_EQ(max_abs_diff(lm.forward(tokens.to(DType::i32)).first, logits), 0.0) << cell;
  }
}

TEST(ModelsWordLM, StateCarriesAcrossCalls) {
  // Running 2T steps at once equals T steps, then T more from the returned state.
  manual_seed(3);
  const Tensor tokens = randint(0, 100, {8, 2});
  for (const char* cell : {"lstm", "gru", "rnn"}) {
    WordLM lm(small(cell, false, 0.5));
    lm.eval();  // no dropout: both runs compute the same function
    autograd::NoGradGuard ng;
    auto [whole, s_whole] = lm.forward(tokens);
    auto [first, s1] = lm.forward(tokens.narrow(0, 0, 4));
    auto [second, s2] = lm.forward(tokens.narrow(0, 4, 4), s1);
    // Only the blocking of the input projection matmul (4 vs 8 rows) differs: f32 rounding, ~1e-7.
    EXPECT_LT(max_abs_diff(cat({first, second}, 0), whole), 1e-5) << cell;
    EXPECT_LT(max_abs_diff(s2.h, s_whole.h), 1e-5) << cell;
    if (s2.c.defined()) { EXPECT_LT(max_abs_diff(s2.c, s_whole.c), 1e-5) << cell; }
    // The state matters: starting the second half from zeros gives other logits.
    auto [fresh, s_fresh] = lm.forward(tokens.narrow(0, 4, 4));
    EXPECT_GT(max_abs_diff(fresh, second), 1e-4) << cell;
  }
}

TEST(ModelsWordLM, DetachCutsTheGraph) {
  // Call 1 sees only tokens 1 and 2, call 2 only tokens 3 and 4. A loss on call 2's logits reaches
  // the embedding rows 1 and 2 only through call 1's state: with the state detached they get no gradient.
  manual_seed(4);
  const Tensor t1 = from_vector<int64_t>({1, 2, 1, 2, 2, 1}, {3, 2});
  const Tensor t2 = from_vector<int64_t>({3, 4, 4, 3, 3, 4}, {3, 2});
  for (const char* cell : {"lstm", "gru"}) {
    for (bool cut : {false, true}) {
      WordLM lm(small(cell));
      auto [l1, s1] = lm.forward(t1);
      EXPECT_NE(s1.h.grad_fn(), nullptr);
      const nn::LSTMState s = cut ? WordLM::detach(s1) : s1;
      if (cut) {
        EXPECT_EQ(s.h.grad_fn(), nullptr);
        EXPECT_FALSE(s.h.requires_grad());
        EXPECT_EQ(s.c.defined(), std::string(cell) == "lstm");
        if (s.c.defined()) { EXPECT_FALSE(s.c.requires_grad()); }
        // Same values: detach cuts the history, not the state.
        EXPECT_EQ(max_abs_diff(s.h, s1.h), 0.0);
      }
      auto [l2, s2] = lm.forward(t2, s);
      sum(l2).backward();
      const Tensor g = lm.encoder().weight().grad();
      ASSERT_TRUE(g.defined());
      const double reach_old = amax(abs(g.narrow(0, 1, 2)), {0, 1}).item<double>();
      const double reach_new = amax(abs(g.narrow(0, 3, 2)), {0, 1}).item<double>();
      EXPECT_GT(reach_new, 0.0) << cell;
      if (cut) {
        EXPECT_EQ(reach_old, 0.0) << cell;
      } else {
        EXPECT_GT(reach_old, 0.0) << cell;
      }
    }
  }
}

TEST(ModelsWordLM, TiedWeightsShareOneTensorAndOneGradient) {
  manual_seed(5);
  const std::string m =
      error_of([] { WordLM({.vocab_size = 10, .embed_size = 8, .hidden_size = 16, .tie_weights = true}); });
  for (const char* part : {"WordLM", "tie_weights", "hidden_size 16", "embed_size 8"}) EXPECT_CONTAINS(m, part);
  WordLM tied(small("lstm", true));
  EXPECT_TRUE(tied.decoder().weight().impl_ptr() == tied.encoder().weight().impl_ptr());
  EXPECT_TRUE(tied.decoder().weight().is_alias_of(tied.encoder().weight()));
  // The state dict carries the tensor under both names (as PyTorch's).
  const nn::StateDict sd = tied.state_dict();
  ASSERT_NE(sd.find("encoder.weight"), nullptr);
  ASSERT_NE(sd.find("decoder.weight"), nullptr);

  // The tied gradient is the sum of the embedding's and the decoder's gradients: compare with an
  // untied model holding the same values in both matrices.
  WordLM untied(small("lstm", false));
  {
    autograd::NoGradGuard ng;
    nn::StateDict s = tied.state_dict();
    untied.load_state_dict(s);  // decoder.weight gets the (shared) encoder values
  }
  EXPECT_EQ(max_abs_diff(untied.decoder().weight(), untied.encoder().weight()), 0.0);
  const Tensor tokens = randint(0, 100, {6, 4});
  const Tensor target = randint(0, 100, {24});
  cross_entropy(tied.forward(tokens).first, target).backward();
  cross_entropy(untied.forward(tokens).first, target).backward();
  int with_grad = 0;
  for (const Tensor& p : tied.parameters()) with_grad += p.grad().defined();
  EXPECT_EQ(with_grad, static_cast<int>(tied.parameters().size()));
  const Tensor want = add(untied.encoder().weight().grad(), untied.decoder().weight().grad());
  // Same f32 computation in both models; only the summation order of the two contributions may differ.
  EXPECT_LT(max_abs_diff(tied.encoder().weight().grad(), want), 1e-6);
  EXPECT_GT(amax(abs(want), {0, 1}).item<double>(), 1e-3);  // the check is not vacuous

  // Tied through a dtype conversion, and still one gradient.
  tied.zero_grad();
  tied.to(DType::bf16);
  EXPECT_TRUE(tied.decoder().weight().impl_ptr() == tied.encoder().weight().impl_ptr());
  EXPECT_EQ(tied.encoder().weight().dtype(), DType::bf16);
  cross_entropy(tied.forward(tokens).first, target).backward();
  EXPECT_TRUE(tied.decoder().weight().grad().defined());
  EXPECT_EQ(tied.decoder().weight().grad().dtype(), DType::bf16);
}

TEST(ModelsWordLM, DropoutOnlyWhenTraining) {
  manual_seed(6);
  WordLM lm(small("gru", false, 0.5));
  const Tensor tokens = randint(0, 100, {4, 2});
  autograd::NoGradGuard ng;
  EXPECT_GT(max_abs_diff(lm.forward(tokens).first, lm.forward(tokens).first), 1e-4);  // new masks each call
  lm.eval();
  EXPECT_EQ(max_abs_diff(lm.forward(tokens).first, lm.forward(tokens).first), 0.0);
  // The RNN's own between-layer dropout is the model's.
  EXPECT_EQ(lm.rnn().options().dropout, 0.5);
  EXPECT_EQ(WordLM({.vocab_size = 5, .embed_size = 4, .hidden_size = 4, .num_layers = 1}).rnn().options().dropout, 0.0);
}

// A word LM's recurrent layer has a forward of its own signature (a state in and out): it runs its hooks itself,
// so the finder names it.
TEST(ModelsWordLM, OverflowFinderNamesTheRecurrentLayer) {
  manual_seed(3);
  auto lm = std::make_shared<WordLM>(
      WordLMOptions{.vocab_size = 10, .embed_size = 4, .hidden_size = 4, .num_layers = 1, .dropout = 0.0});
  amp::OverflowFinder finder(*lm);
  const Tensor tokens = from_vector<int64_t>({1, 2, 3, 4}, {2, 2});
  (void)lm->forward(tokens, {});
  EXPECT_FALSE(finder.first_forward().has_value());
  for (auto& [name, p] : lm->named_parameters())
    if (name.rfind("rnn.", 0) == 0) {
      autograd::NoGradGuard ng;
      p.fill_(std::nan(""));
      break;
    }
  (void)lm->forward(tokens, {});
  ASSERT_TRUE(finder.first_forward().has_value());
  EXPECT_EQ(finder.first_forward()->rfind("rnn (", 0), 0u) << *finder.first_forward();
}

TEST(ModelsWordLM, Errors) {
  std::string m = error_of([] { WordLM({.vocab_size = 10, .cell = "transformer"}); });
  for (const char* part : {"WordLM", "lstm", "transformer"}) EXPECT_CONTAINS(m, part);
  m = error_of([] { WordLM({.vocab_size = 0}); });
  for (const char* part : {"WordLM", "vocab_size"}) EXPECT_CONTAINS(m, part);
  WordLM lm(small("rnn"));
  m = error_of([&] { lm.forward(randn({4, 2})); });
  for (const char* part : {"WordLM::forward", "i64/i32 tokens [T, B]"}) EXPECT_CONTAINS(m, part);
  m = error_of([&] { lm.forward(randint(0, 100, {8})); });
  for (const char* part : {"WordLM::forward", "[T, B]"}) EXPECT_CONTAINS(m, part);
}

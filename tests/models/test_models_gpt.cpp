// mp::models::Gpt: nanoGPT's names, sizes and parameter counts, tied head, causality, training in fp32 and bf16 O2,
// and the same logits as nanoGPT's forward in PyTorch from the exported state dict (Note [tests that need Python]).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "mp/amp/initialize.hpp"
#include "mp/autograd/node.hpp"
#include "mp/models/gpt.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/adam.hpp"
#include "mp/train/safetensors.hpp"
#include "test_util.hpp"

using namespace mp;
using namespace mp::models;

namespace {

GptOptions nano(double dropout = 0.0) {
  GptOptions o = gpt_preset("gpt-nano", 101);
  o.dropout = dropout;
  return o;
}

// nanoGPT's parameter count: V C (wte, shared with lm_head) + T C (wpe) + L (12 C^2 + 13 C) + 2 C (ln_f).
int64_t expected_params(const GptOptions& o) {
  const int64_t C = o.n_embd;
  return o.vocab_size * C + o.block_size * C + o.n_layer * (12 * C * C + 13 * C) + 2 * C;
}

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  manual_seed(seed);
  return randint(0, V, {B, T});
}

}  // namespace

TEST(Gpt, NamesAndSizesAreNanoGpts) {
  manual_seed(1);
  Gpt m(nano());
  const nn::StateDict sd = m.state_dict();
  std::set<std::string> names;
  for (const auto& [k, v] : sd) names.insert(k);
  EXPECT_EQ(names.size(), 2 + 3 * 12 + 3u);
  for (const char* k : {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.2.attn.c_attn.weight",
                        "transformer.h.0.mlp.c_proj.bias", "transformer.ln_f.weight", "lm_head.weight"})
    EXPECT_EQ(names.count(k), 1u) << k;
  EXPECT_EQ(sd.at("transformer.h.0.attn.c_attn.weight").sizes(), (Shape{144, 48}));  // nn.Linear layout [out, in]
  EXPECT_EQ(sd.at("lm_head.weight").sizes(), (Shape{101, 48}));
  // Tied: one parameter (listed once), the same tensor under both names.
  int64_t n = 0;
  for (const Tensor& p : m.parameters()) n += p.numel();
  EXPECT_EQ(n, expected_params(nano()));
  EXPECT_TRUE(sd.at("lm_head.weight").is_alias_of(sd.at("transformer.wte.weight")));
  // GPT-2 124M by the formula nanoGPT's get_num_params() follows: 124,439,808 with the position embedding.
  EXPECT_EQ(expected_params(gpt_preset("gpt2", 50257)), 124439808);
  EXPECT_THROW(gpt_preset("gpt-huge", 10), Error);
  EXPECT_THROW(Gpt({.vocab_size = 10, .n_head = 5, .n_embd = 48}), Error);
}

TEST(Gpt, EachPositionSeesOnlyThePast) {
  manual_seed(2);
  Gpt m(nano());
  m.eval();
  Tensor a = tokens(2, 20, 101, 3), b = a.clone();
  b.data_ptr<int64_t>()[15] = (b.data_ptr<int64_t>()[15] + 7) % 101;  // batch 0, position 15
  const Tensor la = m.forward(a), lb = m.forward(b);
  EXPECT_EQ(la.sizes(), (Shape{2, 20, 101}));
  const double before = amax(abs(sub(la.narrow(1, 0, 15), lb.narrow(1, 0, 15))), {0, 1, 2}).item<double>();
  const double after = amax(abs(sub(la.narrow(1, 15, 5), lb.narrow(1, 15, 5))), {0, 1, 2}).item<double>();
  EXPECT_EQ(before, 0.0) << "a later token changed an earlier position's logits";
  EXPECT_GT(after, 1e-4);
  try {
    (void)m.forward(tokens(1, 65, 101, 4));
    FAIL() << "a sequence longer than block_size was accepted";
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "65 tokens");
    EXPECT_CONTAINS(std::string(e.what()), "block_size");
  }
}

TEST(Gpt, LearnsASequenceInF32AndBf16O2) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 O2" : "fp32");
    manual_seed(5);
    auto m = std::make_shared<Gpt>(nano(0.1));
    optim::AdamW opt(m->parameters(), {.lr = 3e-3, .weight_decay = 0.0});
    if (bf16) {
      (void)amp::prepare(*m, opt, {.opt_level = amp::OptLevel::O2, .dtype = DType::bf16});  // bf16: no scaling
      EXPECT_EQ(m->state_dict().at("transformer.h.0.attn.c_attn.weight").dtype(), DType::bf16);
    }
    const Tensor x = tokens(4, 32, 101, 6);
    const Tensor y = cat({x.narrow(1, 1, 31), x.narrow(1, 0, 1)}, 1);  // predict the next token (cyclic)
    double first = 0, last = 0;
    for (int step = 0; step < 60; ++step) {
      const Tensor loss = cross_entropy(m->forward(x).reshape({-1, 101}).to(DType::f32), y.reshape({-1}));
      if (step == 0) first = loss.item<double>();
      last = loss.item<double>();
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    // Chance is ln 101 = 4.6; 60 steps on one batch of 128 positions memorise most of it.
    EXPECT_NEAR(first, std::log(101.0), 0.3);
    EXPECT_LT(last, 1.0) << "first " << first;
  }
}

TEST(Gpt, ExportedStateDictGivesNanoGptsLogitsInPyTorch) {
  MP_SKIP_OR_FAIL_WITHOUT_PYTHON("torch, safetensors");
  manual_seed(7);
  Gpt m(nano());
  m.eval();
  const Tensor idx = tokens(2, 24, 101, 8);
  nn::StateDict sd = m.state_dict();
  sd.insert("idx", idx);
  sd.insert("logits", m.forward(idx).detach());
  const std::filesystem::path dir = test::scratch_dir("gpt", "twin");
  train::save_safetensors((dir / "gpt.safetensors").string(), sd);
  const test::ShellResult r = test::shell(test::python_command() + " '" MP_SOURCE_DIR "/tests/python/gpt_twin.py' '" +
                                          (dir / "gpt.safetensors").string() + "' 3 3");
  EXPECT_EQ(r.code, 0) << r.output;
  std::printf("[   INFO   ] nanoGPT's forward in PyTorch (f64) against ours (f32): %s", r.output.c_str());
}

namespace {

// The largest |a - b| over all elements, and the largest |b| (for a relative bound).
double max_abs_diff(const Tensor& a, const Tensor& b) {
  return amax(abs(sub(a.to(DType::f32), b.to(DType::f32))), {0, 1, 2}).item<double>();
}
double max_abs(const Tensor& a) { return amax(abs(a.to(DType::f32)), {0, 1, 2}).item<double>(); }

// A nano model taught to continue a cyclic sequence (so that its logits have clear winners for greedy tests).
std::shared_ptr<Gpt> trained_nano(int64_t block_size, uint64_t seed) {
  manual_seed(seed);
  GptOptions o = nano(0.1);
  o.block_size = block_size;
  auto m = std::make_shared<Gpt>(o);
  optim::AdamW opt(m->parameters(), {.lr = 3e-3, .weight_decay = 0.0});
  const Tensor x = tokens(4, 32, 101, seed + 1);
  const Tensor y = cat({x.narrow(1, 1, 31), x.narrow(1, 0, 1)}, 1);
  for (int step = 0; step < 40; ++step) {
    const Tensor loss = cross_entropy(m->forward(x).reshape({-1, 101}), y.reshape({-1}));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  m->eval();
  return m;
}

}  // namespace

// Note [key/value cache] in src/models/gpt.cpp: forward_cached over a sequence fed in pieces (several new positions
// after an empty and after a non-empty cache, single positions) gives forward()'s logits. f32: both paths compute
// the same sums, but GEMMs of other shapes and attention over another number of keys per call may block and order
// them differently, so the logits may differ by a few f32 ulps of the values summed: |diff| <= 1e-5 with logits of
// size ~1. bf16 (weights cast, activations bf16): every layer's output is rounded to 8 bits, and a 1-ulp difference
// in one rounding (2^-8 relative) propagates through later layers, so the bound is a few 16-bit ulps of the largest
// logit: |diff| <= 4 * 2^-8 * max |logit| (+ 2^-8 for logits near 0). Measured on AMD EPYC Zen 4: 0 in both (the
// kernels there happen to sum each row alike); the bounds are for kernels that do not.
TEST(Gpt, CachedForwardGivesTheFullForwardsLogits) {
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    manual_seed(11);
    Gpt m(nano(0.2));  // dropout in the options, eval mode: none applied
    m.eval();
    if (bf16) m.to(DType::bf16);
    const Tensor idx = tokens(2, 20, 101, 12);
    const Tensor full = m.forward(idx);
    GptKvCache cache;
    int64_t at = 0;
    double worst = 0;
    for (const int64_t n : {5, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}) {
      const Tensor part = m.forward_cached(idx.narrow(1, at, n), cache);
      ASSERT_EQ(part.sizes(), (Shape{2, n, 101}));
      EXPECT_FALSE(part.requires_grad());
      worst = std::max(worst, max_abs_diff(part, full.narrow(1, at, n)));
      at += n;
      EXPECT_EQ(cache.length, at);
      EXPECT_EQ(cache.keys.at(2).sizes(), (Shape{2, 3, at, 16}));
    }
    ASSERT_EQ(at, 20);
    const double bound = bf16 ? (4 * max_abs(full) + 1) * std::ldexp(1.0, -8) : 1e-5;
    EXPECT_LE(worst, bound) << "largest logit " << max_abs(full);
    std::printf("[   INFO   ] %s: cached against full logits: max |diff| %.3g (bound %.3g, max |logit| %.3g)\n",
                bf16 ? "bf16" : "f32", worst, bound, max_abs(full));
  }
}

TEST(Gpt, CachedForwardRefusesTrainingModeAndAFullContext) {
  manual_seed(13);
  Gpt m(nano(0.1));
  GptKvCache cache;
  EXPECT_THROW((void)m.forward_cached(tokens(1, 4, 101, 1), cache), Error);  // training mode
  m.eval();
  (void)m.forward_cached(tokens(1, 60, 101, 2), cache);
  try {
    (void)m.forward_cached(tokens(1, 5, 101, 3), cache);
    FAIL() << "60 + 5 positions were accepted with block_size 64";
  } catch (const Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "holds 60 positions");
    EXPECT_CONTAINS(std::string(e.what()), "block_size");
  }
  EXPECT_EQ(cache.length, 60);
  EXPECT_THROW((void)m.forward_cached(tokens(2, 1, 101, 4), cache), Error);  // another batch size
  (void)m.forward_cached(tokens(1, 4, 101, 5), cache);                       // exactly full is fine
  cache.clear();
  EXPECT_EQ(m.forward_cached(tokens(2, 3, 101, 6), cache).sizes(), (Shape{2, 3, 101}));
}

// Linear cost per token: with the cache, every step after the prompt runs the layers on one position (a hook on the
// first block's c_attn sees T = 1; its attention then scores 1 query against the T cached keys: O(T) work, against
// forward()'s T x T scores and T positions of projections), and greedy decoding gives the very tokens of
// recomputing the whole forward at every step (f32; a model trained to continue a sequence, so that the argmax
// is never a near tie that rounding could flip).
TEST(Gpt, CachedGreedyDecodingEqualsRecomputingAndRunsOnePositionPerStep) {
  auto m = trained_nano(96, 21);
  std::vector<int64_t> positions;  // T of each c_attn call
  nn::Module* c_attn = nullptr;
  for (auto& [name, mod] : m->named_modules())
    if (name == "transformer.h.0.attn.c_attn") c_attn = mod;
  ASSERT_NE(c_attn, nullptr);
  const size_t hook = c_attn->register_forward_hook(
      [&](nn::Module&, const Tensor& in, const Tensor&) { positions.push_back(in.size(1)); });

  const Tensor prompt = tokens(1, 32, 101, 22).narrow(1, 0, 8);  // the start of one trained sequence
  std::vector<int64_t> cached, recomputed;
  {
    GptKvCache cache;
    Tensor logits = m->forward_cached(prompt, cache);
    for (int i = 0; i < 64; ++i) {
      const int64_t next = argmax(logits.select(0, 0).select(0, logits.size(1) - 1), 0).item<int64_t>();
      cached.push_back(next);
      logits = m->forward_cached(from_vector(std::vector<int64_t>{next}, {1, 1}), cache);
    }
  }
  ASSERT_EQ(positions.size(), 65u);
  EXPECT_EQ(positions[0], 8);
  for (size_t i = 1; i < positions.size(); ++i) ASSERT_EQ(positions[i], 1) << "step " << i;
  c_attn->remove_forward_hook(hook);

  Tensor seq = prompt;
  for (int i = 0; i < 64; ++i) {
    autograd::NoGradGuard ng;
    const Tensor logits = m->forward(seq);
    const int64_t next = argmax(logits.select(0, 0).select(0, seq.size(1) - 1), 0).item<int64_t>();
    recomputed.push_back(next);
    seq = cat({seq, from_vector(std::vector<int64_t>{next}, {1, 1})}, 1);
  }
  EXPECT_EQ(cached, recomputed);
  std::set<int64_t> distinct(cached.begin(), cached.end());
  EXPECT_GT(distinct.size(), 4u) << "the trained model should continue its sequence, not repeat one token";
}

// mp::models::Gpt: nanoGPT's names, sizes and parameter counts, tied head, causality, training in fp32 and bf16 O2,
// and the same logits as nanoGPT's forward in PyTorch from the exported state dict (Note [tests that need Python]).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "mp/amp/initialize.hpp"
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

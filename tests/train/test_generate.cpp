// train::generate (Note [generating with a key/value cache], Note [gpt checkpoints] in src/train/generate.cpp): the
// tokens of recomputing the full forward with the same cropping rule, streamed whole UTF-8 characters, and clear
// refusals of files that are not GPT checkpoints.
#include <gtest/gtest.h>

#include <sstream>

#include "mp/autograd/node.hpp"
#include "mp/core/error.hpp"
#include "mp/data/utf8_stream.hpp"
#include "mp/train/generate.hpp"
#include "mp/train/safetensors.hpp"
#include "test_util.hpp"
#include "train/gpt_checkpoint_fixture.hpp"

using namespace mp;

namespace {

// Greedy decoding by the full forward at every step, cropping as generate() does: when a new token would make the
// sequence longer than block_size, keep its last block_size / 2 tokens.
std::vector<int64_t> greedy_by_full_forward(models::Gpt& m, std::vector<int64_t> seq, int64_t n) {
  autograd::NoGradGuard ng;
  const int64_t block = m.options().block_size;
  if (static_cast<int64_t>(seq.size()) > block) seq.erase(seq.begin(), seq.end() - block);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor logits = m.forward(from_vector(seq, {1, static_cast<int64_t>(seq.size())}));
    const int64_t next = argmax(logits.select(0, 0).select(0, logits.size(1) - 1), 0).item<int64_t>();
    out.push_back(next);
    seq.push_back(next);
    if (static_cast<int64_t>(seq.size()) > block) seq.erase(seq.begin(), seq.end() - block / 2);
  }
  return out;
}

bool valid_utf8(const std::string& s) {
  data::Utf8Stream u;
  return u.push(s) == s && u.finish().empty();
}

}  // namespace

TEST(Generate, GreedyTokensEqualTheFullForwardsAcrossContextRefills) {
  const std::string path = (test::scratch_dir("generate", "greedy") / "gpt.safetensors").string();
  auto [model, tok] = test::write_gpt_checkpoint(path);
  std::ostringstream out;
  const train::GenerateOptions g{.prompt = "And the earth", .max_new_tokens = 150, .temperature = 0.0};
  const train::GenerateResult r = train::generate(path, g, out);
  EXPECT_EQ(r.prompt_tokens, tok.encode(g.prompt));
  ASSERT_EQ(r.tokens.size(), 150u);
  EXPECT_EQ(r.tokens, greedy_by_full_forward(*model, r.prompt_tokens, 150));
  EXPECT_GE(r.refills, 2) << "150 tokens in a context of 64 should refill the cache";
  EXPECT_EQ(out.str(), g.prompt + r.text);
  EXPECT_TRUE(valid_utf8(r.text));
  EXPECT_GT(r.prefill_ms, 0.0);
  EXPECT_GT(r.ms_per_token, 0.0);
  std::printf("[   INFO   ] %s%s\n[   INFO   ] prefill %.2f ms, %.3f ms/token\n", g.prompt.c_str(), r.text.c_str(),
              r.prefill_ms, r.ms_per_token);

  // The same again, and in bf16 (weights cast) it still runs and gives valid text.
  std::ostringstream again;
  EXPECT_EQ(train::generate(path, g, again).tokens, r.tokens);
  std::ostringstream b;
  train::GenerateOptions gb = g;
  gb.precision = "bf16";
  EXPECT_EQ(train::generate(path, gb, b).tokens.size(), 150u);
  EXPECT_TRUE(valid_utf8(b.str()));
}

TEST(Generate, SamplingIsReproducibleAndTheTextStreamsWholeCharacters) {
  const std::string path = (test::scratch_dir("generate", "sample") / "gpt.safetensors").string();
  (void)test::write_gpt_checkpoint(path, {.context = 32});  // the config's context is the model's block size
  const train::GenerateOptions g{.prompt = "Caf\xC3\xA9", .max_new_tokens = 80, .temperature = 1.5, .seed = 9};
  std::ostringstream a, b, c;
  const train::GenerateResult ra = train::generate(path, g, a);
  EXPECT_EQ(train::generate(path, g, b).tokens, ra.tokens);
  EXPECT_EQ(a.str(), b.str());
  train::GenerateOptions other = g;
  other.seed = 10;
  EXPECT_NE(train::generate(path, other, c).tokens, ra.tokens);
  EXPECT_GE(ra.refills, 1);
  EXPECT_TRUE(valid_utf8(a.str())) << a.str();
  // An empty prompt starts from <|endoftext|>.
  std::ostringstream e;
  const train::GenerateResult re = train::generate(path, {.max_new_tokens = 5}, e);
  EXPECT_EQ(re.prompt_tokens, (std::vector<int64_t>{*test::gpt_tokenizer().token_id("<|endoftext|>")}));
  EXPECT_EQ(e.str(), re.text);
}

TEST(Generate, RefusesFilesThatAreNotGptCheckpoints) {
  const auto dir = test::scratch_dir("generate", "refuse");
  const auto refused = [](const std::string& path, const train::GenerateOptions& g, const std::string& needle) {
    std::ostringstream out;
    try {
      (void)train::generate(path, g, out);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) { EXPECT_CONTAINS(std::string(e.what()), needle); }
  };
  const train::GenerateOptions g{.prompt = "And", .max_new_tokens = 3};
  refused((dir / "none.safetensors").string(), g, "does not exist");
  const std::string lstm = (dir / "lstm.safetensors").string();
  (void)test::write_gpt_checkpoint(lstm, {.model = "lstm", .steps = 0});
  refused(lstm, g, "expected config model gpt-nano, gpt-mini or gpt2, got 'lstm'");
  const std::string notok = (dir / "notok.safetensors").string();
  (void)test::write_gpt_checkpoint(notok, {.tokenizer = false, .steps = 0});
  refused(notok, g, "holds no tokenizer");
  const std::string bare = (dir / "bare.safetensors").string();
  (void)test::write_gpt_checkpoint(bare, {.config = false, .steps = 0});
  refused(bare, g, "has no training config");
  // Weights of a context of 32 under a config that says the preset's 64.
  const std::string ctx = (dir / "ctx.safetensors").string();
  (void)test::write_gpt_checkpoint(ctx, {.context = 32, .steps = 0});
  {
    auto f = train::load_safetensors(ctx);
    f.metadata["config"] = "{\"model\": \"gpt-nano\", \"context\": 0}";
    train::save_safetensors(ctx, f.tensors, f.metadata);
  }
  refused(ctx, g, "expected transformer.wpe.weight of shape [64, 48]");
  const std::string ok = (dir / "ok.safetensors").string();
  (void)test::write_gpt_checkpoint(ok, {.steps = 0});
  refused(ok, {.max_new_tokens = 0}, "expected max_new_tokens > 0, got 0");
  refused(ok, {.temperature = -0.5}, "expected a temperature >= 0");
  refused(ok, {.top_k = -1}, "expected top_k >= 0");
  refused(ok, {.precision = "f64"}, "expected precision fp32, bf16 or fp16");
}

// `mixprec train --model gpt-*` (src/train/gpt_trainer.cpp, Note [GPT training data]): a gpt-nano on the fixture
// corpus learns in fp32 and bf16 O2, resumes exactly, stores its tokenizer in every checkpoint, evaluates from the
// checkpoint alone, and refuses settings that do not apply.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "mp/data/bpe.hpp"
#include "mp/train/safetensors.hpp"
#include "mp/train/trainer.hpp"
#include "test_util.hpp"
#include "trainer_fixtures.hpp"

namespace {

using mp::train::RunSummary;
using mp::train::TrainConfig;
using trainer_fixtures::expect_exact_resume;
using trainer_fixtures::scratch_dir;
using trainer_fixtures::text_config;

TrainConfig gpt_config(const std::string& precision) {
  TrainConfig c = text_config(precision);
  c.model = "gpt-nano";
  c.context = 16;
  c.max_vocab = 300;  // 256 bytes, <|endoftext|> and 43 merges: the fixture's few words become single tokens
  c.dropout = 0.1;    // dropout draws must continue the same random stream after a resume
  c.optimizer.clear();
  c.lr = 3e-3;
  c.batch_size = 8;
  c.epochs = 2;
  c.max_steps_per_epoch = 6;
  return c;
}

TEST(TrainerGpt, LearnsTheCorpusInFp32AndBf16O2) {
  for (const char* p : {"fp32", "bf16"}) {
    TrainConfig c = gpt_config(p);
    c.epochs = 3;
    c.max_steps_per_epoch = 10;
    std::ostringstream sink;
    const RunSummary s = mp::train::train(c, sink);
    ASSERT_EQ(s.epochs.size(), 3u) << p;
    EXPECT_EQ(s.metric_name, "perplexity");
    // The corpus has 4 x 4 x 4 sentence patterns: a model that learned the words and their order is far below a
    // uniform guess over the 300 tokens (perplexity 300).
    EXPECT_LT(s.val_metric, 30) << p;
    EXPECT_LT(s.epochs.back().train_loss, s.epochs.front().train_loss) << p;
    EXPECT_EQ(s.config.optimizer, "adamw") << p;  // the gpt task default (nanoGPT's)
  }
}

TEST(TrainerGpt, ExactResumeFp32) { expect_exact_resume(gpt_config("fp32"), 4, "gpt_fp32"); }

TEST(TrainerGpt, ExactResumeBf16O2AtEpochBoundary) { expect_exact_resume(gpt_config("bf16"), 6, "gpt_bf16"); }

TEST(TrainerGpt, EveryCheckpointStoresTheTokenizerAndEvaluatesAlone) {
  TrainConfig c = gpt_config("fp32");
  c.checkpoint_dir = scratch_dir("trainer_gpt", "ckpt").string();
  std::ostringstream sink;
  const RunSummary s = mp::train::train(c, sink);
  const std::string ckpt = c.checkpoint_dir + "/checkpoint.safetensors";
  std::map<std::string, std::string> md;
  (void)mp::train::read_safetensors_header(ckpt, &md);
  ASSERT_TRUE(md.count("tokenizer")) << "no tokenizer in the checkpoint's metadata";
  const mp::data::BpeTokenizer tok = mp::data::BpeTokenizer::from_json(md["tokenizer"]);
  EXPECT_EQ(tok.vocab_size(), 300);
  EXPECT_EQ(tok.decode(tok.encode("the king went unto the city .")), "the king went unto the city .");
  const mp::train::EvalResult ev = mp::train::evaluate_checkpoint(ckpt, "valid", nullptr, sink);
  EXPECT_EQ(ev.loss, s.val_loss);
  EXPECT_EQ(ev.metric_name, "perplexity");
}

TEST(TrainerGpt, ATokenizerFileIsUsedAsGiven) {
  const auto dir = scratch_dir("trainer_gpt", "tokenizer");
  // a tokenizer trained on other text, with another size: the run's ids are its ids
  const std::vector<std::string> texts = {"a man went unto his house and saw the lord", "the people blessed the land"};
  const mp::data::BpeTokenizer other = mp::data::BpeTokenizer::train(texts, {.vocab_size = 270});
  other.save((dir / "tokenizer.json").string());
  TrainConfig c = gpt_config("fp32");
  c.tokenizer = (dir / "tokenizer.json").string();
  c.epochs = 1;
  c.checkpoint_dir = (dir / "run").string();
  std::ostringstream sink;
  mp::train::train(c, sink);
  std::map<std::string, std::string> md;
  (void)mp::train::read_safetensors_header(c.checkpoint_dir + "/checkpoint.safetensors", &md);
  EXPECT_EQ(md["tokenizer"], other.to_json());
}

TEST(TrainerGpt, SettingsThatDoNotApplyAreRefused) {
  auto message = [](const TrainConfig& c) { return mp::test::error_of([&] { mp::train::validate(c); }); };
  TrainConfig c = gpt_config("fp32");
  EXPECT_EQ(message(c), "(no error)");
  c.tie_weights = true;
  EXPECT_NE(message(c).find("always ties its head"), std::string::npos) << message(c);
  c = gpt_config("fp32");
  c.max_vocab = 100;
  EXPECT_NE(message(c).find("give at least 258"), std::string::npos) << message(c);
  c = text_config("fp32");
  c.context = 32;
  EXPECT_NE(message(c).find("apply to gpt models"), std::string::npos) << message(c);
  c = gpt_config("fp32");
  c.model = "gpt-huge";
  EXPECT_NE(message(c).find("gpt-nano, gpt-mini, gpt2"), std::string::npos) << message(c);
}

}  // namespace

// `mixprec generate CKPT`: text from a tiny gpt-nano checkpoint (tests/train/gpt_checkpoint_fixture.hpp), greedy and
// sampled runs reproducible, and bad input refused with a non-zero status (Note [exit statuses] in main.cpp).
#include <gtest/gtest.h>

#include "cli_util.hpp"
#include "train/gpt_checkpoint_fixture.hpp"

using namespace mp::test::cli;

namespace {

// A gpt-nano checkpoint written once per test run, and the variants that must be refused.
struct Files {
  std::string ok, lstm, notok;
};
const Files& files() {
  static const Files f = [] {
    const fs::path dir = mp::test::scratch_dir("cli", "generate");
    Files r{(dir / "gpt.safetensors").string(), (dir / "lstm.safetensors").string(),
            (dir / "notok.safetensors").string()};
    (void)mp::test::write_gpt_checkpoint(r.ok);
    (void)mp::test::write_gpt_checkpoint(r.lstm, {.model = "lstm", .steps = 0});
    (void)mp::test::write_gpt_checkpoint(r.notok, {.tokenizer = false, .steps = 0});
    return r;
  }();
  return f;
}

}  // namespace

TEST(CliGenerate, GreedyAndSeededRunsAreReproducible) {
  const std::string greedy = "generate " + files().ok + " --prompt 'And the earth' --max_new_tokens 40 --temperature 0";
  const Result a = run(greedy + " --quiet"), b = run(greedy + " --quiet");
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_EQ(a.output.rfind("And the earth", 0), 0u) << "the prompt comes first: " << a.output;
  EXPECT_GT(a.output.size(), std::string("And the earth\n").size());

  const std::string sampled = "generate " + files().ok +
                              " --prompt 'God' --max_new_tokens 30 --temperature 1.2 "
                              "--top_k 20 --seed 5 --quiet";
  const Result s1 = run(sampled), s2 = run(sampled), s3 = run(sampled + " --seed 6");
  ASSERT_EQ(s1.code, 0) << s1.output;
  EXPECT_EQ(s1.output, s2.output);
  EXPECT_NE(s1.output, s3.output);

  // Without --quiet: a timing line on standard error; bf16 runs too.
  const Result t = run(greedy + " --precision bf16");
  ASSERT_EQ(t.code, 0) << t.output;
  EXPECT_NE(t.output.find("ms per token"), std::string::npos) << t.output;
}

TEST(CliGenerate, RefusesBadInputWithANonZeroStatus) {
  const std::string ok = files().ok;
  expect_failure("generate /nonexistent/gpt.safetensors", "'/nonexistent/gpt.safetensors', which does not exist");
  expect_failure("generate " + files().lstm, "expected config model gpt-nano, gpt-mini or gpt2, got 'lstm'");
  expect_failure("generate " + files().notok, "holds no tokenizer (metadata \"tokenizer\")");
  expect_failure("generate " + ok + " --max_new_tokens 0", "expected max_new_tokens > 0, got 0");
  expect_failure("generate " + ok + " --temperature -1", "expected a temperature >= 0");
  expect_failure("generate " + ok + " --top_k -3", "expected top_k >= 0 (0 = every token), got -3");
  expect_failure("generate " + ok + " --precision fp64", "expected precision fp32, bf16 or fp16");
  expect_failure("generate", "checkpoint is required");
  const Result r = run("generate " + ok + " --max_new_tokens 0");
  EXPECT_EQ(r.code, 1) << "an input error (Note [exit statuses])";
}

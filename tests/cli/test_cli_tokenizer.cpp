// `mixprec tokenizer train|encode|decode` (the byte-level BPE tokenizer from the command line).
#include <gtest/gtest.h>

#include "cli_util.hpp"

using namespace mp::test::cli;

TEST(CliTokenizer, TrainsEncodesAndDecodesAFile) {
  const fs::path dir = mp::test::scratch_dir("cli", "tokenizer");
  const std::string tok = (dir / "tok.json").string();
  Result r = run("tokenizer train --dataset text --data_dir " + corpus().string() + " --vocab_size 280 --out " + tok);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("280 tokens"), std::string::npos) << r.output;
  r = run("tokenizer encode " + tok + " --text 'the lord said unto moses'");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string ids = r.output.substr(0, r.output.find('\n'));
  EXPECT_LT(std::count(ids.begin(), ids.end(), ' ') + 1, 10) << "merges should shorten these words: " << ids;
  r = run("tokenizer decode " + tok + " " + ids);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "the lord said unto moses\n");
}

TEST(CliTokenizer, RefusesBadInputWithANonZeroStatus) {
  expect_failure("tokenizer train --dataset pubmed", "expected kjv or text, got 'pubmed'");
  expect_failure("tokenizer train --dataset text", "--data_dir FILE");
  expect_failure(
      "tokenizer train --dataset text --data_dir " + corpus().string() + " --vocab_size 10 --out /tmp/x.json",
      "use at least 257");
  expect_failure("tokenizer encode /nonexistent.json --text hi", "/nonexistent.json");
  expect_failure("tokenizer", "");
}

// The byte-level BPE tokenizer (Note [byte-level BPE], Note [BPE training]): GPT-2's pre-tokenization and byte
// symbols, training, encode/decode round trips, tokenizer.json in and out, refusals, and parity with Hugging Face's
// tokenizers on the same tokenizer.json (Note [tests that need Python]).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "mp/core/error.hpp"
#include "mp/data/bpe.hpp"
#include "mp/data/text.hpp"
#include "test_util.hpp"

using mp::data::BpeTokenizer;

namespace {

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for (const std::string_view p : mp::data::gpt2_pretokenize(text)) out.emplace_back(p);
  return out;
}

// A small corpus with a clear most frequent pair.
std::vector<std::string> small_corpus() {
  return {"the cat sat on the mat", "the cat ate the rat", "that cat, the fat cat!", "low lower lowest newer wider"};
}

// Texts that exercise the pre-tokenizer and the byte fallback.
std::vector<std::string> tricky_texts() {
  return {"In the beginning God created the heaven and the earth.",
          "Hello world's  test 123 !!",
          "a\n\nb  ",
          "x\u0663\u0664 y",  // Arabic-Indic digits: \p{N}
          "I'LL don't we've they'd",
          "\u00dcn\u00efc\u00f6d\u00e9 \u65e5\u672c\u8a9e \xf0\x9f\x98\x80 tabs\tand\r\nCRLF",
          "<|endoftext|>text<|endoftext|><|endoftext|> more",
          "   leading and trailing   ",
          ""};
}

}  // namespace

TEST(Bpe, ByteSymbolsAreGpt2s) {
  std::set<std::string> all;
  for (uint32_t b = 0; b < 256; ++b) all.insert(mp::data::byte_symbol(static_cast<uint8_t>(b)));
  EXPECT_EQ(all.size(), 256u);
  EXPECT_EQ(mp::data::byte_symbol('A'), "A");
  EXPECT_EQ(mp::data::byte_symbol(' '), "\u0120");   // Ġ
  EXPECT_EQ(mp::data::byte_symbol('\n'), "\u010a");  // Ċ
  EXPECT_EQ(mp::data::byte_symbol(0xE9), "\u00e9");  // é stands for itself
  EXPECT_EQ(mp::data::byte_symbol(0xAD), "\u0143");  // soft hyphen: the last of the 68 remapped bytes
}

TEST(Bpe, PreTokenizationFollowsGpt2sRule) {
  // Expected pieces from Hugging Face's ByteLevel(add_prefix_space=False).pre_tokenize_str (tokenizers 0.23.3).
  EXPECT_EQ(pieces("Hello world's  test 123 !!"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " test", " 123", " !!"}));
  EXPECT_EQ(pieces("a\n\nb  "), (std::vector<std::string>{"a", "\n", "\n", "b", "  "}));
  EXPECT_EQ(pieces("x\u0663\u0664 y"), (std::vector<std::string>{"x", "\u0663\u0664", " y"}));
  EXPECT_EQ(pieces("I'LL don't"), (std::vector<std::string>{"I", "'", "LL", " don", "'t"}));
  EXPECT_TRUE(pieces("").empty());
  try {
    (void)mp::data::gpt2_pretokenize("ok \xff\xfe bad");
    FAIL() << "invalid UTF-8 was accepted";
  } catch (const mp::Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "UTF-8");
    EXPECT_CONTAINS(std::string(e.what()), "at byte 3");
  }
}

TEST(Bpe, TrainingMergesTheMostFrequentPairFirstAndIsDeterministic) {
  const std::vector<std::string> corpus = small_corpus();
  const BpeTokenizer a = BpeTokenizer::train(corpus, {.vocab_size = 257 + 6, .min_frequency = 2});
  const BpeTokenizer b = BpeTokenizer::train(corpus, {.vocab_size = 257 + 6, .min_frequency = 2});
  EXPECT_EQ(a.to_json(), b.to_json());
  EXPECT_EQ(a.vocab_size(), 257 + 6);
  EXPECT_EQ(a.token(0), "<|endoftext|>");
  // " t"+"h"... the most frequent pair of this corpus is "a"+"t" (cat x4, sat, mat, rat, that, fat, ate: 10), ahead of
  // "Ġ"+"t" (8) and "t"+"h" (6).
  const nlohmann::json j = nlohmann::json::parse(a.to_json());
  EXPECT_EQ(j["model"]["merges"][0], "a t");
  EXPECT_TRUE(a.token_id("at").has_value());
  // min_frequency stops training before the vocabulary is full.
  const BpeTokenizer c = BpeTokenizer::train(corpus, {.vocab_size = 100000, .min_frequency = 5});
  EXPECT_LT(c.vocab_size(), 100000);
  EXPECT_GE(c.num_merges(), 1);
  for (const std::string& text : corpus) EXPECT_EQ(c.decode(c.encode(text)), text);
}

TEST(Bpe, EncodeDecodeRoundTripsAnyText) {
  const BpeTokenizer t = BpeTokenizer::train(small_corpus(), {.vocab_size = 300});
  for (const std::string& text : tricky_texts()) EXPECT_EQ(t.decode(t.encode(text)), text) << text;
  // Specials become their ids, also back to back; merges shorten a frequent word to one token.
  const std::vector<int64_t> ids = t.encode("<|endoftext|>text<|endoftext|><|endoftext|> more");
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 0), 3);
  EXPECT_LT(t.encode(" the cat").size(), std::string(" the cat").size());
  // Random valid UTF-8: code points of 1-4 bytes.
  std::mt19937 gen(42);
  std::string s;
  for (int i = 0; i < 3000; ++i) {
    const uint32_t r = static_cast<uint32_t>(gen());
    uint32_t cp = r % 4 == 0   ? 0x20 + r % 95
                  : r % 4 == 1 ? 0xA0 + r % 0x700
                  : r % 4 == 2 ? 0x4E00 + r % 0x5000
                               : 0x1F600 + r % 80;
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12)), s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
          s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18)), s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
          s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  EXPECT_EQ(t.decode(t.encode(s)), s);
}

TEST(Bpe, TokenizerJsonRoundTripsAndAcceptsBothMergeForms) {
  const BpeTokenizer t = BpeTokenizer::train(small_corpus(), {.vocab_size = 290});
  const std::filesystem::path dir = mp::test::scratch_dir("bpe", "json");
  const std::string path = (dir / "tokenizer.json").string();
  t.save(path);
  const BpeTokenizer u = BpeTokenizer::load(path);
  EXPECT_EQ(u.to_json(), t.to_json());
  EXPECT_EQ(u.special_tokens(), std::vector<std::string>{"<|endoftext|>"});
  // Newer tokenizers write merges as [left, right] pairs.
  nlohmann::json j = nlohmann::json::parse(t.to_json());
  nlohmann::json pairs = nlohmann::json::array();
  for (const auto& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  j["model"]["merges"] = pairs;
  const BpeTokenizer v = BpeTokenizer::from_json(j.dump());
  for (const std::string& text : tricky_texts()) EXPECT_EQ(v.encode(text), t.encode(text)) << text;
}

TEST(Bpe, RefusalsNameWhatIsWrong) {
  auto expect_error = [](auto&& f, const std::vector<std::string>& parts) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const mp::Error& e) {
      for (const std::string& p : parts) EXPECT_CONTAINS(std::string(e.what()), p);
    }
  };
  const std::vector<std::string> corpus = small_corpus();
  expect_error([&] { (void)BpeTokenizer::train(corpus, {.vocab_size = 200}); }, {"vocab_size 200", "at least 257"});
  expect_error([&] { (void)BpeTokenizer::train(corpus, {.vocab_size = 300, .min_frequency = 0}); }, {"min_frequency"});
  expect_error([] { (void)BpeTokenizer::from_json("{not json"); }, {"not JSON", "tokenizer.json"});
  expect_error([] { (void)BpeTokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"); },
               {"model.type \"BPE\"", "WordPiece"});
  expect_error([] { (void)BpeTokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})"); },
               {"no token for byte 0", "256 byte symbols"});
  nlohmann::json j = nlohmann::json::parse(BpeTokenizer::train(corpus, {.vocab_size = 280}).to_json());
  j["model"]["merges"].push_back("zz qq");
  expect_error([&] { (void)BpeTokenizer::from_json(j.dump(), "my.json"); },
               {"my.json", "'zz' 'qq'", "not in the vocabulary"});
  expect_error([] { (void)BpeTokenizer::load("/nonexistent/tokenizer.json"); }, {"/nonexistent/tokenizer.json"});
  const BpeTokenizer t = BpeTokenizer::train(corpus, {.vocab_size = 280});
  const std::vector<int64_t> bad{5, t.vocab_size()};
  expect_error([&] { (void)t.decode(bad); },
               {"token id " + std::to_string(t.vocab_size()), "[0, " + std::to_string(t.vocab_size()) + ")"});
}

TEST(Bpe, KjvTrainsAVocabularyThatCompressesHeldOutVerses) {
  if (mp::test::shell("command -v bible").code != 0) GTEST_SKIP() << "bible-kjv is not installed (scripts/setup.sh)";
  const std::vector<std::string> verses = mp::data::kjv_verses();
  ASSERT_GT(verses.size(), 30000u);
  std::vector<std::string> train(verses.begin(), verses.end() - 1000), held(verses.end() - 1000, verses.end());
  const BpeTokenizer t = BpeTokenizer::train(train, {.vocab_size = 4096});
  EXPECT_EQ(t.vocab_size(), 4096);
  size_t bytes = 0, tokens = 0;
  for (const std::string& v : held) {
    const std::vector<int64_t> ids = t.encode(v);
    ASSERT_EQ(t.decode(ids), v);
    bytes += v.size(), tokens += ids.size();
  }
  // A 4k BPE vocabulary of English prose takes ~4 bytes per token (measured 4.2 here); a broken merge order or
  // piece cache would fall towards 1.
  EXPECT_GT(static_cast<double>(bytes) / static_cast<double>(tokens), 3.5);
}

TEST(Bpe, EncodesExactlyAsHuggingFaceTokenizersOnTheSameFile) {
  MP_SKIP_OR_FAIL_WITHOUT_PYTHON("tokenizers");
  std::vector<std::string> texts = tricky_texts();
  const std::vector<std::string> verses =
      mp::test::shell("command -v bible").code == 0 ? mp::data::kjv_verses() : std::vector<std::string>{};
  for (size_t i = 0; i < verses.size(); i += 997) texts.push_back(verses[i]);
  const BpeTokenizer t = verses.empty() ? BpeTokenizer::train(small_corpus(), {.vocab_size = 300})
                                        : BpeTokenizer::train(verses, {.vocab_size = 2048});
  const std::filesystem::path dir = mp::test::scratch_dir("bpe", "parity");
  t.save((dir / "tokenizer.json").string());
  std::ofstream((dir / "texts.json").string()) << nlohmann::json(texts).dump();
  const mp::test::ShellResult r =
      mp::test::shell(mp::test::python_command() + " '" MP_SOURCE_DIR "/tests/python/bpe_parity.py' '" +
                      (dir / "tokenizer.json").string() + "' '" + (dir / "texts.json").string() + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json theirs = nlohmann::json::parse(r.output);
  ASSERT_EQ(theirs.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(t.encode(texts[i]), theirs[i].get<std::vector<int64_t>>()) << "text " << i << ": " << texts[i];
}

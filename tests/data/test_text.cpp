// Text corpora: vocabulary rules, folder layouts, the single-file split, the KJV Bible, batchify and
// bptt_batch against hand-computed values.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mp/data/text.hpp"
#include "mp/mp.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace mp;
using namespace mp::data;
using mp::test::error_of;

namespace {

class Text : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = mp::test::scratch_dir("data_text", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::string& text) const {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  fs::path dir_;
};

std::vector<int64_t> ids(const Tensor& t) { return t.to_vector<int64_t>(); }

TEST_F(Text, VocabInOrderOfFirstAppearance) {
  write("c/train.txt", "the cat sat\nthe dog <unk> ran\n");
  write("c/valid.txt", "the bird sat\n\n");
  write("c/test.txt", "");
  const Corpus c = load_corpus(path("c"));
  EXPECT_EQ(c.name, "c");
  EXPECT_EQ(c.vocab.itos, (std::vector<std::string>{"the", "cat", "sat", "<eos>", "dog", "<unk>", "ran"}));
  EXPECT_EQ(c.vocab.size(), 7);
  EXPECT_EQ(c.vocab.eos_id, 3);
  EXPECT_EQ(c.vocab.unk_id, 5);
  EXPECT_EQ(c.vocab.id("dog"), 4);
  EXPECT_EQ(c.vocab.id("bird"), 5);  // absent -> <unk>
  EXPECT_EQ(ids(c.train), (std::vector<int64_t>{0, 1, 2, 3, 0, 4, 5, 6, 3}));
  // Valid words not in train are <unk>; an empty line is a lone <eos> (as in the PyTorch example).
  EXPECT_EQ(ids(c.valid), (std::vector<int64_t>{0, 5, 2, 3, 3}));
  EXPECT_EQ(c.test.numel(), 0);
  EXPECT_EQ(c.train.dtype(), DType::i64);
}

TEST_F(Text, UnkAddedWhenAbsentAndWhitespaceRules) {
  write("c/train.txt", "a  b\tc\r\nb a");  // tabs, double spaces, CRLF, no final newline
  write("c/valid.txt", "z\n");
  write("c/test.txt", "a\n");
  const Corpus c = load_corpus(path("c"));
  EXPECT_EQ(c.vocab.itos, (std::vector<std::string>{"a", "b", "c", "<eos>", "<unk>"}));
  EXPECT_EQ(ids(c.train), (std::vector<int64_t>{0, 1, 2, 3, 1, 0, 3}));
  EXPECT_EQ(ids(c.valid), (std::vector<int64_t>{4, 3}));
}

TEST_F(Text, MaxVocabKeepsTheMostFrequent) {
  // Counts: a 3, b 2, c 1, d 1, <eos> 1. max_vocab 4 keeps a, b + <unk>, <eos>; c, d -> <unk> (count 2,
  // first appearance at c). Order by mapped count, ties by first appearance: a(3), b(2), <unk>(2), <eos>(1).
  write("c/train.txt", "a b a c a b d\n");
  write("c/valid.txt", "d a\n");
  write("c/test.txt", "e\n");
  const Corpus c = load_corpus(path("c"), {.max_vocab = 4});
  EXPECT_EQ(c.vocab.itos, (std::vector<std::string>{"a", "b", "<unk>", "<eos>"}));
  EXPECT_EQ(ids(c.train), (std::vector<int64_t>{0, 1, 0, 2, 0, 1, 2, 3}));
  EXPECT_EQ(ids(c.valid), (std::vector<int64_t>{2, 0, 3}));
  EXPECT_EQ(ids(c.test), (std::vector<int64_t>{2, 3}));
  // Ties among the candidates go to the first seen: max_vocab 5 keeps a, b, c (c before d); <unk> (d,
  // count 1) then ties with c and <eos> and sits by its first appearance (d's), between them.
  EXPECT_EQ(load_corpus(path("c"), {.max_vocab = 5}).vocab.itos,
            (std::vector<std::string>{"a", "b", "c", "<unk>", "<eos>"}));
  // A limit at or above the vocabulary changes nothing (first-appearance order).
  EXPECT_EQ(load_corpus(path("c"), {.max_vocab = 7}).vocab.itos,
            (std::vector<std::string>{"a", "b", "c", "d", "<eos>", "<unk>"}));
  EXPECT_CONTAINS(error_of([&] { load_corpus(path("c"), {.max_vocab = 1}); }), "max_vocab");
}

TEST_F(Text, LowercaseAndPunctuation) {
  write("c/train.txt", "Hello, World! The king's (son) said: yes; no? Maher-shalal.\n");
  write("c/valid.txt", "");
  write("c/test.txt", "");
  const Corpus plain = load_corpus(path("c"));
  EXPECT_EQ(plain.vocab.itos[0], "Hello,");
  const Corpus c = load_corpus(path("c"), {.lowercase = true, .split_punctuation = true});
  EXPECT_EQ(c.vocab.itos,
            (std::vector<std::string>{"hello", ",", "world", "!", "the", "king's", "(", "son", ")", "said", ":", "yes",
                                      ";", "no", "?", "maher-shalal", ".", "<eos>", "<unk>"}));
}

TEST_F(Text, FolderLayouts) {
  write("wt/wiki.train.tokens", "x y\n");
  write("wt/wiki.valid.tokens", "y\n");
  write("wt/wiki.test.tokens", "x\n");
  const Corpus wt = load_corpus(path("wt") + "/");  // a trailing slash keeps the folder's name
  EXPECT_EQ(wt.name, "wt");
  EXPECT_EQ(ids(wt.train), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(ids(wt.valid), (std::vector<int64_t>{1, 2}));
  write("ptb/ptb.train.txt", " aer banknote <unk> \n");
  write("ptb/ptb.valid.txt", " banknote \n");
  write("ptb/ptb.test.txt", " aer \n");
  const Corpus ptb = load_corpus(path("ptb"));
  EXPECT_EQ(ptb.vocab.itos, (std::vector<std::string>{"aer", "banknote", "<unk>", "<eos>"}));
  EXPECT_EQ(ids(ptb.test), (std::vector<int64_t>{0, 3}));
  // Incomplete and empty folders, missing paths.
  write("half/train.txt", "a\n");
  write("half/test.txt", "a\n");
  std::string m = error_of([&] { load_corpus(path("half")); });
  EXPECT_CONTAINS(m, "has train.txt but not " + path("half") + "/valid.txt");
  fs::create_directories(dir_ / "none");
  EXPECT_CONTAINS(error_of([&] { load_corpus(path("none")); }), "wiki.{train,valid,test}.tokens");
  EXPECT_CONTAINS(error_of([&] { load_corpus(path("missing")); }), path("missing") + ": no such file or folder");
}

TEST_F(Text, SingleFileSplitsEveryTwentiethLines) {
  // 45 lines "w0".."w44": valid = lines 18 and 38, test = 19 and 39, train = the other 41.
  std::string text;
  for (int i = 0; i < 45; ++i) {  // appended piecewise: "w" + to_string(i) trips GCC 12's -Wrestrict
    text += 'w';
    text += std::to_string(i);
    text += '\n';
  }
  write("book.txt", text);
  const Corpus c = load_corpus(path("book.txt"));
  EXPECT_EQ(c.name, "book");
  EXPECT_EQ(c.train.numel(), 82);  // 41 words + 41 <eos>
  EXPECT_EQ(c.vocab.size(), 43);   // 41 words, <eos>, <unk>
  const int64_t unk = c.vocab.unk_id, eos = c.vocab.eos_id;
  EXPECT_EQ(ids(c.valid), (std::vector<int64_t>{unk, eos, unk, eos}));    // w18, w38 never occur in train
  EXPECT_EQ(c.vocab.itos[static_cast<size_t>(ids(c.train)[36])], "w20");  // line 20 follows 17 in train
  EXPECT_EQ(c.vocab.itos[static_cast<size_t>(ids(c.train)[34])], "w17");
}

TEST(TextBatches, BatchifyAgainstHandComputedValues) {
  // tokens 0..10, B = 3: rows = 3, column b = tokens [3b, 3b+3); 9 and 10 are dropped.
  const Tensor src = arange(11);
  const Tensor b = batchify(src, 3);
  EXPECT_EQ(b.sizes(), (Shape{3, 3}));
  EXPECT_EQ(ids(b), (std::vector<int64_t>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
  EXPECT_EQ(batchify(arange(5), 1).sizes(), (Shape{5, 1}));
  EXPECT_THROW(batchify(arange(5).to(DType::f32), 2), Error);
  EXPECT_THROW(batchify(arange(5), 0), Error);
}

TEST(TextBatches, BpttBatchAgainstHandComputedValues) {
  // 26 tokens, B = 2: rows 13, column 0 = 0..12, column 1 = 13..25.
  const Tensor source = batchify(arange(26), 2);
  Batch w = bptt_batch(source, 0, 5);
  EXPECT_EQ(w.input.sizes(), (Shape{5, 2}));
  EXPECT_EQ(ids(w.input), (std::vector<int64_t>{0, 13, 1, 14, 2, 15, 3, 16, 4, 17}));
  EXPECT_EQ(w.target.sizes(), (Shape{10}));
  EXPECT_EQ(ids(w.target), (std::vector<int64_t>{1, 14, 2, 15, 3, 16, 4, 17, 5, 18}));
  // Near the end the window shrinks: t = min(5, 13 - 1 - 10) = 2.
  w = bptt_batch(source, 10, 5);
  EXPECT_EQ(ids(w.input), (std::vector<int64_t>{10, 23, 11, 24}));
  EXPECT_EQ(ids(w.target), (std::vector<int64_t>{11, 24, 12, 25}));
  w = bptt_batch(source, 11, 5);
  EXPECT_EQ(ids(w.input), (std::vector<int64_t>{11, 24}));
  EXPECT_EQ(ids(w.target), (std::vector<int64_t>{12, 25}));
  EXPECT_TRUE(w.input.is_contiguous());
  EXPECT_FALSE(w.input.is_alias_of(source));
  EXPECT_CONTAINS(error_of([&] { bptt_batch(source, 12, 5); }), "expected 0 <= i < rows - 1 = 12");
  EXPECT_THROW(bptt_batch(source, 0, 0), Error);
}

TEST_F(Text, KjvFromADump) {
  // The layout of `bible -l0`: blank line, heading, blank line, indented numbered verses.
  write("dump.txt",
        "\nGenesis 1\n\n  1 In the beginning God created the heaven and the earth.\n"
        "  2 And the earth was without form, and void; and darkness (was) upon the face of the deep.\n"
        "\n1 Samuel 3\n\n  10 Speak; for thy servant's ears heareth? Yea!\n"
        "\nSong of Solomon 2\n\n  1 I am the rose of Sharon: and the lily of the valleys.\n");
  const Corpus c = load_kjv({}, path("dump.txt"));
  EXPECT_EQ(c.name, "kjv");
  // 4 verses, all in train (lines 0..3); lowercased, punctuation split, verse numbers and headings gone.
  EXPECT_EQ(c.valid.numel(), 0);
  std::vector<std::string> words;
  for (int64_t id : ids(c.train)) words.push_back(c.vocab.itos[static_cast<size_t>(id)]);
  const std::vector<std::string> want = {
      "in",    "the",  "beginning", "god",       "created", "the",      "heaven", "and",     "the",
      "earth", ".",    "<eos>",     "and",       "the",     "earth",    "was",    "without", "form",
      ",",     "and",  "void",      ";",         "and",     "darkness", "(",      "was",     ")",
      "upon",  "the",  "face",      "of",        "the",     "deep",     ".",      "<eos>",   "speak",
      ";",     "for",  "thy",       "servant's", "ears",    "heareth",  "?",      "yea",     "!",
      "<eos>", "i",    "am",        "the",       "rose",    "of",       "sharon", ":",       "and",
      "the",   "lily", "of",        "the",       "valleys", ".",        "<eos>"};
  EXPECT_EQ(words, want);
  EXPECT_CONTAINS(error_of([&] { load_kjv({}, path("nothing.txt")); }), "no such file");
  write("empty.txt", "\nGenesis 1\n\n");
  EXPECT_CONTAINS(error_of([&] { load_kjv({}, path("empty.txt")); }), "has no verses");
}

TEST(Kjv, MissingProgramSaysHowToInstall) {
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  ::setenv("PATH", "/nonexistent-mp-test", 1);
  const std::string m = error_of([] { load_kjv(); });
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_CONTAINS(m, "apt-get install bible-kjv");
}

TEST(Kjv, RealBible) {
  if (std::system("command -v bible >/dev/null 2>&1") != 0) GTEST_SKIP() << "bible-kjv is not installed";
  const Corpus c = load_kjv();
  // 31102 verses (the KJV's count): 27992 train, 1555 valid, 1555 test, one <eos> each.
  auto count = [&](const Tensor& t, int64_t id) {
    int64_t n = 0;
    for (int64_t v : ids(t)) n += v == id;
    return n;
  };
  EXPECT_EQ(count(c.train, c.vocab.eos_id), 27992);
  EXPECT_EQ(count(c.valid, c.vocab.eos_id), 1555);
  EXPECT_EQ(count(c.test, c.vocab.eos_id), 1555);
  EXPECT_EQ(c.vocab.size(), 10000);  // 12424 distinct train tokens, truncated to max_vocab
  // Words (not punctuation or <eos>): the dump's 823k whitespace words less 31102 verse numbers and the
  // 1189 headings' words give ~790k (789633 by an independent Python count of bible-kjv 4.x; +-1%).
  int64_t words = 0;
  for (const Tensor* t : {&c.train, &c.valid, &c.test})
    for (int64_t v : ids(*t)) {
      const std::string& w = c.vocab.itos[static_cast<size_t>(v)];
      words += w != "<eos>" && !(w.size() == 1 && std::string(",;:.?!()").find(w[0]) != std::string::npos);
    }
  EXPECT_NEAR(static_cast<double>(words), 789633.0, 7900.0);
  // The truncated tail is rare words: under 0.5% of train tokens become <unk> (0.29% measured).
  EXPECT_LT(static_cast<double>(count(c.train, c.vocab.unk_id)), 0.005 * static_cast<double>(c.train.numel()));
  // After truncation the ids follow train frequency: "," (63656 times), "the" (57553), "and" (46645).
  EXPECT_EQ(c.vocab.itos[0], ",");
  EXPECT_EQ(c.vocab.itos[1], "the");
  EXPECT_EQ(c.vocab.itos[2], "and");
}

}  // namespace

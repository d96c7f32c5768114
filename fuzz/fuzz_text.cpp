// libFuzzer target: text corpora for the word LM, one plain-text file through load_corpus and the same bytes as
// a `bible` dump through load_kjv. The first input byte picks the options: bit 0 lowercase, bit 1 split
// punctuation, bits 2-7 max_vocab (0 = all words, else 2 + the value); the rest is the file.
#include "fuzz_util.hpp"
#include "mp/data/text.hpp"

using mp::fuzz::finding;

namespace {

void check(const mp::data::Corpus& c) {
  const int64_t vocab = c.vocab.size();
  if (c.vocab.unk_id < 0 || c.vocab.unk_id >= vocab || c.vocab.eos_id < 0 || c.vocab.eos_id >= vocab)
    finding("a corpus without <unk> or <eos> in its vocabulary");
  for (const mp::Tensor* t : {&c.train, &c.valid, &c.test}) {
    const int64_t* ids = t->data_ptr<int64_t>();
    for (int64_t i = 0; i < t->numel(); ++i)
      if (ids[i] < 0 || ids[i] >= vocab) finding("a token id outside the vocabulary: " + std::to_string(ids[i]));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const mp::data::CorpusOptions options{.max_vocab = data[0] >> 2 == 0 ? 0 : 2 + (data[0] >> 2),
                                        .lowercase = (data[0] & 1) != 0,
                                        .split_punctuation = (data[0] & 2) != 0};
  const std::string path = mp::fuzz::write_temp(data + 1, size - 1, "corpus.txt");
  mp::fuzz::expect_accept_or_refuse(path, [&] { check(mp::data::load_corpus(path, options)); });
  mp::fuzz::expect_accept_or_refuse(path, [&] { check(mp::data::load_kjv(options, path)); });
  return 0;
}

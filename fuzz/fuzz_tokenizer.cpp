// libFuzzer target: byte-level BPE tokenizers. The first input byte picks the reader: even, the rest is a
// tokenizer.json (BpeTokenizer::load; an accepted file must encode and decode a fixed text back, and write itself
// out and read back the same); odd, the rest is text for a fixed small tokenizer (encode must give back the text
// exactly, or refuse invalid UTF-8 with a clear error, never crash).
#include "fuzz_util.hpp"
#include "mp/data/bpe.hpp"

using mp::data::BpeTokenizer;
using mp::fuzz::finding;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    const std::string path = mp::fuzz::write_temp(data + 1, size - 1, "tokenizer.json");
    mp::fuzz::expect_accept_or_refuse(path, [&] {
      const BpeTokenizer t = BpeTokenizer::load(path);
      const std::string text = "In the beginning God created the heaven and the earth.\n";
      if (t.decode(t.encode(text)) != text) finding("an accepted tokenizer does not round-trip a text");
      if (BpeTokenizer::from_json(t.to_json()).to_json() != t.to_json())
        finding("an accepted tokenizer does not write and read back the same");
    });
    return 0;
  }
  static const BpeTokenizer small = [] {
    const std::vector<std::string> corpus{"the cat sat on the mat", "the rat ate the cat's hat 123 !!"};
    return BpeTokenizer::train(corpus, {.vocab_size = 280});
  }();
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    if (small.decode(small.encode(text)) != text) finding("encode/decode does not give the text back");
  } catch (const mp::Error& e) {
    const std::string msg = e.what();
    if (mp::fuzz::internal_error(msg) || msg.find("UTF-8") == std::string::npos)
      finding("text refused without saying why: " + msg);
  }
  return 0;
}

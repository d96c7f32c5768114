#pragma once
// Byte-level BPE tokenizer (GPT-2's scheme): trained on a corpus, saved and loaded in Hugging Face's
// tokenizer.json format, so a user can bring GPT-2's own file.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mp::data {

/// Options of BpeTokenizer::train.
struct BpeTrainOptions {
  int64_t vocab_size = 8192;                                    ///< tokens in all: specials + 256 bytes + merges
  int64_t min_frequency = 2;                                    ///< a pair seen fewer times is never merged
  std::vector<std::string> special_tokens = {"<|endoftext|>"};  ///< ids 0.., never split, never merged into
};

/// A byte-level BPE tokenizer. Text is split on the special tokens, then pre-tokenized with GPT-2's rule (the
/// regex 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, Unicode classes), each
/// piece's UTF-8 bytes are mapped to GPT-2's 256 printable byte symbols, and the merges are applied lowest rank
/// first. Every byte has a token, so any text encodes and decode(encode(text)) == text.
class BpeTokenizer {
 public:
  /// Learns merges from `texts` (e.g. one verse or paragraph per entry): the most frequent adjacent pair of
  /// symbols in the pre-tokenized words is merged, again and again, until vocab_size tokens exist or no pair occurs
  /// min_frequency times (ties: the pair whose merged string sorts first). Throws naming the option when
  /// vocab_size cannot hold the specials and the 256 byte symbols.
  static BpeTokenizer train(std::span<const std::string> texts, const BpeTrainOptions& options = {});

  /// Parses a tokenizer.json (model type BPE over a ByteLevel pre-tokenizer; merges as "a b" strings or
  /// [a, b] pairs; added_tokens become special tokens). `what` names the source in errors.
  static BpeTokenizer from_json(std::string_view json, const std::string& what = "tokenizer.json");
  /// Reads a tokenizer.json file (errors name the file).
  static BpeTokenizer load(const std::string& path);

  /// The tokenizer.json text: Hugging Face's layout (version 1.0, ByteLevel pre-tokenizer and decoder, BPE model
  /// with vocab and merges, added_tokens for the specials).
  std::string to_json() const;
  /// Writes to_json() to `path` atomically.
  void save(const std::string& path) const;

  /// Token ids of `text` (special tokens written literally in the text become their ids).
  std::vector<int64_t> encode(std::string_view text) const;
  /// Token ids of the lines as one text, each line followed by "\n" (how a GPT run encodes a split:
  /// Note [GPT training data]).
  std::vector<int64_t> encode_lines(const std::vector<std::string>& lines) const;
  /// The text of `ids` (bytes joined; throws naming an id outside the vocabulary).
  std::string decode(std::span<const int64_t> ids) const;

  /// Number of tokens (the largest id + 1).
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  /// Number of merges.
  int64_t num_merges() const { return static_cast<int64_t>(merges_.size()); }
  /// The id of a token string (in byte-symbol form, e.g. "Ġthe"), if any.
  std::optional<int64_t> token_id(std::string_view token) const;
  /// The token string of an id (byte-symbol form).
  const std::string& token(int64_t id) const;
  /// The special tokens, in id order of the file.
  const std::vector<std::string>& special_tokens() const { return specials_; }

 private:
  struct PairHash {
    size_t operator()(const std::pair<int64_t, int64_t>& p) const noexcept {
      return std::hash<int64_t>()(p.first * 1000003 ^ p.second);
    }
  };
  struct Merge {
    int64_t rank, id;  // the merge's rank and the id of the token it makes
  };
  void index();  // fills ids_ and ranks_ from tokens_ and merges_
  void encode_piece(std::string_view piece, std::vector<int64_t>& out) const;
  // The first special token in `text` at or after `pos` (the longest of those starting there): its position and
  // length, or npos.
  std::pair<size_t, size_t> next_special(std::string_view text, size_t pos) const;
  // Replaces every adjacent (a, b) in `sym`, left to right, with `ab` (GPT-2's bpe() and training alike).
  static void merge_pair(std::vector<int64_t>& sym, int64_t a, int64_t b, int64_t ab);

  std::vector<std::string> tokens_;                          // id -> token string (byte-symbol form)
  std::vector<std::pair<std::string, std::string>> merges_;  // rank -> the pair it merges
  std::vector<std::string> specials_;
  std::unordered_map<std::string, int64_t> ids_;
  std::unordered_map<std::pair<int64_t, int64_t>, Merge, PairHash> ranks_;  // (left id, right id) -> merge
};

/// GPT-2's pre-tokenization of `text` into pieces (views into `text`); throws when the library was built without
/// PCRE2 (install libpcre2-dev and reconfigure) or the text is not valid UTF-8.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

/// GPT-2's byte-level symbol of each byte (printable bytes map to themselves, the others to U+0100..), as UTF-8.
const std::string& byte_symbol(uint8_t byte);

}  // namespace mp::data

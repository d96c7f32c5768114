// Learning byte-level BPE merges from a corpus (Note [BPE training]).
#include <algorithm>
#include <queue>
#include <unordered_map>

#include "mp/core/error.hpp"
#include "mp/data/bpe.hpp"

namespace mp::data {

// Note [BPE training]
// The corpus is cut into GPT-2's pre-tokenized pieces and counted: merges never cross a piece, so each distinct
// piece (a "word") is one symbol sequence with a weight, and a pair's count is the weighted sum over the words. The
// most frequent pair is merged, everywhere, and becomes a token; repeated until the vocabulary is full or no pair
// reaches min_frequency. Counts live in a map and in a max-heap whose entries may be stale (a pair's count only
// shrinks or grows when a word holding it is rewritten): a popped entry whose count is no longer current is pushed
// back with the current count. Only the words holding the merged pair (an index kept per pair) are rewritten: their
// old pairs are subtracted and their new ones added. Ties go to the pair whose merged string sorts first, so
// training is deterministic.

namespace {

using Pair = std::pair<int64_t, int64_t>;

struct Word {
  std::vector<int64_t> sym;
  int64_t count = 0;
};

}  // namespace

BpeTokenizer BpeTokenizer::train(std::span<const std::string> texts, const BpeTrainOptions& options) {
  const int64_t base = static_cast<int64_t>(options.special_tokens.size()) + 256;
  MP_CHECK(options.vocab_size >= base, "BpeTokenizer::train: vocab_size ", options.vocab_size, " cannot hold the ",
           options.special_tokens.size(), " special tokens and the 256 byte tokens; use at least ", base);
  MP_CHECK(options.min_frequency >= 1, "BpeTokenizer::train: min_frequency must be >= 1, got ", options.min_frequency);
  BpeTokenizer t;
  for (const std::string& s : options.special_tokens) {
    MP_CHECK(!s.empty(), "BpeTokenizer::train: a special token is empty");
    t.tokens_.push_back(s);
    t.specials_.push_back(s);
  }
  for (uint32_t b = 0; b < 256; ++b) t.tokens_.push_back(byte_symbol(static_cast<uint8_t>(b)));
  t.index();  // specials and bytes only, for the ids below

  // Count the pieces (between special tokens, which training skips).
  std::unordered_map<std::string, int64_t> piece_counts;
  for (const std::string_view text : texts) {
    for (size_t pos = 0; pos < text.size();) {
      const auto [cut, len] = t.next_special(text, pos);
      const std::string_view part = text.substr(pos, cut == std::string_view::npos ? cut : cut - pos);
      for (const std::string_view piece : gpt2_pretokenize(part)) ++piece_counts[std::string(piece)];
      if (cut == std::string_view::npos) break;
      pos = cut + len;
    }
  }
  std::vector<Word> words;
  words.reserve(piece_counts.size());
  for (const auto& [piece, n] : piece_counts) {
    Word w{{}, n};
    for (const char c : piece) w.sym.push_back(t.ids_.at(byte_symbol(static_cast<uint8_t>(c))));
    words.push_back(std::move(w));
  }
  std::sort(words.begin(), words.end(), [](const Word& a, const Word& b) { return a.sym < b.sym; });  // determinism

  std::unordered_map<Pair, int64_t, PairHash> count;
  std::unordered_map<Pair, std::vector<int64_t>, PairHash> where;
  auto add_pairs = [&](int64_t wi, int64_t sign) {
    const Word& w = words[static_cast<size_t>(wi)];
    for (size_t i = 0; i + 1 < w.sym.size(); ++i) {
      const Pair p{w.sym[i], w.sym[i + 1]};
      count[p] += sign * w.count;
      if (sign > 0) where[p].push_back(wi);
    }
  };
  for (int64_t wi = 0; wi < static_cast<int64_t>(words.size()); ++wi) add_pairs(wi, +1);

  struct Entry {
    int64_t count;
    std::string merged;
    Pair pair;
  };
  auto lower = [](const Entry& x, const Entry& y) {  // the heap's top: the largest count, then the smallest string
    return x.count != y.count ? x.count < y.count : x.merged > y.merged;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(lower)> heap(lower);
  auto merged_of = [&](const Pair& p) {
    return t.tokens_[static_cast<size_t>(p.first)] + t.tokens_[static_cast<size_t>(p.second)];
  };
  for (const auto& [p, n] : count)
    if (n >= options.min_frequency) heap.push({n, merged_of(p), p});

  std::vector<int64_t> stamp(words.size(), -1);
  while (static_cast<int64_t>(t.tokens_.size()) < options.vocab_size && !heap.empty()) {
    Entry top = heap.top();
    heap.pop();
    const int64_t now = count[top.pair];
    if (now != top.count) {  // stale
      if (now >= options.min_frequency) heap.push({now, std::move(top.merged), top.pair});
      continue;
    }
    const int64_t rank = static_cast<int64_t>(t.merges_.size());
    const auto [a, b] = top.pair;
    t.merges_.emplace_back(t.tokens_[static_cast<size_t>(a)], t.tokens_[static_cast<size_t>(b)]);
    int64_t ab;
    if (const auto it = t.ids_.find(top.merged); it != t.ids_.end()) {
      ab = it->second;  // another pair already made this string
    } else {
      ab = static_cast<int64_t>(t.tokens_.size());
      t.tokens_.push_back(top.merged);
      t.ids_.emplace(top.merged, ab);
    }
    const std::vector<int64_t> holders = std::move(where[top.pair]);
    where.erase(top.pair);
    std::unordered_map<Pair, int64_t, PairHash> touched;
    for (const int64_t wi : holders) {
      if (stamp[static_cast<size_t>(wi)] == rank) continue;  // listed twice
      stamp[static_cast<size_t>(wi)] = rank;
      Word& w = words[static_cast<size_t>(wi)];
      bool has = false;
      for (size_t i = 0; i + 1 < w.sym.size() && !has; ++i) has = w.sym[i] == a && w.sym[i + 1] == b;
      if (!has) continue;  // an earlier merge rewrote it
      add_pairs(wi, -1);
      merge_pair(w.sym, a, b, ab);
      add_pairs(wi, +1);
      for (size_t i = 0; i + 1 < w.sym.size(); ++i)
        if (w.sym[i] == ab || w.sym[i + 1] == ab) touched[{w.sym[i], w.sym[i + 1]}] = 0;
    }
    for (const auto& [p, unused] : touched)
      if (count[p] >= options.min_frequency) heap.push({count[p], merged_of(p), p});
  }
  t.index();
  return t;
}

}  // namespace mp::data

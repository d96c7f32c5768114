#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "mp/data/dataset.hpp"

namespace mp::data {

/// Words <-> ids of a corpus.
struct Vocab {
  std::vector<std::string> itos;                  ///< id -> word
  std::unordered_map<std::string, int64_t> stoi;  ///< word -> id
  int64_t unk_id = -1;                            ///< id of "<unk>"
  int64_t eos_id = -1;                            ///< id of "<eos>"
  /// Number of words.
  int64_t size() const { return static_cast<int64_t>(itos.size()); }
  /// Id of `w`; unk_id if absent.
  int64_t id(const std::string& w) const;
  /// Append `w` if absent; its id.
  int64_t add(const std::string& w);
};

/// A word-level language-model corpus.
struct Corpus {
  std::string name;           ///< folder or file name ("kjv" for the Bible)
  Vocab vocab;                ///< built from train
  Tensor train, valid, test;  ///< i64 [n] token ids
};

/// How load_corpus tokenises and builds the vocabulary.
struct CorpusOptions {
  int64_t max_vocab = 0;           ///< 0 = all words of train; else at most this many words including <unk>
                                   ///< and <eos>: the most frequent (ties by first appearance), others -> <unk>
  bool lowercase = false;          ///< lowercase (ASCII) before counting
  bool split_punctuation = false;  ///< make each of , ; : . ? ! ( ) its own token
};

/// The lines of a text dataset in its three splits.
struct TextSplits {
  std::string name;                             ///< folder or file name ("kjv" for the Bible)
  std::vector<std::string> train, valid, test;  ///< lines, in order
};

/// The splits of `path` as load_corpus reads them (below), before any tokenisation.
TextSplits text_splits(const std::string& path);

/// `path` = a folder with train/valid/test files (train.txt valid.txt test.txt | wiki.{train,valid,test}.tokens |
/// ptb.{train,valid,test}.txt) or one plain-text file (lines split deterministically: line i with i%20==18 ->
/// valid, i%20==19 -> test, else train). Each line -> its whitespace-separated words + "<eos>"; a literal
/// "<unk>" in the text is the unknown word. Vocab built from train (in order of first appearance unless
/// max_vocab truncates by frequency: then ordered by frequency in the mapped train text, ties by first
/// appearance); <unk> and <eos> always present (<unk> last when train has none and nothing is truncated).
Corpus load_corpus(const std::string& path, const CorpusOptions& options = {});

/// Corpus from three lists of lines (what load_corpus does after reading the files); `name` is its name.
Corpus make_corpus(std::string name, const std::vector<std::string>& train, const std::vector<std::string>& valid,
                   const std::vector<std::string>& test, const CorpusOptions& options = {});

/// The King James Bible from Debian's bible-kjv: the text of `bible -l0 "Gen1:1-Rev22:21"` (read from
/// `dump_path` if given, else run that command with popen; absent: error naming apt-get install bible-kjv).
/// Drops blank lines and chapter headings ("Genesis 1"), strips verse numbers, lowercases and splits
/// punctuation into tokens (",", ";", ":", ".", "?", "!", "(", ")"; keep apostrophes inside words) whatever
/// options.lowercase/split_punctuation say, one verse per line, split as the single-file rule above.
/// max_vocab as given (use 10000 in the CLI default).
Corpus load_kjv(const CorpusOptions& options = {.max_vocab = 10000}, const std::string& dump_path = "");

/// The lines of a file (split at '\n', the newlines dropped; a last line without one kept), errors naming the file.
std::vector<std::string> read_lines(const std::string& path);

/// The verses of kjv_verses() split as one plain-text file is (valid: verses i % 20 == 18, test: == 19), with their
/// case and punctuation (what load_kjv lowercases and splits into words).
TextSplits kjv_splits(const std::string& dump_path = "");

/// The verses of the King James Bible as load_kjv reads them (headings dropped, verse numbers stripped), with their
/// case and punctuation: one verse per entry, in book order (the text a BPE tokenizer is trained on).
std::vector<std::string> kjv_verses(const std::string& dump_path = "");

/// tokens [n] -> [n / B, B] (column b = the b-th contiguous chunk; the tail that does not fill a row is dropped),
/// as batchify() in the PyTorch example. i64 in, i64 contiguous out.
Tensor batchify(const Tensor& tokens, int64_t batch_size);

/// Window i of a batchified source: data = source[i : i+t] ([t, B]), target = source[i+1 : i+1+t] flattened
/// ([t*B]), t = min(bptt, rows - 1 - i); both contiguous copies. Requires 0 <= i < rows - 1.
Batch bptt_batch(const Tensor& source, int64_t i, int64_t bptt);

}  // namespace mp::data

// Word-level language-model corpora (PyTorch examples/word_language_model conventions), the KJV
// Bible from Debian's bible-kjv, batchify and bptt_batch.
#include "mp/data/text.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <sys/wait.h>

#include "mp/core/error.hpp"
#include "mp/data/idx.hpp"

namespace mp::data {

namespace {

constexpr const char* kUnk = "<unk>";
constexpr const char* kEos = "<eos>";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }

bool is_split_punct(char c) {
  return c == ',' || c == ';' || c == ':' || c == '.' || c == '?' || c == '!' || c == '(' || c == ')';
}

// The tokens of one line (without the trailing <eos>), appended to `out`.
void tokenize(const std::string& line, const CorpusOptions& opt, std::vector<std::string>& out) {
  std::string word;
  auto flush = [&] {
    if (!word.empty()) out.push_back(std::move(word));
    word.clear();
  };
  for (char c : line) {
    if (opt.lowercase && c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (is_space(c)) {
      flush();
    } else if (opt.split_punctuation && is_split_punct(c)) {
      flush();
      out.emplace_back(1, c);
    } else {
      word.push_back(c);
    }
  }
  flush();
}

// Lines of a byte buffer ("\n"-separated; a final newline does not start an extra line; "\r" kept,
// the tokenizer treats it as space).
std::vector<std::string> split_lines(const std::vector<uint8_t>& bytes) {
  std::vector<std::string> lines;
  size_t start = 0;
  const char* p = reinterpret_cast<const char*>(bytes.data());
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] == '\n') {
      lines.emplace_back(p + start, i - start);
      start = i + 1;
    }
  }
  if (start < bytes.size()) lines.emplace_back(p + start, bytes.size() - start);
  return lines;
}

// Lines i with i % 20 == 18 -> valid, == 19 -> test, else train.
void split_single_file(const std::vector<std::string>& lines, std::vector<std::string>& train,
                       std::vector<std::string>& valid, std::vector<std::string>& test) {
  for (size_t i = 0; i < lines.size(); ++i) {
    const size_t r = i % 20;
    (r == 18 ? valid : r == 19 ? test : train).push_back(lines[i]);
  }
}

// Token ids of some lines (each + <eos>) under a finished vocabulary.
Tensor encode(const std::vector<std::string>& lines, const Vocab& vocab, const CorpusOptions& opt) {
  std::vector<int64_t> ids;
  std::vector<std::string> words;
  for (const std::string& line : lines) {
    words.clear();
    tokenize(line, opt, words);
    for (const std::string& w : words) ids.push_back(vocab.id(w));
    ids.push_back(vocab.eos_id);
  }
  Tensor t = empty({static_cast<int64_t>(ids.size())}, {.dtype = DType::i64});
  if (!ids.empty()) std::memcpy(t.raw_data(), ids.data(), ids.size() * sizeof(int64_t));
  return t;
}

}  // namespace

int64_t Vocab::id(const std::string& w) const {
  const auto it = stoi.find(w);
  return it == stoi.end() ? unk_id : it->second;
}

int64_t Vocab::add(const std::string& w) {
  const auto [it, inserted] = stoi.try_emplace(w, size());
  if (inserted) itos.push_back(w);
  return it->second;
}

Corpus make_corpus(std::string name, const std::vector<std::string>& train, const std::vector<std::string>& valid,
                   const std::vector<std::string>& test, const CorpusOptions& options) {
  MP_CHECK(options.max_vocab == 0 || options.max_vocab >= 2,
           "load_corpus: expected max_vocab 0 (all words) or >= 2 "
           "(<unk> and <eos> are always in the vocabulary), got ",
           options.max_vocab);
  // Pass 1: train words in order of first appearance ("raw" ids), with counts.
  Vocab raw;
  std::vector<int64_t> count;
  std::vector<int64_t> train_raw;
  std::vector<std::string> words;
  auto see = [&](const std::string& w) {
    const int64_t id = raw.add(w);
    if (id == static_cast<int64_t>(count.size())) count.push_back(0);
    ++count[static_cast<size_t>(id)];
    train_raw.push_back(id);
  };
  for (const std::string& line : train) {
    words.clear();
    tokenize(line, options, words);
    for (const std::string& w : words) see(w);
    see(kEos);
  }
  // The specials always exist (a corpus without <unk> in train gets it last; an empty train gets <eos> too).
  for (const char* special : {kEos, kUnk})
    if (raw.add(special) == static_cast<int64_t>(count.size())) count.push_back(0);
  const int64_t raw_eos = raw.stoi.at(kEos), raw_unk = raw.stoi.at(kUnk), n_raw = raw.size();

  Corpus c;
  c.name = std::move(name);
  std::vector<int64_t> remap(static_cast<size_t>(n_raw));  // raw id -> final id
  if (options.max_vocab == 0 || n_raw <= options.max_vocab) {
    c.vocab = std::move(raw);
    std::iota(remap.begin(), remap.end(), int64_t{0});
  } else {
    // Keep the max_vocab - 2 most frequent ordinary words (ties by first appearance = smaller raw id);
    // the rest become <unk>.
    std::vector<int64_t> ordinary;
    for (int64_t r = 0; r < n_raw; ++r)
      if (r != raw_eos && r != raw_unk) ordinary.push_back(r);
    auto by_count = [&](int64_t a, int64_t b) {
      const int64_t ca = count[static_cast<size_t>(a)], cb = count[static_cast<size_t>(b)];
      return ca != cb ? ca > cb : a < b;
    };
    const size_t keep = static_cast<size_t>(options.max_vocab - 2);
    std::stable_sort(ordinary.begin(), ordinary.end(), by_count);
    std::vector<int64_t> kept(ordinary.begin(), ordinary.begin() + static_cast<std::ptrdiff_t>(keep));
    // <unk> stands for the literal <unk> and every dropped word: its count and first appearance are theirs.
    int64_t unk_count = count[static_cast<size_t>(raw_unk)], unk_first = raw_unk;
    for (size_t k = keep; k < ordinary.size(); ++k) {
      unk_count += count[static_cast<size_t>(ordinary[k])];
      unk_first = std::min(unk_first, ordinary[k]);
    }
    // Final order: count in the mapped train text, descending; ties by first appearance.
    struct Entry {
      int64_t raw, count, first;
    };
    std::vector<Entry> entries;
    for (int64_t r : kept) entries.push_back({r, count[static_cast<size_t>(r)], r});
    entries.push_back({raw_eos, count[static_cast<size_t>(raw_eos)], raw_eos});
    entries.push_back({raw_unk, unk_count, unk_first});
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.count != b.count ? a.count > b.count : a.first < b.first;
    });
    std::fill(remap.begin(), remap.end(), int64_t{-1});
    for (const Entry& e : entries)
      remap[static_cast<size_t>(e.raw)] = c.vocab.add(raw.itos[static_cast<size_t>(e.raw)]);
    const int64_t unk_final = remap[static_cast<size_t>(raw_unk)];
    for (int64_t& m : remap)
      if (m < 0) m = unk_final;
  }
  c.vocab.unk_id = c.vocab.stoi.at(kUnk);
  c.vocab.eos_id = c.vocab.stoi.at(kEos);

  c.train = empty({static_cast<int64_t>(train_raw.size())}, {.dtype = DType::i64});
  int64_t* tp = c.train.data_ptr<int64_t>();
  for (size_t i = 0; i < train_raw.size(); ++i) tp[i] = remap[static_cast<size_t>(train_raw[i])];
  c.valid = encode(valid, c.vocab, options);
  c.test = encode(test, c.vocab, options);
  return c;
}

TextSplits text_splits(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) {
    static const char* const kLayouts[][3] = {{"train.txt", "valid.txt", "test.txt"},
                                              {"wiki.train.tokens", "wiki.valid.tokens", "wiki.test.tokens"},
                                              {"ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"}};
    for (const auto& layout : kLayouts) {
      const bool have[3] = {fs::is_regular_file(p / layout[0], ec), fs::is_regular_file(p / layout[1], ec),
                            fs::is_regular_file(p / layout[2], ec)};
      if (!have[0] && !have[1] && !have[2]) continue;
      for (int k = 0; k < 3; ++k)
        MP_CHECK(have[k], "load_corpus: ", path, " has ",
                 layout[have[0]   ? 0
                        : have[1] ? 1
                                  : 2],
                 " but not ", (p / layout[k]).string(), "; expected all of ", layout[0], ", ", layout[1], ", ",
                 layout[2]);
      std::string name = p.filename().string();
      if (name.empty() || name == ".") name = p.parent_path().filename().string();
      return {name, read_lines((p / layout[0]).string()), read_lines((p / layout[1]).string()),
              read_lines((p / layout[2]).string())};
    }
    MP_FAIL("load_corpus: ", path,
            " is a folder without corpus files: expected train.txt/valid.txt/test.txt, "
            "wiki.{train,valid,test}.tokens (WikiText) or ptb.{train,valid,test}.txt (Penn Treebank), or pass one "
            "plain-text file");
  }
  MP_CHECK(fs::is_regular_file(p, ec), "load_corpus: ", path,
           ": no such file or folder; expected a folder with "
           "train/valid/test files or one plain-text file");
  TextSplits t{p.stem().string(), {}, {}, {}};
  split_single_file(read_lines(path), t.train, t.valid, t.test);
  return t;
}

Corpus load_corpus(const std::string& path, const CorpusOptions& options) {
  const TextSplits t = text_splits(path);
  return make_corpus(t.name, t.train, t.valid, t.test, options);
}

namespace {

// Whether `line` is a chapter heading of the bible dump: "Genesis 1", "1 Samuel 3", "Song of Solomon 2"
// (no leading space; words of letters, an optional leading book number; ends with " <digits>").
bool is_kjv_heading(const std::string& line) {
  if (line.empty() || is_space(line[0])) return false;
  size_t end = line.size();
  while (end > 0 && line[end - 1] >= '0' && line[end - 1] <= '9') --end;
  if (end == line.size() || end < 2 || line[end - 1] != ' ') return false;
  for (size_t i = 0; i + 1 < end; ++i) {
    const char c = line[i];
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == ' ' || (i == 0 && c >= '1' && c <= '3');
    if (!ok) return false;
  }
  return true;
}

// The verse text of a dump line: leading space and the verse number removed.
std::string strip_verse_number(const std::string& line) {
  size_t i = 0;
  while (i < line.size() && is_space(line[i])) ++i;
  size_t j = i;
  while (j < line.size() && line[j] >= '0' && line[j] <= '9') ++j;
  if (j > i && j < line.size() && is_space(line[j])) i = j;  // a number followed by space: the verse number
  while (i < line.size() && is_space(line[i])) ++i;
  return line.substr(i);
}

// Whether `prog` is an executable file in one of the PATH folders.
bool in_path(const std::string& prog) {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string dirs = path;
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    if (::access((dir + "/" + prog).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

std::vector<uint8_t> run_bible() {
  constexpr const char* kCmd = "bible -l0 \"Gen1:1-Rev22:21\" 2>/dev/null";
  MP_CHECK(in_path("bible"),
           "load_kjv: the `bible` program is not installed (not found in PATH); install it with: "
           "apt-get install bible-kjv (or pass a dump of `bible -l0 \"Gen1:1-Rev22:21\"` as dump_path)");
  FILE* pipe = ::popen(kCmd, "r");
  MP_CHECK(pipe != nullptr, "load_kjv: popen(\"", kCmd, "\") failed: ", std::strerror(errno));
  std::vector<uint8_t> out;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) out.insert(out.end(), buf, buf + n);
  const int status = ::pclose(pipe);
  MP_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "load_kjv: `", kCmd, "` failed (status ",
           status,
           "); check that bible-kjv is installed completely (apt-get install "
           "--reinstall bible-kjv)");
  return out;
}

}  // namespace

std::vector<std::string> read_lines(const std::string& path) { return split_lines(read_file_bytes(path)); }

std::vector<std::string> kjv_verses(const std::string& dump_path) {
  const std::vector<uint8_t> text = dump_path.empty() ? run_bible() : read_file_bytes(dump_path);
  std::vector<std::string> verses;
  for (std::string& line : split_lines(text)) {
    while (!line.empty() && is_space(line.back())) line.pop_back();
    if (line.empty() || is_kjv_heading(line)) continue;
    std::string verse = strip_verse_number(line);
    if (!verse.empty()) verses.push_back(std::move(verse));
  }
  MP_CHECK(!verses.empty(), "load_kjv: ", dump_path.empty() ? std::string("the output of `bible`") : dump_path,
           " has no verses; expected the text of `bible -l0 \"Gen1:1-Rev22:21\"` (one verse per line)");
  return verses;
}

TextSplits kjv_splits(const std::string& dump_path) {
  TextSplits t{"kjv", {}, {}, {}};
  split_single_file(kjv_verses(dump_path), t.train, t.valid, t.test);
  return t;
}

Corpus load_kjv(const CorpusOptions& options, const std::string& dump_path) {
  const TextSplits t = kjv_splits(dump_path);
  CorpusOptions opt = options;
  opt.lowercase = true;
  opt.split_punctuation = true;
  return make_corpus("kjv", t.train, t.valid, t.test, opt);
}

Tensor batchify(const Tensor& tokens, int64_t batch_size) {
  MP_CHECK(tokens.defined() && tokens.dim() == 1 && tokens.dtype() == DType::i64,
           "batchify: expected i64 token ids "
           "[n], got ",
           tokens.defined() ? tokens.describe() : std::string("undefined"));
  MP_CHECK(batch_size >= 1, "batchify: expected batch_size >= 1, got ", batch_size);
  const Tensor src = tokens.contiguous();
  const int64_t rows = src.size(0) / batch_size;
  Tensor out = empty({rows, batch_size}, {.dtype = DType::i64});
  const int64_t* s = src.data_ptr<int64_t>();
  int64_t* d = out.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_size; ++b)
    for (int64_t r = 0; r < rows; ++r) d[r * batch_size + b] = s[b * rows + r];
  return out;
}

Batch bptt_batch(const Tensor& source, int64_t i, int64_t bptt) {
  MP_CHECK(source.defined() && source.dim() == 2 && source.dtype() == DType::i64,
           "bptt_batch: expected a "
           "batchified i64 source [rows, B], got ",
           source.defined() ? source.describe() : std::string("undefined"));
  MP_CHECK(bptt >= 1, "bptt_batch: expected bptt >= 1, got ", bptt);
  const int64_t rows = source.size(0), B = source.size(1);
  MP_CHECK(i >= 0 && i < rows - 1, "bptt_batch: expected 0 <= i < rows - 1 = ", rows - 1,
           " (a window needs a next "
           "token as target), got i = ",
           i);
  const int64_t t = std::min(bptt, rows - 1 - i);
  return {source.narrow(0, i, t).clone(), source.narrow(0, i + 1, t).clone().reshape({t * B})};
}

}  // namespace mp::data

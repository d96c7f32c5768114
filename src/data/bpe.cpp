// The byte-level BPE model: encode, decode, and Hugging Face's tokenizer.json (Note [byte-level BPE]).
#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "mp/core/atomic_file.hpp"
#include "mp/core/error.hpp"
#include "mp/data/bpe.hpp"
#include "mp/data/idx.hpp"

namespace mp::data {

// Note [byte-level BPE]
// Tokens are strings of GPT-2's byte symbols (byte_symbol: every byte one printable code point), so a vocabulary
// is plain text and 256 single-symbol tokens cover any input. A merge joins two adjacent tokens of a pre-tokenized
// piece into one; encoding applies, within each piece, the lowest-ranked merge present until none applies (GPT-2's
// bpe()), which is what Hugging Face's BPE model does without dropout. Pieces repeat (a corpus has far fewer
// distinct words than words), so their ids are cached. Special tokens are cut out of the text before
// pre-tokenization and are never split or merged.

namespace {

std::string json_excerpt_of(std::string_view s) { return std::string(s.substr(0, 80)) + (s.size() > 80 ? "..." : ""); }

}  // namespace

void BpeTokenizer::index() {
  ids_.clear();
  ranks_.clear();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const auto [it, fresh] = ids_.emplace(tokens_[i], static_cast<int64_t>(i));
    MP_CHECK(fresh, "BpeTokenizer: the token '", tokens_[i], "' has two ids (", it->second, " and ", i, ")");
  }
  for (size_t r = 0; r < merges_.size(); ++r) {
    const auto& [a, b] = merges_[r];
    const auto ia = ids_.find(a), ib = ids_.find(b), iab = ids_.find(a + b);
    MP_CHECK(ia != ids_.end() && ib != ids_.end() && iab != ids_.end(), "BpeTokenizer: merge ", r, " ('", a, "' '", b,
             "') names a token that is not in the vocabulary; the file's vocab and merges do not belong together");
    ranks_.emplace(std::pair{ia->second, ib->second}, Merge{static_cast<int64_t>(r), iab->second});
  }
  for (uint32_t byte = 0; byte < 256; ++byte)
    MP_CHECK(ids_.count(byte_symbol(static_cast<uint8_t>(byte))) == 1,
             "BpeTokenizer: the vocabulary has no token for byte ", byte, " ('",
             byte_symbol(static_cast<uint8_t>(byte)),
             "'); a byte-level BPE vocabulary holds all 256 byte symbols (GPT-2's tokenizer.json does)");
}

std::optional<int64_t> BpeTokenizer::token_id(std::string_view token) const {
  const auto it = ids_.find(std::string(token));
  return it == ids_.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

const std::string& BpeTokenizer::token(int64_t id) const {
  MP_CHECK(id >= 0 && id < vocab_size(), "BpeTokenizer: token id ", id, " is outside the vocabulary [0, ", vocab_size(),
           ")");
  return tokens_[static_cast<size_t>(id)];
}

void BpeTokenizer::merge_pair(std::vector<int64_t>& sym, int64_t a, int64_t b, int64_t ab) {
  size_t w = 0;
  for (size_t i = 0; i < sym.size(); ++i, ++w) {
    if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
      sym[w] = ab;
      ++i;
    } else {
      sym[w] = sym[i];
    }
  }
  sym.resize(w);
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int64_t>& out) const {
  std::vector<int64_t> sym;
  sym.reserve(piece.size());
  for (const char c : piece) sym.push_back(ids_.at(byte_symbol(static_cast<uint8_t>(c))));
  while (sym.size() > 1) {
    const Merge* best = nullptr;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      const auto it = ranks_.find({sym[i], sym[i + 1]});
      if (it != ranks_.end() && (best == nullptr || it->second.rank < best->rank)) best = &it->second, at = i;
    }
    if (best == nullptr) break;
    merge_pair(sym, sym[at], sym[at + 1], best->id);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

std::pair<size_t, size_t> BpeTokenizer::next_special(std::string_view text, size_t pos) const {
  size_t found = std::string_view::npos, len = 0;
  for (const std::string& s : specials_) {
    const size_t f = s.empty() ? std::string_view::npos : text.find(s, pos);
    if (f != std::string_view::npos && (f < found || (f == found && s.size() > len))) found = f, len = s.size();
  }
  return {found, len};
}

std::vector<int64_t> BpeTokenizer::encode_lines(const std::vector<std::string>& lines) const {
  std::string text;
  for (const std::string& l : lines) text.append(l).push_back('\n');
  return encode(text);
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out;
  std::unordered_map<std::string_view, std::vector<int64_t>> cache;  // pieces repeat
  auto plain = [&](std::string_view part) {
    for (const std::string_view piece : gpt2_pretokenize(part)) {
      auto it = cache.find(piece);
      if (it == cache.end()) {
        std::vector<int64_t> ids;
        encode_piece(piece, ids);
        it = cache.emplace(piece, std::move(ids)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  };
  size_t pos = 0;
  while (pos < text.size()) {
    const auto [found, len] = next_special(text, pos);
    plain(text.substr(pos, found == std::string_view::npos ? std::string_view::npos : found - pos));
    if (found == std::string_view::npos) break;
    out.push_back(ids_.at(std::string(text.substr(found, len))));
    pos = found + len;
  }
  return out;
}

std::string BpeTokenizer::decode(std::span<const int64_t> ids) const {
  // The inverse of byte_symbol, by symbol string.
  static const std::unordered_map<std::string, char> byte_of = [] {
    std::unordered_map<std::string, char> m;
    for (uint32_t b = 0; b < 256; ++b) m.emplace(byte_symbol(static_cast<uint8_t>(b)), static_cast<char>(b));
    return m;
  }();
  const std::unordered_set<std::string> specials(specials_.begin(), specials_.end());
  std::string out;
  for (const int64_t id : ids) {
    const std::string& t = token(id);
    if (specials.count(t) != 0) {
      out += t;
      continue;
    }
    for (size_t i = 0; i < t.size();) {
      const size_t n = (static_cast<uint8_t>(t[i]) & 0x80) == 0 ? 1 : 2;  // byte symbols are U+0000..U+0143
      const auto it = byte_of.find(t.substr(i, n));
      MP_CHECK(it != byte_of.end(), "BpeTokenizer::decode: token ", id, " ('", t,
               "') is not made of byte symbols; is this a byte-level BPE vocabulary?");
      out += it->second;
      i += n;
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------ tokenizer.json

std::string BpeTokenizer::to_json() const {
  using nlohmann::ordered_json;
  ordered_json added = ordered_json::array();
  for (const std::string& s : specials_)
    added.push_back({{"id", ids_.at(s)},
                     {"content", s},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  ordered_json vocab = ordered_json::object();
  for (size_t i = 0; i < tokens_.size(); ++i) vocab[tokens_[i]] = i;
  ordered_json merges = ordered_json::array();
  for (const auto& [a, b] : merges_) merges.push_back(a + " " + b);
  const ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  ordered_json j = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer", byte_level},
                    {"post_processor", byte_level},
                    {"decoder", byte_level},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"vocab", vocab},
                      {"merges", merges}}}};
  return j.dump(2);
}

void BpeTokenizer::save(const std::string& path) const { atomic_write_file(path, to_json() + "\n"); }

BpeTokenizer BpeTokenizer::from_json(std::string_view text, const std::string& what) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MP_FAIL(what, ": not JSON (", e.what(), "); expected a Hugging Face tokenizer.json");
  }
  auto need = [&](const nlohmann::json& obj, const char* key, const char* where) -> const nlohmann::json& {
    MP_CHECK(obj.is_object() && obj.contains(key), what, ": expected a tokenizer.json with ", where, "; it has none");
    return obj.at(key);
  };
  const nlohmann::json& model = need(j, "model", "a \"model\" object");
  const nlohmann::json& type = need(model, "type", "model.type");
  MP_CHECK(type.is_string() && type.get<std::string>() == "BPE", what, ": expected model.type \"BPE\", got ",
           json_excerpt_of(type.dump()), "; only byte-level BPE tokenizers (GPT-2's kind) are supported");
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    const nlohmann::json& pre = j["pre_tokenizer"];
    MP_CHECK(
        pre.is_object() && pre.value("type", std::string()) == "ByteLevel" && !pre.value("add_prefix_space", false),
        what, ": expected a ByteLevel pre_tokenizer without add_prefix_space (GPT-2's), got ",
        json_excerpt_of(pre.dump()));
  }
  const nlohmann::json& vocab = need(model, "vocab", "model.vocab");
  const nlohmann::json& merges = need(model, "merges", "model.merges");
  MP_CHECK(vocab.is_object() && merges.is_array(), what, ": expected model.vocab an object and model.merges a list");

  BpeTokenizer t;
  t.tokens_.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [tok, idj] : vocab.items()) {
    MP_CHECK(idj.is_number_integer(), what, ": the id of token '", json_excerpt_of(tok), "' is not an integer");
    const int64_t id = idj.get<int64_t>();
    MP_CHECK(id >= 0 && id < static_cast<int64_t>(vocab.size()) && !seen[static_cast<size_t>(id)], what,
             ": token ids must be 0..", vocab.size() - 1, " each once; '", json_excerpt_of(tok), "' has ", id);
    seen[static_cast<size_t>(id)] = true;
    t.tokens_[static_cast<size_t>(id)] = tok;
  }
  for (const nlohmann::json& m : merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      MP_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos, what,
               ": a merge must be \"left right\", got \"", json_excerpt_of(s), "\"");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      MP_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), what,
               ": a merge must be \"left right\" or [left, right], got ", json_excerpt_of(m.dump()));
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    }
    t.merges_.emplace_back(std::move(a), std::move(b));
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const nlohmann::json& at : j["added_tokens"]) {
      MP_CHECK(at.is_object() && at.contains("id") && at.contains("content") && at["content"].is_string() &&
                   at["id"].is_number_integer(),
               what, ": an added token needs \"id\" and \"content\", got ", json_excerpt_of(at.dump()));
      const std::string content = at["content"].get<std::string>();
      const int64_t id = at["id"].get<int64_t>();
      if (id == static_cast<int64_t>(t.tokens_.size())) t.tokens_.push_back(content);  // added beyond the model's vocab
      MP_CHECK(id >= 0 && id < static_cast<int64_t>(t.tokens_.size()) && t.tokens_[static_cast<size_t>(id)] == content,
               what, ": added token '", json_excerpt_of(content), "' has id ", id, ", which the vocabulary gives to '",
               id >= 0 && id < static_cast<int64_t>(t.tokens_.size()) ? t.tokens_[static_cast<size_t>(id)] : "", "'");
      t.specials_.push_back(content);
    }
  }
  try {
    t.index();
  } catch (const Error& e) { MP_FAIL(what, ": ", e.what()); }
  return t;
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  return from_json(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

}  // namespace mp::data

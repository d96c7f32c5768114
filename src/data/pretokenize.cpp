// GPT-2's pre-tokenization (a regex with Unicode classes, on PCRE2) and its byte-level symbols.
#include <array>
#include <string>

#include "mp/core/error.hpp"
#include "mp/data/bpe.hpp"

#if defined(MP_HAVE_PCRE2)
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#endif

namespace mp::data {

const std::string& byte_symbol(uint8_t byte) {
  // GPT-2's bytes_to_unicode(): the printable bytes ! .. ~, ¡ .. ¬, ® .. ÿ stand for themselves (as code points);
  // the other 68 take U+0100 onwards, in byte order.
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    auto utf8 = [](uint32_t cp) {
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {  // below U+0800 here: two bytes
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      return s;
    };
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = utf8(printable ? b : next++);
    }
    return t;
  }();
  return table[byte];
}

#if defined(MP_HAVE_PCRE2)
namespace {

// GPT-2's pattern (its encoder.py); PCRE2_UCP makes \s, \p{L}, \p{N} Unicode-aware as the original's `regex` module.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

const pcre2_code* gpt2_regex() {
  static const std::unique_ptr<pcre2_code, CodeDeleter> code = [] {
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
    MP_CHECK(c != nullptr, "gpt2_pretokenize: PCRE2 refused GPT-2's pattern (error ", err, " at ", at, ")");
    pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);  // without JIT support the interpreter matches the same
    return std::unique_ptr<pcre2_code, CodeDeleter>(c);
  }();
  return code.get();
}

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  const pcre2_code* re = gpt2_regex();
  const std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(re, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE pos = 0;
  uint32_t options = 0;  // the UTF check runs once, on the first match
  while (pos < text.size()) {
    const int rc = pcre2_match(re, subject, text.size(), pos, options, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // cannot happen (\s+ and the catch-all classes cover everything)
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      const bool utf = rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21;  // startchar: the bad byte
      MP_FAIL("gpt2_pretokenize: ", reinterpret_cast<const char*>(msg), " at byte ",
              utf ? pcre2_get_startchar(md.get()) : pos,
              utf ? "; the tokenizer reads UTF-8 text: convert the input to UTF-8" : "");
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[1] == ov[0]) break;  // an empty match would loop; the pattern has none
    pieces.emplace_back(text.data() + ov[0], ov[1] - ov[0]);
    pos = ov[1];
    options = PCRE2_NO_UTF_CHECK;
  }
  return pieces;
}

#else

std::vector<std::string_view> gpt2_pretokenize(std::string_view) {
  MP_FAIL(
      "gpt2_pretokenize: this build of mixprec has no PCRE2, which GPT-2's pre-tokenization rule needs; "
      "install libpcre2-dev (scripts/setup.sh does) and configure again");
}

#endif

}  // namespace mp::data

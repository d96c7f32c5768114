// data::Utf8Stream: byte pieces to whole UTF-8 characters.
#include "mp/data/utf8_stream.hpp"

#include <cstdint>

namespace mp::data {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the character that lead byte `b` starts (0: not a lead byte), and the range its second byte must
// fall in (Unicode's table 3-7 of well-formed sequences: no overlongs, surrogates or code points above U+10FFFF).
struct Lead {
  int length;
  uint8_t lo, hi;
};
Lead lead(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const auto at = [&](size_t i) { return static_cast<uint8_t>(pending_[i]); };
  size_t i = 0;
  while (i < pending_.size()) {
    const Lead l = lead(at(i));
    if (l.length == 0) {  // not a lead byte
      out += kReplacement;
      ++i;
      continue;
    }
    // How many of the bytes that follow continue the character validly (up to its length).
    size_t n = 1;
    while (n < static_cast<size_t>(l.length) && i + n < pending_.size()) {
      const uint8_t c = at(i + n);
      const bool ok = n == 1 ? c >= l.lo && c <= l.hi : (c & 0xC0) == 0x80;
      if (!ok) break;
      ++n;
    }
    if (n == static_cast<size_t>(l.length)) {
      out.append(pending_, i, n);
      i += n;
    } else if (i + n == pending_.size()) {
      break;  // valid so far, unfinished: wait for the rest
    } else {
      out += kReplacement;  // broken off by a byte that cannot continue it: that byte starts afresh
      i += n;
    }
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  const bool unfinished = !pending_.empty();
  pending_.clear();
  return unfinished ? std::string(kReplacement) : std::string();
}

}  // namespace mp::data

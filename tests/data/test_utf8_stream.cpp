// data::Utf8Stream: byte pieces (tokens decoded one at a time) to whole UTF-8 characters.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mp/data/utf8_stream.hpp"

using mp::data::Utf8Stream;

namespace {

const std::string kFffd = "\xEF\xBF\xBD";

// The pieces push() returns for `chunks`, each checked to be whole characters, then finish().
std::vector<std::string> pieces(const std::vector<std::string>& chunks) {
  Utf8Stream s;
  std::vector<std::string> out;
  for (const std::string& c : chunks) out.push_back(s.push(c));
  out.push_back(s.finish());
  return out;
}

}  // namespace

TEST(Utf8Stream, HoldsACharacterSplitAcrossPiecesUntilItIsWhole) {
  // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80.
  EXPECT_EQ(pieces({"ab\xC3", "\xA9", "c"}), (std::vector<std::string>{"ab", "\xC3\xA9", "c", ""}));
  EXPECT_EQ(pieces({"\xE2", "\x82", "\xAC!"}), (std::vector<std::string>{"", "", "\xE2\x82\xAC!", ""}));
  EXPECT_EQ(pieces({"x\xF0\x9F", "\x98\x80"}), (std::vector<std::string>{"x", "\xF0\x9F\x98\x80", ""}));
  // Every split of a mixed string gives the string back.
  const std::string text = "h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80.";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    Utf8Stream s;
    const std::string a = s.push(text.substr(0, cut));
    EXPECT_LE(s.pending(), 3u);
    const std::string b = s.push(text.substr(cut));
    EXPECT_EQ(a + b + s.finish(), text) << "cut at " << cut;
  }
}

TEST(Utf8Stream, ReplacesBytesThatCannotFormACharacter) {
  EXPECT_EQ(pieces({"a\x80z"}), (std::vector<std::string>{"a" + kFffd + "z", ""}));            // stray continuation
  EXPECT_EQ(pieces({"\xC3z"}), (std::vector<std::string>{kFffd + "z", ""}));                   // lead broken off
  EXPECT_EQ(pieces({"\xC0\xAF"}), (std::vector<std::string>{kFffd + kFffd, ""}));              // overlong lead
  EXPECT_EQ(pieces({"\xED\xA0\x80"}), (std::vector<std::string>{kFffd + kFffd + kFffd, ""}));  // a surrogate
  EXPECT_EQ(pieces({"ok\xE2\x82"}), (std::vector<std::string>{"ok", kFffd}));                  // unfinished at the end
}

#pragma once
// Printing text that arrives in byte pieces (a byte-level BPE model's tokens, decoded one at a time) without ever
// printing part of a character: a UTF-8 character may span tokens.
#include <string>
#include <string_view>

namespace mp::data {

/// Cuts a stream of bytes into valid UTF-8 pieces. push() returns the text of every character completed so far
/// and keeps an unfinished one for the next push; a byte that cannot be part of a valid character (a stray
/// continuation byte, an overlong or surrogate form, a lead byte followed by a non-continuation) becomes U+FFFD,
/// as Python's decode(errors="replace"). finish() returns U+FFFD for an unfinished character left at the end, so
/// the pieces joined are valid UTF-8 and equal the bytes joined whenever those are valid.
class Utf8Stream {
 public:
  /// Append `bytes`; returns the complete characters now available (possibly empty).
  std::string push(std::string_view bytes);
  /// End of the stream: U+FFFD for a pending unfinished character, else empty; the stream is then empty.
  std::string finish();
  /// Bytes held back (the start of an unfinished character: at most 3).
  size_t pending() const { return pending_.size(); }

 private:
  std::string pending_;
};

}  // namespace mp::data

#pragma once
// What the fuzz targets share (Note [fuzz targets] in fuzz/CMakeLists.txt): the input written to a file (the
// readers take paths), and the rule every target checks: a reader accepts the bytes or refuses them with an
// mp::Error whose message names the file. Anything else is a finding, reported by libFuzzer as a crash: another
// exception type (it escapes LLVMFuzzerTestOneInput), a sanitizer report, a hang, an internal error
// (MP_ASSERT) or a refusal that does not say which file it was about.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mp/core/error.hpp"

namespace mp::fuzz {

/// Stop the process as a finding: libFuzzer saves the input as crash-<sha1>.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::abort();
}

/// A file of this process holding `size` bytes of `data`, overwritten by each call with the same `tag`
/// ($TMPDIR or /tmp, named by the process id so parallel fuzzers do not share it).
inline std::string write_temp(const uint8_t* data, size_t size, const std::string& tag = "input") {
  const char* dir = std::getenv("TMPDIR");
  const std::string path = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/mixprec-fuzz-" +
                           std::to_string(::getpid()) + "-" + tag;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  f.close();
  if (!f) finding("cannot write the temporary file " + path);
  return path;
}

/// Whether `msg` reports an internal error (MP_ASSERT's message), maybe after `prefix` (a caller's wrapping of
/// the message). Only the start counts: a refusal may quote the input, which can hold any words.
inline bool internal_error(std::string_view msg, std::string_view prefix = "") {
  if (!prefix.empty() && msg.starts_with(prefix)) msg.remove_prefix(prefix.size());
  return msg.starts_with("mixprec internal error");
}

/// Run `read` on the files `paths`: returning, or throwing an mp::Error that names one of them, is fine. `prefix`:
/// what the reader puts before a message it wraps (internal_error).
template <class F>
void expect_accept_or_refuse(const std::vector<std::string>& paths, F&& read, const std::string& prefix = "") {
  try {
    read();
  } catch (const mp::Error& e) {
    const std::string_view msg = e.what();
    if (internal_error(msg, prefix)) finding(std::string("an internal error: ") + e.what());
    bool named = false;
    for (const std::string& p : paths) named = named || msg.find(p) != std::string_view::npos;
    if (!named) finding("a refusal that does not name the file '" + paths.front() + "': " + e.what());
  }
}

/// expect_accept_or_refuse for a reader of one file.
template <class F>
void expect_accept_or_refuse(const std::string& path, F&& read, const std::string& prefix = "") {
  expect_accept_or_refuse(std::vector<std::string>{path}, std::forward<F>(read), prefix);
}

}  // namespace mp::fuzz

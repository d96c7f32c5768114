#pragma once
// Atomic file replacement: write a temporary file beside the target, fsync it, rename it over the
// target and fsync the folder, so a reader (or a crash) sees either the old file or the new one whole.
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>

namespace mp {

/// Write `bytes` to `path` atomically: a temporary file in the same folder (path + ".tmp.<pid>.<random>"),
/// fsync, rename over `path`, fsync the folder. On any failure the old file is untouched, the temporary
/// removed, and the mp::Error names the path and strerror(errno). A symlink at `path` is replaced by a file.
void atomic_write_file(const std::string& path, std::string_view bytes);

/// Same, for content produced by a writer callback into an ostream (large files without a second copy in
/// memory). An exception thrown by `write` removes the temporary, leaves `path` untouched and propagates.
void atomic_write_file(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace mp

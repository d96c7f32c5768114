#pragma once
// The per-machine cache file of measured kernel paths (Note [the kernel-path cache file] in kernel_path_file.cpp).
#include <map>
#include <string>

namespace mp::backend::cpu {

/// One measured choice: the path and each candidate's median time in milliseconds.
struct CachedPath {
  std::string path;
  std::map<std::string, double> ms;
};

/// Call key -> measured choice.
using PathTable = std::map<std::string, CachedPath>;

/// What makes timings comparable: CPU model, OpenMP threads, oneDNN and mixprec versions, file format (JSON).
std::string path_cache_identity();

/// The cache file for `identity`: MP_CACHE_DIR, else $XDG_CACHE_HOME/mixprec, else $HOME/.cache/mixprec, then
/// kernel-paths-<hash of the identity>.json. Empty when no folder can be named (no HOME).
std::string path_cache_file(const std::string& identity);

/// The entries of `file` when it is a well-formed cache of `identity`; otherwise empty, with `why` saying what
/// was wrong ("" for a missing file: nothing measured yet).
PathTable load_path_cache(const std::string& file, const std::string& identity, std::string& why);

/// Adds `entries` to `file` (its other entries are kept): under an exclusive lock on file.lock, the current file
/// is read, merged and written to a temporary file that is renamed over it, so readers see the old or the new
/// file whole and two processes writing at once lose nothing. Returns "" or what failed.
std::string store_path_cache(const std::string& file, const std::string& identity, const PathTable& entries);

}  // namespace mp::backend::cpu

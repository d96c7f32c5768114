#pragma once
// Which kernel path each 16-bit CPU matmul and convolution, and each small f32 convolution, takes: chosen per shape
// by timing the candidates on the machine at hand, cached in memory and in the user's cache folder, recorded in a
// run's checkpoint so a resumed run reuses them (Note [kernel paths chosen by measurement] in
// src/backend/cpu/kernel_paths.cpp).
#include <map>
#include <string>

namespace mp {

/// How a low-precision CPU call finds its path when no forced path (MP_BF16) applies.
enum class KernelPathMode : unsigned char {
  measure,  ///< time the candidates on first use of a shape (the default), reuse the user's cache file
  pinned,   ///< no timing: every shape takes its default path (oneDNN's 16-bit kernels; f16 through f32)
};

/// "measure" or "pinned".
const char* kernel_path_mode_name(KernelPathMode mode);

/// Sets the mode for calls after this one. Without a call, MP_KERNEL_PATHS=measure|pinned decides (default
/// measure; the test suite pins).
void set_kernel_path_mode(KernelPathMode mode);

/// The mode in force now.
KernelPathMode kernel_path_mode();

/// What this process chose so far, and how.
struct KernelPathRecord {
  std::map<std::string, std::string> choices;  ///< call key (op, dtypes, shape) -> path ("native", "via_f32", "gemm")
  int measured = 0;                            ///< shapes timed in this process
  int from_cache = 0;                          ///< shapes found in the user's cache file
  int from_record = 0;                         ///< shapes adopted from a run's record (a resumed checkpoint)
  int defaults = 0;            ///< shapes given their default (pinned mode, or the measuring budget was spent)
  double measure_seconds = 0;  ///< wall time spent timing candidates
  std::string mode;            ///< kernel_path_mode_name() now
  std::string cache_file;      ///< the cache file of this machine (CPU, threads, library versions); may not exist
};

/// The record of this process (a copy).
KernelPathRecord kernel_path_record();

/// The record as a JSON object: mode, counters, measure_seconds, cache_file, paths (how many shapes take each
/// path) and choices (key -> path).
std::string kernel_path_record_json(const KernelPathRecord& record);

/// How many calls take each path, for people: "gemm 3, native 14" ("" for none).
std::string kernel_path_counts(const std::map<std::string, std::string>& choices);

/// One line for people: "native 14, gemm 3, via_f32 1; 18 measured in 1.6 s, ..."; "none" without choices.
std::string kernel_path_summary(const KernelPathRecord& record);

/// Each candidate's measured median in ms for the call named `key` (this process's timing or the cache
/// file's); empty when it was not measured (pinned, forced, adopted without a cache entry).
std::map<std::string, double> kernel_path_timings(const std::string& key);

/// What this machine's cache file holds, for people: "23 shapes: native 17, gemm 4, via_f32 2", or why none.
std::string kernel_path_cache_summary();

/// Uses these choices (a run's record, key -> path name) for their shapes from now on, ahead of the cache
/// file and of measuring, so a resumed run computes as the interrupted one did. A path name other than native,
/// via_f32 or gemm throws mp::Error naming it (a damaged record).
void adopt_kernel_paths(const std::map<std::string, std::string>& choices);

/// Forgets every choice made or adopted in this process and zeroes the counters (tests; the file stays).
void reset_kernel_paths();

}  // namespace mp

#pragma once
// The kernel-path selector of the CPU backend (Note [kernel paths chosen by measurement] in kernel_paths.cpp):
// the matmul and convolution kernels name a call by a key and list their candidate paths; the selector answers
// from memory, a run's record, the cache file, or by timing the candidates once.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mp/kernel_paths.hpp"

namespace mp::backend::cpu {

/// How one 16-bit matmul or convolution computes.
enum class KernelPath : uint8_t {
  native,   ///< oneDNN's primitive in the operands' own dtype (f32 accumulation)
  via_f32,  ///< operands widened to f32 (exact), oneDNN's f32 primitive, the result rounded once
  gemm,     ///< convolutions only: im2col + one native 16-bit GEMM (Note [small convolutions as one GEMM])
};

/// "native", "via_f32" or "gemm".
const char* kernel_path_name(KernelPath path);

/// The path named `name`, or nullopt.
std::optional<KernelPath> parse_kernel_path(const std::string& name);

/// The path for the call named `key` (op, dtypes and shape; any text without spaces at its ends).
/// `candidates` lists the paths that can compute it, the default first. With one candidate that one is
/// returned. Otherwise, in order: a choice already made in this process or adopted from a record; in pinned
/// mode the default; the user's cache file; else `run(path)` is timed for each candidate on stand-in operands
/// (never the caller's: it must have no effect outside itself) and the choice is stored in memory and in the
/// cache file. A call made while this thread is timing another (a GEMM path's inner matmul) gets its default.
/// `usable` (optional), asked only before timing, drops candidates known to be slow without timing them (a
/// oneDNN reference implementation); when it drops the default, the first remaining candidate is the default.
KernelPath choose_kernel_path(const std::string& key, std::span<const KernelPath> candidates,
                              const std::function<void(KernelPath)>& run,
                              const std::function<bool(KernelPath)>& usable = {});

/// One candidate's timing: the median of its timed runs, in seconds.
struct PathTiming {
  KernelPath path;
  double seconds;
};

/// The decision rule on measured medians (timings[0] is the default): the fastest other path replaces the
/// default only when it is at least kReplaceFactor times faster, so choices do not flip with noise.
KernelPath decide_kernel_path(std::span<const PathTiming> timings);

/// Replaces the clock candidates are timed with (seconds; tests drive a fake one from fake kernels, so their
/// timings are exact); nullptr restores std::chrono::steady_clock.
void set_kernel_path_clock(double (*clock)());

/// A path must be this many times faster than the default to replace it (10%).
inline constexpr double kReplaceFactor = 1.10;

}  // namespace mp::backend::cpu

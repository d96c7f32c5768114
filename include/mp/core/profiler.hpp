#pragma once
// Per-kernel profiler: while enabled, every kernel called through a backend KernelSlot (matmul,
// convolution, each element-wise op, reductions, optimizer updates, ...) adds its wall time and the
// bytes of its tensor operands to a table keyed by label. Times are exclusive (a kernel that calls
// another kernel is charged only its own time). Off by default; when off a kernel call costs one
// relaxed atomic load. Used by `mixprec bench op-breakdown`.
//
// Note [device time in the profiler]
// A CUDA kernel call returns as soon as the work is queued, so host time would measure launches. A kernel
// called for a CUDA device is therefore timed with two timestamps queued on the device's stream around
// it (a DeviceTimer: CUDA events, installed by the CUDA backend); snapshot() waits for them and charges
// each label the device time between its timestamps, exclusive of nested device regions, exactly as host
// times are exclusive of nested host regions. The host's own time inside such a call (queueing the work)
// is kept beside it (OpStats::host_seconds, also exclusive): a step whose host time is close to its wall
// time is bound by the host, and this says where that time goes.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace mp::profiler {

/// Totals of one kernel label.
struct OpStats {
  std::string name;    ///< label: the kernel family, or the element-wise/reduce op ("add", "copy", "sum")
  int64_t calls = 0;   ///< number of calls
  double seconds = 0;  ///< exclusive wall time
  double bytes = 0;    ///< sum over calls of the operand tensors' sizes (inputs + outputs)
  /// Device regions only: the host's exclusive time inside the kernel calls (queueing the work: launches, library
  /// calls, allocation), beside `seconds`, the device's (Note [device time in the profiler]).
  double host_seconds = 0;
};

/// Start (true) or stop (false) recording; does not clear the table.
void enable(bool on);
/// Whether recording is on.
inline bool enabled();
/// Clear the table.
void reset();
/// The table, largest time first.
std::vector<OpStats> snapshot();

/// RAII: clears the table and records inside the scope (restores the previous on/off state).
class Session {
 public:
  Session();
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  bool prev_;
};

/// Timestamps of work queued on an accelerator (Note [device time in the profiler]). The CUDA backend
/// installs one when the library loads; without one, kernels of every device are timed on the host.
struct DeviceTimer {
  /// Queue a timestamp on `device`'s stream (after the work queued so far) and return its handle.
  void* (*record)(int device);
  /// Wait until `end` has been reached and return the seconds between the `start` and `end` timestamps.
  double (*elapsed_seconds)(void* start, void* end);
  /// Give a handle back (it may be reused by a later record).
  void (*release)(void* handle);
};

/// Install `timer` (nullptr: none) and return the previous one. The timer must outlive its use.
const DeviceTimer* set_device_timer(const DeviceTimer* timer);

namespace detail {
inline std::atomic<bool> g_enabled{false};
/// Whether a DeviceTimer is installed.
bool has_device_timer();
/// Begin a region of device work on `device` (timestamps queued on its stream); returns its id.
uint64_t begin_device(int device);
/// End region `id`: charges label the device time between its timestamps, less its nested regions',
/// when the table is next read (snapshot() waits for the timestamps), and `bytes` now.
void end_device(const char* label, uint64_t id, double bytes) noexcept;
/// Begin a timed region on this thread; returns the start time in ns.
int64_t begin();
/// End the region begun at `start`: charges label its exclusive time and `bytes`.
void end(const char* label, int64_t start, double bytes);
}  // namespace detail

inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

}  // namespace mp::profiler

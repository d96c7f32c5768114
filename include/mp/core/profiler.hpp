#pragma once
// Per-kernel profiler: while enabled, every kernel called through a backend KernelSlot (matmul,
// convolution, each element-wise op, reductions, optimizer updates, ...) adds its wall time and the
// bytes of its tensor operands to a table keyed by label. Times are exclusive (a kernel that calls
// another kernel is charged only its own time). Off by default; when off a kernel call costs one
// relaxed atomic load. Used by `mixprec bench op-breakdown`.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace mp::profiler {

/// Totals of one kernel label.
struct OpStats {
  std::string name;     ///< label: the kernel family, or the element-wise/reduce op ("add", "copy", "sum")
  int64_t calls = 0;    ///< number of calls
  double seconds = 0;   ///< exclusive wall time
  double bytes = 0;     ///< sum over calls of the operand tensors' sizes (inputs + outputs)
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

namespace detail {
inline std::atomic<bool> g_enabled{false};
/// Begin a timed region on this thread; returns the start time in ns.
int64_t begin();
/// End the region begun at `start`: charges label its exclusive time and `bytes`.
void end(const char* label, int64_t start, double bytes);
}  // namespace detail

inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

}  // namespace mp::profiler

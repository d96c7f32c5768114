// The kernel profiler's table (include/mp/core/profiler.hpp).
#include "mp/core/profiler.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <unordered_map>

namespace mp::profiler {
namespace {

struct Table {
  std::mutex mu;
  std::unordered_map<std::string, OpStats> ops;
};

Table& table() {
  static Table t;
  return t;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Per thread: time spent in nested kernel calls of each open region, to make times exclusive.
thread_local std::vector<int64_t> t_child_ns;

// Device regions whose time is not yet charged: timestamps, nesting and accumulated child time.
struct DeviceRecord {
  const char* label = nullptr;  // null while the region is open
  void* start = nullptr;
  void* end = nullptr;
  uint64_t parent = 0;  // 0: none
  int device = 0;
  double child_seconds = 0;
  int64_t host_start_ns = 0;  // the host's time inside the call: start, and the nested regions' share
  int64_t host_child_ns = 0;
};

struct DeviceState {
  std::mutex mu;
  std::atomic<const DeviceTimer*> timer{nullptr};
  std::unordered_map<uint64_t, DeviceRecord> pending;
  uint64_t next_id = 1;
};

DeviceState& device_state() {
  static DeviceState d;
  return d;
}

// Per thread: the open device regions, innermost last.
thread_local std::vector<uint64_t> t_open_device;

// Charge every closed device region whose time is known: waits for its end timestamp, then adds its
// exclusive time to the table and its whole time to its parent's child time. Children close before their
// parents, so one pass in id order (parents have smaller ids) settles every closed region whose parent
// is settled or still open.
void settle_device_regions(Table& t) {
  DeviceState& d = device_state();
  std::lock_guard lock(d.mu);
  const DeviceTimer* timer = d.timer.load();
  if (timer == nullptr || d.pending.empty()) return;
  std::vector<uint64_t> ids;
  for (const auto& [id, r] : d.pending)
    if (r.label != nullptr) ids.push_back(id);
  std::sort(ids.begin(), ids.end(), std::greater<>());  // innermost (newest) first
  for (uint64_t id : ids) {
    DeviceRecord& r = d.pending.at(id);
    double total = 0;
    try {
      total = timer->elapsed_seconds(r.start, r.end);
    } catch (...) {  // a device that faulted has no timings to give; the fault surfaces at its next use
      total = 0;
    }
    timer->release(r.start);
    timer->release(r.end);
    if (r.parent != 0)
      if (auto p = d.pending.find(r.parent); p != d.pending.end()) p->second.child_seconds += total;
    OpStats& s = t.ops[r.label];
    if (s.name.empty()) s.name = r.label;
    s.seconds += std::max(0.0, total - r.child_seconds);
    d.pending.erase(id);
  }
}

}  // namespace

const DeviceTimer* set_device_timer(const DeviceTimer* timer) { return device_state().timer.exchange(timer); }

void enable(bool on) { detail::g_enabled.store(on, std::memory_order_relaxed); }

void reset() {
  Table& t = table();
  std::lock_guard lock(t.mu);
  settle_device_regions(t);  // releases the timestamps of regions closed before the reset
  t.ops.clear();
}

std::vector<OpStats> snapshot() {
  Table& t = table();
  std::vector<OpStats> r;
  {
    std::lock_guard lock(t.mu);
    settle_device_regions(t);
    r.reserve(t.ops.size());
    for (const auto& [k, v] : t.ops) r.push_back(v);
  }
  std::sort(r.begin(), r.end(), [](const OpStats& a, const OpStats& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
  });
  return r;
}

Session::Session() : prev_(enabled()) {
  reset();
  enable(true);
}

Session::~Session() { enable(prev_); }

namespace detail {

int64_t begin() {
  t_child_ns.push_back(0);
  return now_ns();
}

void end(const char* label, int64_t start, double bytes) {
  const int64_t total = now_ns() - start;
  const int64_t self = total - t_child_ns.back();
  t_child_ns.pop_back();
  if (!t_child_ns.empty()) t_child_ns.back() += total;
  Table& t = table();
  std::lock_guard lock(t.mu);
  OpStats& s = t.ops[label];
  if (s.name.empty()) s.name = label;
  ++s.calls;
  s.seconds += static_cast<double>(self) * 1e-9;
  s.bytes += bytes;
}

bool has_device_timer() { return device_state().timer.load() != nullptr; }

uint64_t begin_device(int device) {
  DeviceState& d = device_state();
  const DeviceTimer* timer = d.timer.load();
  if (timer == nullptr) return 0;
  const int64_t host_start = now_ns();
  void* start = timer->record(device);
  std::lock_guard lock(d.mu);
  const uint64_t id = d.next_id++;
  DeviceRecord& r = d.pending[id];
  r.start = start;
  r.device = device;
  r.host_start_ns = host_start;
  r.parent = t_open_device.empty() ? 0 : t_open_device.back();
  t_open_device.push_back(id);
  return id;
}

void end_device(const char* label, uint64_t id, double bytes) noexcept {
  if (id == 0) return;
  DeviceState& d = device_state();
  const DeviceTimer* timer = d.timer.load();
  if (!t_open_device.empty() && t_open_device.back() == id) t_open_device.pop_back();
  int64_t host_self = 0;
  {
    std::lock_guard lock(d.mu);
    auto it = d.pending.find(id);
    if (it == d.pending.end() || timer == nullptr) return;
    try {
      it->second.end = timer->record(it->second.device);
    } catch (...) {  // called from a destructor: a failed timestamp drops the region, never terminates
      timer->release(it->second.start);
      d.pending.erase(it);
      return;
    }
    it->second.label = label;
    const int64_t host_total = now_ns() - it->second.host_start_ns;
    host_self = host_total - it->second.host_child_ns;
    if (it->second.parent != 0)
      if (auto p = d.pending.find(it->second.parent); p != d.pending.end()) p->second.host_child_ns += host_total;
  }
  Table& t = table();
  std::lock_guard lock(t.mu);
  OpStats& s = t.ops[label];
  if (s.name.empty()) s.name = label;
  ++s.calls;
  s.bytes += bytes;
  s.host_seconds += static_cast<double>(host_self) * 1e-9;
}

}  // namespace detail
}  // namespace mp::profiler

// The kernel profiler's table (include/mp/core/profiler.hpp).
#include "mp/core/profiler.hpp"

#include <algorithm>
#include <chrono>
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

}  // namespace

void enable(bool on) { detail::g_enabled.store(on, std::memory_order_relaxed); }

void reset() {
  Table& t = table();
  std::lock_guard lock(t.mu);
  t.ops.clear();
}

std::vector<OpStats> snapshot() {
  Table& t = table();
  std::vector<OpStats> r;
  {
    std::lock_guard lock(t.mu);
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

}  // namespace detail
}  // namespace mp::profiler

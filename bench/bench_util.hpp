#pragma once
// Shared timing helpers of the benchmark programs.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <cstring>
#include <functional>
#include <vector>

namespace mp::bench {

/// Seconds on the steady clock (wall time).
inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Seconds of CPU time this process has used, all threads: with one thread, the time the work ran on a core,
/// which other processes sharing the machine do not inflate.
inline double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// The median of v (the upper one of an even count).
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median wall time of `repeats` calls of fn after one warm-up call (page faults, caches, primitive creation).
inline double median_seconds(const std::function<void()>& fn, int repeats) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// The machine's copy bandwidth in GB/s (bytes read + written) for n floats, parallel like STREAM copy:
/// the reference that element-wise kernels are measured against in the same run.
inline double copy_bandwidth_gbs(int64_t n, int repeats) {
  std::vector<float> src(static_cast<size_t>(n), 1.0f), dst(static_cast<size_t>(n), 0.0f);
  const double t = median_seconds(
      [&] {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i += 16384)
          std::memcpy(dst.data() + i, src.data() + i, static_cast<size_t>(std::min<int64_t>(16384, n - i)) * 4);
      },
      repeats);
  return 8.0 * static_cast<double>(n) / t / 1e9;
}

}  // namespace mp::bench

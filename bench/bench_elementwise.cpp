// Element-wise ops and dtype casts in GB/s against the machine's copy bandwidth, measured in the same
// run (issue 2's target: >= 50% of copy bandwidth). Bytes counted = bytes read + bytes written.
// Usage: bench_elementwise [elements=33554432] [repeats=15]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mp/mp.hpp"

using namespace mp;
using mp::bench::median_seconds;

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{1} << 25);
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 15;
  std::printf("# element-wise bandwidth: n = %lld elements, %d threads, median of %d\n\n", static_cast<long long>(n),
              omp_get_max_threads(), repeats);

  // Reference: a parallel copy of 4n bytes (read + write = 8n bytes), like STREAM copy.
  const double copy_gbs = mp::bench::copy_bandwidth_gbs(n, repeats);
  std::printf("| op | dtype | GB/s | %% of copy |\n|---|---|---:|---:|\n");
  std::printf("| memcpy (reference) | f32 | %.1f | 100%% |\n", copy_gbs);

  manual_seed(1);
  Tensor a32 = randn({n}), b32 = randn({n});
  Tensor a16 = a32.to(DType::bf16), b16 = b32.to(DType::bf16);
  Tensor h16 = a32.to(DType::f16);
  Tensor out32 = empty({n}), out16 = empty({n}, {.dtype = DType::bf16}), outh = empty({n}, {.dtype = DType::f16});
  struct Case {
    std::string name, dtype;
    double bytes_per_elem;
    std::function<void()> fn;
  };
  std::vector<Case> cases = {
      {"add", "f32", 12, [&] { (void)add(a32, b32); }},
      {"mul", "f32", 12, [&] { (void)mul(a32, b32); }},
      {"relu", "f32", 8, [&] { (void)relu(a32); }},
      {"add_ (in place)", "f32", 12, [&] { add_(out32, a32); }},
      {"add", "bf16", 6, [&] { (void)add(a16, b16); }},
      {"relu", "bf16", 4, [&] { (void)relu(a16); }},
      {"cast f32->bf16", "bf16", 6, [&] { out16.copy_(a32); }},
      {"cast bf16->f32", "f32", 6, [&] { out32.copy_(a16); }},
      {"cast f32->f16", "f16", 6, [&] { outh.copy_(a32); }},
      {"cast f16->f32", "f32", 6, [&] { out32.copy_(h16); }},
      {"to(bf16) (allocating)", "bf16", 6, [&] { (void)a32.to(DType::bf16); }},
      {"sum", "f32", 4, [&] { (void)sum(a32); }},
  };
  for (auto& c : cases) {
    const double t = median_seconds(c.fn, repeats);
    const double gbs = c.bytes_per_elem * static_cast<double>(n) / t / 1e9;
    std::printf("| %s | %s | %.1f | %.0f%% |\n", c.name.c_str(), c.dtype.c_str(), gbs, 100.0 * gbs / copy_gbs);
  }
  return 0;
}

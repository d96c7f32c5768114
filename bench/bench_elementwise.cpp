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
  auto whole = [&](int i, int64_t dflt, int64_t min) {
    if (argc <= i) return dflt;
    char* end = nullptr;
    const long long v = std::strtoll(argv[i], &end, 10);
    if (end == argv[i] || *end != '\0' || v < min) {
      std::fprintf(stderr,
                   "usage: bench_elementwise [elements >= 4096, default 33554432] [repeats >= 1, default 15]; "
                   "got '%s'\n",
                   argv[i]);
      std::exit(2);
    }
    return static_cast<int64_t>(v);
  };
  const int64_t n = whole(1, int64_t{1} << 25, 4096);
  const int repeats = static_cast<int>(whole(2, 15, 1));
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
  // A square-ish [r, n / r] view for the transposing copies (Note [transposing copies]).
  const int64_t rows = int64_t{1} << (63 - __builtin_clzll(static_cast<unsigned long long>(n)) + 1) / 2;
  const Tensor t32 = a32.narrow(0, 0, rows * (n / rows)).view({rows, n / rows}).t();
  const Tensor th16 = h16.narrow(0, 0, rows * (n / rows)).view({rows, n / rows}).t();
  Tensor tout32 = empty(t32.sizes());
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
      {"transposing copy", "f32", 8, [&] { tout32.copy_(t32); }},
      {"transposing cast f16->f32", "f32", 6, [&] { tout32.copy_(th16); }},
  };
  for (auto& c : cases) {
    const double t = median_seconds(c.fn, repeats);
    const double gbs = c.bytes_per_elem * static_cast<double>(n) / t / 1e9;
    std::printf("| %s | %s | %.1f | %.0f%% |\n", c.name.c_str(), c.dtype.c_str(), gbs, 100.0 * gbs / copy_gbs);
  }
  return 0;
}

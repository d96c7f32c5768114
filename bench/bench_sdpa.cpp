// One configuration of mp::scaled_dot_product_attention (the fused CPU kernel), timed as its PyTorch twin
// bench/pytorch/bench_sdpa.py times F.scaled_dot_product_attention, printing the same JSON object; run side by
// side by bench/compare_attention.py. Forward alone (no grad) and forward + backward (upstream gradient of
// ones), `warmup` calls then the median of `repeats`; wall-clock and process CPU time. Memory: the process's
// peak resident set above what it held just before the first call (the same measure on both sides: it counts
// the kernels' scratch, which the allocator statistics do not), and the allocator's peak for mixprec.
// Usage: bench_sdpa DTYPE(f32|bf16) B H T D [causal=1] [repeats=5] [warmup=2]
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mp/mp.hpp"

using namespace mp;
using mp::bench::cpu_seconds;
using mp::bench::median;
using mp::bench::wall_seconds;

namespace {

// The resident set now, from /proc/self/statm (pages), in bytes.
double rss_now() {
  std::ifstream f("/proc/self/statm");
  long long size = 0, resident = 0;
  f >> size >> resident;
  return static_cast<double>(resident) * 4096.0;
}

double peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: bench_sdpa DTYPE(f32|bf16) B H T D [causal=1] [repeats=5] [warmup=2]\n");
    return 2;
  }
  const std::string dname = argv[1];
  if (dname != "f32" && dname != "bf16") {
    std::fprintf(stderr, "bench_sdpa: DTYPE must be f32 or bf16, got '%s'\n", dname.c_str());
    return 2;
  }
  const DType dt = dname == "f32" ? DType::f32 : DType::bf16;
  const int64_t B = std::atoll(argv[2]), H = std::atoll(argv[3]), T = std::atoll(argv[4]), D = std::atoll(argv[5]);
  const bool causal = argc > 6 ? std::atoi(argv[6]) != 0 : true;
  const int repeats = argc > 7 ? std::atoi(argv[7]) : 5, warmup = argc > 8 ? std::atoi(argv[8]) : 2;
  const AttentionOptions o{.causal = causal};
  manual_seed(0);
  Tensor q = randn({B, H, T, D}).to(dt).requires_grad_(), k = randn({B, H, T, D}).to(dt).requires_grad_(),
         v = randn({B, H, T, D}).to(dt).requires_grad_();
  const Tensor g = ones({B, H, T, D}, {.dtype = dt});
  const auto fwd = [&] {
    autograd::NoGradGuard ng;
    (void)scaled_dot_product_attention(q, k, v, o);
  };
  const auto fwd_bwd = [&] {
    Tensor out = scaled_dot_product_attention(q, k, v, o);
    out.backward(g);
    for (const Tensor* t : {&q, &k, &v}) t->set_grad(Tensor());
  };
  const double rss0 = rss_now();
  const int64_t alloc0 = memory::memory_stats().allocated;
  memory::reset_peak_memory_stats();
  const auto time = [&](const auto& f, double& wall_ms, double& cpu_ms) {
    for (int i = 0; i < warmup; ++i) f();
    std::vector<double> w, c;
    for (int i = 0; i < repeats; ++i) {
      const double w0 = wall_seconds(), c0 = cpu_seconds();
      f();
      c.push_back(1e3 * (cpu_seconds() - c0));
      w.push_back(1e3 * (wall_seconds() - w0));
    }
    wall_ms = median(w);
    cpu_ms = median(c);
  };
  double fwd_ms = 0, fwd_cpu = 0, fb_ms = 0, fb_cpu = 0;
  time(fwd_bwd, fb_ms, fb_cpu);
  const double rss_peak = peak_rss() - rss0;
  const double alloc_peak = static_cast<double>(memory::memory_stats().peak_allocated - alloc0);
  time(fwd, fwd_ms, fwd_cpu);
  std::printf(
      "{\"framework\": \"mixprec\", \"dtype\": \"%s\", \"B\": %lld, \"H\": %lld, \"T\": %lld, \"D\": %lld, "
      "\"causal\": %s, \"threads\": %d, \"fwd_ms\": %.3f, \"fwd_cpu_ms\": %.3f, \"fwd_bwd_ms\": %.3f, "
      "\"fwd_bwd_cpu_ms\": %.3f, \"peak_rss_above_start_bytes\": %.0f, \"peak_allocated_bytes\": %.0f}\n",
      dname.c_str(), static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(T),
      static_cast<long long>(D), causal ? "true" : "false", omp_get_max_threads(), fwd_ms, fwd_cpu, fb_ms, fb_cpu,
      rss_peak, alloc_peak);
  return 0;
}

// Generation with and without the key/value cache (Note [key/value cache] in src/models/gpt.cpp): the time of one new
// token at a context of T tokens, as `mixprec generate` spends it (Gpt::forward_cached on one position after T - 1
// cached ones) against nanoGPT's sample.py without a cache (Gpt::forward over all T positions for every token), at
// gpt-nano and gpt-mini widths (random weights; the vocabulary of a KJV tokenizer, 8192; block_size = T). Rounds are
// interleaved and each case's best round median is printed, so other processes on a shared machine hit both alike;
// the process CPU time per token is printed too (with OMP_NUM_THREADS=1 the time the work ran on a core, which other
// processes do not inflate).
// Usage: bench_generate [rounds=3] [tokens=16] [dtype=f32]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mp/mp.hpp"

using namespace mp;

namespace {

double now_ms() { return 1e3 * bench::wall_seconds(); }
double cpu_ms() { return 1e3 * bench::cpu_seconds(); }
using bench::median;

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const int64_t tokens = argc > 2 ? std::atoll(argv[2]) : 16;
  const DType dtype = dtype_from_string(argc > 3 ? argv[3] : "f32");
  std::printf("%s, OMP threads %d\n", dtype_name(dtype), omp_get_max_threads());
  std::printf("| model | context T | with cache: ms/token (CPU ms) | without: ms/token (CPU ms) | speed-up |\n");
  std::printf("|---|---|---|---|---|\n");
  for (const char* name : {"gpt-nano", "gpt-mini"}) {
    for (const int64_t T : {64, 256}) {
      manual_seed(1);
      models::GptOptions o = models::gpt_preset(name, 8192);
      o.block_size = T;
      models::Gpt m(o);
      m.eval();
      if (dtype != DType::f32) m.to(dtype);
      autograd::NoGradGuard ng;
      const Tensor seq = randint(0, 8192, {1, T});
      double best_cached = 1e30, best_full = 1e30, cpu_cached = 1e30, cpu_full = 1e30;
      for (int r = 0; r < rounds; ++r) {
        // With the cache: T - tokens positions prefilled, then `tokens` steps of one position (the last at T).
        models::GptKvCache cache;
        (void)m.forward_cached(seq.narrow(1, 0, T - tokens), cache);
        std::vector<double> ms, cpu;
        for (int64_t i = T - tokens; i < T; ++i) {
          const double t0 = now_ms(), c0 = cpu_ms();
          (void)m.forward_cached(seq.narrow(1, i, 1), cache).to(DType::f32);
          ms.push_back(now_ms() - t0);
          cpu.push_back(cpu_ms() - c0);
        }
        best_cached = std::min(best_cached, median(ms));
        cpu_cached = std::min(cpu_cached, median(cpu));
        // Without: the whole context through forward() per token (contexts T - tokens + 1 .. T).
        ms.clear();
        cpu.clear();
        for (int64_t i = T - tokens; i < T; ++i) {
          const double t0 = now_ms(), c0 = cpu_ms();
          (void)m.forward(seq.narrow(1, 0, i + 1)).to(DType::f32);
          ms.push_back(now_ms() - t0);
          cpu.push_back(cpu_ms() - c0);
        }
        best_full = std::min(best_full, median(ms));
        cpu_full = std::min(cpu_full, median(cpu));
      }
      std::printf("| %s | %lld | %.2f (%.2f) | %.2f (%.2f) | %.1fx |\n", name, static_cast<long long>(T), best_cached,
                  cpu_cached, best_full, cpu_full, best_full / best_cached);
      std::fflush(stdout);
    }
  }
  return 0;
}

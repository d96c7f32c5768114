// scaled_dot_product_attention on the CPU: the fused kernel against the composite of other ops (oneDNN matmuls,
// f32 softmax), forward alone (no grad) and forward + backward, in f32 and bf16, with each variant's peak
// allocator memory (bytes above what was allocated before the call; the fused kernel's per-thread tile scratch
// is not allocator memory and is not counted: it is O(tile) in the forward and O(T D) per thread in the
// backward). Rounds are interleaved (every case once per round, median of `repeats` calls each), so load from
// other processes hits all variants alike; the table gives each case's best round median and the spread.
// The process CPU time is given too: with OMP_NUM_THREADS=1 it is the time the kernel ran on a core, which other
// processes sharing the machine do not inflate (with more threads it also counts OpenMP spin-waiting).
// Usage: bench_attention [rounds=3] [repeats=5] [B=16] [H=6] [T=256] [D=64] [causal=1]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mp/mp.hpp"
#include "ops/attention_composite.hpp"

using namespace mp;
using mp::bench::cpu_seconds;
using mp::bench::median;
using mp::bench::wall_seconds;

namespace {

struct Variant {
  std::string name;
  DType dtype;
  bool fused;
  bool backward;
  bool gemm = false;               // the reference: oneDNN's matmul q k^T alone (the composite's first product)
  std::vector<double> ms, cpu_ms;  // one median per round: wall-clock and process CPU time
  double peak_mb = 0;
};

// One call of a variant: forward (under no_grad) or forward + backward with a ones upstream gradient.
void call(const Variant& v, const Tensor& q, const Tensor& k, const Tensor& val, const AttentionOptions& o) {
  if (v.gemm) {
    autograd::NoGradGuard ng;
    (void)matmul(q, k.transpose(-2, -1));
    return;
  }
  if (!v.backward) {
    autograd::NoGradGuard ng;
    (void)(v.fused ? scaled_dot_product_attention(q, k, val, o) : detail::sdpa_composite(q, k, val, o));
    return;
  }
  Tensor out = v.fused ? scaled_dot_product_attention(q, k, val, o) : detail::sdpa_composite(q, k, val, o);
  out.backward(ones_like(out));
  for (const Tensor* t : {&q, &k, &val}) t->set_grad(Tensor());
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const int64_t B = argc > 3 ? std::atoll(argv[3]) : 16, H = argc > 4 ? std::atoll(argv[4]) : 6;
  const int64_t T = argc > 5 ? std::atoll(argv[5]) : 256, D = argc > 6 ? std::atoll(argv[6]) : 64;
  const bool causal = argc > 7 ? std::atoi(argv[7]) != 0 : true;
  const AttentionOptions o{.causal = causal};
  std::printf("scaled_dot_product_attention, B=%lld H=%lld T=%lld D=%lld %s, %d threads, %d rounds x median of %d\n",
              static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(T),
              static_cast<long long>(D), causal ? "causal" : "not causal", omp_get_max_threads(), rounds, repeats);
  std::vector<Variant> vs;
  for (DType dt : {DType::f32, DType::bf16})
    for (bool bwd : {false, true})
      for (bool fused : {true, false})
        vs.push_back({std::string(dtype_name(dt)) + (bwd ? " fwd+bwd " : " fwd     ") + (fused ? "fused" : "composite"),
                      dt, fused, bwd});
  for (DType dt : {DType::f32, DType::bf16}) {
    Variant g{std::string(dtype_name(dt)) + " gemm q k^T (oneDNN)", dt, false, false};
    g.gemm = true;
    vs.push_back(g);
  }
  // Useful FLOPs: 2 products of 2 T T D flops per head in the forward (half the pairs when causal: T (T + 1) / 2),
  // 5 products in the backward (FlashAttention's count: forward + backward = 3.5 forwards).
  const double pairs = causal ? static_cast<double>(T) * static_cast<double>(T + 1) / 2 : static_cast<double>(T * T);
  const double fwd_flop = 4.0 * static_cast<double>(B * H * D) * pairs;
  manual_seed(0);
  std::vector<Tensor> in[2];
  for (int i = 0; i < 2; ++i) {
    const DType dt = i == 0 ? DType::f32 : DType::bf16;
    for (int j = 0; j < 3; ++j) in[i].push_back(randn({B, H, T, D}).to(dt).requires_grad_());
  }
  for (Variant& v : vs) {  // warm-up (kernel-path timing, primitive creation) and peak memory
    const auto& x = in[v.dtype == DType::f32 ? 0 : 1];
    call(v, x[0], x[1], x[2], o);
    const int64_t before = memory::memory_stats().allocated;
    memory::reset_peak_memory_stats();
    call(v, x[0], x[1], x[2], o);
    v.peak_mb = static_cast<double>(memory::memory_stats().peak_allocated - before) / (1024.0 * 1024.0);
  }
  for (int r = 0; r < rounds; ++r)
    for (Variant& v : vs) {
      const auto& x = in[v.dtype == DType::f32 ? 0 : 1];
      std::vector<double> wall, cpu;
      for (int i = 0; i < repeats; ++i) {
        const double w0 = wall_seconds(), c0 = cpu_seconds();
        call(v, x[0], x[1], x[2], o);
        cpu.push_back(1e3 * (cpu_seconds() - c0));
        wall.push_back(1e3 * (wall_seconds() - w0));
      }
      v.ms.push_back(median(wall));
      v.cpu_ms.push_back(median(cpu));
    }
  std::printf("%-32s %10s %10s %10s %10s %8s %10s\n", "variant", "best ms", "worst ms", "cpu ms", "fused x", "GFLOP/s",
              "peak MiB");
  for (size_t i = 0; i < vs.size(); ++i) {
    const Variant& v = vs[i];
    const double best = *std::min_element(v.ms.begin(), v.ms.end());
    const double worst = *std::max_element(v.ms.begin(), v.ms.end());
    std::string ratio = "";
    const double flop = v.gemm ? 2.0 * static_cast<double>(B * H * D * T * T) : (v.backward ? 3.5 : 1.0) * fwd_flop;
    if (!v.fused && !v.gemm) {
      const Variant& f = vs[i - 1];
      const double fb = *std::min_element(f.ms.begin(), f.ms.end());
      ratio = std::to_string(best / fb).substr(0, 5);
    }
    const double cpu = *std::min_element(v.cpu_ms.begin(), v.cpu_ms.end());
    std::printf("%-32s %10.2f %10.2f %10.2f %10s %8.1f %10.1f\n", v.name.c_str(), best, worst, cpu, ratio.c_str(),
                flop / (best * 1e6), v.peak_mb);
  }
  return 0;
}

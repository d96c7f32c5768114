// Throughput of the vectorised float transcendentals (src/backend/fast_math.hpp, Note [fast float
// transcendentals]) and of the ops built on them.
//  1. The functions alone, in cache, on one thread: ns per element of libm (std::exp etc. on float, a
//     scalar call per element), of fast_* in the baseline (SSE2) loop and in the AVX-512 loop
//     (Note [AVX-512 element-wise loops]).
//  2. The ops on n elements with the machine's threads: mp::exp/log/tanh/sigmoid/gelu and the gelu
//     backward (f32 and bf16), softmax/log_softmax over rows of 1024, cross entropy forward and
//     backward, the fused LSTM gates forward; each with the AVX-512 loops off and on, and for the
//     element-wise ops also the same blocked loop with a libm functor (what they ran before
//     fast_math.hpp). GB/s counts bytes read + written, against the copy bandwidth of the same run.
// Run with OMP_NUM_THREADS=1 and =2 to see per-core speed and scaling.
// Usage: bench_fast_math [elements=16777216] [repeats=15]
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/fast_math.hpp"
#include "backend/pointwise.hpp"
#include "backend/pointwise_kernels.hpp"
#include "bench_util.hpp"
#include "mp/mp.hpp"

using namespace mp;
using mp::bench::median_seconds;

namespace {

// libm functors: what the element-wise ops called per element before fast_math.hpp.
struct LibmExp {
  float operator()(float x) const { return std::exp(x); }
};
struct LibmLog {
  float operator()(float x) const { return std::log(x); }
};
struct LibmTanh {
  float operator()(float x) const { return std::tanh(x); }
};
struct LibmSigmoid {
  float operator()(float x) const {
    if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
    const float e = std::exp(x);
    return e / (1.0f + e);
  }
};
struct LibmErf {
  float operator()(float x) const { return std::erf(x); }
};
struct LibmGelu {
  float operator()(float x) const { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752440f)); }
};
struct FastErf {
  MP_FORCE_INLINE float operator()(float x) const { return backend::fast_erf(x); }
};

// ---------------------------------------------------------------- 1. the functions

template <class F>
void libm_loop(const float* x, float* y, int64_t n) {
  const F f;
  for (int64_t j = 0; j < n; ++j) y[j] = f(x[j]);
}

// ns per element of `run` over a 4096-float array in cache, single thread.
double ns_per_element(const std::function<void(const float*, float*, int64_t)>& run, const std::vector<float>& x,
                      int repeats) {
  std::vector<float> y(x.size());
  constexpr int kInner = 200;
  const double t = median_seconds(
      [&] {
        for (int k = 0; k < kInner; ++k) run(x.data(), y.data(), static_cast<int64_t>(x.size()));
      },
      repeats);
  volatile float sink = y[x.size() / 2];
  (void)sink;
  return t / kInner / static_cast<double>(x.size()) * 1e9;
}

template <class Fast, class Libm>
void function_row(const char* name, float lo, float hi, bool avx512, int repeats) {
  std::vector<float> x(4096);
  for (size_t i = 0; i < x.size(); ++i) x[i] = lo + (hi - lo) * static_cast<float>(i * 2654435761u % 4096) / 4096.0f;
  const double libm = ns_per_element(libm_loop<Libm>, x, repeats);
  auto fast = [](bool isa) {
    return [isa](const float* a, float* y, int64_t n) {
      const backend::cpu::SimdBlock<1, Fast> block{Fast{}};
      backend::cpu::call_isa(isa, block, y, static_cast<const float* const*>(&a), n);
    };
  };
  const double base = ns_per_element(fast(false), x, repeats);
  if (avx512) {
    const double avx = ns_per_element(fast(true), x, repeats);
    std::printf("| %s | [%g, %g] | %.2f | %.3f | %.3f | %.1fx | %.1fx |\n", name, lo, hi, libm, base, avx, libm / base,
                libm / avx);
  } else {
    std::printf("| %s | [%g, %g] | %.2f | %.3f | - | %.1fx | - |\n", name, lo, hi, libm, base, libm / base);
  }
}

// ---------------------------------------------------------------- 2. the ops

struct OpCase {
  std::string name, dtype;
  double bytes_per_elem;
  std::function<void()> fn;
  std::function<void()> libm;  // the same op through the blocked loop with a libm functor, or empty
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{1} << 24);
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 15;
  const bool has_avx512 = backend::cpu::avx512_loops_enabled();
  std::printf("# fast float transcendentals: n = %lld elements, %d threads, median of %d\n", static_cast<long long>(n),
              omp_get_max_threads(), repeats);
  std::printf("# cpu: %s; AVX-512 loops: %s\n\n", cpu_features_string().c_str(), has_avx512 ? "yes" : "no");

  std::printf("## 1. functions, ns per element (one thread, 4096 floats in cache)\n\n");
  std::printf(
      "| function | inputs | libm | fast, baseline loop | fast, AVX-512 loop | speed-up baseline | "
      "speed-up AVX-512 |\n|---|---|---:|---:|---:|---:|---:|\n");
  function_row<backend::ExpFn<float>, LibmExp>("exp", -80, 80, has_avx512, repeats);
  function_row<backend::LogFn<float>, LibmLog>("log", 1e-3f, 1e3f, has_avx512, repeats);
  function_row<backend::TanhFn<float>, LibmTanh>("tanh", -10, 10, has_avx512, repeats);
  function_row<backend::SigmoidFn<float>, LibmSigmoid>("sigmoid", -20, 20, has_avx512, repeats);
  function_row<FastErf, LibmErf>("erf", -5, 5, has_avx512, repeats);
  function_row<backend::GeluFn<float>, LibmGelu>("gelu", -6, 6, has_avx512, repeats);

  const double copy_gbs = mp::bench::copy_bandwidth_gbs(n, repeats);
  manual_seed(1);
  // Inputs spread over the interesting range of every function (|x| up to ~12, some saturating).
  const Tensor x32 = mul(randn({n}), scalar_tensor(3.0));
  const Tensor pos32 = add(abs(x32), scalar_tensor(1e-3));  // log's domain
  const Tensor g32 = randn({n});
  const Tensor x16 = x32.to(DType::bf16);
  Tensor out32 = empty({n}), out16 = empty({n}, {.dtype = DType::bf16}), dx32 = empty({n});
  const std::vector<Tensor> gelu_bwd_ins = {g32, x32};
  const auto pointwise = backend::pointwise_kernel.get(kCPU);
  auto libm_op = [&]<class F>(F, const Tensor& out, const Tensor& in) {
    return [&out, &in] {
      const Tensor ins[1] = {in};
      backend::cpu::pointwise_loop<float, 1>(out, ins, F{});
    };
  };
  // Softmax family: rows of 1024 classes.
  const int64_t C = 1024, R = n / C;
  const Tensor logits = mul(randn({R, C}), scalar_tensor(3.0));
  const Tensor target = randint(0, C, {R});
  const Tensor logits_leaf = logits.detach().requires_grad_();
  // LSTM gates: B x H hidden units with H = 1024, n / 4 units (each reads 5 and writes 2 floats).
  const int64_t H = 1024, B = std::max<int64_t>(1, n / 4 / H);
  const Tensor gates = mul(randn({B, 4 * H}), scalar_tensor(3.0)), cell = randn({B, H});

  const std::vector<OpCase> cases = {
      {"exp", "f32", 8, [&] { (void)mp::exp(x32); }, libm_op(LibmExp{}, out32, x32)},
      {"log", "f32", 8, [&] { (void)mp::log(pos32); }, libm_op(LibmLog{}, out32, pos32)},
      {"tanh", "f32", 8, [&] { (void)mp::tanh(x32); }, libm_op(LibmTanh{}, out32, x32)},
      {"sigmoid", "f32", 8, [&] { (void)mp::sigmoid(x32); }, libm_op(LibmSigmoid{}, out32, x32)},
      {"gelu", "f32", 8, [&] { (void)mp::gelu(x32); }, libm_op(LibmGelu{}, out32, x32)},
      {"gelu backward",
       "f32",
       12,
       [&] { pointwise(backend::PointwiseOp::gelu_backward, dx32, gelu_bwd_ins, DType::f32, {}); },
       {}},
      {"exp", "bf16", 4, [&] { (void)mp::exp(x16); }, libm_op(LibmExp{}, out16, x16)},
      {"tanh", "bf16", 4, [&] { (void)mp::tanh(x16); }, libm_op(LibmTanh{}, out16, x16)},
      {"sigmoid", "bf16", 4, [&] { (void)mp::sigmoid(x16); }, libm_op(LibmSigmoid{}, out16, x16)},
      {"gelu", "bf16", 4, [&] { (void)mp::gelu(x16); }, libm_op(LibmGelu{}, out16, x16)},
      {"softmax [R,1024]", "f32", 8, [&] { (void)softmax(logits, 1); }, {}},
      {"log_softmax [R,1024]", "f32", 8, [&] { (void)log_softmax(logits, 1); }, {}},
      {"cross_entropy fwd", "f32", 4, [&] { (void)cross_entropy(logits, target); }, {}},
      {"cross_entropy fwd+bwd",
       "f32",
       12,
       [&] {
         logits_leaf.set_grad(Tensor());
         cross_entropy(logits_leaf, target).backward();
       },
       {}},
      {"lstm_gates fwd", "f32", 28.0 / 4, [&] { (void)lstm_gates(gates, cell); }, {}},
  };
  std::printf("\n## 2. ops, copy bandwidth %.1f GB/s\n\n", copy_gbs);
  std::printf(
      "| op | dtype | libm loop ms | baseline ms | AVX-512 ms | GB/s (best) | %% of copy | speed-up vs libm |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& c : cases) {
    const double t_libm = c.libm ? median_seconds(c.libm, repeats) : 0.0;
    backend::cpu::set_avx512_loops(false);
    const double t_base = median_seconds(c.fn, repeats);
    backend::cpu::set_avx512_loops(true);
    const double t_avx = has_avx512 ? median_seconds(c.fn, repeats) : 0.0;
    const double best = has_avx512 ? std::min(t_base, t_avx) : t_base;
    const double gbs = c.bytes_per_elem * static_cast<double>(n) / best / 1e9;
    char libm_ms[32] = "-", avx_ms[32] = "-", speedup[32] = "-";
    if (c.libm) std::snprintf(libm_ms, sizeof libm_ms, "%.2f", t_libm * 1e3);
    if (has_avx512) std::snprintf(avx_ms, sizeof avx_ms, "%.2f", t_avx * 1e3);
    if (c.libm) std::snprintf(speedup, sizeof speedup, "%.1fx", t_libm / best);
    std::printf("| %s | %s | %s | %.2f | %s | %.1f | %.0f%% | %s |\n", c.name.c_str(), c.dtype.c_str(), libm_ms,
                t_base * 1e3, avx_ms, gbs, 100.0 * gbs / copy_gbs, speedup);
  }
  return 0;
}

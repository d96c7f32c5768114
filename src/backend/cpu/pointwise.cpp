// CPU kernel of every element-wise op: picks the shared functor and runs the blocked loop.
#include <atomic>
#include <type_traits>

#include "backend/cpu/loops.hpp"
#include "backend/cpu/transpose_copy.hpp"
#include "backend/pointwise_kernels.hpp"
#include "mp/core/cpu_features.hpp"

namespace mp::backend::cpu {

namespace {
// Whether the CPU (and OS) support the AVX-512 loops; detected once.
bool cpu_has_avx512_loops() {
#if defined(MP_HAVE_AVX512_LOOPS)
  static const bool has = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx512f && f.avx512bw && f.avx512vl && f.fma;
  }();
  return has;
#else
  return false;
#endif
}
// set_avx512_loops()'s switch.
std::atomic<bool> g_avx512_loops_allowed{true};
}  // namespace

bool avx512_loops_enabled() { return g_avx512_loops_allowed.load(std::memory_order_relaxed) && cpu_has_avx512_loops(); }

bool vector_loops_enabled() {
#if defined(MP_HAVE_AVX512_LOOPS)
  static const bool avx2 = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx2 && f.fma && f.f16c;
  }();
  return g_avx512_loops_allowed.load(std::memory_order_relaxed) && (avx2 || cpu_has_avx512_loops());
#else
  return false;
#endif
}

bool set_avx512_loops(bool allowed) {
  const bool was = avx512_loops_enabled();
  g_avx512_loops_allowed.store(allowed, std::memory_order_relaxed);
  return was;
}

namespace {

template <class C>
void run_pointwise(PointwiseOp op, const Tensor& out, std::span<const Tensor> ins, const PointwiseParams& p) {
  visit_pointwise_functor<C>(op, p, [&]<int N, class F>(PointwiseArity<N>, const F& f) {
    // The float transcendentals are compute-bound (fast_math.hpp): their loops also get an AVX-512
    // copy (Note [AVX-512 element-wise loops] in loops.hpp); double calls libm either way.
    constexpr LoopIsa isa = std::is_same_v<C, float> && kTranscendentalFn<F> ? LoopIsa::widest : LoopIsa::baseline;
    pointwise_loop<C, N, isa>(out, ins, f);
  });
}

void pointwise_cpu(PointwiseOp op, const Tensor& out, std::span<const Tensor> ins, DType compute,
                   const PointwiseParams& p) {
  MP_ASSERT(static_cast<int>(ins.size()) == pointwise_arity(op), "wrong operand count");
  if (op == PointwiseOp::copy && (row_copy(out, ins[0]) || transpose_copy(out, ins[0])))
    return;  // Note [row copies], Note [transposing copies]
  switch (compute) {
    case DType::f64: return run_pointwise<double>(op, out, ins, p);
    case DType::f32:
    case DType::f16:
    case DType::bf16: return run_pointwise<float>(op, out, ins, p);
    default: return run_pointwise<int64_t>(op, out, ins, p);
  }
}

}  // namespace

MP_REGISTER_KERNEL(pointwise_kernel, DeviceType::cpu, &pointwise_cpu);

}  // namespace mp::backend::cpu

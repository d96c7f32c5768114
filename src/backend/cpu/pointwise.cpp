// CPU kernel of every element-wise op: picks the shared functor and runs the blocked loop.
#include <atomic>
#include <type_traits>

#include "backend/cpu/loops.hpp"
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

bool avx512_loops_enabled() {
  return g_avx512_loops_allowed.load(std::memory_order_relaxed) && cpu_has_avx512_loops();
}

bool set_avx512_loops(bool allowed) {
  const bool was = avx512_loops_enabled();
  g_avx512_loops_allowed.store(allowed, std::memory_order_relaxed);
  return was;
}

namespace {

template <class C>
void run_pointwise(PointwiseOp op, const Tensor& out, std::span<const Tensor> ins, const PointwiseParams& p) {
  const C s0 = static_cast<C>(p.scalar0), s1 = static_cast<C>(p.scalar1);
  switch (op) {
    case PointwiseOp::copy: return pointwise_loop<C, 1>(out, ins, CopyFn<C>{});
    case PointwiseOp::neg: return pointwise_loop<C, 1>(out, ins, NegFn<C>{});
    case PointwiseOp::abs: return pointwise_loop<C, 1>(out, ins, AbsFn<C>{});
    case PointwiseOp::square: return pointwise_loop<C, 1>(out, ins, SquareFn<C>{});
    case PointwiseOp::sign: return pointwise_loop<C, 1>(out, ins, SignFn<C>{});
    case PointwiseOp::relu: return pointwise_loop<C, 1>(out, ins, ReluFn<C>{});
    case PointwiseOp::add_scalar: return pointwise_loop<C, 1>(out, ins, AddScalarFn<C>{s0});
    case PointwiseOp::mul_scalar: return pointwise_loop<C, 1>(out, ins, MulScalarFn<C>{s0});
    case PointwiseOp::clamp: return pointwise_loop<C, 1>(out, ins, ClampFn<C>{s0, s1});
    case PointwiseOp::add: return pointwise_loop<C, 2>(out, ins, AddFn<C>{});
    case PointwiseOp::sub: return pointwise_loop<C, 2>(out, ins, SubFn<C>{});
    case PointwiseOp::mul: return pointwise_loop<C, 2>(out, ins, MulFn<C>{});
    case PointwiseOp::maximum: return pointwise_loop<C, 2>(out, ins, MaximumFn<C>{});
    case PointwiseOp::minimum: return pointwise_loop<C, 2>(out, ins, MinimumFn<C>{});
    case PointwiseOp::add_scaled: return pointwise_loop<C, 2>(out, ins, AddScaledFn<C>{s0});
    case PointwiseOp::eq: return pointwise_loop<C, 2>(out, ins, EqFn<C>{});
    case PointwiseOp::ne: return pointwise_loop<C, 2>(out, ins, NeFn<C>{});
    case PointwiseOp::lt: return pointwise_loop<C, 2>(out, ins, LtFn<C>{});
    case PointwiseOp::le: return pointwise_loop<C, 2>(out, ins, LeFn<C>{});
    case PointwiseOp::gt: return pointwise_loop<C, 2>(out, ins, GtFn<C>{});
    case PointwiseOp::ge: return pointwise_loop<C, 2>(out, ins, GeFn<C>{});
    case PointwiseOp::relu_backward: return pointwise_loop<C, 2>(out, ins, ReluBackwardFn<C>{});
    case PointwiseOp::clamp_backward: return pointwise_loop<C, 2>(out, ins, ClampBackwardFn<C>{s0, s1});
    case PointwiseOp::where: return pointwise_loop<C, 3>(out, ins, WhereFn<C>{});
    default: break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    // The float transcendentals are compute-bound (fast_math.hpp): their loops also get an AVX-512
    // copy (Note [AVX-512 element-wise loops] in loops.hpp); double calls libm either way.
    constexpr LoopIsa kT = std::is_same_v<C, float> ? LoopIsa::avx512 : LoopIsa::baseline;
    switch (op) {
      case PointwiseOp::exp: return pointwise_loop<C, 1, kT>(out, ins, ExpFn<C>{});
      case PointwiseOp::log: return pointwise_loop<C, 1, kT>(out, ins, LogFn<C>{});
      case PointwiseOp::sqrt: return pointwise_loop<C, 1>(out, ins, SqrtFn<C>{});
      case PointwiseOp::rsqrt: return pointwise_loop<C, 1>(out, ins, RsqrtFn<C>{});
      case PointwiseOp::gelu: return pointwise_loop<C, 1, kT>(out, ins, GeluFn<C>{});
      case PointwiseOp::tanh: return pointwise_loop<C, 1, kT>(out, ins, TanhFn<C>{});
      case PointwiseOp::sigmoid: return pointwise_loop<C, 1, kT>(out, ins, SigmoidFn<C>{});
      case PointwiseOp::reciprocal: return pointwise_loop<C, 1>(out, ins, ReciprocalFn<C>{});
      case PointwiseOp::pow_scalar: return pointwise_loop<C, 1>(out, ins, PowScalarFn<C>{s0});
      case PointwiseOp::div: return pointwise_loop<C, 2>(out, ins, DivFn<C>{});
      case PointwiseOp::pow: return pointwise_loop<C, 2>(out, ins, PowFn<C>{});
      case PointwiseOp::gelu_backward: return pointwise_loop<C, 2, kT>(out, ins, GeluBackwardFn<C>{});
      case PointwiseOp::tanh_backward: return pointwise_loop<C, 2>(out, ins, TanhBackwardFn<C>{});
      case PointwiseOp::sigmoid_backward: return pointwise_loop<C, 2>(out, ins, SigmoidBackwardFn<C>{});
      default: break;
    }
  } else if (op == PointwiseOp::div) {
    return pointwise_loop<C, 2>(out, ins, DivFn<C>{});
  }
  MP_FAIL("pointwise op ", static_cast<int>(op), " is not defined for integer tensors; convert to a floating dtype");
}

void pointwise_cpu(PointwiseOp op, const Tensor& out, std::span<const Tensor> ins, DType compute,
                   const PointwiseParams& p) {
  MP_ASSERT(static_cast<int>(ins.size()) == pointwise_arity(op), "wrong operand count");
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

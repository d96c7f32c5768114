// CUDA kernels of the fused optimizer updates (optim_kernels.hpp): one pass per element with the
// shared SgdStepFn / AdamStepFn (Note [fused optimizer step] in optim_pointwise.hpp), master weights
// as on the CPU (Note [master weights in the fused step] in cpu/optim.cpp): the weight is read from
// the f32 master when there is one, else from the parameter; the new weight goes to the master and,
// rounded, to the parameter in the same pass. State (momentum, moments) is in the compute type C
// (f32, or f64 for f64 parameters).
//
// Each thread handles V consecutive elements per grid-stride step (V = 16 bytes of C) with vector
// loads and stores when every operand is aligned to its vector, else one element per step.
// Instantiated per (C, parameter dtype, gradient dtype). A 16-bit parameter without master may be
// rounded stochastically (Note [stochastic rounding]), with the same random bits per element as the CPU.
#include <type_traits>

#include "backend/cuda/loops.cuh"
#include "backend/optim_kernels.hpp"

namespace mp::backend::cuda {
namespace {

// x[0..V) = p[0..V) (a vector load when V > 1).
template <int V, class T>
__device__ MP_FORCE_INLINE void load_n(const T* p, T (&x)[V]) {
  if constexpr (V == 1)
    x[0] = *p;
  else
    load_vec<V>(p, x);
}
// p[0..V) = x[0..V).
template <int V, class T>
__device__ MP_FORCE_INLINE void store_n(T* p, const T (&x)[V]) {
  if constexpr (V == 1)
    *p = x[0];
  else
    store_vec<V>(p, x);
}

// The operands of one update. master and state pointers may be null (absent).
template <class C, class TP, class TG>
struct StepOperands {
  TP* param;
  C* master;
  const TG* grad;
  C* s0;  // SGD: momentum buffer; Adam: exp_avg
  C* s1;  // Adam: exp_avg_sq
  C* s2;  // Adam: max_exp_avg_sq (amsgrad)
  int64_t n;
  RoundingStream rounding;  // on only for a 16-bit parameter without master (Note [stochastic rounding])
};

// Update elements [i, i + V) with step(w, g, s0, s1, s2) -> new w; the state pointers that are null
// are neither read nor written (their values are 0 for the functor).
template <int V, class C, class TP, class TG, class Step>
__device__ MP_FORCE_INLINE void update(const StepOperands<C, TP, TG>& o, int64_t i, const Step& step) {
  C w[V], g[V], a[V] = {}, b[V] = {}, c[V] = {};
  if (o.master != nullptr) {
    load_n<V>(o.master + i, w);
  } else {
    TP pw[V];
    load_n<V>(o.param + i, pw);
#pragma unroll
    for (int j = 0; j < V; ++j) w[j] = device_cast<C>(pw[j]);
  }
  {
    TG gg[V];
    load_n<V>(o.grad + i, gg);
#pragma unroll
    for (int j = 0; j < V; ++j) g[j] = device_cast<C>(gg[j]);
  }
  if (o.s0 != nullptr) load_n<V>(o.s0 + i, a);
  if (o.s1 != nullptr) load_n<V>(o.s1 + i, b);
  if (o.s2 != nullptr) load_n<V>(o.s2 + i, c);
#pragma unroll
  for (int j = 0; j < V; ++j) w[j] = step(w[j], g[j], a[j], b[j], c[j]);
  if (o.s0 != nullptr) store_n<V>(o.s0 + i, a);
  if (o.s1 != nullptr) store_n<V>(o.s1 + i, b);
  if (o.s2 != nullptr) store_n<V>(o.s2 + i, c);
  if (o.master != nullptr) store_n<V>(o.master + i, w);
  if constexpr (std::is_same_v<TP, C>) {
    store_n<V>(o.param + i, w);
  } else {
    TP pw[V];
    if constexpr (std::is_same_v<C, float> && (std::is_same_v<TP, Half> || std::is_same_v<TP, BFloat16>)) {
      if (o.rounding.on) {
        // element i + j takes word (i + j) % 4 of block (i + j) / 4 (V is 4 or 1, i a multiple of V)
        static_assert(V == 4 || V == 1);
        const U32x4 r = rounding_block(o.rounding, static_cast<uint64_t>(i) / 4);
#pragma unroll
        for (int j = 0; j < V; ++j) pw[j] = stochastic_round<TP>(w[j], r.v[V == 4 ? j : i % 4]);
        store_n<V>(o.param + i, pw);
        return;
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) pw[j] = device_cast<TP>(w[j]);
    store_n<V>(o.param + i, pw);
  }
}

template <class C, class TP, class TG, class Step>
__global__ void __launch_bounds__(kThreads) step_kernel(StepOperands<C, TP, TG> o, Step step, bool vectorized) {
  constexpr int V = kVecBytes / static_cast<int>(sizeof(C));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorized) {
    const int64_t nv = o.n / V;
    for (int64_t v = tid; v < nv; v += stride) update<V>(o, v * V, step);
    done = nv * V;
  }
  for (int64_t i = done + tid; i < o.n; i += stride) update<1>(o, i, step);
}

// SgdStepFn as a five-operand step (s0 = momentum buffer; its value is unused without momentum).
template <class C>
struct SgdStep {
  SgdStepFn<C> f;
  __device__ MP_FORCE_INLINE C operator()(C w, C g, C& buf, C&, C&) const { return f(w, g, buf); }
};
// AdamStepFn as a five-operand step (s0 = exp_avg, s1 = exp_avg_sq, s2 = max_exp_avg_sq).
template <class C>
struct AdamStep {
  AdamStepFn<C> f;
  __device__ MP_FORCE_INLINE C operator()(C w, C g, C& m, C& v, C& vmax) const { return f(w, g, m, v, vmax); }
};

// The state dtype that goes with a parameter dtype (as cpu/optim.cpp's check_state).
template <class C>
void check_state(const Tensor& param, const Tensor& s, const char* what) {
  MP_ASSERT(
      s.dtype() == dtype_of<C>() && s.is_contiguous() && s.numel() == param.numel() && s.device() == param.device(),
      what, " must be a contiguous ", dtype_name(dtype_of<C>()), " tensor of the parameter's size on ",
      param.device().str(), ", got ", s.describe());
}

// Launch the step for parameter type TP and the gradient's dtype.
template <class C, class TP, class Step>
void launch_step(const Tensor& param, const Tensor& master, const Tensor& grad, C* s0, C* s1, C* s2,
                 const RoundingStream& rounding, const Step& step) {
  constexpr int V = kVecBytes / static_cast<int>(sizeof(C));
  const int64_t n = param.numel();
  if (n == 0) return;
  const int dev = param.device().index;
  visit_floating(grad.dtype(), "optimizer step", [&]<class TG>() {
    StepOperands<C, TP, TG> o{static_cast<TP*>(param.raw_data()),
                              master.defined() ? static_cast<C*>(master.raw_data()) : nullptr,
                              static_cast<const TG*>(grad.raw_data()),
                              s0,
                              s1,
                              s2,
                              n,
                              rounding};
    o.rounding.on = rounding.on && !master.defined() && (std::is_same_v<TP, Half> || std::is_same_v<TP, BFloat16>);
    const bool vectorized = is_aligned(o.param, V * sizeof(TP)) && is_aligned(o.grad, V * sizeof(TG)) &&
                            is_aligned(o.master, V * sizeof(C)) && is_aligned(s0, V * sizeof(C)) &&
                            is_aligned(s1, V * sizeof(C)) && is_aligned(s2, V * sizeof(C));
    step_kernel<<<blocks_for(vectorized ? (n + V - 1) / V : n, kThreads, dev), kThreads, 0, current_stream(dev)>>>(
        o, step, vectorized);
    MP_CUDA_CHECK_LAUNCH();
  });
}

// Visit the parameter's storage type for compute type C (C itself for f64; f32/f16/bf16 for float).
template <class C, class F>
void visit_param(const Tensor& param, F&& f) {
  if constexpr (std::is_same_v<C, double>) {
    f.template operator()<double>();
  } else {
    switch (param.dtype()) {
      case DType::f16: return f.template operator()<Half>();
      case DType::bf16: return f.template operator()<BFloat16>();
      default: return f.template operator()<float>();
    }
  }
}

void check_operands(const Tensor& param, const Tensor& master, const Tensor& grad, const char* op) {
  MP_ASSERT(
      param.is_contiguous() && grad.is_contiguous() && param.numel() == grad.numel() && grad.device() == param.device(),
      op, ": expected contiguous param and grad of one size on one device, got ", param.describe(), " and ",
      grad.describe());
  MP_CHECK(is_floating(param.dtype()), op, ": expected a floating parameter, got ", param.describe());
  (void)master;
}

template <class C>
void sgd_step_impl(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& momentum_buffer,
                   const SgdStepParams& p) {
  const SgdStep<C> step{SgdStepFn<C>(p)};
  MP_ASSERT(!step.f.use_momentum || momentum_buffer.defined(), "sgd_step: momentum needs a momentum buffer");
  if (momentum_buffer.defined()) check_state<C>(param, momentum_buffer, "sgd_step: momentum_buffer");
  if (master.defined()) check_state<C>(param, master, "optimizer step: master weights");
  // Without momentum the buffer is neither read nor written (the CPU writes back the unchanged values).
  C* buf = momentum_buffer.defined() && step.f.use_momentum ? static_cast<C*>(momentum_buffer.raw_data()) : nullptr;
  visit_param<C>(param,
                 [&]<class TP>() { launch_step<C, TP>(param, master, grad, buf, nullptr, nullptr, p.rounding, step); });
}

template <class C>
void adam_step_impl(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const AdamStepParams& p) {
  const AdamStep<C> step{AdamStepFn<C>(p)};
  check_state<C>(param, exp_avg, "adam_step: exp_avg");
  check_state<C>(param, exp_avg_sq, "adam_step: exp_avg_sq");
  MP_ASSERT(!p.amsgrad || max_exp_avg_sq.defined(), "adam_step: amsgrad needs max_exp_avg_sq");
  if (p.amsgrad) check_state<C>(param, max_exp_avg_sq, "adam_step: max_exp_avg_sq");
  if (master.defined()) check_state<C>(param, master, "optimizer step: master weights");
  C* vmax = p.amsgrad ? static_cast<C*>(max_exp_avg_sq.raw_data()) : nullptr;
  visit_param<C>(param, [&]<class TP>() {
    launch_step<C, TP>(param, master, grad, static_cast<C*>(exp_avg.raw_data()), static_cast<C*>(exp_avg_sq.raw_data()),
                       vmax, p.rounding, step);
  });
}

void sgd_step_cuda(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& momentum_buffer,
                   const SgdStepParams& p) {
  DeviceGuard guard(param.device(), "sgd_step");
  check_operands(param, master, grad, "sgd_step");
  if (param.dtype() == DType::f64) return sgd_step_impl<double>(param, master, grad, momentum_buffer, p);
  sgd_step_impl<float>(param, master, grad, momentum_buffer, p);
}

void adam_step_cuda(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const AdamStepParams& p) {
  DeviceGuard guard(param.device(), "adam_step");
  check_operands(param, master, grad, "adam_step");
  if (param.dtype() == DType::f64)
    return adam_step_impl<double>(param, master, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, p);
  adam_step_impl<float>(param, master, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, p);
}

}  // namespace

MP_REGISTER_KERNEL(sgd_step_kernel, DeviceType::cuda, &sgd_step_cuda);
MP_REGISTER_KERNEL(adam_step_kernel, DeviceType::cuda, &adam_step_cuda);

}  // namespace mp::backend::cuda

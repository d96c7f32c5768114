// CPU kernels of the fused optimizer updates: one blocked pass per tensor; each block of the
// parameter and gradient is brought to the compute type (bulk-converted when 16-bit), the shared
// functor runs over plain arrays with the f32 state updated in place, and the new weights are
// stored back (rounded when the parameter is 16-bit). Note [fused optimizer step].
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "backend/cpu/loops.hpp"
#include "backend/optim_kernels.hpp"

namespace mp::backend::cpu {
namespace {

// The state dtype that goes with a parameter dtype.
template <class C>
void check_state(const Tensor& param, const Tensor& s, const char* what) {
  MP_ASSERT(s.dtype() == dtype_of<C>() && s.is_contiguous() && s.numel() == param.numel(), what,
            " must be a contiguous ", dtype_name(dtype_of<C>()), " tensor of the parameter's size, got ", s.describe());
}

// Run body(j0, len) over blocks of kBlock elements of an n-element tensor, in parallel when large.
template <class Body>
void for_blocks(int64_t n, Body&& body) {
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
  const bool parallel = n >= kParallelGrain && !omp_in_parallel() && omp_get_max_threads() > 1;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t j0 = b * kBlock;
    body(j0, std::min(kBlock, n - j0));
  }
}

// Note [master weights in the fused step]: a block of weights is read from and written to the
// parameter itself, or, when the parameter is 16-bit and has an f32 master, the master, with the
// rounded result also stored into the parameter. An update smaller than half an ulp of the 16-bit
// weight (2^-11 relative in f16, 2^-8 in bf16) then still accumulates in the master. Either way the
// block is loaded once and stored once per destination.
template <class C>
struct WeightIO {
  char* param;
  DType param_dtype;
  int64_t param_size;
  C* master;                // null: no master
  RoundingStream rounding;  // on only for a 16-bit parameter without master (Note [stochastic rounding])
  WeightIO(const Tensor& p, const Tensor& m, const RoundingStream& r)
      : param(static_cast<char*>(p.raw_data())),
        param_dtype(p.dtype()),
        param_size(static_cast<int64_t>(dtype_size(p.dtype()))),
        master(m.defined() ? static_cast<C*>(m.raw_data()) : nullptr) {
    if (m.defined()) check_state<C>(p, m, "optimizer step: master weights");
    rounding = r;
    rounding.on = r.on && master == nullptr && (param_dtype == DType::f16 || param_dtype == DType::bf16);
  }
  // Current weights of block [j0, j0+len) as C (a pointer into param/master or into buf).
  const C* load(int64_t j0, int64_t len, C* buf) const {
    if (master != nullptr) return master + j0;
    return load_block<C>(param + j0 * param_size, 1, param_dtype, len, buf);
  }
  // Where the functor writes the new weights: in place when param (or master) is C, else buf.
  C* out(int64_t j0, C* buf) const {
    if (master != nullptr) return master + j0;
    return param_dtype == dtype_of<C>() ? reinterpret_cast<C*>(param + j0 * param_size) : buf;
  }
  // Publish the new weights of the block to the parameter when they were not written there directly.
  void store(int64_t j0, int64_t len, const C* vals) const {
    if (rounding.on) {
      if constexpr (std::is_same_v<C, float>) {
        if (param_dtype == DType::bf16) return store_stochastic<BFloat16>(j0, len, vals);
        return store_stochastic<Half>(j0, len, vals);
      }
    }
    if (master != nullptr || param_dtype != dtype_of<C>())
      store_block<C>(param + j0 * param_size, 1, param_dtype, len, vals);
  }
  // Element i = j0 + j takes word i % 4 of the stream's block i / 4 (j0 is a multiple of kBlock, so of 4).
  template <class T>
  void store_stochastic(int64_t j0, int64_t len, const float* vals) const {
    static_assert(kBlock % 4 == 0, "a block must start on a Philox block boundary");
    auto* out = reinterpret_cast<uint16_t*>(param) + j0;
    for (int64_t j = 0; j < len; j += 4) {
      const U32x4 r = rounding_block(rounding, static_cast<uint64_t>(j0 + j) / 4);
      for (int64_t k = 0; k < 4 && j + k < len; ++k) out[j + k] = stochastic_round<T>(vals[j + k], r.v[k]).bits();
    }
  }
};

// Note [vectorised optimizer loops]: the update loops call the shared functor through a local copy
// made inside the block. Read through the lambda's reference, its step flags and constants could alias
// the stores to the state arrays, so GCC reloaded them after every store, kept the flag tests inside
// the loop and left it scalar (measured: SGD with momentum at ~5 GB/s, a third of a 20-byte-per-element
// copy). As locals they are loop-invariant, the tests are hoisted and the loop vectorises (SGD with
// momentum, bf16 weights with f32 masters: 3x faster, bench_amp). Adam's std::sqrt vectorises only
// without errno: this file is compiled with -fno-math-errno (CMakeLists.txt; its argument is never
// negative), AdamW 2.5-3x faster. The loops stay on the baseline ISA:
// they are memory-bound, and without FMA contraction the fused unscale (g * 1/S inside the step)
// rounds exactly as unscale_() followed by the step (Note [GradScaler fused step]).
template <class C>
void sgd_step_impl(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& momentum_buffer,
                   const SgdStepParams& p) {
  const SgdStepFn<C> f(p);
  MP_ASSERT(!f.use_momentum || momentum_buffer.defined(), "sgd_step: momentum needs a momentum buffer");
  if (momentum_buffer.defined()) check_state<C>(param, momentum_buffer, "sgd_step: momentum_buffer");
  const WeightIO<C> io(param, master, p.rounding);
  const char* pg = static_cast<const char*>(grad.raw_data());
  C* pb = momentum_buffer.defined() ? static_cast<C*>(momentum_buffer.raw_data()) : nullptr;
  const DType gdt = grad.dtype();
  const auto gsz = static_cast<int64_t>(dtype_size(gdt));
  for_blocks(param.numel(), [&](int64_t j0, int64_t len) {
    alignas(64) C wbuf[kBlock];
    alignas(64) C gbuf[kBlock];
    const C* w = io.load(j0, len, wbuf);
    const C* g = load_block<C>(pg + j0 * gsz, 1, gdt, len, gbuf);
    C* out = io.out(j0, wbuf);
    const SgdStepFn<C> fn = f;  // a local copy: Note [vectorised optimizer loops]
    if (pb != nullptr) {
      C* buf = pb + j0;
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) out[j] = fn(w[j], g[j], buf[j]);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) {
        C unused = C(0);  // no momentum: the buffer is neither read nor written
        out[j] = fn(w[j], g[j], unused);
      }
    }
    io.store(j0, len, out);
  });
}

template <class C>
void adam_step_impl(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                    const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const AdamStepParams& p) {
  const AdamStepFn<C> f(p);
  check_state<C>(param, exp_avg, "adam_step: exp_avg");
  check_state<C>(param, exp_avg_sq, "adam_step: exp_avg_sq");
  MP_ASSERT(!p.amsgrad || max_exp_avg_sq.defined(), "adam_step: amsgrad needs max_exp_avg_sq");
  if (p.amsgrad) check_state<C>(param, max_exp_avg_sq, "adam_step: max_exp_avg_sq");
  const WeightIO<C> io(param, master, p.rounding);
  const char* pg = static_cast<const char*>(grad.raw_data());
  C* pm = static_cast<C*>(exp_avg.raw_data());
  C* pv = static_cast<C*>(exp_avg_sq.raw_data());
  C* pvmax = p.amsgrad ? static_cast<C*>(max_exp_avg_sq.raw_data()) : nullptr;
  const DType gdt = grad.dtype();
  const auto gsz = static_cast<int64_t>(dtype_size(gdt));
  for_blocks(param.numel(), [&](int64_t j0, int64_t len) {
    alignas(64) C wbuf[kBlock];
    alignas(64) C gbuf[kBlock];
    const C* w = io.load(j0, len, wbuf);
    const C* g = load_block<C>(pg + j0 * gsz, 1, gdt, len, gbuf);
    C* m = pm + j0;
    C* v = pv + j0;
    C* out = io.out(j0, wbuf);
    const AdamStepFn<C> fn = f;  // a local copy: Note [vectorised optimizer loops]
    if (pvmax != nullptr) {
      C* vmax = pvmax + j0;
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) out[j] = fn(w[j], g[j], m[j], v[j], vmax[j]);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) {
        C unused = C(0);  // no amsgrad: max_exp_avg_sq is neither read nor written
        out[j] = fn(w[j], g[j], m[j], v[j], unused);
      }
    }
    io.store(j0, len, out);
  });
}

void check_operands(const Tensor& param, const Tensor& grad, const char* op) {
  MP_ASSERT(param.is_contiguous() && grad.is_contiguous() && param.numel() == grad.numel(), op,
            ": expected contiguous param and grad of one size, got ", param.describe(), " and ", grad.describe());
}

void sgd_step_cpu(std::span<const SgdStepItem> items) {
  for (const SgdStepItem& it : items) {
    check_operands(it.param, it.grad, "sgd_step");
    if (it.param.dtype() == DType::f64) {
      sgd_step_impl<double>(it.param, it.master, it.grad, it.momentum_buffer, it.p);
      continue;
    }
    MP_CHECK(is_floating(it.param.dtype()), "sgd_step: expected a floating parameter, got ", it.param.describe());
    sgd_step_impl<float>(it.param, it.master, it.grad, it.momentum_buffer, it.p);
  }
}

void adam_step_cpu(std::span<const AdamStepItem> items) {
  for (const AdamStepItem& it : items) {
    check_operands(it.param, it.grad, "adam_step");
    if (it.param.dtype() == DType::f64) {
      adam_step_impl<double>(it.param, it.master, it.grad, it.exp_avg, it.exp_avg_sq, it.max_exp_avg_sq, it.p);
      continue;
    }
    MP_CHECK(is_floating(it.param.dtype()), "adam_step: expected a floating parameter, got ", it.param.describe());
    adam_step_impl<float>(it.param, it.master, it.grad, it.exp_avg, it.exp_avg_sq, it.max_exp_avg_sq, it.p);
  }
}

}  // namespace

MP_REGISTER_KERNEL(sgd_step_kernel, DeviceType::cpu, &sgd_step_cpu);
MP_REGISTER_KERNEL(adam_step_kernel, DeviceType::cpu, &adam_step_cpu);

}  // namespace mp::backend::cpu

// CUDA kernels of the fused optimizer updates (optim_kernels.hpp): one pass per element with the
// shared SgdStepFn / AdamStepFn (Note [fused optimizer step] in optim_pointwise.hpp), master weights
// as on the CPU (Note [master weights in the fused step] in cpu/optim.cpp): the weight is read from
// the f32 master when there is one, else from the parameter; the new weight goes to the master and,
// rounded, to the parameter in the same pass. State (momentum, moments) is in the compute type C
// (f32, or f64 for f64 parameters).
//
// One launch updates every parameter of a (parameter dtype, gradient dtype) pair (Note [CUDA multi-tensor
// launch] in amp.cu: a table entry per parameter with its operands and its own step functor, chunks of
// kChunk elements; ResNet-18's 62 parameters took 62 launches and 0.74 ms of host time per step). Each
// thread handles V consecutive elements of a chunk (V = 16 bytes of C) with vector loads and stores when
// every operand of the parameter is aligned to its vector, else one element at a time; the values are
// those of one launch per parameter (the same functor per element). Instantiated per (C, parameter dtype,
// gradient dtype). A 16-bit parameter without master may be
// rounded stochastically (Note [stochastic rounding]), with the same random bits per element as the CPU.
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/loops.cuh"
#include "backend/cuda/multi_tensor.cuh"
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

// One parameter's entry in the table of a multi-tensor update: its operands, its step functor (its own
// hyper-parameters, first-step flag or step count), its first chunk and whether its operands are aligned
// to vectors.
template <class C, class TP, class TG, class Step>
struct StepEntry {
  StepOperands<C, TP, TG> o;
  Step step;
  int64_t first_chunk;
  bool vectorized;
};

template <class C, class TP, class TG, class Step>
__global__ void __launch_bounds__(kThreads)
    step_kernel(const StepEntry<C, TP, TG, Step>* table, int ntensors, int64_t nchunks) {
  constexpr int V = kVecBytes / static_cast<int>(sizeof(C));
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const StepEntry<C, TP, TG, Step>& e = table[find_chunk_entry(table, ntensors, c)];
    const StepOperands<C, TP, TG> o = e.o;
    const Step step = e.step;
    const int64_t start = (c - e.first_chunk) * kChunk, end = min(start + kChunk, o.n);
    int64_t done = start;
    if (e.vectorized) {
      const int64_t nv = (end - start) / V;
      for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) update<V>(o, start + v * V, step);
      done = start + nv * V;
    }
    for (int64_t i = done + threadIdx.x; i < end; i += blockDim.x) update<1>(o, i, step);
  }
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

// What an optimizer adds to a parameter's operands for compute type C: its state pointers (null: absent)
// and its step functor.
template <class C, class Step>
struct StepState {
  C* s0;
  C* s1;
  C* s2;
  Step step;
};

// One launch over `group` (parameters of type TP with gradients of type TG, compute type C); make<C>(item)
// gives an item's StepState.
template <class C, class TP, class TG, class Item, class Make>
void launch_group(const std::vector<const Item*>& group, Device dev, const Make& make) {
  using State = decltype(make.template operator()<C>(*group[0]));
  using Entry = StepEntry<C, TP, TG, decltype(State::step)>;
  constexpr int V = kVecBytes / static_cast<int>(sizeof(C));
  constexpr bool low = std::is_same_v<TP, Half> || std::is_same_v<TP, BFloat16>;
  std::vector<Entry> table;
  table.reserve(group.size());
  int64_t nchunks = 0;
  for (const Item* it : group) {
    const State s = make.template operator()<C>(*it);
    if (it->master.defined()) check_state<C>(it->param, it->master, "optimizer step: master weights");
    Entry e{{static_cast<TP*>(it->param.raw_data()),
             it->master.defined() ? static_cast<C*>(it->master.raw_data()) : nullptr,
             static_cast<const TG*>(it->grad.raw_data()), s.s0, s.s1, s.s2, it->param.numel(), it->p.rounding},
            s.step,
            nchunks,
            false};
    e.o.rounding.on = it->p.rounding.on && !it->master.defined() && low;
    e.vectorized = is_aligned(e.o.param, V * sizeof(TP)) && is_aligned(e.o.grad, V * sizeof(TG)) &&
                   is_aligned(e.o.master, V * sizeof(C)) && is_aligned(s.s0, V * sizeof(C)) &&
                   is_aligned(s.s1, V * sizeof(C)) && is_aligned(s.s2, V * sizeof(C));
    nchunks += chunks_of(e.o.n);
    table.push_back(e);
  }
  const int d = dev.index;
  const Tensor t = upload(table.data(), table.size() * sizeof(Entry), dev);
  step_kernel<<<blocks_for(nchunks * kThreads, kThreads, d), kThreads, 0, current_stream(d)>>>(
      static_cast<const Entry*>(t.raw_data()), static_cast<int>(table.size()), nchunks);
  MP_CUDA_CHECK_LAUNCH();
}

void check_operands(const Tensor& param, const Tensor& grad, Device dev, const char* op) {
  MP_ASSERT(param.is_contiguous() && grad.is_contiguous() && param.numel() == grad.numel() &&
                grad.device() == param.device() && param.device() == dev,
            op, ": expected contiguous param and grad of one size on ", dev.str(), ", got ", param.describe(), " and ",
            grad.describe());
  MP_CHECK(is_floating(param.dtype()), op, ": expected a floating parameter, got ", param.describe());
}

// The update of every item: one launch per (parameter dtype, gradient dtype), in the order first met.
template <class Item, class Make>
void update_many(std::span<const Item> items, const char* op, const Make& make) {
  if (items.empty()) return;
  const Device dev = items[0].param.device();
  DeviceGuard guard(dev, op);
  std::vector<std::pair<std::pair<DType, DType>, std::vector<const Item*>>> groups;
  for (const Item& it : items) {
    check_operands(it.param, it.grad, dev, op);
    if (it.param.numel() == 0) continue;
    const std::pair<DType, DType> key{it.param.dtype(), it.grad.dtype()};
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == key; });
    if (g == groups.end()) g = groups.insert(groups.end(), {key, {}});
    g->second.push_back(&it);
  }
  for (const auto& [key, group] : groups) {
    const auto run = [&]<class C>() {
      const DType pd = key.first;
      const auto with_param = [&]<class TP>() {
        visit_floating(key.second, op, [&]<class TG>() { launch_group<C, TP, TG>(group, dev, make); });
      };
      if constexpr (std::is_same_v<C, double>) {
        with_param.template operator()<double>();
      } else if (pd == DType::f16) {
        with_param.template operator()<Half>();
      } else if (pd == DType::bf16) {
        with_param.template operator()<BFloat16>();
      } else {
        with_param.template operator()<float>();
      }
    };
    if (key.first == DType::f64)
      run.template operator()<double>();
    else
      run.template operator()<float>();
  }
}

void sgd_step_cuda(std::span<const SgdStepItem> items) {
  update_many(items, "sgd_step", [&]<class C>(const SgdStepItem& it) {
    const SgdStep<C> step{SgdStepFn<C>(it.p)};
    MP_ASSERT(!step.f.use_momentum || it.momentum_buffer.defined(), "sgd_step: momentum needs a momentum buffer");
    if (it.momentum_buffer.defined()) check_state<C>(it.param, it.momentum_buffer, "sgd_step: momentum_buffer");
    // Without momentum the buffer is neither read nor written (the CPU writes back the unchanged values).
    C* buf =
        it.momentum_buffer.defined() && step.f.use_momentum ? static_cast<C*>(it.momentum_buffer.raw_data()) : nullptr;
    return StepState<C, SgdStep<C>>{buf, nullptr, nullptr, step};
  });
}

void adam_step_cuda(std::span<const AdamStepItem> items) {
  update_many(items, "adam_step", [&]<class C>(const AdamStepItem& it) {
    check_state<C>(it.param, it.exp_avg, "adam_step: exp_avg");
    check_state<C>(it.param, it.exp_avg_sq, "adam_step: exp_avg_sq");
    MP_ASSERT(!it.p.amsgrad || it.max_exp_avg_sq.defined(), "adam_step: amsgrad needs max_exp_avg_sq");
    if (it.p.amsgrad) check_state<C>(it.param, it.max_exp_avg_sq, "adam_step: max_exp_avg_sq");
    return StepState<C, AdamStep<C>>{static_cast<C*>(it.exp_avg.raw_data()), static_cast<C*>(it.exp_avg_sq.raw_data()),
                                     it.p.amsgrad ? static_cast<C*>(it.max_exp_avg_sq.raw_data()) : nullptr,
                                     AdamStep<C>{AdamStepFn<C>(it.p)}};
  });
}

}  // namespace

MP_REGISTER_KERNEL(sgd_step_kernel, DeviceType::cuda, &sgd_step_cuda);
MP_REGISTER_KERNEL(adam_step_kernel, DeviceType::cuda, &adam_step_cuda);

}  // namespace mp::backend::cuda

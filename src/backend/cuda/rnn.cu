// CUDA kernels of the fused recurrent-cell arithmetic (LSTM gates, the lstm_gates_* slots of
// rnn_kernels.hpp). One point-wise kernel per direction: a thread takes V consecutive hidden units of one
// batch row, reads its four gate segments and the cell state (16-byte vector loads when every operand
// has one dtype, H is a multiple of V and the pointers are aligned), runs the shared MP_HD functor
// (rnn_pointwise.hpp: the formulas the CPU runs) in the compute type and stores the results rounded once.
// Operands of different dtypes take a run-time-dtype path (load_as/store_as per element), which is what
// the CPU does with its bulk conversions: the same values in the compute type, rounded once on store.
// The compute type is double when gates or c is f64, else float (as the CPU).
#include <cuda_runtime_api.h>

#include <type_traits>

#include "backend/cuda/loops.cuh"
#include "backend/cuda/runtime.hpp"
#include "backend/rnn_kernels.hpp"

namespace mp::backend::cuda {
namespace {

// Where thread-group g (V units) of a [B, H] operand lies: batch row b and first unit j.
struct UnitIndex {
  int64_t b, j;
};

// Row/column of unit group g with `gpr` groups per row (32-bit division when use32).
__device__ MP_FORCE_INLINE UnitIndex unit_of(int64_t g, const IntDivider& gpr, bool use32, int V) {
  int64_t b;
  if (use32)
    b = gpr.div32(static_cast<uint32_t>(g));
  else
    b = g / gpr.d64;
  return {b, (g - b * gpr.d64) * V};
}

// One operand with its dtype decided at run time (the mixed-dtype path).
struct DynOperand {
  char* p;
  DType dt;
  int esize;
  __device__ MP_FORCE_INLINE char* at(int64_t i) const { return p + i * esize; }
};

DynOperand dyn(const Tensor& t) {
  return {static_cast<char*>(t.raw_data()), t.dtype(), static_cast<int>(t.element_size())};
}

// Shape arguments shared by the kernels.
struct LstmShape {
  int64_t groups;  // B * H / V
  int64_t H;       // hidden units per row
  IntDivider gpr;  // groups per row, H / V
  bool use32;      // groups < 2^31: 32-bit division
};

LstmShape lstm_shape(int64_t B, int64_t H, int V) {
  const int64_t gpr = H / V;
  return {B * gpr, H, IntDivider(gpr), B * gpr <= INT32_MAX && gpr <= INT32_MAX};
}

// ---------------------------------------------------------------- forward

// All operands of type T; V units per thread (V > 1 requires H % V == 0 and V-aligned pointers).
template <class T, int V>
__global__ void lstm_forward_typed(T* __restrict__ h_out, T* __restrict__ c_out, const T* __restrict__ gates,
                                   const T* __restrict__ c, LstmShape s) {
  using C = acc_t<T>;
  const LstmGatesForwardFn<C> fn{};
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < s.groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const UnitIndex u = unit_of(g, s.gpr, s.use32, V);
    const int64_t grow = u.b * 4 * s.H + u.j, row = u.b * s.H + u.j;
    T gi[V], gf[V], gg[V], go[V], cp[V], ho[V], co[V];
    if constexpr (V > 1) {
      load_vec<V>(gates + grow, gi);
      load_vec<V>(gates + grow + s.H, gf);
      load_vec<V>(gates + grow + 2 * s.H, gg);
      load_vec<V>(gates + grow + 3 * s.H, go);
      load_vec<V>(c + row, cp);
    } else {
      gi[0] = gates[grow];
      gf[0] = gates[grow + s.H];
      gg[0] = gates[grow + 2 * s.H];
      go[0] = gates[grow + 3 * s.H];
      cp[0] = c[row];
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      C h, cn;
      fn(device_cast<C>(gi[k]), device_cast<C>(gf[k]), device_cast<C>(gg[k]), device_cast<C>(go[k]),
         device_cast<C>(cp[k]), h, cn);
      ho[k] = device_cast<T>(h);
      co[k] = device_cast<T>(cn);
    }
    if constexpr (V > 1) {
      store_vec<V>(h_out + row, ho);
      store_vec<V>(c_out + row, co);
    } else {
      h_out[row] = ho[0];
      c_out[row] = co[0];
    }
  }
}

// Any dtypes, converted per element; one unit per thread.
template <class C>
__global__ void lstm_forward_dyn(DynOperand h_out, DynOperand c_out, DynOperand gates, DynOperand c, LstmShape s) {
  const LstmGatesForwardFn<C> fn{};
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < s.groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const UnitIndex u = unit_of(g, s.gpr, s.use32, 1);
    const int64_t grow = u.b * 4 * s.H + u.j, row = u.b * s.H + u.j;
    C h, cn;
    fn(load_as<C>(gates.at(grow), gates.dt), load_as<C>(gates.at(grow + s.H), gates.dt),
       load_as<C>(gates.at(grow + 2 * s.H), gates.dt), load_as<C>(gates.at(grow + 3 * s.H), gates.dt),
       load_as<C>(c.at(row), c.dt), h, cn);
    store_as(h_out.at(row), h_out.dt, h);
    store_as(c_out.at(row), c_out.dt, cn);
  }
}

// ---------------------------------------------------------------- backward

template <class T, int V>
__global__ void lstm_backward_typed(T* __restrict__ dgates, T* __restrict__ dc, const T* __restrict__ dh_out,
                                    const T* __restrict__ dc_out, const T* __restrict__ gates, const T* __restrict__ c,
                                    LstmShape s) {
  using C = acc_t<T>;
  const LstmGatesBackwardFn<C> fn{};
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < s.groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const UnitIndex u = unit_of(g, s.gpr, s.use32, V);
    const int64_t grow = u.b * 4 * s.H + u.j, row = u.b * s.H + u.j;
    T gi[V], gf[V], gg[V], go[V], cp[V], dh[V], dcn[V];
    T odi[V], odf[V], odg[V], odo[V], odc[V];
    if constexpr (V > 1) {
      load_vec<V>(gates + grow, gi);
      load_vec<V>(gates + grow + s.H, gf);
      load_vec<V>(gates + grow + 2 * s.H, gg);
      load_vec<V>(gates + grow + 3 * s.H, go);
      load_vec<V>(c + row, cp);
      load_vec<V>(dh_out + row, dh);
      load_vec<V>(dc_out + row, dcn);
    } else {
      gi[0] = gates[grow];
      gf[0] = gates[grow + s.H];
      gg[0] = gates[grow + 2 * s.H];
      go[0] = gates[grow + 3 * s.H];
      cp[0] = c[row];
      dh[0] = dh_out[row];
      dcn[0] = dc_out[row];
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      C di, df, dg, dgo, dcx;
      fn(device_cast<C>(gi[k]), device_cast<C>(gf[k]), device_cast<C>(gg[k]), device_cast<C>(go[k]),
         device_cast<C>(cp[k]), device_cast<C>(dh[k]), device_cast<C>(dcn[k]), di, df, dg, dgo, dcx);
      odi[k] = device_cast<T>(di);
      odf[k] = device_cast<T>(df);
      odg[k] = device_cast<T>(dg);
      odo[k] = device_cast<T>(dgo);
      odc[k] = device_cast<T>(dcx);
    }
    if constexpr (V > 1) {
      store_vec<V>(dgates + grow, odi);
      store_vec<V>(dgates + grow + s.H, odf);
      store_vec<V>(dgates + grow + 2 * s.H, odg);
      store_vec<V>(dgates + grow + 3 * s.H, odo);
      store_vec<V>(dc + row, odc);
    } else {
      dgates[grow] = odi[0];
      dgates[grow + s.H] = odf[0];
      dgates[grow + 2 * s.H] = odg[0];
      dgates[grow + 3 * s.H] = odo[0];
      dc[row] = odc[0];
    }
  }
}

template <class C>
__global__ void lstm_backward_dyn(DynOperand dgates, DynOperand dc, DynOperand dh_out, DynOperand dc_out,
                                  DynOperand gates, DynOperand c, LstmShape s) {
  const LstmGatesBackwardFn<C> fn{};
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < s.groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const UnitIndex u = unit_of(g, s.gpr, s.use32, 1);
    const int64_t grow = u.b * 4 * s.H + u.j, row = u.b * s.H + u.j;
    C di, df, dg, dgo, dcx;
    fn(load_as<C>(gates.at(grow), gates.dt), load_as<C>(gates.at(grow + s.H), gates.dt),
       load_as<C>(gates.at(grow + 2 * s.H), gates.dt), load_as<C>(gates.at(grow + 3 * s.H), gates.dt),
       load_as<C>(c.at(row), c.dt), load_as<C>(dh_out.at(row), dh_out.dt), load_as<C>(dc_out.at(row), dc_out.dt), di,
       df, dg, dgo, dcx);
    store_as(dgates.at(grow), dgates.dt, di);
    store_as(dgates.at(grow + s.H), dgates.dt, df);
    store_as(dgates.at(grow + 2 * s.H), dgates.dt, dg);
    store_as(dgates.at(grow + 3 * s.H), dgates.dt, dgo);
    store_as(dc.at(row), dc.dt, dcx);
  }
}

// ---------------------------------------------------------------- entry points

// Whether every tensor has dtype dt.
bool all_dtype(std::initializer_list<const Tensor*> ts, DType dt) {
  for (const Tensor* t : ts)
    if (t->dtype() != dt) return false;
  return true;
}

// Units per thread for the typed path of T: the vector width when H allows it and every pointer is aligned.
template <class T>
int units_per_thread(int64_t H, std::initializer_list<const Tensor*> ts) {
  constexpr int V = kVecBytes / static_cast<int>(sizeof(T));
  if (H % V != 0) return 1;
  for (const Tensor* t : ts)
    if (!is_aligned(t->raw_data(), kVecBytes)) return 1;
  return V;
}

void lstm_gates_forward_cuda(const Tensor& h_out, const Tensor& c_out, const Tensor& gates, const Tensor& c) {
  DeviceGuard guard(h_out.device(), "lstm_gates_forward");
  const int64_t B = c.size(0), H = c.size(1);
  if (B * H == 0) return;
  const int dev = h_out.device().index;
  cudaStream_t stream = stream_of(h_out);
  const auto ops = {&h_out, &c_out, &gates, &c};
  if (all_dtype(ops, gates.dtype())) {
    visit_floating(gates.dtype(), "lstm_gates_forward", [&]<class T>() {
      constexpr int V = kVecBytes / static_cast<int>(sizeof(T));
      T* ho = static_cast<T*>(h_out.raw_data());
      T* co = static_cast<T*>(c_out.raw_data());
      const T* gp = static_cast<const T*>(gates.raw_data());
      const T* cp = static_cast<const T*>(c.raw_data());
      if (units_per_thread<T>(H, ops) == V) {
        const LstmShape s = lstm_shape(B, H, V);
        lstm_forward_typed<T, V><<<blocks_for(s.groups, kThreads, dev), kThreads, 0, stream>>>(ho, co, gp, cp, s);
      } else {
        const LstmShape s = lstm_shape(B, H, 1);
        lstm_forward_typed<T, 1><<<blocks_for(s.groups, kThreads, dev), kThreads, 0, stream>>>(ho, co, gp, cp, s);
      }
      MP_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  const LstmShape s = lstm_shape(B, H, 1);
  const unsigned grid = blocks_for(s.groups, kThreads, dev);
  if (gates.dtype() == DType::f64 || c.dtype() == DType::f64)
    lstm_forward_dyn<double><<<grid, kThreads, 0, stream>>>(dyn(h_out), dyn(c_out), dyn(gates), dyn(c), s);
  else
    lstm_forward_dyn<float><<<grid, kThreads, 0, stream>>>(dyn(h_out), dyn(c_out), dyn(gates), dyn(c), s);
  MP_CUDA_CHECK_LAUNCH();
}

void lstm_gates_backward_cuda(const Tensor& dgates, const Tensor& dc, const Tensor& dh_out, const Tensor& dc_out,
                              const Tensor& gates, const Tensor& c) {
  DeviceGuard guard(dgates.device(), "lstm_gates_backward");
  const int64_t B = c.size(0), H = c.size(1);
  if (B * H == 0) return;
  const int dev = dgates.device().index;
  cudaStream_t stream = stream_of(dgates);
  const auto ops = {&dgates, &dc, &dh_out, &dc_out, &gates, &c};
  if (all_dtype(ops, gates.dtype())) {
    visit_floating(gates.dtype(), "lstm_gates_backward", [&]<class T>() {
      constexpr int V = kVecBytes / static_cast<int>(sizeof(T));
      T* dg = static_cast<T*>(dgates.raw_data());
      T* dcp = static_cast<T*>(dc.raw_data());
      const T* dh = static_cast<const T*>(dh_out.raw_data());
      const T* dco = static_cast<const T*>(dc_out.raw_data());
      const T* gp = static_cast<const T*>(gates.raw_data());
      const T* cp = static_cast<const T*>(c.raw_data());
      if (units_per_thread<T>(H, ops) == V) {
        const LstmShape s = lstm_shape(B, H, V);
        lstm_backward_typed<T, V>
            <<<blocks_for(s.groups, kThreads, dev), kThreads, 0, stream>>>(dg, dcp, dh, dco, gp, cp, s);
      } else {
        const LstmShape s = lstm_shape(B, H, 1);
        lstm_backward_typed<T, 1>
            <<<blocks_for(s.groups, kThreads, dev), kThreads, 0, stream>>>(dg, dcp, dh, dco, gp, cp, s);
      }
      MP_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  const LstmShape s = lstm_shape(B, H, 1);
  const unsigned grid = blocks_for(s.groups, kThreads, dev);
  if (gates.dtype() == DType::f64 || c.dtype() == DType::f64)
    lstm_backward_dyn<double>
        <<<grid, kThreads, 0, stream>>>(dyn(dgates), dyn(dc), dyn(dh_out), dyn(dc_out), dyn(gates), dyn(c), s);
  else
    lstm_backward_dyn<float>
        <<<grid, kThreads, 0, stream>>>(dyn(dgates), dyn(dc), dyn(dh_out), dyn(dc_out), dyn(gates), dyn(c), s);
  MP_CUDA_CHECK_LAUNCH();
}

}  // namespace

MP_REGISTER_KERNEL(lstm_gates_forward_kernel, DeviceType::cuda, &lstm_gates_forward_cuda);
MP_REGISTER_KERNEL(lstm_gates_backward_kernel, DeviceType::cuda, &lstm_gates_backward_cuda);

}  // namespace mp::backend::cuda

// Row-wise building blocks of the CUDA kernels that give each row of a [rows, n] tensor to a warp or a
// block (softmax.cu, layer_norm.cu): a vectorised per-row element loop, an all-reduce over the row's
// threads and the row schedule. Device code only (include from .cu files).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/loops.cuh"
#include "mp/core/macros.hpp"

namespace mp::backend::cuda {

// v of lane 0 in every lane of the warp (any trivially copyable V, moved as 32-bit words).
template <class V>
__device__ MP_FORCE_INLINE V broadcast_lane0(V v) {
  constexpr int kWords = (sizeof(V) + 3) / 4;
  uint32_t w[kWords] = {};
  memcpy(w, &v, sizeof(V));
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_sync(0xffffffffu, w[i], 0);
  V r;
  memcpy(&r, w, sizeof(V));
  return r;
}

// The combines of row sums and maxima.
template <class A>
struct Plus {
  __device__ MP_FORCE_INLINE A operator()(A a, A b) const { return a + b; }
};
template <class A>
struct Max {  // NaN never wins, as the CPU's lanes_max
  __device__ MP_FORCE_INLINE A operator()(A a, A b) const { return b > a ? b : a; }
};

// Shared scratch of the block-per-row reductions: 32 partials plus the broadcast slot.
struct alignas(16) RowSmem {
  unsigned char bytes[33 * 32];
};

// Reduce v over the kRowThreads threads of a row (a warp, or the whole block) with combine; every thread
// gets the same bits (lane / thread 0's result). Block version: all threads of the block must call it.
template <int kRowThreads, class V, class F>
__device__ MP_FORCE_INLINE V row_allreduce(V v, F combine, V identity, RowSmem& smem) {
  static_assert(sizeof(V) <= 32, "row_allreduce: partial too large for RowSmem");
  if constexpr (kRowThreads == kWarpSize) {
    return broadcast_lane0(warp_reduce(v, combine));
  } else {
    V* s = reinterpret_cast<V*>(smem.bytes);
    v = block_reduce(v, combine, identity, s);
    if (threadIdx.x == 0) s[32] = v;
    __syncthreads();
    return s[32];
  }
}

// Calls f(vals, i) for the elements i of a row of n that this thread (tid of nthr) owns, vals[k] being
// in[k][i] converted to A; with kWrite, out[i] = f(vals, i) rounded to T. 16-byte vector accesses after a
// scalar head when every row pointer has the same offset from a 16-byte boundary; scalar otherwise.
template <class A, bool kWrite, int NIn, class T, class F>
__device__ MP_FORCE_INLINE void row_loop(const T* const (&in)[NIn], std::type_identity_t<T>* out, int64_t n, int tid,
                                         int nthr, F&& f) {
  constexpr int V = kVecBytes / static_cast<int>(sizeof(T));
  const auto mis = static_cast<unsigned>(reinterpret_cast<uintptr_t>(in[0]) & (kVecBytes - 1));
  bool same = true;
#pragma unroll
  for (int k = 1; k < NIn; ++k)
    same = same && static_cast<unsigned>(reinterpret_cast<uintptr_t>(in[k]) & (kVecBytes - 1)) == mis;
  if constexpr (kWrite) same = same && static_cast<unsigned>(reinterpret_cast<uintptr_t>(out) & (kVecBytes - 1)) == mis;
  const int64_t head = same ? min(n, static_cast<int64_t>(((kVecBytes - mis) & (kVecBytes - 1)) / sizeof(T))) : n;
  auto one = [&](int64_t i) {
    A v[NIn];
#pragma unroll
    for (int k = 0; k < NIn; ++k) v[k] = device_cast<A>(in[k][i]);
    if constexpr (kWrite)
      out[i] = device_cast<T>(f(v, i));
    else
      f(v, i);
  };
  for (int64_t i = tid; i < head; i += nthr) one(i);
  if (head == n) return;
  const int64_t nv = (n - head) / V;
  for (int64_t q = tid; q < nv; q += nthr) {
    const int64_t i0 = head + q * V;
    T x[NIn][V];
#pragma unroll
    for (int k = 0; k < NIn; ++k) load_vec<V>(in[k] + i0, x[k]);
    T y[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      A v[NIn];
#pragma unroll
      for (int k = 0; k < NIn; ++k) v[k] = device_cast<A>(x[k][j]);
      if constexpr (kWrite)
        y[j] = device_cast<T>(f(v, i0 + j));
      else
        f(v, i0 + j);
    }
    if constexpr (kWrite) store_vec<V>(out + i0, y);
  }
  for (int64_t i = head + nv * V + tid; i < n; i += nthr) one(i);
}

// The rows of a rows kernel: this thread's place in its row and the row loop bounds.
template <int kRowThreads>
struct RowSched {
  int tid;        // thread index within the row
  int64_t first;  // first row of this thread
  int64_t step;   // rows between iterations
  __device__ RowSched() {
    const int per_block = static_cast<int>(blockDim.x) / kRowThreads;
    tid = static_cast<int>(threadIdx.x) % kRowThreads;
    first = static_cast<int64_t>(blockIdx.x) * per_block + static_cast<int>(threadIdx.x) / kRowThreads;
    step = static_cast<int64_t>(gridDim.x) * per_block;
  }
};

}  // namespace mp::backend::cuda

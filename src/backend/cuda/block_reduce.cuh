// Warp and block reductions for the CUDA kernels (nvcc only). Deterministic: a fixed butterfly /
// tree order that depends only on the launch shape, never on timing (no atomics).
//
// API (keep names stable; other .cu files use them):
//   shfl_xor(v, mask, width)                  __shfl_xor_sync for any trivially copyable T
//   warp_reduce(v, combine, width)            every lane of each `width`-lane segment gets the result
//   block_reduce(v, combine, identity, smem)  the result in thread 0; smem holds >= 32 T
//   kWarpSize
#pragma once
#if !defined(__CUDACC__)
#error "block_reduce.cuh is for CUDA sources (.cu) only"
#endif
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "mp/core/macros.hpp"

namespace mp::backend::cuda {

/// Threads per warp.
inline constexpr int kWarpSize = 32;

/// __shfl_xor_sync over all 32 lanes for any trivially copyable T (moved as 32-bit words).
template <class T>
__device__ MP_FORCE_INLINE T shfl_xor(T v, int lane_mask, int width = kWarpSize) {
  static_assert(std::is_trivially_copyable_v<T>, "shfl_xor: T must be trivially copyable");
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int> ||
                std::is_same_v<T, unsigned> || std::is_same_v<T, long long> || std::is_same_v<T, unsigned long long>) {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask, width);
  } else if constexpr (std::is_same_v<T, int64_t> && sizeof(long) == 8) {
    return static_cast<T>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(v), lane_mask, width));
  } else {
    constexpr int kWords = (sizeof(T) + 3) / 4;
    uint32_t w[kWords] = {};
    memcpy(w, &v, sizeof(T));
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = __shfl_xor_sync(0xffffffffu, w[i], lane_mask, width);
    T r;
    memcpy(&r, w, sizeof(T));
    return r;
  }
}

/// Reduce v over each segment of `width` consecutive lanes (a power of two <= 32) with
/// combine(a, b); every lane of the segment gets the result. All 32 lanes of the warp must call it.
template <class T, class F>
__device__ MP_FORCE_INLINE T warp_reduce(T v, F combine, int width = kWarpSize) {
  for (int m = width / 2; m > 0; m /= 2) v = combine(v, shfl_xor(v, m, width));
  return v;
}

/// Reduce v over the whole block (blockDim.x * y * z threads, a multiple of 32, at most 1024) with
/// combine(a, b); the result is valid in thread 0 (linear thread index 0). `identity` is
/// combine's neutral element; `smem` is __shared__ storage of at least 32 T. Every thread of the
/// block must call it; it may be called repeatedly with the same smem (it synchronises first).
template <class T, class F>
__device__ MP_FORCE_INLINE T block_reduce(T v, F combine, T identity, T* smem) {
  const int tid = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int nthreads = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  const int lane = tid % kWarpSize, warp = tid / kWarpSize, nwarps = nthreads / kWarpSize;
  v = warp_reduce(v, combine);
  __syncthreads();  // an earlier call's readers are done with smem
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < nwarps ? smem[lane] : identity;
    v = warp_reduce(v, combine);
  }
  return v;
}

}  // namespace mp::backend::cuda

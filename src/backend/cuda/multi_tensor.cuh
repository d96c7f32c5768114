// The chunk table of a multi-tensor launch (Note [CUDA multi-tensor launch] in amp.cu): the work of a list of
// tensors cut into chunks of kChunk elements, each table entry holding its tensor's first chunk, so a block
// that takes chunk c finds its tensor by binary search. Shared by amp.cu (unscale, underflow statistics) and
// optim.cu (the fused optimizer updates). For CUDA sources (.cu) only.
#pragma once
#if !defined(__CUDACC__)
#error "multi_tensor.cuh is for CUDA sources (.cu) only"
#endif
#include <cstdint>

#include "mp/core/macros.hpp"

namespace mp::backend::cuda {

/// Elements per chunk: a multiple of every vector width, so chunk starts keep a tensor's alignment (and of 4,
/// the stochastic rounding's block of random words).
inline constexpr int64_t kChunk = 16384;

/// The number of chunks of a tensor of n elements.
inline int64_t chunks_of(int64_t n) { return (n + kChunk - 1) / kChunk; }

/// The index of the entry that holds chunk c: the last of table[0, n) whose first_chunk is <= c.
template <class Entry>
__device__ MP_FORCE_INLINE int find_chunk_entry(const Entry* table, int n, int64_t c) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].first_chunk <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace mp::backend::cuda

// Size classes of the CUDA caching allocator (allocator.cu). Device-neutral so the tests check the
// rounding in every build.
#pragma once
#include <cstddef>

namespace mp::backend::cuda {

/// Requests below this are rounded to kSmallGranularity, the rest to kLargeGranularity.
inline constexpr size_t kLargeAllocation = size_t{1} << 20;
/// Rounding of small requests (512 B, cudaMalloc's own alignment).
inline constexpr size_t kSmallGranularity = 512;
/// Rounding of large requests (2 MiB, the driver's page size for large allocations).
inline constexpr size_t kLargeGranularity = size_t{2} << 20;
/// Largest request the allocator rounds; anything larger is reported as out of memory without
/// calling cudaMalloc (and without overflowing the rounding).
inline constexpr size_t kMaxAllocation = size_t{1} << 56;

/// Bytes of the block that serves a request of `bytes` (0 for 0; callers check kMaxAllocation
/// first). Note [CUDA size classes]: freed blocks are cached per (device, block size) and reused
/// only for requests rounding to the same size, so a class is never split; 512 B steps keep the
/// waste of small tensors below 512 B, 2 MiB steps keep large ones below 2 MiB (under 50% for the
/// 1-2 MiB range, under 3% above 64 MiB).
constexpr size_t round_allocation_size(size_t bytes) {
  const size_t g = bytes < kLargeAllocation ? kSmallGranularity : kLargeGranularity;
  return (bytes + g - 1) / g * g;
}

}  // namespace mp::backend::cuda

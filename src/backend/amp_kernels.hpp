#pragma once
#include <cstdint>
#include <span>

#include "backend/amp_pointwise.hpp"
#include "backend/registry.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// Multi-tensor loss-scale unscaling: returns whether any element of any tensor is inf/NaN and, when
/// `write`, multiplies every tensor by `inv_scale` in place, all in one pass over the elements (one
/// parallel region across all tensors, as Apex's multi_tensor_apply). Tensors must be contiguous.
using UnscaleKernel = bool(std::span<const Tensor> tensors, double inv_scale, bool write);
inline constinit KernelSlot<UnscaleKernel> unscale_kernel{"unscale"};

/// Counts of nonzero gradient values by where |g * scale| would land in f16.
struct UnderflowCounts {
  int64_t nonzero = 0;    ///< nonzero elements
  int64_t flushed = 0;    ///< |g*scale| < 2^-24: below f16's smallest subnormal (lost)
  int64_t subnormal = 0;  ///< 2^-24 <= |g*scale| < 2^-14: an f16 subnormal (precision lost)
  int64_t nonfinite = 0;  ///< inf or NaN
};

/// Underflow statistics of many tensors at one scale (read-only).
using UnderflowKernel = UnderflowCounts(std::span<const Tensor> tensors, double scale);
inline constinit KernelSlot<UnderflowKernel> underflow_kernel{"underflow_stats"};

}  // namespace mp::backend

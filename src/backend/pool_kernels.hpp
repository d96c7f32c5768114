#pragma once
// 2-D pooling kernels (max, average, adaptive average), forward and backward, over contiguous NCHW planes.
// Every kernel works plane by plane (one plane = one (n, c) pair of H x W values); 16-bit planes are loaded
// to f32, f64 computes in double, results are rounded once when stored. The window arithmetic is PyTorch's
// and lives here as inline functions so a CUDA backend uses the same formulas.
#include <array>
#include <cstdint>

#include "backend/registry.hpp"
#include "mp/core/macros.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// Window of a fixed-size pool: kernel, stride (>= 1, already resolved from "0 = kernel") and padding per
/// spatial dim (h, w).
struct Pool2dWindow {
  std::array<int64_t, 2> kernel{1, 1};
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
};

/// PyTorch's pooled extent of one dim: floor or ceil of (in + 2 pad - k) / stride, plus 1. In ceil mode the
/// last window must start inside the input or the left padding, else it is dropped. May return <= 0.
inline int64_t pool_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, bool ceil_mode) {
  const int64_t span = in + 2 * pad - k + (ceil_mode ? stride - 1 : 0);
  // Floor division (span may be negative for a kernel larger than the padded input).
  int64_t out = (span >= 0 ? span / stride : -((-span + stride - 1) / stride)) + 1;
  if (ceil_mode && out > 0 && (out - 1) * stride >= in + pad) --out;
  return out;
}

/// First input index of adaptive bin i of `out` bins over `in` values: floor(i * in / out).
MP_HD inline int64_t adaptive_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
/// One past the last input index of adaptive bin i: ceil((i + 1) * in / out).
MP_HD inline int64_t adaptive_end(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }

/// Max pool: out [N, C, oh, ow] (x's dtype) and indices [N, C, oh, ow] (i32 or i64: the flat index ih * W + iw
/// of the max inside its plane) from x [N, C, H, W]; padding counts as -inf and NaN wins (propagates).
/// All tensors contiguous.
using MaxPool2dForwardKernel = void(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dWindow& w);
inline constinit KernelSlot<MaxPool2dForwardKernel> max_pool2d_forward_kernel{"max_pool2d_forward"};

/// Max pool backward: dx [N, C, H, W] (overwritten) gets each dy [N, C, oh, ow] value added at its saved index.
using MaxPool2dBackwardKernel = void(const Tensor& dx, const Tensor& dy, const Tensor& indices);
inline constinit KernelSlot<MaxPool2dBackwardKernel> max_pool2d_backward_kernel{"max_pool2d_backward"};

/// Average pool: out [N, C, oh, ow] from x [N, C, H, W]. The divisor is the window size clipped to the padded
/// input (count_include_pad) or the number of input values in it. All tensors contiguous.
using AvgPool2dForwardKernel = void(const Tensor& out, const Tensor& x, const Pool2dWindow& w, bool count_include_pad);
inline constinit KernelSlot<AvgPool2dForwardKernel> avg_pool2d_forward_kernel{"avg_pool2d_forward"};

/// Average pool backward: dx [N, C, H, W] (overwritten) from dy [N, C, oh, ow].
using AvgPool2dBackwardKernel = void(const Tensor& dx, const Tensor& dy, const Pool2dWindow& w, bool count_include_pad);
inline constinit KernelSlot<AvgPool2dBackwardKernel> avg_pool2d_backward_kernel{"avg_pool2d_backward"};

/// Adaptive average pool: out [N, C, oh, ow] from x [N, C, H, W], bins [adaptive_start, adaptive_end) per dim.
using AdaptiveAvgPool2dForwardKernel = void(const Tensor& out, const Tensor& x);
inline constinit KernelSlot<AdaptiveAvgPool2dForwardKernel> adaptive_avg_pool2d_forward_kernel{
    "adaptive_avg_pool2d_forward"};

/// Adaptive average pool backward: dx [N, C, H, W] (overwritten) from dy [N, C, oh, ow].
using AdaptiveAvgPool2dBackwardKernel = void(const Tensor& dx, const Tensor& dy);
inline constinit KernelSlot<AdaptiveAvgPool2dBackwardKernel> adaptive_avg_pool2d_backward_kernel{
    "adaptive_avg_pool2d_backward"};

}  // namespace mp::backend

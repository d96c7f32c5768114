#pragma once
// 2-D convolution kernels (forward, backward data, backward weights). Activations are NCHW or channels-last
// (MemoryFormat::channels_last, NHWC in memory with the same logical dims), weights OIHW
// ([O, C/groups, kH, kW]), PyTorch semantics (symmetric zero padding, dilation 1 = dense kernel).
// x and weight share one dtype: f32, f64, bf16 or f16. f32 and bf16 run on oneDNN with f32 accumulation;
// f64 runs plain loops (gradient checks); f16 computes through f32 on the CPU, rounding the result once
// (oneDNN 3.x has f16 convolutions only on CPUs with AVX512-FP16 or AMX-FP16).
#include <array>
#include <cstdint>

#include "backend/registry.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// Geometry of a 2-D convolution: strides (>= 1), padding on each side (>= 0), dilations (>= 1), groups.
struct Conv2dGeometry {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

// Note [channels-last convolutions]
// Activations may be NCHW or NHWC (MemoryFormat::channels_last): oneDNN's AMX kernels and cuDNN's tensor-core
// kernels work on NHWC, so a network that keeps its activations channels-last skips the two reorders around
// every convolution (on the GPU, cuDNN's NCHW f16/bf16 kernels transpose internally). A call runs in the
// layout of the activation it writes (out, dx), or for the weight gradient in the layout of x (or dy); the
// other activation operand is brought into that layout when it is not already. A tensor that is dense in both
// layouts (C == 1, or 1x1 spatial) follows the operand it is paired with.

/// The layout a convolution call runs in (Note [channels-last convolutions]): `written` is the activation
/// it writes (out or dx; undefined for the weight gradient), `read` the activation it reads.
inline MemoryFormat conv_call_format(const Tensor& written, const Tensor& read) {
  if (written.defined()) {
    if (!written.is_contiguous(MemoryFormat::channels_last)) return MemoryFormat::contiguous;
    if (!written.is_contiguous()) return MemoryFormat::channels_last;
  }
  return read.suggest_memory_format();
}

/// Output extent of one spatial dim: (in + 2 pad - dil (k - 1) - 1) / stride + 1, or <= 0 when the dilated
/// kernel does not fit the padded input.
inline int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  const int64_t span = in + 2 * pad - dil * (k - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

/// out [N, O, oh, ow] (contiguous or channels-last; x's dtype) = conv(x, weight) + bias.
/// x [N, C, H, W] and weight [O, C/groups, kH, kW] share a dtype and may be strided; bias [O] of any
/// floating dtype or undefined.
using Conv2dForwardKernel = void(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 const Conv2dGeometry& g);
inline constinit KernelSlot<Conv2dForwardKernel> conv2d_forward_kernel{"conv2d_forward"};

/// Both gradients of a convolution in one call (what the autograd node calls; dx or dweight undefined = not
/// needed, and x or weight may then be undefined too), letting a backend share work between them (the CPU reorders
/// dy into oneDNN's layout once):
/// - dx [N, C, H, W] (contiguous or channels-last; weight's dtype; overwritten) = the gradient with respect to the
///   input, from dy [N, O, oh, ow] and weight (same dtype, may be strided);
/// - dweight [O, C/groups, kH, kW] and dbias [O] (contiguous, overwritten; dbias may be undefined) from x and dy
///   (same dtype, may be strided); f64 for f64 inputs and f32 otherwise (f32 accumulation).
using Conv2dBackwardKernel = void(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& x,
                                  const Tensor& dy, const Tensor& weight, const Conv2dGeometry& g);
inline constinit KernelSlot<Conv2dBackwardKernel> conv2d_backward_kernel{"conv2d_backward"};

}  // namespace mp::backend

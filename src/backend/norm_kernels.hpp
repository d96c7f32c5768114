#pragma once
// Normalisation kernels (batch norm, layer norm). Statistics are kept in the "statistics dtype":
// f64 when x is f64, f32 otherwise (f32, f16, bf16). weight/bias may have any floating dtype (f32
// parameters with 16-bit activations are the amp "keep batch norm in fp32" case); they are converted
// to the statistics type once per call. Outputs keep x's dtype.
#include "backend/registry.hpp"
#include "mp/core/macros.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// Per-element affine normalisation y = (x - mean) * invstd * w + b as (x - mean) * scale + shift with
/// scale = invstd * w and shift = b. Not folded to x * scale + (b - mean * scale): that form cancels
/// catastrophically when |mean| >> std (x * scale and mean * scale are both large).
template <class T>
struct NormAffineFn {
  T mean, scale, shift;
  MP_HD T operator()(T x) const { return (x - mean) * scale + shift; }
};

/// Normalisation backward for one element, with the per-group sums folded into three constants:
/// dx = a * dy + b * (x - mean) + c, where (M elements per group, w the weight, r = invstd)
///   training: a = w r, b = -w r^3 sum(dy (x - mean)) / M, c = -w r sum(dy) / M
///   eval (batch norm with running statistics, which are constants): a = w r, b = c = 0.
/// This is dx = w r (dy - mean(dy) - xhat mean(dy xhat)) with xhat = (x - mean) r.
template <class T>
struct NormBackwardFn {
  T a, b, c, mean;
  MP_HD T operator()(T dy, T x) const { return a * dy + b * (x - mean) + c; }
};

// Note [batch norm + add + ReLU]
// ResNet's blocks apply relu(bn(conv(x))) and relu(bn(conv(x)) + identity). Fused, the batch-norm kernel adds
// the residual and applies the ReLU in its output pass (the block is still in cache), and the backward masks the
// gradient inside its first pass: two to four passes over the activation fewer per block and direction, and two
// fewer intermediate tensors. The results are bit-identical to the unfused ops: the normalised value is rounded to
// y's dtype before the residual is added (in the statistics type, as the add op computes), and the sum is rounded
// again; the ReLU and the mask are exact. NaN propagates through the ReLU as in ReluFn.

/// Batch norm forward over x [N, C, S] (S = product of the spatial dims, 1 for [N, C]), contiguous or
/// channels-last: strides {S C, 1, C} (element (n, c, s) at n S C + s C + c, memory a row-major [N S, C] matrix,
/// as torch.channels_last); detected from x (x.stride(1) == 1 with S > 1 and C > 1), and y must share x's
/// layout (asserted). y: [N, C, S] in x's dtype. mean, var, invstd: contiguous [C] in the statistics dtype.
/// The CPU kernels' results do not depend on the thread count.
/// training: writes the batch mean and biased variance into mean/var and invstd = 1/sqrt(var + eps);
/// else reads mean/var (the running statistics) and writes invstd. weight/bias: [C] or undefined.
/// Fused epilogue (Note [batch norm + add + ReLU]): residual (x's shape, dtype and layout, or undefined) is
/// added to the normalised values and relu applies max(., 0) last: y = relu(bn(x) + residual).
using BatchNormForwardKernel = void(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd,
                                    const Tensor& x, const Tensor& weight, const Tensor& bias, bool training,
                                    double eps, const Tensor& residual, bool relu);
inline constinit KernelSlot<BatchNormForwardKernel> batch_norm_forward_kernel{"batch_norm_forward"};

/// Batch norm backward. dy, x, dx: [N, C, S], all contiguous or all channels-last (detected from x as in the
/// forward; asserted; their dtypes may differ); mean, invstd: [C] statistics dtype (the saved batch
/// statistics in training, the running ones in eval); weight [C] or undefined (= 1).
/// Writes dx ([N, C, S], its own dtype), dweight and dbias ([C], statistics dtype); each may be
/// undefined when not needed. training selects the full formula, else statistics are constants.
/// Fused ReLU (Note [batch norm + add + ReLU]): when y (the fused forward's output, x's layout) is defined, the
/// gradient is first masked, dz = y > 0 ? dy : 0, and the formulas use dz; dz (undefined, or x's shape and
/// layout) receives it (the residual's gradient). With y defined, dy, y, dx and dz must all have x's dtype.
using BatchNormBackwardKernel = void(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                                     const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                                     bool training, const Tensor& y, const Tensor& dz);
inline constinit KernelSlot<BatchNormBackwardKernel> batch_norm_backward_kernel{"batch_norm_backward"};

/// Layer norm forward over the rows of x [M, N] (contiguous): y [M, N] in x's dtype; mean, rstd [M]
/// in the statistics dtype; weight/bias [N] or undefined.
using LayerNormForwardKernel = void(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                    const Tensor& weight, const Tensor& bias, double eps);
inline constinit KernelSlot<LayerNormForwardKernel> layer_norm_forward_kernel{"layer_norm_forward"};

/// Layer norm backward: dy, x [M, N] contiguous, saved mean/rstd [M], weight [N] or undefined.
/// Writes dx ([M, N], its own dtype), dweight and dbias ([N], statistics dtype); each may be undefined.
using LayerNormBackwardKernel = void(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                                     const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight);
inline constinit KernelSlot<LayerNormBackwardKernel> layer_norm_backward_kernel{"layer_norm_backward"};

}  // namespace mp::backend

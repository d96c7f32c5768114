#pragma once
// Softmax-family kernels: softmax / log-softmax along one dim (forward and backward) and the fused
// class losses built on log-softmax (cross entropy, and NLL on log-probabilities). The formulas live
// in the MP_HD functions below so the CPU loops and the CUDA kernels compute the same thing; exp and
// log are math_exp/math_log (fast_math.hpp: vectorisable for float, Note [fast float
// transcendentals]; std:: for double).
#include <cmath>
#include <cstdint>

#include "backend/fast_math.hpp"
#include "backend/registry.hpp"
#include "mp/core/macros.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// A contiguous tensor seen as [outer, n, inner] around the softmax (or class) dim of size n.
struct SoftmaxShape {
  int64_t outer = 1;  ///< product of the sizes before the dim
  int64_t n = 1;      ///< size of the dim
  int64_t inner = 1;  ///< product of the sizes after the dim (1: the dim is last and unit-stride)
};

/// Softmax gradient of one element: y * (g - sum_k g_k y_k).
template <class A>
struct SoftmaxGradFn {
  MP_HD A operator()(A g, A y, A dot) const { return y * (g - dot); }
};

/// Log-softmax gradient of one element: g - exp(y) * sum_k g_k (math_exp: vectorisable for float).
template <class A>
struct LogSoftmaxGradFn {
  MP_HD MP_FORCE_INLINE A operator()(A g, A y, A gsum) const { return g - math_exp(y) * gsum; }
};

/// Options of a class loss as the kernels see them.
struct ClassLossParams {
  int64_t ignore_index = -100;   ///< rows whose target equals this contribute 0 and get no gradient
  double label_smoothing = 0.0;  ///< eps in [0, 1]
  bool log_probs = false;        ///< true: the input already holds log-probabilities (nll_loss)
};

// Note [class loss with label smoothing]
// With lse = log sum_c exp(x_c) (0 for nll_loss, whose input x is already log p), log p_c = x_c - lse and
//   loss = (1 - eps) * (-log p_t) + eps * mean_c(-log p_c) = (1 - eps) * (lse - x_t) + eps * (lse - mean_c x_c)
// (PyTorch's formula: the smoothing term is the mean over the C classes of -log p). Its gradient wrt x_c is
//   p_c - (1 - eps) * [c == t] - eps / C   (p_c = exp(x_c - lse) for cross entropy, 0 for nll_loss).
// Rows whose target is ignore_index have loss 0 and gradient 0.
// The kernels evaluate both on max-shifted logits x'_c = x_c - m (m = max_c x_c), with lse' = log sum_c
// exp(x'_c): the loss is shift-invariant, and lse' stays small, so huge logits (1e4) lose no precision to
// the rounding of lse = m + lse' (in f32 its spacing near 1e4 is 2^-10).

/// Loss of one row from its log-sum-exp, target logit and mean logit (Note [class loss with label smoothing]).
template <class A>
MP_HD MP_FORCE_INLINE A class_loss_value(A lse, A x_target, A mean_x, A eps) {
  return (A(1) - eps) * (lse - x_target) + eps * (lse - mean_x);
}

/// Gradient of a row's loss wrt class c's input, times the row's incoming gradient w.
template <class A>
MP_HD MP_FORCE_INLINE A class_loss_grad(A p_c, bool is_target, A eps, A eps_over_c, A w) {
  return w * (p_c - (is_target ? A(1) - eps : A(0)) - eps_over_c);
}

/// out = softmax(in) (or log_softmax when `log`) along the middle dim of shape s. `in` and `out` are
/// contiguous floating tensors (any of f32/f64/f16/bf16); compute is f32 (f64 when either is f64).
using SoftmaxKernel = void(bool log, const Tensor& out, const Tensor& in, const SoftmaxShape& s);
inline constinit KernelSlot<SoftmaxKernel> softmax_kernel{"softmax"};

/// grad_in from grad_out and the forward output y (all contiguous with shape s; dtypes may differ):
/// softmax: y * (g - sum(g * y)); log_softmax: g - exp(y) * sum(g).
using SoftmaxBackwardKernel = void(bool log, const Tensor& grad_in, const Tensor& grad_out, const Tensor& out,
                                   const SoftmaxShape& s);
inline constinit KernelSlot<SoftmaxBackwardKernel> softmax_backward_kernel{"softmax_backward"};

/// Per-row class loss of `input` [N, C, inner] (contiguous; s = {N, C, inner}) against i64 `target`
/// [N * inner]: `losses` [N * inner] gets each row's loss (0 where ignored); `stats` [N * inner, 2] gets
/// each row's max m and shifted log-sum-exp lse' for the backward (cross entropy only; undefined for
/// nll). `losses` and `stats` are f32 (f64 for f64 input), which is also the compute type. Throws
/// mp::Error naming `op`, the first out-of-range target and C.
using ClassLossKernel = void(const char* op, const Tensor& losses, const Tensor& stats, const Tensor& input,
                             const Tensor& target, const SoftmaxShape& s, const ClassLossParams& p);
inline constinit KernelSlot<ClassLossKernel> class_loss_kernel{"class_loss"};

/// grad_input [N, C, inner] (contiguous, any floating dtype) = class_loss_grad with w = grad_rows[r]
/// (grad_rows holds N * inner values, or 1 value shared by every row; f32/f64 like `stats`).
using ClassLossBackwardKernel = void(const Tensor& grad_input, const Tensor& grad_rows, const Tensor& input,
                                     const Tensor& stats, const Tensor& target, const SoftmaxShape& s,
                                     const ClassLossParams& p);
inline constinit KernelSlot<ClassLossBackwardKernel> class_loss_backward_kernel{"class_loss_backward"};

}  // namespace mp::backend

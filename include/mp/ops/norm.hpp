#pragma once
#include "mp/tensor/tensor.hpp"

namespace mp {

/// Batch normalisation over dim 1 of x [N, C, ...]. In training, normalises with batch statistics
/// and updates running_mean/running_var in place (momentum as PyTorch: new = (1-m) old + m batch,
/// unbiased var for the running estimate); in eval, uses the running statistics. weight/bias [C]
/// or undefined. Statistics are computed in f32 whatever the input dtype (autocast class: fp32
/// statistics, output in the input dtype).
Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);

/// relu(batch_norm(x, ...)) in one kernel per direction (Note [batch norm + add + ReLU]); the values and
/// gradients are bit-identical to the two ops.
Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5);

/// relu(batch_norm(x, ...) + residual), the end of a ResNet block, fused as batch_norm_relu. A residual of
/// another shape or dtype than x (broadcast, type promotion) is handled by the unfused ops.
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                           double momentum = 0.1, double eps = 1e-5);

/// Layer normalisation over the trailing dims given by normalized_shape; weight/bias of that shape
/// or undefined. Statistics in f32 (f64 for f64 input).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace mp

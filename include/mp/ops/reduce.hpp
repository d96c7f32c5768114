#pragma once
#include <utility>

#include "mp/tensor/tensor.hpp"

namespace mp {

/// Sum of all elements (f32 accumulation for 16-bit inputs; result in the input dtype).
Tensor sum(const Tensor& x);
/// Sum over dims.
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim = false);
/// Sum of the squares of all elements in one pass, accumulated in f32 (f64 for f64 input) and returned
/// as a 0-dim f32 (f64) tensor whatever the input's floating dtype: the squared L2 norm without a
/// squared temporary (clip_grad_norm_). Differentiable (2 x g).
Tensor sum_squares(const Tensor& x);
/// Mean of all elements.
Tensor mean(const Tensor& x);
/// Mean over dims.
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim = false);
/// Variance over dims (correction 1 = unbiased, 0 = population).
Tensor var(const Tensor& x, const Shape& dims, int64_t correction = 1, bool keepdim = false);
/// Max over dims (gradient split evenly among ties, as torch.amax).
Tensor amax(const Tensor& x, const Shape& dims, bool keepdim = false);
/// Min over dims.
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim = false);
/// Max over one dim: values and i64 indices (gradient to the index).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
/// Max of all elements.
Tensor max(const Tensor& x);
/// Index of the max along dim (i64, not differentiable).
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
/// Sum broadcast dims away so the result has `shape` (the gradient of expand).
Tensor sum_to_size(const Tensor& x, const Shape& shape);

}  // namespace mp

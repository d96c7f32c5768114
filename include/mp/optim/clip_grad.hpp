#pragma once
#include <vector>

#include "mp/tensor/tensor.hpp"

namespace mp::optim {

/// Scale the gradients of `params` in place so that their joint L2 norm is at most `max_norm`
/// (PyTorch's clip_grad_norm_); returns the norm before clipping. The norm is accumulated in f32
/// (f64 for f64 gradients) whatever the gradient dtype. With loss scaling, call it after
/// GradScaler::unscale_ so the threshold applies to true gradients. A non-finite norm leaves the
/// gradients untouched (GradScaler::step will skip the step).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

}  // namespace mp::optim

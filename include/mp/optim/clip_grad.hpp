#pragma once
#include <functional>
#include <vector>

#include "mp/tensor/tensor.hpp"

namespace mp::optim {

/// Scale the gradients of `params` in place so that their joint L2 norm is at most `max_norm`
/// (PyTorch's clip_grad_norm_); returns the norm before clipping. The norm is accumulated in f32
/// (f64 for f64 gradients) whatever the gradient dtype. With loss scaling, call it after
/// GradScaler::unscale_ so the threshold applies to true gradients. A non-finite norm leaves the
/// gradients untouched (GradScaler::step will skip the step).
/// `total`, when given, turns the sum of squares of these gradients into that of all of the model's (a sharded run's
/// ranks each hold a part of the gradients: the sum over the ranks, Note [sharded optimizer state]).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm,
                       const std::function<double(double)>& total = {});

}  // namespace mp::optim

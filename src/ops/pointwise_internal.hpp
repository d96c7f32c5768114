#pragma once
// Element-wise helpers shared by ops in other files (not part of the public API).
#include "mp/tensor/tensor.hpp"

namespace mp::detail {

/// grad where output > 0, else 0: ReLU's gradient computed from its output (no autograd record).
Tensor relu_backward_from_output(const Tensor& grad, const Tensor& output);

}  // namespace mp::detail

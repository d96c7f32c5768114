#pragma once
#include "mp/tensor/tensor.hpp"

namespace mp {

/// Softmax along dim (max-subtracted; computed in f32 for 16-bit inputs, result in the input dtype).
Tensor softmax(const Tensor& x, int64_t dim);
/// Log-softmax along dim (log-sum-exp form).
Tensor log_softmax(const Tensor& x, int64_t dim);

}  // namespace mp

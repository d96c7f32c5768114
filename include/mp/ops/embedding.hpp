#pragma once
#include "mp/tensor/tensor.hpp"

namespace mp {

/// Rows of weight [V, D] picked by i64/i32 indices of any shape -> [..., D]. Out-of-range indices
/// throw naming the index and V. The weight gradient is a dense scatter-add.
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx = -1);

/// Inverted dropout: zero with probability p and scale the rest by 1/(1-p) when training
/// (counter-based mask, reproducible under manual_seed); identity otherwise.
Tensor dropout(const Tensor& x, double p, bool training);

}  // namespace mp

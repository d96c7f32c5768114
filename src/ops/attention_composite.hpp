#pragma once
// The composite form of scaled_dot_product_attention, for devices without the fused kernels and as the
// reference the fused kernels are tested and benchmarked against.
#include "mp/ops/attention.hpp"

namespace mp::detail {

/// scaled_dot_product_attention computed by other ops (each with its own autograd node): scores by
/// matmul in the input dtype, then f32 (f64 for f64) mask, softmax and dropout (the fused kernel's draws:
/// Note [fused attention]), then the weights in the input dtype times v. Same checks and semantics as the
/// op; memory O(B H Tq Tk).
Tensor sdpa_composite(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options = {});

}  // namespace mp::detail

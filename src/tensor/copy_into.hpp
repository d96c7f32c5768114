#pragma once
#include "mp/tensor/tensor.hpp"

namespace mp::detail {

/// out = src converted element-wise, src broadcast to out's sizes; both on one device. Records nothing:
/// callers pass detached sources (Tensor::copy_, fill_, and the casts in src/ops/tensor_methods.cpp).
void copy_into(const Tensor& out, const Tensor& src);

}  // namespace mp::detail

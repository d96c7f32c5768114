#pragma once
#include <span>

#include "backend/pointwise.hpp"
#include "backend/registry.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// out = op(ins...) element-wise. All operands have out's shape (inputs pre-expanded, stride 0 where
/// broadcast); input dtypes may differ from out's: each is loaded and converted to the compute type
/// `compute` (f64 -> double, any float -> float, integers -> int64).
using PointwiseKernel = void(PointwiseOp op, const Tensor& out, std::span<const Tensor> ins, DType compute,
                             const PointwiseParams& p);
inline constinit KernelSlot<PointwiseKernel> pointwise_kernel{"pointwise"};

}  // namespace mp::backend

#pragma once
#include <iterator>
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

/// The op's name as the profiler reports it ("add", "relu_backward", ...).
constexpr const char* pointwise_op_name(PointwiseOp op) {
  constexpr const char* kNames[] = {"copy",
                                    "neg",
                                    "exp",
                                    "log",
                                    "sqrt",
                                    "rsqrt",
                                    "relu",
                                    "gelu",
                                    "gelu_tanh",
                                    "tanh",
                                    "sigmoid",
                                    "abs",
                                    "square",
                                    "sign",
                                    "pow_scalar",
                                    "add_scalar",
                                    "mul_scalar",
                                    "clamp",
                                    "add",
                                    "sub",
                                    "mul",
                                    "div",
                                    "pow",
                                    "maximum",
                                    "minimum",
                                    "add_scaled",
                                    "axpby",
                                    "eq",
                                    "ne",
                                    "lt",
                                    "le",
                                    "gt",
                                    "ge",
                                    "relu_backward",
                                    "gelu_backward",
                                    "gelu_tanh_backward",
                                    "tanh_backward",
                                    "sigmoid_backward",
                                    "clamp_backward",
                                    "where"};
  static_assert(std::size(kNames) == static_cast<size_t>(PointwiseOp::where) + 1,
                "pointwise_op_name: one name per PointwiseOp, in enum order");
  return kNames[static_cast<size_t>(op)];
}

/// Profiler label of an element-wise call: the op, with copies that change dtype reported as "cast".
template <class... R>
const char* kernel_label(const char*, PointwiseOp op, const Tensor& out, std::span<const Tensor> ins, const R&...) {
  if (op == PointwiseOp::copy && !ins.empty() && ins[0].dtype() != out.dtype()) return "cast";
  return pointwise_op_name(op);
}

}  // namespace mp::backend

#pragma once
#include "backend/registry.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// Reductions the kernels know.
enum class ReduceOp : uint8_t { sum, max, min, sum_squares };

/// out[k...] = reduce over r... of in[k..., r...]: `in` is a (strided) view whose first
/// in.dim() - nreduce dims are kept and whose last `nreduce` dims are reduced; `out` is contiguous
/// with the kept sizes. Accumulates in float for f32/f16/bf16 (double for f64, int64 for integers).
using ReduceKernel = void(ReduceOp op, const Tensor& out, const Tensor& in, int64_t nreduce);
inline constinit KernelSlot<ReduceKernel> reduce_kernel{"reduce"};

/// Profiler label of a reduction: "sum", "max" or "min".
template <class... R>
const char* kernel_label(const char*, ReduceOp op, const R&...) {
  constexpr const char* kNames[] = {"sum", "max", "min", "sum_squares"};
  return kNames[static_cast<size_t>(op)];
}

/// Max (or min) over the last dim of `in` with the index of the first extreme: values and i64 indices
/// are contiguous with in's leading sizes.
using ArgReduceKernel = void(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in);
inline constinit KernelSlot<ArgReduceKernel> arg_reduce_kernel{"arg_reduce"};

}  // namespace mp::backend

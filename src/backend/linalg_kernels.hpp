#pragma once
#include "backend/registry.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// What a matmul applies to its f32 (f64) result before storing it.
enum class MatmulEpilogue : uint8_t {
  none,
  relu,  ///< max(x, 0) after the bias (NaN stays NaN); not combined with accumulate
};

/// out[b] (+)= epilogue(a[b] x b[b] (+ bias)): a [B, m, k] and b [B, k, n] are strided 3-D views (batch
/// stride 0 broadcasts), out [B, m, n] is written through its strides, bias [n] or undefined. a and b
/// share a dtype; out may be wider (f32 out for bf16 inputs). Accumulation is f32 (f64 for f64).
using MatmulKernel = void(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, bool accumulate,
                          MatmulEpilogue epilogue);
inline constinit KernelSlot<MatmulKernel> matmul_kernel{"matmul"};

/// The dtype a device's matmul kernel multiplies `ab` operands in for a [batch, m, k] x [batch, k, n] -> `c` call
/// whose A / B are read column-major (transposed views) when `a_cm` / `b_cm`: `ab` itself, or f32 where the kernel
/// widens 16-bit operands and rounds the result once (the CPU: f16 always, bf16 for shapes and layouts where that
/// path is chosen). A caller that multiplies by the same operand many times (the LSTM's recurrent weight) widens it
/// once instead, with the same result. Optional: without one, `ab`.
using MatmulComputeDtype = DType(DType ab, DType c, int64_t batch, int64_t m, int64_t n, int64_t k, bool a_cm,
                                 bool b_cm);
inline constinit KernelSlot<MatmulComputeDtype> matmul_compute_dtype{"matmul_compute_dtype"};

}  // namespace mp::backend

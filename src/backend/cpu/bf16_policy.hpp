#pragma once
// How bf16 matmuls and convolutions compute on the CPU (Note [bf16 through f32 without AMX] in
// bf16_policy.cpp; Notes [small convolutions as one GEMM], [bf16 weight gradient as one GEMM] and [GEMM paths
// need AMX] in conv.cpp).
#include "mp/core/dtype.hpp"

namespace mp::backend::cpu {

enum class Bf16Path {
  cpu_default,  ///< native_gemm where the CPU has AMX-BF16, via_f32 otherwise
  native_gemm,  ///< oneDNN's bf16 primitives; convolutions with few output pixels as im2col + one bf16 GEMM
  native,       ///< oneDNN's bf16 primitives for every shape
  via_f32,      ///< bf16 operands widened to f32 (exact), oneDNN's f32 primitives, the result rounded once
};

const char* bf16_path_name(Bf16Path path);

/// Sets the path for matmuls and convolutions that start after the call (tests run every path on any CPU).
/// With cpu_default, the environment variable MP_BF16=native_gemm|native|via_f32 (experiments) picks one; the
/// variables MP_CONV_GEMM_MAX_PIXELS / MP_CONV_WGRAD_GEMM_MAX_PIXELS (tuning) override the GEMM thresholds.
void set_bf16_path(Bf16Path path);

/// The path bf16 matmuls and convolutions take now (cpu_default and the environment resolved).
Bf16Path bf16_path();

/// The dtype oneDNN multiplies `dt` operands in on this CPU: f32 for f16 (storage-only on the CPU) and for bf16
/// on the via_f32 path, `dt` otherwise. The matmul and convolution kernels widen to it and round once.
DType compute_dtype(DType dt);

}  // namespace mp::backend::cpu

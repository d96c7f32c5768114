#pragma once
// Process-wide numeric modes of the math libraries, like PyTorch's torch.set_float32_matmul_precision.
//
// Note [TF32]: on Ampere and later GPUs, f32 matmuls and convolutions may round their inputs to TF32
// (10-bit mantissa, f32's 8-bit exponent) and accumulate in f32 on the tensor cores: about 8x the
// f32 throughput, at a relative error of about 2^-11 per product instead of 2^-24. As in PyTorch the
// default is `highest` (no TF32): f32 means f32 unless the user opts in with `high`. f16/bf16 inputs
// are not affected (they always use the tensor cores with f32 accumulation), nor is f64, nor the CPU
// (oneDNN keeps f32 exact here).
#include <string>

namespace mp {

/// Internal precision of f32 matrix products (matmul, linear, convolution, RNN GEMMs) on CUDA.
enum class Float32MatmulPrecision {
  highest,  ///< full f32 products and accumulation (the default; PyTorch's "highest")
  high,     ///< TF32 tensor-core products with f32 accumulation on CUDA (PyTorch's "high")
};

/// Set the f32 matmul precision for the whole process (thread-safe; affects later calls only).
/// cuBLASLt uses CUBLAS_COMPUTE_32F_FAST_TF32 for f32 GEMMs when `high`; the CPU ignores it.
void set_float32_matmul_precision(Float32MatmulPrecision p);

/// The current f32 matmul precision (thread-safe; `highest` until set).
Float32MatmulPrecision float32_matmul_precision();

/// "highest" or "high".
const char* float32_matmul_precision_name(Float32MatmulPrecision p);

/// Parse "highest" or "high" (also "tf32" for high, "f32"/"fp32" for highest); throws mp::Error otherwise.
Float32MatmulPrecision float32_matmul_precision_from_string(const std::string& s);

}  // namespace mp

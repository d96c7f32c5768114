#pragma once
// Which CPUs run bf16 convolutions with few output pixels as im2col + one oneDNN matmul (Notes [small
// convolutions as one GEMM], [bf16 weight gradient as one GEMM] and [GEMM paths need AMX] in conv.cpp).

namespace mp::backend::cpu {

enum class ConvGemmPaths {
  cpu_default,  ///< on where the CPU has AMX-BF16, off otherwise
  on,           ///< always (tests use it to cover the paths on any CPU)
  off,          ///< never: every convolution runs oneDNN's convolution primitives
};

/// Sets the policy for convolutions that start after the call. The environment variables
/// MP_CONV_GEMM_MAX_PIXELS / MP_CONV_WGRAD_GEMM_MAX_PIXELS (tuning experiments) override it.
void set_conv_gemm_paths(ConvGemmPaths paths);

}  // namespace mp::backend::cpu

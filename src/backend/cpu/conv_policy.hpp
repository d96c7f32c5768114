#pragma once
// How bf16 convolutions run on the CPU (Notes [bf16 convolutions through f32 without AMX], [small convolutions
// as one GEMM], [bf16 weight gradient as one GEMM] and [GEMM paths need AMX] in conv.cpp).

namespace mp::backend::cpu {

enum class ConvBf16Path {
  cpu_default,  ///< native_gemm where the CPU has AMX-BF16, via_f32 otherwise
  native_gemm,  ///< oneDNN's bf16 primitives; few output pixels as im2col + one bf16 GEMM
  native,       ///< oneDNN's bf16 convolution primitives for every shape
  via_f32,      ///< bf16 operands widened to f32 (exact), oneDNN's f32 primitives, the result rounded once
};

const char* conv_bf16_path_name(ConvBf16Path path);

/// Sets the path for convolutions that start after the call (tests run every path on any CPU). With
/// cpu_default, the environment variable MP_CONV_BF16=native_gemm|native|via_f32 (experiments) picks one; the
/// variables MP_CONV_GEMM_MAX_PIXELS / MP_CONV_WGRAD_GEMM_MAX_PIXELS (tuning) override the GEMM thresholds.
void set_conv_bf16_path(ConvBf16Path path);

/// The path bf16 convolutions take now (cpu_default and the environment resolved).
ConvBf16Path conv_bf16_path();

}  // namespace mp::backend::cpu

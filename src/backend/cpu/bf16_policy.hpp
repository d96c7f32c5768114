#pragma once
// Which path a 16-bit matmul or convolution takes on the CPU: a forced rule (MP_BF16, tests), else chosen per
// shape by measurement (Note [kernel paths chosen by measurement] in kernel_paths.cpp).
#include <functional>
#include <string>

#include "backend/cpu/kernel_paths.hpp"
#include "mp/core/dtype.hpp"

namespace mp::backend::cpu {

enum class Bf16Path {
  cpu_default,  ///< no forced rule: each shape's path is chosen by measurement (or pinned to its default)
  native_gemm,  ///< forced: oneDNN's bf16 primitives, convolutions that can take it as im2col + one bf16 GEMM
  native,       ///< forced: oneDNN's bf16 primitives for every shape
  via_f32,      ///< forced: bf16 operands widened to f32 (exact), oneDNN's f32 primitives, the result rounded once
};

const char* bf16_path_name(Bf16Path path);

/// Forces a rule for bf16 matmuls and convolutions that start after the call (tests run every path on any CPU);
/// cpu_default removes it. Without a call, MP_BF16=native_gemm|native|via_f32 (experiments) forces one.
void set_bf16_path(Bf16Path path);

/// The rule forced now (set_bf16_path's, else MP_BF16's), or cpu_default.
Bf16Path bf16_path();

/// Whether oneDNN has a non-reference matmul kernel for `dt` (bf16 or f16) on this CPU: without one (no AVX-512:
/// AMD Zen 3) 16-bit calls go through f32 whatever is measured, and a forced native rule fails naming the call.
bool onednn_has_native(DType dt);

/// The path of one 16-bit (`dt`: bf16 or f16) matmul or convolution call: the forced rule's for bf16 when one is
/// set, else choose_kernel_path over the candidates this CPU and library offer (bf16: native, via_f32, and gemm
/// when `gemm_ok`; f16: via_f32). `key` names the call; `run` times a path on stand-in operands;
/// `native_is_reference`, asked only before timing, says whether oneDNN would run the call's 16-bit primitive on a
/// reference implementation (then native is not timed: choose_kernel_path's `usable`).
KernelPath choose_16bit_path(DType dt, bool gemm_ok, const std::function<std::string()>& key,
                             const std::function<void(KernelPath)>& run,
                             const std::function<bool()>& native_is_reference);

}  // namespace mp::backend::cpu

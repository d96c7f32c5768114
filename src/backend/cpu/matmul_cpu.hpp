#pragma once
// The CPU matmul kernel on a given path (the convolutions' GEMM paths call it with KernelPath::native).
#include "backend/cpu/kernel_paths.hpp"
#include "backend/linalg_kernels.hpp"

namespace mp::backend::cpu {

/// out (+)= epilogue(a x b (+ bias)) as backend::matmul_kernel, with 16-bit operands computed on `path`
/// (native or via_f32; f32 operands ignore it). f64 operands are not accepted here.
void matmul_on_path(KernelPath path, const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias,
                    bool accumulate, MatmulEpilogue epilogue);

}  // namespace mp::backend::cpu

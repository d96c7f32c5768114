#pragma once
#include "mp/tensor/tensor.hpp"

namespace mp {

/// Matrix product with PyTorch's matmul semantics: 1-D x 1-D dot, 2-D x 2-D, batched with
/// broadcasting of batch dims. f32/f64/bf16 (bf16 inputs accumulate in f32 on oneDNN/AMX);
/// f16 on the CPU is storage only and computes through f32. Autocast class: lower precision.
Tensor matmul(const Tensor& a, const Tensor& b);
/// Batched [B, n, k] x [B, k, m] -> [B, n, m].
Tensor bmm(const Tensor& a, const Tensor& b);
/// y = x W^T + b with x [..., in], weight [out, in], bias [out] or undefined (PyTorch layout).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
/// relu(linear(x, weight, bias)) with the ReLU applied in the GEMM's epilogue (oneDNN post-op on the
/// CPU, cuBLASLt RELU/RELU_BIAS on CUDA): the same values as the two ops, without a separate pass over
/// the output. Its gradient is ReLU's mask applied to the incoming gradient, then linear's.
/// nn::Sequential uses it for a Linear followed by a ReLU (Note [Linear + ReLU fusion]).
Tensor linear_relu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace mp

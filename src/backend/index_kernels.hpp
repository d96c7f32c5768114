#pragma once
// Index kernels: embedding gather / scatter-add and the dropout mask. The dropout keep rule is an MP_HD
// function so the CPU loop and a CUDA kernel draw the same mask from the same Philox stream.
#include <cstdint>

#include "backend/registry.hpp"
#include "mp/core/macros.hpp"
#include "mp/core/philox.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

// Note [dropout mask]
// Element i of a dropout call keeps its value when philox_uniform(seed, offset, i) >= p, where
// (seed, offset) were reserved from the generator for numel draws. The uniform lies on a 2^-24 grid in
// [0, 1), so p = 0 keeps everything, p = 1 drops everything and any other p drops with probability
// ceil(p * 2^24) / 2^24 (within 2^-24 of p). Kept values are scaled by 1 / (1 - p) (inverted dropout).

/// Whether dropout keeps an element whose uniform draw is u (Note [dropout mask]).
MP_HD MP_FORCE_INLINE bool dropout_keeps(float u, float p) { return u >= p; }

/// Whether dropout keeps element i of a call that reserved the draws at (seed, offset).
MP_HD MP_FORCE_INLINE bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t i, float p) {
  return dropout_keeps(philox_uniform(seed, offset, i), p);
}

/// out [M, D] = rows of weight [V, D] picked by indices [M] (i64 or i32). All contiguous; out has
/// weight's dtype. Throws mp::Error naming the first out-of-range index and V.
using EmbeddingKernel = void(const Tensor& out, const Tensor& weight, const Tensor& indices);
inline constinit KernelSlot<EmbeddingKernel> embedding_kernel{"embedding"};

/// grad_weight [V, D] (zero-initialised, f32 or f64) += row m of grad_out [M, D] (any floating dtype)
/// at row indices[m], for every m whose index is not padding_idx (-1: none). Race-free.
using EmbeddingBackwardKernel = void(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& indices,
                                     int64_t padding_idx);
inline constinit KernelSlot<EmbeddingBackwardKernel> embedding_backward_kernel{"embedding_backward"};

/// Inverted dropout over contiguous tensors of one shape: mask (u8) = keep rule of Note [dropout mask]
/// with draws (state.seed, state.offset + i); out = in * mask * scale (computed in f32, f64 for f64).
using DropoutKernel = void(const Tensor& out, const Tensor& mask, const Tensor& in, float p, double scale,
                           PhiloxState state);
inline constinit KernelSlot<DropoutKernel> dropout_kernel{"dropout"};

/// grad_in = grad_out * mask * scale (contiguous; grad_in and grad_out any floating dtypes, mask u8).
using DropoutBackwardKernel = void(const Tensor& grad_in, const Tensor& grad_out, const Tensor& mask, double scale);
inline constinit KernelSlot<DropoutBackwardKernel> dropout_backward_kernel{"dropout_backward"};

}  // namespace mp::backend

#pragma once
// The operand checks every process group makes before a collective (MPI's and the single process's on the CPU,
// NCCL's on its GPU), so that a misuse gets the same message whatever backs the group.
#include <cstdint>
#include <span>

#include "mp/tensor/tensor.hpp"

namespace mp::dist::detail {

/// `t` on `where`, contiguous, and (with `floating`) of a floating dtype: what the collectives take.
void check_operand(const Tensor& t, const char* op, bool floating, Device where = kCPU);
/// An all-reduce buffer: f32, f64, bf16 or f16, within one message (2^31 elements).
void check_sum_buffer(const Tensor& t, Device where = kCPU);
/// The blocks of a reduce-scatter, all-gather or gather: one count per rank, adding up to the buffer's numel, within
/// one message.
void check_blocks(const Tensor& buffer, std::span<const int64_t> counts, int ranks, const char* op);
/// reduce_scatter_sum's operands.
void check_reduce_scatter(const Tensor& buffer, const Tensor& out, std::span<const int64_t> counts, int rank, int ranks,
                          Device where = kCPU);
/// gather's operands: this rank's block, and on the root the whole.
void check_gather(const Tensor& mine, const Tensor& out, std::span<const int64_t> counts, int rank, int ranks,
                  bool root, Device where = kCPU);

}  // namespace mp::dist::detail

#pragma once
// Fused scaled-dot-product attention kernels (the FlashAttention-2 algorithm; Note [fused attention] in
// backend/cpu/attention.cpp). A device without them runs the op as a composite of other ops
// (src/ops/attention.cpp), so the slots are optional hooks: the op asks find().
#include <cstdint>

#include "backend/registry.hpp"
#include "mp/core/philox.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// Sizes and settings of one attention call as the kernels see them.
struct AttentionParams {
  int64_t B = 1, H = 1, Tq = 1, Tk = 1, D = 1;
  double scale = 1.0;         ///< factor of the scores q . k
  bool causal = false;        ///< key j is masked for query i when j > i (top-left aligned)
  double dropout_p = 0.0;     ///< probability of dropping a weight; 0: no dropout
  PhiloxState dropout_rng{};  ///< B*H*Tq*Tk draws reserved; weight (b, h, i, j) is element ((b*H+h)*Tq+i)*Tk+j
                              ///< of Note [dropout mask] in index_kernels.hpp
};

/// Forward: out [B, H, Tq, D] and lse [B, H, Tq] (the log-sum-exp of each row's masked, scaled scores;
/// +inf for a row whose keys are all masked, whose output is 0) from q [B, H, Tq, D], k and v
/// [B, H, Tk, D]. q, k, v, out are contiguous and of one floating dtype; lse and `mask` have the compute
/// type (f32, f64 for f64). `mask` is undefined or an additive mask viewed as [B, H, Tq, Tk] with any
/// strides (0 along broadcast dims). Memory beyond the outputs: O(tile) per thread.
using AttentionForwardKernel = void(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& mask, const AttentionParams& p);
inline constinit KernelSlot<AttentionForwardKernel> attention_forward_kernel{"attention_forward"};

/// Backward: dq, dk, dv (contiguous, q's dtype and shapes) from dout (contiguous, q's dtype) and the
/// forward's q, k, v, out, lse and mask, recomputing the weights tile by tile (dropout regenerated from
/// p.dropout_rng).
using AttentionBackwardKernel = void(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                     const Tensor& lse, const Tensor& mask, const AttentionParams& p);
inline constinit KernelSlot<AttentionBackwardKernel> attention_backward_kernel{"attention_backward"};

}  // namespace mp::backend

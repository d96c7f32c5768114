#pragma once
#include <optional>

#include "mp/tensor/tensor.hpp"

namespace mp {

/// Options of scaled_dot_product_attention (PyTorch's F.scaled_dot_product_attention arguments).
struct AttentionOptions {
  /// Causal mask, top-left aligned as in PyTorch: query i attends to keys j <= i (for Tq != Tk too:
  /// with Tq > Tk the rows i >= Tk see every key). Refused together with `mask`.
  bool causal = false;
  /// Optional mask broadcastable to [B, H, Tq, Tk] ([B, Tq, Tk] for 3-D inputs): bool (true = the key
  /// takes part) or floating (added to the scores; -inf removes a key). Not differentiated.
  Tensor mask;
  /// Dropout probability on the attention weights, in [0, 1) (Philox stream of the default generator).
  double dropout_p = 0.0;
  /// Factor of the scores; 1 / sqrt(D) when unset.
  std::optional<double> scale;
};

/// softmax(q k^T * scale + mask) v with optional causal mask and dropout on the weights.
/// q [B, H, Tq, D], k and v [B, H, Tk, D] (or all 3-D: [B, Tq, D], [B, Tk, D]), one floating dtype
/// and device; returns [B, H, Tq, D] (resp. [B, Tq, D]) in q's dtype. A query row whose keys are all
/// masked gets 0 (and no gradient), as PyTorch >= 2.5. Differentiable in q, k, v. On the CPU it runs
/// the fused tiled kernel (memory O(B H T)); elsewhere a composite of matmul, f32 softmax, dropout and
/// matmul (Note [fused attention] in src/backend/cpu/attention.cpp). Autocast class: lower.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

}  // namespace mp

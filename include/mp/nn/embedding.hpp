#pragma once
#include <optional>

#include "mp/nn/module.hpp"

namespace mp::nn {

/// Options of Embedding.
struct EmbeddingOptions {
  int64_t num_embeddings = 0;  ///< vocabulary size V
  int64_t embedding_dim = 0;   ///< vector size D
  /// Row that reads as zeros and gets no gradient (negative counts from the end, as PyTorch).
  std::optional<int64_t> padding_idx = std::nullopt;
};

/// A lookup table (PyTorch's nn.Embedding): weight [V, D] ~ Normal(0, 1), the padding row zeroed.
class Embedding : public UnaryModule {
 public:
  /// A table with freshly drawn rows.
  explicit Embedding(const EmbeddingOptions& options);
  /// Embedding({.num_embeddings = n, .embedding_dim = d}).
  Embedding(int64_t num_embeddings, int64_t embedding_dim)
      : Embedding(EmbeddingOptions{.num_embeddings = num_embeddings, .embedding_dim = embedding_dim}) {}
  /// i64/i32 indices of any shape -> [..., D].
  Tensor forward(const Tensor& indices) override;
  /// Redraw N(0, 1) and zero the padding row.
  void reset_parameters();
  /// "1000, 64, padding_idx=0".
  std::string extra_repr() const override;
  /// Table [V, D].
  const Tensor& weight() const { return *weight_; }
  /// The padding row after wrapping negatives, or -1 for none.
  int64_t padding_idx() const { return padding_idx_; }

 private:
  EmbeddingOptions options_;
  int64_t padding_idx_ = -1;
  Tensor* weight_;
};

}  // namespace mp::nn

// nn::Embedding.
#include "mp/nn/embedding.hpp"

#include "mp/autograd/node.hpp"
#include "mp/nn/init.hpp"
#include "mp/ops/embedding.hpp"

namespace mp::nn {

Embedding::Embedding(const EmbeddingOptions& o) : UnaryModule("Embedding"), options_(o) {
  MP_CHECK(o.num_embeddings > 0 && o.embedding_dim > 0, "Embedding: expected positive num_embeddings and ",
           "embedding_dim, got ", o.num_embeddings, " and ", o.embedding_dim);
  if (o.padding_idx) {
    const int64_t p = *o.padding_idx;
    MP_CHECK(p >= -o.num_embeddings && p < o.num_embeddings, "Embedding: padding_idx must be within [",
             -o.num_embeddings, ", ", o.num_embeddings, "), got ", p);
    padding_idx_ = p < 0 ? p + o.num_embeddings : p;
  }
  weight_ = &register_parameter("weight", empty({o.num_embeddings, o.embedding_dim}));
  reset_parameters();
}

void Embedding::reset_parameters() {
  init::normal_(*weight_, 0.0, 1.0);
  if (padding_idx_ >= 0) {
    autograd::NoGradGuard ng;
    weight_->select(0, padding_idx_).fill_(0.0);
  }
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(*weight_, indices, padding_idx_); }

std::string Embedding::extra_repr() const {
  std::string s = std::to_string(options_.num_embeddings) + ", " + std::to_string(options_.embedding_dim);
  if (padding_idx_ >= 0) s += ", padding_idx=" + std::to_string(padding_idx_);
  return s;
}

}  // namespace mp::nn

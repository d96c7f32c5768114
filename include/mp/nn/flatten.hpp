#pragma once
#include "mp/nn/module.hpp"

namespace mp::nn {

/// Options of Flatten.
struct FlattenOptions {
  int64_t start_dim = 1;  ///< first dim merged (dim 0, the batch, is kept by default)
  int64_t end_dim = -1;   ///< last dim merged
};

/// Flatten dims [start_dim, end_dim] into one (PyTorch's nn.Flatten).
class Flatten : public UnaryModule {
 public:
  /// A flatten layer.
  explicit Flatten(const FlattenOptions& options = {}) : UnaryModule("Flatten"), options_(options) {}
  /// x.flatten(start_dim, end_dim).
  Tensor forward(const Tensor& x) override { return x.flatten(options_.start_dim, options_.end_dim); }
  /// "start_dim=1, end_dim=-1".
  std::string extra_repr() const override {
    return "start_dim=" + std::to_string(options_.start_dim) + ", end_dim=" + std::to_string(options_.end_dim);
  }

 private:
  FlattenOptions options_;
};

}  // namespace mp::nn

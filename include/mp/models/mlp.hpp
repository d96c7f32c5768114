#pragma once
#include <memory>
#include <vector>

#include "mp/nn/module.hpp"
#include "mp/nn/sequential.hpp"

namespace mp::models {

/// Options of MLP.
struct MLPOptions {
  int64_t in_features = 0;           ///< elements per sample after flattening (C*H*W for images)
  std::vector<int64_t> hidden = {};  ///< width of each hidden layer (none = a linear classifier)
  int64_t num_classes = 10;          ///< outputs (logits)
  double dropout = 0.0;              ///< dropout after each hidden ReLU (0 = no Dropout module at all)
};

/// Multi-layer perceptron: flattens its input [N, ...] to [N, in_features], then Linear+ReLU
/// (+Dropout when dropout > 0) per hidden layer and a final Linear to the logits.
/// Parameter names: layers.{i}.weight/bias with i the index in the Sequential `layers`
/// (layers.0, layers.2, ... without dropout; layers.0, layers.3, ... with it), as the PyTorch twin in
/// bench/pytorch/models.py.
class MLP : public nn::UnaryModule {
 public:
  /// A freshly initialised MLP (PyTorch's default Linear initialisation).
  explicit MLP(const MLPOptions& options);
  /// x [N, ...] with in_features elements per sample -> logits [N, num_classes].
  Tensor forward(const Tensor& x) override;
  /// The options it was built with.
  const MLPOptions& options() const { return options_; }
  /// The layer chain (Linear, ReLU, [Dropout], ..., Linear).
  nn::Sequential& layers() { return *layers_; }

 private:
  MLPOptions options_;
  std::shared_ptr<nn::Sequential> layers_;
};

}  // namespace mp::models

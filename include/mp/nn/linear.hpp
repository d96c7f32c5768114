#pragma once
#include "mp/nn/module.hpp"

namespace mp::nn {

/// Options of Linear.
struct LinearOptions {
  int64_t in_features = 0;   ///< size of the last input dim
  int64_t out_features = 0;  ///< size of the last output dim
  bool bias = true;          ///< learn an additive bias
};

/// y = x W^T + b (PyTorch's nn.Linear): weight [out, in] ~ kaiming_uniform_(a = sqrt(5)), i.e.
/// U(-1/sqrt(in), 1/sqrt(in)); bias [out] ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public UnaryModule {
 public:
  /// A layer with freshly initialised parameters.
  explicit Linear(const LinearOptions& options);
  /// Linear({.in_features = in, .out_features = out, .bias = bias}).
  Linear(int64_t in_features, int64_t out_features, bool bias = true)
      : Linear(LinearOptions{in_features, out_features, bias}) {}
  /// x [..., in] -> [..., out].
  Tensor forward(const Tensor& x) override;
  /// relu(forward(x)) with the ReLU fused into the GEMM (linear_relu); the forward hooks do not run.
  Tensor forward_relu(const Tensor& x);
  /// Redraw the parameters with the default initialisation.
  void reset_parameters();
  /// Make `w` (another module's parameter of shape [out, in], e.g. an embedding's) this layer's weight: one
  /// tensor, one gradient (the sum of both uses); named_parameters() lists it once, the state dict under both
  /// names, and Module::to(dtype) keeps the two tied. Throws naming both shapes when they differ.
  void tie_weight(const Tensor& w);
  /// "in_features=4, out_features=8, bias=true".
  std::string extra_repr() const override;
  /// Weight [out, in].
  const Tensor& weight() const { return *weight_; }
  /// Bias [out] (undefined without bias).
  const Tensor& bias() const { return *bias_; }
  /// The options it was built with.
  const LinearOptions& options() const { return options_; }

 private:
  LinearOptions options_;
  Tensor* weight_;
  Tensor* bias_;
};

}  // namespace mp::nn

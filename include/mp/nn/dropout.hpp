#pragma once
#include "mp/nn/module.hpp"

namespace mp::nn {

/// Options of Dropout.
struct DropoutOptions {
  double p = 0.5;  ///< probability of zeroing an element, in [0, 1]
};

/// Inverted dropout in training mode, identity in eval mode (PyTorch's nn.Dropout).
class Dropout : public UnaryModule {
 public:
  /// A dropout layer with probability options.p.
  explicit Dropout(const DropoutOptions& options = {});
  /// Dropout({.p = p}).
  explicit Dropout(double p) : Dropout(DropoutOptions{p}) {}
  /// Zero each element with probability p and scale the rest by 1/(1-p) when training.
  Tensor forward(const Tensor& x) override;
  /// "p=0.5".
  std::string extra_repr() const override;

 private:
  DropoutOptions options_;
};

}  // namespace mp::nn

#pragma once
#include "mp/nn/module.hpp"

namespace mp::nn {

/// max(x, 0) (PyTorch's nn.ReLU).
class ReLU : public UnaryModule {
 public:
  ReLU() : UnaryModule("ReLU") {}
  /// Element-wise relu.
  Tensor forward(const Tensor& x) override;
};

/// Exact GELU x * Phi(x) (PyTorch's nn.GELU(approximate='none')).
class GELU : public UnaryModule {
 public:
  GELU() : UnaryModule("GELU") {}
  /// Element-wise gelu.
  Tensor forward(const Tensor& x) override;
};

/// tanh x (PyTorch's nn.Tanh).
class Tanh : public UnaryModule {
 public:
  Tanh() : UnaryModule("Tanh") {}
  /// Element-wise tanh.
  Tensor forward(const Tensor& x) override;
};

/// 1 / (1 + e^-x) (PyTorch's nn.Sigmoid).
class Sigmoid : public UnaryModule {
 public:
  Sigmoid() : UnaryModule("Sigmoid") {}
  /// Element-wise sigmoid.
  Tensor forward(const Tensor& x) override;
};

/// Returns its input (PyTorch's nn.Identity; a placeholder in Sequential).
class Identity : public UnaryModule {
 public:
  Identity() : UnaryModule("Identity") {}
  /// x.
  Tensor forward(const Tensor& x) override { return x; }
};

}  // namespace mp::nn

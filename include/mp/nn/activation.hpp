#pragma once
#include "mp/nn/module.hpp"
#include "mp/ops/pointwise.hpp"

namespace mp::nn {

/// max(x, 0) (PyTorch's nn.ReLU).
class ReLU : public UnaryModule {
 public:
  ReLU() : UnaryModule("ReLU") {}
  /// Element-wise relu.
  Tensor forward(const Tensor& x) override;
};

/// GELU x * Phi(x) (PyTorch's nn.GELU: exact by default, approximate = tanh for GPT-2's form).
class GELU : public UnaryModule {
 public:
  explicit GELU(GeluApproximate approximate = GeluApproximate::none) : UnaryModule("GELU"), approximate_(approximate) {}
  /// Element-wise gelu.
  Tensor forward(const Tensor& x) override;

 private:
  GeluApproximate approximate_;
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

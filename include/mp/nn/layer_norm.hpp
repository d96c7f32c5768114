#pragma once
#include "mp/nn/module.hpp"

namespace mp::nn {

/// Options of LayerNorm (PyTorch's defaults).
struct LayerNormOptions {
  Shape normalized_shape;          ///< trailing dims normalised together
  double eps = 1e-5;               ///< added to the variance
  bool elementwise_affine = true;  ///< learn weight (init 1) and, when `bias`, bias (init 0)
  bool bias = true;                ///< learn a bias (only with elementwise_affine)
};

/// Layer normalisation over the trailing normalized_shape dims (PyTorch's nn.LayerNorm).
class LayerNorm : public UnaryModule {
 public:
  /// A layer with weight 1 and bias 0.
  explicit LayerNorm(const LayerNormOptions& options);
  /// LayerNorm({.normalized_shape = normalized_shape}).
  explicit LayerNorm(Shape normalized_shape)
      : LayerNorm(LayerNormOptions{.normalized_shape = std::move(normalized_shape)}) {}
  /// x [..., normalized_shape] -> same shape.
  Tensor forward(const Tensor& x) override;
  /// weight = 1, bias = 0.
  void reset_parameters();
  /// "[16], eps=1e-05, elementwise_affine=true".
  std::string extra_repr() const override;
  /// Scale of normalized_shape (undefined without elementwise_affine).
  const Tensor& weight() const { return *weight_; }
  /// Shift of normalized_shape (undefined without it).
  const Tensor& bias() const { return *bias_; }

 private:
  LayerNormOptions options_;
  Tensor* weight_;
  Tensor* bias_;
};

}  // namespace mp::nn

#pragma once
#include <array>

#include "mp/nn/module.hpp"
#include "mp/ops/pool.hpp"

namespace mp::nn {

/// Max pooling over [N, C, H, W] (PyTorch's nn.MaxPool2d; stride 0 = kernel).
class MaxPool2d : public UnaryModule {
 public:
  /// A pool with the given kernel/stride/padding.
  explicit MaxPool2d(const Pool2dOptions& options);
  /// [N, C, H, W] -> [N, C, H', W'].
  Tensor forward(const Tensor& x) override;
  /// "kernel_size=(2, 2), stride=(2, 2), padding=(0, 0)".
  std::string extra_repr() const override;

 private:
  Pool2dOptions options_;
};

/// Average pooling over [N, C, H, W] (PyTorch's nn.AvgPool2d; stride 0 = kernel).
class AvgPool2d : public UnaryModule {
 public:
  /// A pool with the given kernel/stride/padding.
  explicit AvgPool2d(const Pool2dOptions& options);
  /// [N, C, H, W] -> [N, C, H', W'].
  Tensor forward(const Tensor& x) override;
  /// "kernel_size=(2, 2), stride=(2, 2), padding=(0, 0)".
  std::string extra_repr() const override;

 private:
  Pool2dOptions options_;
};

/// Average pooling to a fixed output size (PyTorch's nn.AdaptiveAvgPool2d; {1, 1} = global pool).
class AdaptiveAvgPool2d : public UnaryModule {
 public:
  /// A pool producing [N, C, output_size[0], output_size[1]].
  explicit AdaptiveAvgPool2d(std::array<int64_t, 2> output_size);
  /// [N, C, H, W] -> [N, C, out_h, out_w].
  Tensor forward(const Tensor& x) override;
  /// "output_size=(1, 1)".
  std::string extra_repr() const override;

 private:
  std::array<int64_t, 2> output_size_;
};

}  // namespace mp::nn

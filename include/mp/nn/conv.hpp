#pragma once
#include <array>

#include "mp/nn/module.hpp"
#include "mp/ops/conv.hpp"

namespace mp::nn {

/// Options of Conv2d (PyTorch's arguments; zero padding).
struct Conv2dOptions {
  int64_t in_channels = 0;                   ///< C of the input [N, C, H, W]
  int64_t out_channels = 0;                  ///< channels of the output
  std::array<int64_t, 2> kernel_size{3, 3};  ///< (kH, kW)
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;  ///< in_channels and out_channels must be divisible by it
  bool bias = true;    ///< learn a per-channel bias
};

/// 2-D convolution (PyTorch's nn.Conv2d): weight [out, in/groups, kH, kW] ~ kaiming_uniform_(a =
/// sqrt(5)), bias [out] ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = in/groups * kH * kW.
class Conv2d : public UnaryModule {
 public:
  /// A layer with freshly initialised parameters.
  explicit Conv2d(const Conv2dOptions& options);
  /// x [N, C, H, W] -> [N, out, H', W'].
  Tensor forward(const Tensor& x) override;
  /// Redraw the parameters with the default initialisation.
  void reset_parameters();
  /// "3, 16, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1), bias=false".
  std::string extra_repr() const override;
  /// Weight [out, in/groups, kH, kW].
  const Tensor& weight() const { return *weight_; }
  /// Bias [out] (undefined without bias).
  const Tensor& bias() const { return *bias_; }
  /// The options it was built with.
  const Conv2dOptions& options() const { return options_; }

 private:
  Conv2dOptions options_;
  Tensor* weight_;
  Tensor* bias_;
};

}  // namespace mp::nn

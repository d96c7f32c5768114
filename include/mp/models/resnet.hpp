#pragma once
#include <memory>
#include <vector>

#include "mp/nn/batch_norm.hpp"
#include "mp/nn/conv.hpp"
#include "mp/nn/linear.hpp"
#include "mp/nn/module.hpp"
#include "mp/nn/pooling.hpp"
#include "mp/nn/sequential.hpp"

namespace mp::models {

/// Which ResNet layout a depth selects.
enum class ResNetFamily {
  automatic,    ///< torchvision for 18/34/50/101/152, otherwise cifar (depth 6n+2)
  torchvision,  ///< 4 stages, BasicBlock (18, 34) or Bottleneck (50, 101, 152), widths width*{1,2,4,8}
  cifar,        ///< He et al.'s CIFAR nets: 3 stages of n = (depth-2)/6 BasicBlocks, widths width*{1,2,4}
};

/// Options of ResNet.
struct ResNetOptions {
  int64_t depth = 18;        ///< 18/34/50/101/152 (torchvision) or 6n+2: 8, 14, 20, 32, 44, 56, 110 (cifar)
  int64_t in_channels = 3;   ///< channels of the input images
  int64_t num_classes = 10;  ///< outputs of fc
  int64_t width = 0;         ///< first-stage width; 0 = the family's default (64 torchvision, 16 cifar)
  ResNetFamily family = ResNetFamily::automatic;  ///< needed only for 50 and 152, which are also 6n+2
  bool zero_init_residual = false;                ///< zero the last BN gamma of every block (Goyal et al.)
  /// Layout of the activations: channels_last keeps them NHWC from the stem on (the input is converted
  /// once), which oneDNN's bf16 and cuDNN's tensor-core convolutions read without reorders; contiguous = NCHW.
  MemoryFormat memory_format = MemoryFormat::contiguous;
};

/// 3x3 convolution, padding 1, no bias (torchvision's conv3x3).
std::shared_ptr<nn::Conv2d> conv3x3(int64_t in_channels, int64_t out_channels, int64_t stride = 1);
/// 1x1 convolution, no bias (torchvision's conv1x1).
std::shared_ptr<nn::Conv2d> conv1x1(int64_t in_channels, int64_t out_channels, int64_t stride = 1);
/// The ResNet initialisation on every descendant of m: convolution weights kaiming_normal_ (fan_out,
/// relu), batch norm gamma 1 and beta 0; Linear layers keep PyTorch's default initialisation.
void init_conv_bn(nn::Module& m);

/// torchvision's BasicBlock: conv1 (3x3, stride) bn1 relu conv2 (3x3) bn2, plus the input or
/// downsample(x) (Sequential 1x1 conv + BN, "downsample.0"/"downsample.1") where the shape changes; relu.
class BasicBlock : public nn::UnaryModule {
 public:
  /// Output channels = planes * expansion.
  static constexpr int64_t expansion = 1;
  /// A block from in_planes to planes channels; a projection shortcut when stride != 1 or the width changes.
  BasicBlock(int64_t in_planes, int64_t planes, int64_t stride = 1);
  /// x [N, in_planes, H, W] -> [N, planes, H/stride, W/stride].
  Tensor forward(const Tensor& x) override;
  /// The batch norm whose gamma zero_init_residual zeroes (bn2).
  nn::BatchNorm2d& last_bn() { return *bn2_; }
  /// The projection shortcut, or nullptr for the identity.
  const std::shared_ptr<nn::Sequential>& downsample() const { return downsample_; }

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<nn::Sequential> downsample_;
};

/// torchvision's Bottleneck (v1.5: stride on the 3x3): conv1 (1x1) bn1 relu conv2 (3x3, stride) bn2
/// relu conv3 (1x1, planes*4) bn3, plus the input or downsample(x); relu.
class Bottleneck : public nn::UnaryModule {
 public:
  /// Output channels = planes * expansion.
  static constexpr int64_t expansion = 4;
  /// A block from in_planes to planes*4 channels; a projection shortcut where the shape changes.
  Bottleneck(int64_t in_planes, int64_t planes, int64_t stride = 1);
  /// x [N, in_planes, H, W] -> [N, 4 planes, H/stride, W/stride].
  Tensor forward(const Tensor& x) override;
  /// The batch norm whose gamma zero_init_residual zeroes (bn3).
  nn::BatchNorm2d& last_bn() { return *bn3_; }
  /// The projection shortcut, or nullptr for the identity.
  const std::shared_ptr<nn::Sequential>& downsample() const { return downsample_; }

 private:
  std::shared_ptr<nn::Conv2d> conv1_, conv2_, conv3_;
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_, bn3_;
  std::shared_ptr<nn::Sequential> downsample_;
};

/// ResNet for CIFAR-sized inputs (any channel count and size): stem conv1 (3x3, stride 1, no
/// max-pool) bn1 relu, stages layer1..layer4 (torchvision) or layer1..layer3 (cifar) with strides
/// {1, 2, 2, 2}, global average pool, fc. Parameter and buffer names are torchvision's (conv1.weight,
/// bn1.running_mean, layer1.0.conv1.weight, layer2.0.downsample.0.weight, layer2.0.downsample.1.weight,
/// fc.weight, ...), so torchvision-style state dicts load; bench/pytorch/models.py is the PyTorch twin.
class ResNet : public nn::UnaryModule {
 public:
  /// A freshly initialised network (see init_conv_bn; fc as PyTorch's Linear).
  explicit ResNet(const ResNetOptions& options);
  /// x [N, in_channels, H, W] -> logits [N, num_classes].
  Tensor forward(const Tensor& x) override;
  /// The options it was built with (width and family resolved).
  const ResNetOptions& options() const { return options_; }
  /// Stage i (0-based): a Sequential of blocks named "0", "1", ...
  nn::Sequential& stage(size_t i) { return *stages_.at(i); }
  /// Number of stages (4 torchvision, 3 cifar).
  size_t num_stages() const { return stages_.size(); }

 private:
  ResNetOptions options_;
  std::shared_ptr<nn::Conv2d> conv1_;
  std::shared_ptr<nn::BatchNorm2d> bn1_;
  std::vector<std::shared_ptr<nn::Sequential>> stages_;
  std::shared_ptr<nn::AdaptiveAvgPool2d> avgpool_;
  std::shared_ptr<nn::Linear> fc_;
};

}  // namespace mp::models

#pragma once
#include <memory>
#include <vector>

#include "mp/nn/batch_norm.hpp"
#include "mp/nn/conv.hpp"
#include "mp/nn/linear.hpp"
#include "mp/nn/module.hpp"
#include "mp/nn/sequential.hpp"

namespace mp::models {

/// Options of WideResNet (WRN-depth-widen).
struct WideResNetOptions {
  int64_t depth = 16;        ///< 6n+4: n blocks per stage (16, 22, 28, 40, ...)
  int64_t widen = 4;         ///< k: stage widths 16k, 32k, 64k
  int64_t in_channels = 3;   ///< channels of the input images
  int64_t num_classes = 10;  ///< outputs of fc
  double dropout = 0.0;      ///< dropout between the two convolutions of each block, when training
  /// Layout of the activations: channels_last keeps them NHWC from the stem on (the input is converted
  /// once), which oneDNN's bf16 and cuDNN's tensor-core convolutions read without reorders; contiguous = NCHW.
  MemoryFormat memory_format = MemoryFormat::contiguous;
};

/// The pre-activation block of a Wide-ResNet: o = relu(bn1(x)); y = conv2(dropout(relu(bn2(conv1(o)))));
/// output y + x, or y + shortcut(o) (1x1 conv of the activated input) where the shape changes.
/// Names: bn1, conv1, bn2, conv2, shortcut (convolutions have no bias).
class WideBasicBlock : public nn::UnaryModule {
 public:
  /// A block from in_channels to out_channels, conv1 with `stride`.
  WideBasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, double dropout);
  /// x [N, in, H, W] -> [N, out, H/stride, W/stride].
  Tensor forward(const Tensor& x) override;
  /// The 1x1 projection, or nullptr for the identity shortcut.
  const std::shared_ptr<nn::Conv2d>& shortcut() const { return shortcut_; }

 private:
  std::shared_ptr<nn::BatchNorm2d> bn1_, bn2_;
  std::shared_ptr<nn::Conv2d> conv1_, conv2_, shortcut_;
  double dropout_;
};

/// Wide-ResNet-d-k (Zagoruyko & Komodakis 2016) for CIFAR-sized inputs: conv1 (3x3 to 16 channels),
/// layer1..layer3 of n = (d-4)/6 WideBasicBlocks with widths 16k, 32k, 64k and strides 1, 2, 2, then
/// bn, relu, global average pool and fc. Parameter and buffer names (the PyTorch twin in
/// bench/pytorch/models.py uses the same): conv1.weight; layer{s}.{i}.bn1.{weight,bias,running_mean,
/// running_var,num_batches_tracked}, layer{s}.{i}.conv1.weight, layer{s}.{i}.bn2.*, layer{s}.{i}.conv2.weight,
/// layer{s}.{0}.shortcut.weight (first block of a stage whose width or stride changes); bn.*; fc.weight,
/// fc.bias. Initialisation as ResNet (init_conv_bn). WRN-28-10 on 10 classes has 36,479,194 parameters.
class WideResNet : public nn::UnaryModule {
 public:
  /// A freshly initialised network.
  explicit WideResNet(const WideResNetOptions& options);
  /// x [N, in_channels, H, W] -> logits [N, num_classes].
  Tensor forward(const Tensor& x) override;
  /// The options it was built with.
  const WideResNetOptions& options() const { return options_; }

 private:
  WideResNetOptions options_;
  std::shared_ptr<nn::Conv2d> conv1_;
  std::vector<std::shared_ptr<nn::Sequential>> stages_;
  std::shared_ptr<nn::BatchNorm2d> bn_;
  std::shared_ptr<nn::Linear> fc_;
};

}  // namespace mp::models

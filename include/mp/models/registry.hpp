#pragma once
#include <memory>
#include <string>
#include <vector>

#include "mp/nn/module.hpp"

namespace mp::models {

/// What an image model is built for.
struct ImageModelSpec {
  int64_t in_channels = 3;   ///< channels of the input images
  int64_t image_size = 32;   ///< height = width (the MLP's input size; the conv nets take any size)
  int64_t num_classes = 10;  ///< outputs
  /// Activation layout of the convolutional nets (ResNetOptions::memory_format); the MLP ignores it.
  MemoryFormat memory_format = MemoryFormat::contiguous;
};

/// Build an image classifier by name: "mlp" (hidden 512, 512 on the flattened image), "mlp-WxL"
/// (L >= 1 hidden layers of width W >= 1: mlp-2048x2 on 1x28x28 is 784-2048-2048-10),
/// "resnet8/14/20/32/44/56/110" (He et al.'s CIFAR ResNets), "resnet18/34/50/101/152"
/// (torchvision layout with a CIFAR stem), "wrn-D-K" (Wide-ResNet, (D-4) % 6 == 0, K >= 1, e.g.
/// wrn-16-4, wrn-28-10). An unknown name throws, listing the known ones.
std::shared_ptr<nn::UnaryModule> create_image_model(const std::string& name, const ImageModelSpec& spec = {});

/// The fixed names create_image_model knows, plus common Wide-ResNets (any valid wrn-D-K and any
/// mlp-WxL work too).
std::vector<std::string> image_model_names();

/// Whether create_image_model accepts `name`.
bool is_image_model(const std::string& name);

/// The activation layout a `--memory_format` flag selects for the conv nets: "channels_last"
/// (or "nhwc"), "contiguous" (or "nchw"), or "auto" = channels_last on every device (oneDNN's bf16 kernels
/// and cuDNN's tensor-core kernels work in NHWC: no reorders around each convolution). Anything else throws
/// naming `flag`.
MemoryFormat memory_format_from_flag(const std::string& name, const char* flag = "--memory_format");

}  // namespace mp::models

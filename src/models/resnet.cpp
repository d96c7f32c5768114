// models::ResNet (torchvision layout with a CIFAR stem, and He et al.'s 6n+2 CIFAR nets), its blocks
// and the shared convolution helpers/initialisation.
#include "mp/models/resnet.hpp"

#include <algorithm>
#include <array>

#include "mp/nn/init.hpp"
#include "mp/ops/pointwise.hpp"

namespace mp::models {

std::shared_ptr<nn::Conv2d> conv3x3(int64_t in_channels, int64_t out_channels, int64_t stride) {
  return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = in_channels,
                                                        .out_channels = out_channels,
                                                        .kernel_size = {3, 3},
                                                        .stride = {stride, stride},
                                                        .padding = {1, 1},
                                                        .bias = false});
}

std::shared_ptr<nn::Conv2d> conv1x1(int64_t in_channels, int64_t out_channels, int64_t stride) {
  return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = in_channels,
                                                        .out_channels = out_channels,
                                                        .kernel_size = {1, 1},
                                                        .stride = {stride, stride},
                                                        .bias = false});
}

void init_conv_bn(nn::Module& m) {
  for (auto& [name, sub] : m.named_modules()) {
    if (auto* conv = dynamic_cast<nn::Conv2d*>(sub)) {
      nn::init::kaiming_normal_(conv->weight(),
                                {.mode = nn::init::FanMode::fan_out, .nonlinearity = nn::init::Nonlinearity::relu});
      if (conv->bias().defined()) nn::init::zeros_(conv->bias());
    } else if (auto* bn = dynamic_cast<nn::BatchNormBase*>(sub)) {
      if (bn->weight().defined()) nn::init::ones_(bn->weight());
      if (bn->bias().defined()) nn::init::zeros_(bn->bias());
    }
  }
}

namespace {

// The projection shortcut: Sequential(1x1 conv with stride, BN), named downsample.0 / downsample.1.
std::shared_ptr<nn::Sequential> projection(int64_t in_channels, int64_t out_channels, int64_t stride) {
  return std::make_shared<nn::Sequential>(conv1x1(in_channels, out_channels, stride),
                                          std::make_shared<nn::BatchNorm2d>(out_channels));
}

}  // namespace

// ---------------------------------------------------------------- blocks

BasicBlock::BasicBlock(int64_t in_planes, int64_t planes, int64_t stride) : nn::UnaryModule("BasicBlock") {
  conv1_ = register_module("conv1", conv3x3(in_planes, planes, stride));
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2_ = register_module("conv2", conv3x3(planes, planes));
  bn2_ = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  if (stride != 1 || in_planes != planes * expansion)
    downsample_ = register_module("downsample", projection(in_planes, planes * expansion, stride));
}

Tensor BasicBlock::forward(const Tensor& x) {
  const Tensor identity = downsample_ ? (*downsample_)(x) : x;
  const Tensor out = bn1_->forward_relu((*conv1_)(x));
  return bn2_->forward_add_relu((*conv2_)(out), identity);
}

Bottleneck::Bottleneck(int64_t in_planes, int64_t planes, int64_t stride) : nn::UnaryModule("Bottleneck") {
  conv1_ = register_module("conv1", conv1x1(in_planes, planes));
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  conv2_ = register_module("conv2", conv3x3(planes, planes, stride));
  bn2_ = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  conv3_ = register_module("conv3", conv1x1(planes, planes * expansion));
  bn3_ = register_module("bn3", std::make_shared<nn::BatchNorm2d>(planes * expansion));
  if (stride != 1 || in_planes != planes * expansion)
    downsample_ = register_module("downsample", projection(in_planes, planes * expansion, stride));
}

Tensor Bottleneck::forward(const Tensor& x) {
  const Tensor identity = downsample_ ? (*downsample_)(x) : x;
  Tensor out = bn1_->forward_relu((*conv1_)(x));
  out = bn2_->forward_relu((*conv2_)(out));
  return bn3_->forward_add_relu((*conv3_)(out), identity);
}

// ---------------------------------------------------------------- the network

namespace {

constexpr std::array<int64_t, 5> kTorchvisionDepths{18, 34, 50, 101, 152};

bool is_torchvision_depth(int64_t d) {
  return std::find(kTorchvisionDepths.begin(), kTorchvisionDepths.end(), d) != kTorchvisionDepths.end();
}

// Blocks per stage of a torchvision depth.
std::vector<int64_t> torchvision_blocks(int64_t depth) {
  switch (depth) {
    case 18: return {2, 2, 2, 2};
    case 34: return {3, 4, 6, 3};
    case 50: return {3, 4, 6, 3};
    case 101: return {3, 4, 23, 3};
    default: return {3, 8, 36, 3};  // 152
  }
}

// Resolve family and width, and check the depth fits the family.
ResNetOptions resolved(ResNetOptions o) {
  MP_CHECK(o.in_channels > 0 && o.num_classes > 0, "ResNet: expected positive in_channels and num_classes, got ",
           o.in_channels, " and ", o.num_classes);
  MP_CHECK(o.width >= 0, "ResNet: expected width >= 0 (0 = the family's default), got ", o.width);
  if (o.family == ResNetFamily::automatic)
    o.family = is_torchvision_depth(o.depth) ? ResNetFamily::torchvision : ResNetFamily::cifar;
  if (o.family == ResNetFamily::torchvision) {
    MP_CHECK(is_torchvision_depth(o.depth), "ResNet: the torchvision family has depths 18, 34, 50, 101, 152, got ",
             o.depth, "; use ResNetFamily::cifar for depth 6n+2 (8, 14, 20, 32, 44, 56, 110)");
    if (o.width == 0) o.width = 64;
  } else {
    MP_CHECK(o.depth >= 8 && (o.depth - 2) % 6 == 0, "ResNet: the cifar family has depths 6n+2 (8, 14, 20, 32, 44, ",
             "56, 110, ...), got ", o.depth, "; use 18, 34, 50, 101 or 152 for the torchvision family");
    if (o.width == 0) o.width = 16;
  }
  return o;
}

}  // namespace

ResNet::ResNet(const ResNetOptions& options) : nn::UnaryModule("ResNet"), options_(resolved(options)) {
  const ResNetOptions& o = options_;
  const bool tv = o.family == ResNetFamily::torchvision;
  const bool bottleneck = tv && o.depth >= 50;
  const std::vector<int64_t> blocks = tv ? torchvision_blocks(o.depth) : std::vector<int64_t>(3, (o.depth - 2) / 6);
  const int64_t expansion = bottleneck ? Bottleneck::expansion : BasicBlock::expansion;

  conv1_ = register_module("conv1", conv3x3(o.in_channels, o.width));
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(o.width));
  int64_t in_planes = o.width;
  for (size_t s = 0; s < blocks.size(); ++s) {
    const int64_t planes = o.width << s;  // width * {1, 2, 4, 8}
    const int64_t stride = s == 0 ? 1 : 2;
    auto stage = std::make_shared<nn::Sequential>();
    for (int64_t b = 0; b < blocks[s]; ++b) {
      const int64_t st = b == 0 ? stride : 1;
      if (bottleneck)
        stage->push_back(std::make_shared<Bottleneck>(in_planes, planes, st));
      else
        stage->push_back(std::make_shared<BasicBlock>(in_planes, planes, st));
      in_planes = planes * expansion;
    }
    stages_.push_back(register_module("layer" + std::to_string(s + 1), stage));
  }
  avgpool_ = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(std::array<int64_t, 2>{1, 1}));
  fc_ = register_module("fc", std::make_shared<nn::Linear>(in_planes, o.num_classes));

  init_conv_bn(*this);
  if (o.zero_init_residual) {
    for (auto& stage : stages_)
      for (size_t b = 0; b < stage->size(); ++b) {
        if (auto blk = std::dynamic_pointer_cast<BasicBlock>((*stage)[b])) nn::init::zeros_(blk->last_bn().weight());
        if (auto blk = std::dynamic_pointer_cast<Bottleneck>((*stage)[b])) nn::init::zeros_(blk->last_bn().weight());
      }
  }
}

Tensor ResNet::forward(const Tensor& x) {
  MP_CHECK(x.defined() && x.dim() == 4 && x.size(1) == options_.in_channels, "ResNet::forward: expected images [N, ",
           options_.in_channels, ", H, W], got ", x.defined() ? x.describe() : std::string("an undefined tensor"));
  const Tensor xf = x.contiguous(options_.memory_format);
  Tensor y = bn1_->forward_relu((*conv1_)(xf));
  for (auto& stage : stages_) y = (*stage)(y);
  return (*fc_)((*avgpool_)(y).flatten(1));
}

}  // namespace mp::models

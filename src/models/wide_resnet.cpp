// models::WideResNet (Zagoruyko & Komodakis 2016): pre-activation wide basic blocks.
#include "mp/models/wide_resnet.hpp"

#include "mp/models/resnet.hpp"
#include "mp/ops/pool.hpp"
#include "mp/ops/embedding.hpp"
#include "mp/ops/pointwise.hpp"

namespace mp::models {

WideBasicBlock::WideBasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride, double dropout)
    : nn::UnaryModule("WideBasicBlock"), dropout_(dropout) {
  bn1_ = register_module("bn1", std::make_shared<nn::BatchNorm2d>(in_channels));
  conv1_ = register_module("conv1", conv3x3(in_channels, out_channels, stride));
  bn2_ = register_module("bn2", std::make_shared<nn::BatchNorm2d>(out_channels));
  conv2_ = register_module("conv2", conv3x3(out_channels, out_channels));
  if (stride != 1 || in_channels != out_channels)
    shortcut_ = register_module("shortcut", conv1x1(in_channels, out_channels, stride));
}

Tensor WideBasicBlock::forward(const Tensor& x) {
  const Tensor o = bn1_->forward_relu(x);
  Tensor y = bn2_->forward_relu((*conv1_)(o));
  if (dropout_ > 0.0) y = dropout(y, dropout_, is_training());
  y = (*conv2_)(y);
  return add(y, shortcut_ ? (*shortcut_)(o) : x);
}

WideResNet::WideResNet(const WideResNetOptions& o) : nn::UnaryModule("WideResNet"), options_(o) {
  MP_CHECK(o.depth >= 10 && (o.depth - 4) % 6 == 0, "WideResNet: expected depth 6n+4 (10, 16, 22, 28, 40, ...), got ",
           o.depth);
  MP_CHECK(o.widen >= 1, "WideResNet: expected widen factor k >= 1, got ", o.widen);
  MP_CHECK(o.in_channels > 0 && o.num_classes > 0, "WideResNet: expected positive in_channels and num_classes, got ",
           o.in_channels, " and ", o.num_classes);
  MP_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, "WideResNet: expected dropout in [0, 1), got ", o.dropout);
  const int64_t n = (o.depth - 4) / 6;
  conv1_ = register_module("conv1", conv3x3(o.in_channels, 16));
  int64_t in = 16;
  for (int64_t s = 0; s < 3; ++s) {
    const int64_t width = (16 << s) * o.widen;  // 16k, 32k, 64k
    auto stage = std::make_shared<nn::Sequential>();
    for (int64_t b = 0; b < n; ++b) {
      stage->push_back(std::make_shared<WideBasicBlock>(in, width, b == 0 && s > 0 ? 2 : 1, o.dropout));
      in = width;
    }
    stages_.push_back(register_module("layer" + std::to_string(s + 1), stage));
  }
  bn_ = register_module("bn", std::make_shared<nn::BatchNorm2d>(in));
  fc_ = register_module("fc", std::make_shared<nn::Linear>(in, o.num_classes));
  init_conv_bn(*this);
}

Tensor WideResNet::forward(const Tensor& x) {
  MP_CHECK(x.defined() && x.dim() == 4 && x.size(1) == options_.in_channels,
           "WideResNet::forward: expected images [N, ", options_.in_channels, ", H, W], got ",
           x.defined() ? x.describe() : std::string("an undefined tensor"));
  Tensor y = (*conv1_)(x.contiguous(options_.memory_format));
  for (auto& stage : stages_) y = (*stage)(y);
  y = bn_->forward_relu(y);
  return (*fc_)(adaptive_avg_pool2d(y, {1, 1}).flatten(1));
}

}  // namespace mp::models

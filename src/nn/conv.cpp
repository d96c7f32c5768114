// nn::Conv2d.
#include "mp/nn/conv.hpp"

#include <cmath>
#include <sstream>

#include "mp/nn/init.hpp"

namespace mp::nn {

namespace {
std::string pair_str(const std::array<int64_t, 2>& a) {
  std::ostringstream os;
  os << "(" << a[0] << ", " << a[1] << ")";
  return os.str();
}
}  // namespace

Conv2d::Conv2d(const Conv2dOptions& o) : UnaryModule("Conv2d"), options_(o) {
  MP_CHECK(o.in_channels > 0 && o.out_channels > 0 && o.groups > 0, "Conv2d: expected positive in_channels, ",
           "out_channels and groups, got ", o.in_channels, ", ", o.out_channels, ", ", o.groups);
  MP_CHECK(o.in_channels % o.groups == 0 && o.out_channels % o.groups == 0, "Conv2d: in_channels (", o.in_channels,
           ") and out_channels (", o.out_channels, ") must be divisible by groups (", o.groups, ")");
  MP_CHECK(o.kernel_size[0] > 0 && o.kernel_size[1] > 0 && o.stride[0] > 0 && o.stride[1] > 0 && o.dilation[0] > 0 &&
               o.dilation[1] > 0 && o.padding[0] >= 0 && o.padding[1] >= 0,
           "Conv2d: expected positive kernel_size/stride/dilation and non-negative padding, got kernel_size=",
           pair_str(o.kernel_size), " stride=", pair_str(o.stride), " dilation=", pair_str(o.dilation),
           " padding=", pair_str(o.padding));
  weight_ = &register_parameter("weight",
                                empty({o.out_channels, o.in_channels / o.groups, o.kernel_size[0], o.kernel_size[1]}));
  bias_ = &register_parameter("bias", o.bias ? empty({o.out_channels}) : Tensor());
  reset_parameters();
}

void Conv2d::reset_parameters() {
  init::kaiming_uniform_(*weight_, {.a = std::sqrt(5.0)});
  if (bias_->defined()) {
    const int64_t fan_in = init::calculate_fan_in_and_fan_out(*weight_).first;
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    init::uniform_(*bias_, -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  MP_CHECK(x.dim() == 4 && x.size(1) == options_.in_channels, "Conv2d::forward: expected input [N, ",
           options_.in_channels, ", H, W], got ", x.describe());
  return conv2d(x, *weight_, *bias_,
                mp::Conv2dOptions{.stride = options_.stride,
                                  .padding = options_.padding,
                                  .dilation = options_.dilation,
                                  .groups = options_.groups});
}

std::string Conv2d::extra_repr() const {
  std::string s = std::to_string(options_.in_channels) + ", " + std::to_string(options_.out_channels) +
                  ", kernel_size=" + pair_str(options_.kernel_size) + ", stride=" + pair_str(options_.stride);
  if (options_.padding != std::array<int64_t, 2>{0, 0}) s += ", padding=" + pair_str(options_.padding);
  if (options_.dilation != std::array<int64_t, 2>{1, 1}) s += ", dilation=" + pair_str(options_.dilation);
  if (options_.groups != 1) s += ", groups=" + std::to_string(options_.groups);
  if (!options_.bias) s += ", bias=false";
  return s;
}

}  // namespace mp::nn

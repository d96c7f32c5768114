// nn::MaxPool2d, AvgPool2d, AdaptiveAvgPool2d.
#include "mp/nn/pooling.hpp"

#include <sstream>

namespace mp::nn {

namespace {

std::string pair_str(const std::array<int64_t, 2>& a) {
  std::ostringstream os;
  os << "(" << a[0] << ", " << a[1] << ")";
  return os.str();
}

void check_pool(const Pool2dOptions& o, const char* layer) {
  MP_CHECK(o.kernel[0] > 0 && o.kernel[1] > 0 && o.stride[0] >= 0 && o.stride[1] >= 0 && o.padding[0] >= 0 &&
               o.padding[1] >= 0,
           layer, ": expected a positive kernel, non-negative stride (0 = kernel) and padding, got kernel=",
           pair_str(o.kernel), " stride=", pair_str(o.stride), " padding=", pair_str(o.padding));
}

std::string pool_repr(const Pool2dOptions& o) {
  const std::array<int64_t, 2> stride{o.stride[0] ? o.stride[0] : o.kernel[0], o.stride[1] ? o.stride[1] : o.kernel[1]};
  return "kernel_size=" + pair_str(o.kernel) + ", stride=" + pair_str(stride) + ", padding=" + pair_str(o.padding) +
         (o.ceil_mode ? ", ceil_mode=true" : "");
}

}  // namespace

MaxPool2d::MaxPool2d(const Pool2dOptions& options) : UnaryModule("MaxPool2d"), options_(options) {
  check_pool(options, "MaxPool2d");
}
Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, options_); }
std::string MaxPool2d::extra_repr() const { return pool_repr(options_); }

AvgPool2d::AvgPool2d(const Pool2dOptions& options) : UnaryModule("AvgPool2d"), options_(options) {
  check_pool(options, "AvgPool2d");
}
Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, options_); }
std::string AvgPool2d::extra_repr() const { return pool_repr(options_); }

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::array<int64_t, 2> output_size)
    : UnaryModule("AdaptiveAvgPool2d"), output_size_(output_size) {
  MP_CHECK(output_size[0] > 0 && output_size[1] > 0, "AdaptiveAvgPool2d: expected a positive output size, got ",
           pair_str(output_size));
}
Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size_); }
std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + pair_str(output_size_); }

}  // namespace mp::nn

// Initialisers (torch.nn.init): draw from the seeded generator in f32, copy into the tensor.
#include "mp/nn/init.hpp"

#include <cmath>

#include "mp/autograd/node.hpp"

namespace mp::nn::init {

namespace {

// Copy src into t's elements without recording (t may be a leaf that requires grad).
Tensor fill_from(const Tensor& t, const Tensor& src) {
  autograd::NoGradGuard ng;
  Tensor h = t;
  h.copy_(src);
  return t;
}

void check_defined(const Tensor& t, const char* op) {
  MP_CHECK(t.defined(), "init::", op, ": the tensor is undefined");
  MP_CHECK(is_floating(t.dtype()), "init::", op, ": expected a floating tensor, got ", t.describe());
}

int64_t fan_of(const Tensor& t, FanMode mode, const char* op) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const int64_t fan = mode == FanMode::fan_in ? fan_in : fan_out;
  MP_CHECK(fan > 0, "init::", op, ": fan is 0 for ", t.describe(), "; initialising a tensor with no elements");
  return fan;
}

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::linear:
    case Nonlinearity::conv:
    case Nonlinearity::sigmoid: return 1.0;
    case Nonlinearity::tanh: return 5.0 / 3.0;
    case Nonlinearity::relu: return std::sqrt(2.0);
    case Nonlinearity::leaky_relu: return std::sqrt(2.0 / (1.0 + param * param));
    case Nonlinearity::selu: return 3.0 / 4.0;
  }
  return 1.0;
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  MP_CHECK(t.defined() && t.dim() >= 2, "init::calculate_fan_in_and_fan_out: needs a tensor with at least 2 dims, got ",
           t.defined() ? t.describe() : std::string("an undefined tensor"),
           "; use uniform_/normal_ with explicit bounds for vectors");
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor uniform_(const Tensor& t, double a, double b) {
  check_defined(t, "uniform_");
  MP_CHECK(a <= b, "init::uniform_: expected a <= b, got a = ", a, ", b = ", b);
  return fill_from(t, rand(t.sizes(), {.dtype = DType::f32, .device = t.device()}, a, b));
}

Tensor normal_(const Tensor& t, double mean, double std) {
  check_defined(t, "normal_");
  MP_CHECK(std >= 0.0, "init::normal_: expected std >= 0, got ", std);
  return fill_from(t, randn(t.sizes(), {.dtype = DType::f32, .device = t.device()}, mean, std));
}

Tensor constant_(const Tensor& t, double value) {
  MP_CHECK(t.defined(), "init::constant_: the tensor is undefined");
  autograd::NoGradGuard ng;
  Tensor h = t;
  h.fill_(value);
  return t;
}

Tensor zeros_(const Tensor& t) { return constant_(t, 0.0); }
Tensor ones_(const Tensor& t) { return constant_(t, 1.0); }

Tensor kaiming_uniform_(const Tensor& t, const KaimingOptions& opt) {
  check_defined(t, "kaiming_uniform_");
  const double gain = calculate_gain(opt.nonlinearity, opt.a);
  const double bound = gain * std::sqrt(3.0 / static_cast<double>(fan_of(t, opt.mode, "kaiming_uniform_")));
  return uniform_(t, -bound, bound);
}

Tensor kaiming_normal_(const Tensor& t, const KaimingOptions& opt) {
  check_defined(t, "kaiming_normal_");
  const double gain = calculate_gain(opt.nonlinearity, opt.a);
  return normal_(t, 0.0, gain / std::sqrt(static_cast<double>(fan_of(t, opt.mode, "kaiming_normal_"))));
}

Tensor xavier_uniform_(const Tensor& t, double gain) {
  check_defined(t, "xavier_uniform_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const double a = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(t, -a, a);
}

Tensor xavier_normal_(const Tensor& t, double gain) {
  check_defined(t, "xavier_normal_");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)));
}

}  // namespace mp::nn::init

// nn::Linear.
#include "mp/nn/linear.hpp"

#include <cmath>

#include "mp/nn/init.hpp"
#include "mp/ops/linalg.hpp"

namespace mp::nn {

Linear::Linear(const LinearOptions& options) : UnaryModule("Linear"), options_(options) {
  MP_CHECK(options.in_features > 0 && options.out_features > 0, "Linear: expected positive in_features and ",
           "out_features, got ", options.in_features, " and ", options.out_features);
  weight_ = &register_parameter("weight", empty({options.out_features, options.in_features}));
  bias_ = &register_parameter("bias", options.bias ? empty({options.out_features}) : Tensor());
  reset_parameters();
}

void Linear::reset_parameters() {
  init::kaiming_uniform_(*weight_, {.a = std::sqrt(5.0)});
  if (bias_->defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(options_.in_features));
    init::uniform_(*bias_, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& x) {
  MP_CHECK(x.dim() >= 1 && x.size(-1) == options_.in_features, "Linear::forward: expected input [..., ",
           options_.in_features, "], got ", x.describe());
  return linear(x, *weight_, *bias_);
}

Tensor Linear::forward_relu(const Tensor& x) {
  MP_CHECK(x.dim() >= 1 && x.size(-1) == options_.in_features, "Linear::forward_relu: expected input [..., ",
           options_.in_features, "], got ", x.describe());
  return linear_relu(x, *weight_, *bias_);
}

std::string Linear::extra_repr() const {
  return "in_features=" + std::to_string(options_.in_features) +
         ", out_features=" + std::to_string(options_.out_features) + ", bias=" + (options_.bias ? "true" : "false");
}

void Linear::tie_weight(const Tensor& w) {
  MP_CHECK(w.defined() && w.sizes() == weight().sizes(), "Linear::tie_weight: expected a tensor of the weight's shape ",
           shape_str(weight().sizes()), ", got ", w.defined() ? shape_str(w.sizes()) : std::string("undefined"));
  parameter_slot("weight") = w;
}

}  // namespace mp::nn

// nn::LayerNorm.
#include "mp/nn/layer_norm.hpp"

#include <sstream>

#include "mp/nn/init.hpp"
#include "mp/ops/norm.hpp"

namespace mp::nn {

LayerNorm::LayerNorm(const LayerNormOptions& o) : UnaryModule("LayerNorm"), options_(o) {
  MP_CHECK(!o.normalized_shape.empty() && shape_numel(o.normalized_shape) > 0,
           "LayerNorm: expected a non-empty normalized_shape with positive sizes, got ", shape_str(o.normalized_shape));
  weight_ = &register_parameter("weight", o.elementwise_affine ? empty(o.normalized_shape) : Tensor());
  bias_ = &register_parameter("bias", o.elementwise_affine && o.bias ? empty(o.normalized_shape) : Tensor());
  reset_parameters();
}

void LayerNorm::reset_parameters() {
  if (weight_->defined()) init::ones_(*weight_);
  if (bias_->defined()) init::zeros_(*bias_);
}

Tensor LayerNorm::forward(const Tensor& x) {
  return layer_norm(x, options_.normalized_shape, *weight_, *bias_, options_.eps);
}

std::string LayerNorm::extra_repr() const {
  std::ostringstream os;
  os << shape_str(options_.normalized_shape) << ", eps=" << options_.eps
     << ", elementwise_affine=" << (options_.elementwise_affine ? "true" : "false");
  return os.str();
}

}  // namespace mp::nn

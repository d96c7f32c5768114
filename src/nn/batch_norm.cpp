// nn::BatchNorm1d / BatchNorm2d.
#include "mp/nn/batch_norm.hpp"

#include <algorithm>
#include <sstream>

#include "mp/autograd/node.hpp"
#include "mp/nn/init.hpp"
#include "mp/ops/norm.hpp"
#include "mp/ops/pointwise.hpp"

namespace mp::nn {

BatchNormBase::BatchNormBase(std::string type_name, const BatchNormOptions& o, std::vector<int64_t> input_dims)
    : UnaryModule(std::move(type_name)), options_(o), input_dims_(std::move(input_dims)) {
  MP_CHECK(o.num_features > 0, this->type_name(), ": expected num_features > 0, got ", o.num_features);
  MP_CHECK(o.eps >= 0.0, this->type_name(), ": expected eps >= 0, got ", o.eps);
  MP_CHECK(!o.momentum || (*o.momentum >= 0.0 && *o.momentum <= 1.0), this->type_name(),
           ": expected momentum in [0, 1] (or nullopt for a cumulative average), got ", o.momentum.value_or(0.0));
  const int64_t C = o.num_features;
  weight_ = &register_parameter("weight", o.affine ? empty({C}) : Tensor());
  bias_ = &register_parameter("bias", o.affine ? empty({C}) : Tensor());
  running_mean_ = &register_buffer("running_mean", o.track_running_stats ? empty({C}) : Tensor());
  running_var_ = &register_buffer("running_var", o.track_running_stats ? empty({C}) : Tensor());
  num_batches_tracked_ =
      &register_buffer("num_batches_tracked", o.track_running_stats ? zeros({}, {.dtype = DType::i64}) : Tensor());
  reset_parameters();
}

void BatchNormBase::reset_running_stats() {
  if (!options_.track_running_stats) return;
  init::zeros_(*running_mean_);
  init::ones_(*running_var_);
  init::zeros_(*num_batches_tracked_);
}

void BatchNormBase::reset_parameters() {
  reset_running_stats();
  if (options_.affine) {
    init::ones_(*weight_);
    init::zeros_(*bias_);
  }
}

Tensor BatchNormBase::forward(const Tensor& x) { return forward_fused(x, Tensor(), false); }

// With forward hooks (amp diagnostics, a user's probe), the hooks see this module's own output: not fused.
Tensor BatchNormBase::forward_relu(const Tensor& x) {
  if (has_forward_hooks()) return relu((*this)(x));
  return forward_fused(x, Tensor(), true);
}

Tensor BatchNormBase::forward_add_relu(const Tensor& x, const Tensor& residual) {
  MP_CHECK(residual.defined(), type_name(), "::forward_add_relu: got an undefined residual");
  if (has_forward_hooks()) return relu(add((*this)(x), residual));
  return forward_fused(x, residual, true);
}

Tensor BatchNormBase::forward_fused(const Tensor& x, const Tensor& residual, bool relu) {
  MP_CHECK(std::find(input_dims_.begin(), input_dims_.end(), x.dim()) != input_dims_.end(), type_name(),
           "::forward: expected a ", input_dims_.front(), input_dims_.size() > 1 ? "-D or " : "-D",
           input_dims_.size() > 1 ? std::to_string(input_dims_.back()) + "-D" : std::string(), " input, got ",
           x.describe());
  MP_CHECK(x.size(1) == options_.num_features, type_name(), "::forward: expected ", options_.num_features,
           " channels in dim 1, got ", x.describe());
  double factor = options_.momentum.value_or(0.0);
  const bool update = is_training() && options_.track_running_stats;
  if (update) {
    autograd::NoGradGuard ng;
    if (options_.momentum) {
      // Counted on the buffer's device: no read back (on a GPU, a read is a host synchronisation per layer).
      num_batches_tracked_->copy_(add(*num_batches_tracked_, 1.0));
    } else {
      const int64_t n = num_batches_tracked_->item<int64_t>() + 1;
      num_batches_tracked_->fill_(static_cast<double>(n));
      factor = 1.0 / static_cast<double>(n);  // cumulative moving average
    }
  }
  // Running statistics are used in eval mode only when tracked (else batch statistics, as PyTorch).
  const bool batch_stats = is_training() || !options_.track_running_stats;
  if (residual.defined())
    return batch_norm_add_relu(x, residual, *running_mean_, *running_var_, *weight_, *bias_, batch_stats, factor,
                               options_.eps);
  if (relu)
    return batch_norm_relu(x, *running_mean_, *running_var_, *weight_, *bias_, batch_stats, factor, options_.eps);
  return batch_norm(x, *running_mean_, *running_var_, *weight_, *bias_, batch_stats, factor, options_.eps);
}

std::string BatchNormBase::extra_repr() const {
  std::ostringstream os;
  os << options_.num_features << ", eps=" << options_.eps << ", momentum=";
  if (options_.momentum) {
    os << *options_.momentum;
  } else {
    os << "None";
  }
  os << ", affine=" << (options_.affine ? "true" : "false")
     << ", track_running_stats=" << (options_.track_running_stats ? "true" : "false");
  return os.str();
}

bool is_batch_norm(const Module& m) { return dynamic_cast<const BatchNormBase*>(&m) != nullptr; }

}  // namespace mp::nn

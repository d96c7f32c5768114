#pragma once
#include "mp/optim/optimizer.hpp"

namespace mp::optim {

/// Options of SGD (PyTorch's torch.optim.SGD defaults).
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  ///< L2 penalty added to the gradient
  bool nesterov = false;      ///< needs momentum > 0 and dampening = 0
};

/// {"lr", "momentum", "dampening", "weight_decay", "nesterov"}.
OptionsMap to_options_map(const SGDOptions& o);
/// Overwrite the fields named in m (unknown names throw).
void from_options_map(SGDOptions& o, const OptionsMap& m);
/// Throw on negative rates or nesterov without momentum.
void validate_options(const SGDOptions& o);

/// Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay, in
/// PyTorch's exact order: g += wd w; buf = momentum buf + (1 - dampening) g (buf = g on the first
/// step); g = nesterov ? g + momentum buf : buf; w -= lr g. State: "momentum_buffer" (f32).
class SGD : public OptimizerWith<SGDOptions> {
 public:
  /// One group with `options`.
  explicit SGD(std::vector<Tensor> params, const SGDOptions& options = {})
      : SGD(std::vector<ParamGroup<SGDOptions>>{{std::move(params), options}}, options) {}
  /// Several groups; `defaults` is what add_param_group(params) uses later.
  SGD(std::vector<ParamGroup<SGDOptions>> groups, const SGDOptions& defaults)
      : OptimizerWith("SGD", std::move(groups), defaults) {}
  /// One update of every parameter with a gradient.
  void step() override;
};

}  // namespace mp::optim

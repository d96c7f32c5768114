#pragma once
#include <array>

#include "mp/optim/optimizer.hpp"

namespace mp::optim {

/// Options of Adam (PyTorch's torch.optim.Adam defaults).
struct AdamOptions {
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};  ///< decay of the first and second moment estimates
  double eps = 1e-8;                        ///< added to the denominator
  double weight_decay = 0.0;                ///< L2 penalty added to the gradient
  bool amsgrad = false;                     ///< use the running maximum of the second moment
};

/// Options of AdamW (PyTorch's torch.optim.AdamW defaults: weight_decay 1e-2, decoupled).
struct AdamWOptions {
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;  ///< decoupled: w *= 1 - lr * weight_decay before the Adam step
  bool amsgrad = false;
};

/// {"lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad"}.
OptionsMap to_options_map(const AdamOptions& o);
/// Overwrite the fields named in m (unknown names throw).
void from_options_map(AdamOptions& o, const OptionsMap& m);
/// Throw on betas outside [0, 1), negative lr/eps/weight_decay.
void validate_options(const AdamOptions& o);
/// As for AdamOptions.
OptionsMap to_options_map(const AdamWOptions& o);
/// As for AdamOptions.
void from_options_map(AdamWOptions& o, const OptionsMap& m);
/// As for AdamOptions.
void validate_options(const AdamWOptions& o);

namespace detail {
/// The Adam/AdamW update loop, shared by both (they differ in options defaults and `decoupled`).
template <class Options>
class AdamBase : public OptimizerWith<Options> {
 public:
  /// One update of every parameter with a gradient.
  void step() override;

 protected:
  AdamBase(const char* name, std::vector<ParamGroup<Options>> groups, const Options& defaults, bool decoupled)
      : OptimizerWith<Options>(name, std::move(groups), defaults), decoupled_(decoupled) {}
  bool decoupled_;
};
extern template class AdamBase<AdamOptions>;
extern template class AdamBase<AdamWOptions>;
}  // namespace detail

/// Adam (Kingma & Ba) with bias correction, L2 weight decay added to the gradient and optional
/// AMSGrad, in PyTorch's order. State per parameter: step, "exp_avg", "exp_avg_sq" and
/// "max_exp_avg_sq" (amsgrad), f32.
class Adam : public detail::AdamBase<AdamOptions> {
 public:
  /// One group with `options`.
  explicit Adam(std::vector<Tensor> params, const AdamOptions& options = {})
      : Adam(std::vector<ParamGroup<AdamOptions>>{{std::move(params), options}}, options) {}
  /// Several groups; `defaults` is what add_param_group(params) uses later.
  Adam(std::vector<ParamGroup<AdamOptions>> groups, const AdamOptions& defaults)
      : AdamBase("Adam", std::move(groups), defaults, false) {}
};

/// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay w *= 1 - lr * wd.
class AdamW : public detail::AdamBase<AdamWOptions> {
 public:
  /// One group with `options`.
  explicit AdamW(std::vector<Tensor> params, const AdamWOptions& options = {})
      : AdamW(std::vector<ParamGroup<AdamWOptions>>{{std::move(params), options}}, options) {}
  /// Several groups; `defaults` is what add_param_group(params) uses later.
  AdamW(std::vector<ParamGroup<AdamWOptions>> groups, const AdamWOptions& defaults)
      : AdamBase("AdamW", std::move(groups), defaults, true) {}
};

}  // namespace mp::optim

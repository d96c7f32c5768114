// optim::Adam and AdamW: options and the per-parameter loop over the fused kernel.
#include "mp/optim/adam.hpp"

#include "backend/optim_kernels.hpp"
#include "mp/autograd/node.hpp"

namespace mp::optim {

namespace {

template <class O>
OptionsMap adam_to_map(const O& o) {
  return {{"lr", o.lr},
          {"beta1", o.betas[0]},
          {"beta2", o.betas[1]},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"amsgrad", o.amsgrad ? 1.0 : 0.0}};
}

template <class O>
void adam_from_map(O& o, const OptionsMap& m, const char* name) {
  detail::check_option_keys(m, {"lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad"}, name);
  detail::read_option(m, "lr", o.lr);
  detail::read_option(m, "beta1", o.betas[0]);
  detail::read_option(m, "beta2", o.betas[1]);
  detail::read_option(m, "eps", o.eps);
  detail::read_option(m, "weight_decay", o.weight_decay);
  detail::read_option(m, "amsgrad", o.amsgrad);
}

template <class O>
void adam_validate(const O& o, const char* name) {
  MP_CHECK(o.lr >= 0.0, name, ": expected lr >= 0, got ", o.lr);
  MP_CHECK(o.eps >= 0.0, name, ": expected eps >= 0, got ", o.eps);
  MP_CHECK(o.betas[0] >= 0.0 && o.betas[0] < 1.0 && o.betas[1] >= 0.0 && o.betas[1] < 1.0, name,
           ": expected betas in [0, 1), got (", o.betas[0], ", ", o.betas[1], ")");
  MP_CHECK(o.weight_decay >= 0.0, name, ": expected weight_decay >= 0, got ", o.weight_decay);
}

}  // namespace

OptionsMap to_options_map(const AdamOptions& o) { return adam_to_map(o); }
void from_options_map(AdamOptions& o, const OptionsMap& m) { adam_from_map(o, m, "Adam"); }
void validate_options(const AdamOptions& o) { adam_validate(o, "Adam"); }
OptionsMap to_options_map(const AdamWOptions& o) { return adam_to_map(o); }
void from_options_map(AdamWOptions& o, const OptionsMap& m) { adam_from_map(o, m, "AdamW"); }
void validate_options(const AdamWOptions& o) { adam_validate(o, "AdamW"); }

namespace detail {

template <class Options>
void AdamBase<Options>::step() {
  autograd::NoGradGuard ng;
  std::vector<backend::AdamStepItem> items;
  std::vector<Tensor> params;
  size_t t = 0;  // p's index in parameters()
  for (const auto& group : this->groups_) {
    const Options& o = group.options;
    for (const Tensor& p : group.params) {
      const size_t index = t++;
      const Tensor g = this->grad_for_step(p, this->name_);
      if (!g.defined()) continue;
      ParamState& st = this->state_for(p);
      backend::AdamStepItem it{.param = this->update_target(p),
                               .grad = g,
                               .exp_avg = this->state_buffer(st, p, "exp_avg"),
                               .exp_avg_sq = this->state_buffer(st, p, "exp_avg_sq")};
      if (o.amsgrad) it.max_exp_avg_sq = this->state_buffer(st, p, "max_exp_avg_sq");
      it.master = this->master_for_step(st, p);
      ++st.step;
      it.p = {.lr = o.lr,
              .beta1 = o.betas[0],
              .beta2 = o.betas[1],
              .eps = o.eps,
              .weight_decay = o.weight_decay,
              .decoupled_weight_decay = decoupled_,
              .amsgrad = o.amsgrad,
              .step = st.step,
              .grad_scale_inv = this->grad_scale_inv(),
              .rounding = this->rounding_for(st.step, index)};
      items.push_back(std::move(it));
      params.push_back(p);
    }
  }
  this->update_all(items, params, backend::adam_step_kernel);
}

template class AdamBase<AdamOptions>;
template class AdamBase<AdamWOptions>;

}  // namespace detail

}  // namespace mp::optim

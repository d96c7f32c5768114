// optim::SGD: options and the per-parameter loop over the fused kernel.
#include "mp/optim/sgd.hpp"

#include "backend/optim_kernels.hpp"
#include "mp/autograd/node.hpp"

namespace mp::optim {

OptionsMap to_options_map(const SGDOptions& o) {
  return {{"lr", o.lr},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"weight_decay", o.weight_decay},
          {"nesterov", o.nesterov ? 1.0 : 0.0}};
}

void from_options_map(SGDOptions& o, const OptionsMap& m) {
  detail::check_option_keys(m, {"lr", "momentum", "dampening", "weight_decay", "nesterov"}, "SGD");
  detail::read_option(m, "lr", o.lr);
  detail::read_option(m, "momentum", o.momentum);
  detail::read_option(m, "dampening", o.dampening);
  detail::read_option(m, "weight_decay", o.weight_decay);
  detail::read_option(m, "nesterov", o.nesterov);
}

void validate_options(const SGDOptions& o) {
  MP_CHECK(o.lr >= 0.0, "SGD: expected lr >= 0, got ", o.lr);
  MP_CHECK(o.momentum >= 0.0, "SGD: expected momentum >= 0, got ", o.momentum);
  MP_CHECK(o.weight_decay >= 0.0, "SGD: expected weight_decay >= 0, got ", o.weight_decay);
  MP_CHECK(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0),
           "SGD: nesterov momentum requires momentum > 0 and dampening = 0, got momentum = ", o.momentum,
           ", dampening = ", o.dampening);
}

void SGD::step() {
  autograd::NoGradGuard ng;
  std::vector<backend::SgdStepItem> items;
  std::vector<Tensor> params;
  size_t t = 0;  // p's index in parameters()
  for (const auto& group : groups_) {
    const SGDOptions& o = group.options;
    for (const Tensor& p : group.params) {
      const size_t index = t++;
      const Tensor g = grad_for_step(p, "SGD");
      if (!g.defined()) continue;
      ParamState& st = state_for(p);
      backend::SgdStepItem it{.param = update_target(p),
                              .grad = g,
                              .p = {.lr = o.lr,
                                    .momentum = o.momentum,
                                    .dampening = o.dampening,
                                    .weight_decay = o.weight_decay,
                                    .nesterov = o.nesterov,
                                    .grad_scale_inv = grad_scale_inv()}};
      if (o.momentum != 0.0) it.momentum_buffer = state_buffer(st, p, "momentum_buffer", &it.p.first_step);
      it.master = master_for_step(st, p);
      ++st.step;
      it.p.rounding = rounding_for(st.step, index);
      items.push_back(std::move(it));
      params.push_back(p);
    }
  }
  update_all(items, params, backend::sgd_step_kernel);
}

}  // namespace mp::optim

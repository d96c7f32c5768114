// The parts of a run built from its config, shared by the image trainer, the word-LM trainer and
// `mixprec bench step` (mp/train/run_parts.hpp).
#include "mp/train/run_parts.hpp"

#include <utility>

#include "mp/amp/grad_scaler.hpp"
#include "mp/models/gpt.hpp"
#include "mp/optim/optim.hpp"

namespace mp::train {

TrainConfig with_task_defaults(const TrainConfig& in) {
  TrainConfig c = in;
  const bool text = is_text_task(c);
  const bool gpt = text && models::is_gpt_model(c.model);  // nanoGPT's recipe: AdamW, decay 0.1, clip 1
  if (c.optimizer.empty()) c.optimizer = gpt ? "adamw" : "sgd";
  if (c.lr == 0) c.lr = c.optimizer == "sgd" ? (text ? 20.0 : 0.1) : 1e-3;
  if (c.momentum < 0) c.momentum = text ? 0.0 : 0.9;
  if (c.weight_decay < 0) c.weight_decay = gpt ? 0.1 : text ? 0.0 : 5e-4;
  if (c.clip_grad_norm < 0) c.clip_grad_norm = gpt ? 1.0 : text ? 0.25 : 0.0;
  if (!c.opt_level) c.opt_level = c.precision == DType::f32 ? amp::OptLevel::O0 : amp::OptLevel::O2;
  return c;
}

amp::AmpOptions amp_options(const TrainConfig& c) {
  amp::AmpOptions o;
  o.opt_level = c.precision == DType::f32 ? amp::OptLevel::O0 : c.opt_level.value_or(amp::OptLevel::O2);
  o.dtype = c.precision == DType::f16 ? DType::f16 : DType::bf16;
  o.loss_scale = c.loss_scale;
  o.keep_batchnorm_fp32 = c.keep_batchnorm_fp32;
  o.master_weights = c.master_weights;
  o.stochastic_rounding = c.stochastic_rounding;
  o.rounding_seed = c.seed;
  // The scaler's settings (resolve() sets enabled/dynamic, and a static scale's value, from the loss scale);
  // validate() refuses the dynamic scale's where no dynamic scaling runs, the static scale's where none runs.
  o.scaler.init_scale = c.init_scale;
  o.scaler.growth_factor = c.growth_factor;
  o.scaler.backoff_factor = c.backoff_factor;
  o.scaler.growth_interval = c.growth_interval;
  o.scaler.hysteresis = c.hysteresis;
  o.scaler.min_scale = c.min_scale;
  o.scaler.max_scale = c.max_scale;
  o.scaler.max_overflows_at_min_scale = c.max_overflows_at_min_scale;
  o.scaler.max_consecutive_skips = c.max_consecutive_skips;
  return o;
}

models::GptOptions gpt_run_options(const TrainConfig& c, int64_t vocab) {
  models::GptOptions o = models::gpt_preset(c.model, vocab);
  if (c.context > 0) o.block_size = c.context;
  o.dropout = c.dropout;
  return o;
}

namespace {

// One group with the config's weight decay, or (--no-decay_norm_and_bias) two: the parameters of two or
// more dimensions with it, the 1-dim ones (biases, norm scales and shifts) without. Empty groups are left
// out, so a model without 1-dim parameters keeps one group.
template <class Opt, class Options>
std::unique_ptr<optim::Optimizer> grouped(const TrainConfig& c, std::vector<Tensor> params, Options o) {
  if (c.decay_norm_and_bias || o.weight_decay == 0) return std::make_unique<Opt>(std::move(params), o);
  std::vector<optim::ParamGroup<Options>> groups(2);
  for (Tensor& p : params) groups[p.dim() <= 1 ? 1 : 0].params.push_back(std::move(p));
  groups[0].options = o;
  groups[1].options = o;
  groups[1].options.weight_decay = 0;
  std::erase_if(groups, [](const auto& g) { return g.params.empty(); });
  return std::make_unique<Opt>(std::move(groups), o);
}

}  // namespace

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<Tensor> params) {
  if (c.optimizer == "sgd")
    return grouped<optim::SGD>(
        c, std::move(params),
        optim::SGDOptions{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay, .nesterov = c.nesterov});
  if (c.optimizer == "adam")
    return grouped<optim::Adam>(c, std::move(params), optim::AdamOptions{.lr = c.lr, .weight_decay = c.weight_decay});
  return grouped<optim::AdamW>(c, std::move(params), optim::AdamWOptions{.lr = c.lr, .weight_decay = c.weight_decay});
}

}  // namespace mp::train

#pragma once
// The parts of a training run built from its TrainConfig: the task defaults, the optimizer, the AMP
// options and the forward pass's autocast scope. The image trainer, the word-LM trainer and `mixprec bench
// step` all build their runs with these, so one flag means one thing everywhere.
#include <memory>
#include <optional>
#include <vector>

#include "mp/autocast/autocast.hpp"
#include "mp/amp/initialize.hpp"
#include "mp/models/gpt.hpp"
#include "mp/optim/optimizer.hpp"
#include "mp/train/trainer.hpp"

namespace mp::train {

/// The config with every "task default" (-1 / 0) replaced by its value for this task (image or text).
TrainConfig with_task_defaults(const TrainConfig& c);
/// The amp options the config asks for (not yet resolved).
amp::AmpOptions amp_options(const TrainConfig& c);
/// The sizes of a gpt model of the config (--model's preset, --context, --dropout) over a vocabulary of `vocab`.
models::GptOptions gpt_run_options(const TrainConfig& c, int64_t vocab);
/// The optimizer of the config (after with_task_defaults) over `params`.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<Tensor> params);

/// O1: an Autocast region for the forward pass; other levels: nothing.
class ForwardScope {
 public:
  explicit ForwardScope(const amp::AmpOptions& o) {
    if (o.opt_level == amp::OptLevel::O1) guard_.emplace(amp::AutocastOptions{.dtype = o.dtype});
  }

 private:
  std::optional<amp::Autocast> guard_;
};

}  // namespace mp::train

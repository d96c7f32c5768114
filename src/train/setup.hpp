#pragma once
// Internal pieces shared by the image and text training loops (src/train/trainer.cpp, lm_trainer.cpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "mp/autocast/autocast.hpp"
#include "mp/amp/grad_scaler.hpp"
#include "mp/amp/initialize.hpp"
#include "mp/optim/ema.hpp"
#include "mp/optim/lr_scheduler.hpp"
#include "mp/optim/optimizer.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/train/run_log.hpp"
#include "mp/train/run_parts.hpp"
#include "mp/train/trainer.hpp"
#include "train/data_parallel.hpp"

namespace mp::train::detail {

using Clock = std::chrono::steady_clock;

/// Seconds since t0.
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// The LR schedule (warm-up + decay) over `steps_per_epoch * epochs` steps.
std::unique_ptr<optim::WarmupSchedule> make_schedule(const TrainConfig& c, optim::Optimizer& opt,
                                                     int64_t steps_per_epoch);
/// The checkpoint file of a config ("" when checkpointing is off).
std::string checkpoint_path(const TrainConfig& c);
/// Whether progress bars should redraw in place (stdout is a terminal and `out` is std::cout).
bool out_is_tty(const std::ostream& out);

/// Perplexity of a mean loss per token, capped so a diverged run prints a number instead of overflowing.
inline double perplexity(double loss) { return std::exp(std::min(loss, 700.0)); }

/// Exponential moving average of the loss for the progress bar.
struct LossEma {
  double value = 0;
  bool started = false;
  void add(double v) {
    if (!std::isfinite(v)) return;
    value = started ? 0.95 * value + 0.05 * v : v;
    started = true;
  }
};

/// What a model trains with: its optimizer, resolved opt level, loss scaler, parameters (as the opt level left
/// them) and weight averages (--ema_decay > 0; else null).
struct TrainObjects {
  std::unique_ptr<optim::Optimizer> optimizer;
  amp::AmpOptions amp;
  std::unique_ptr<amp::GradScaler> scaler;
  std::vector<Tensor> params;
  std::unique_ptr<optim::ModelEma> ema;
};
/// Every trainer's set-up of a freshly built f32 model (initialised on the host, so every device starts from the
/// same weights): moved to `dev`, --init_from loaded, rank 0's weights broadcast, then the optimizer, the opt level
/// (amp::prepare) and the averages, which start from the training weights. The caller applies the level's casting
/// around its forward (amp::AmpModel for a one-tensor forward).
TrainObjects prepare_training(const TrainConfig& c, nn::Module& model, Device dev, const DataParallel& dp,
                              std::ostream& out);
/// Train an image classifier on the ranks of `dp` (trainer.cpp).
RunSummary train_images(const TrainConfig& c, std::ostream& out, const DataParallel& dp);
/// Train a word language model on the ranks of `dp` (lm_trainer.cpp).
RunSummary train_text(const TrainConfig& c, std::ostream& out, const DataParallel& dp);
/// Train a GPT on BPE tokens on the ranks of `dp` (gpt_trainer.cpp, Note [GPT training data]).
RunSummary train_gpt(const TrainConfig& c, std::ostream& out, const DataParallel& dp);
/// Evaluate a checkpoint of a gpt run (`path`, its `metadata` holding the tokenizer) on "valid" or "test".
EvalResult evaluate_gpt_checkpoint(const TrainConfig& c, const nn::StateDict& weights,
                                   const std::map<std::string, std::string>& metadata, const std::string& path,
                                   const std::string& split, std::ostream& out);
/// Evaluate a checkpoint of an image run (trainer.cpp).
EvalResult evaluate_images(const TrainConfig& c, const nn::StateDict& weights, std::ostream& out);
/// Evaluate a checkpoint of a text run on "valid" or "test" (lm_trainer.cpp).
EvalResult evaluate_text(const TrainConfig& c, const nn::StateDict& weights, const std::string& split,
                         std::ostream& out);
/// Convert a freshly built f32 model for evaluation at the config's opt level (O2/O3: 16-bit, batch
/// norm f32 for O2) and return the resolved amp options. With --auto_precision, the modules whose 16-bit parameters
/// `weights` (what will be loaded) hold in f32 stay f32: the layers the run moved (Note [automatic precision]).
amp::AmpOptions convert_for_eval(const TrainConfig& c, nn::Module& model, const nn::StateDict& weights);
/// Throws listing the differences (StateDictDiff::describe) when `weights` do not fit `model` by name and shape.
void check_weights_fit(const TrainConfig& c, const nn::Module& model, const nn::StateDict& weights);
/// --init_from: load the file's weights into the freshly built (f32, on its device) model before the optimizer and
/// the opt level see it, so masters and averages start from them; says what was loaded on `out` (trainer.cpp).
void apply_init_from(const TrainConfig& c, nn::Module& model, std::ostream& out);

}  // namespace mp::train::detail

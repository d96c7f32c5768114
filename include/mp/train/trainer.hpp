#pragma once
// The training loop behind `mixprec train` and `mixprec compare`: an image classifier or a word
// language model, in any precision and opt level, with a threaded loader, loss scaling, LR warm-up,
// checkpoints with exact resume, a JSONL run log and a progress bar. Its settings: mp/train/config.hpp.
#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "mp/train/config.hpp"
#include "mp/core/device.hpp"
#include "mp/kernel_paths.hpp"

namespace mp::train {

/// Per-epoch statistics.
struct EpochStats {
  int64_t epoch = 0;                                   ///< 1-based
  double train_loss = 0;                               ///< mean over the epoch's steps (skipped steps included)
  double val_loss = 0;                                 ///< mean loss on the evaluation split
  double val_metric = 0;                               ///< accuracy in [0,1] (images) or perplexity (text)
  std::optional<double> ema_val_loss, ema_val_metric;  ///< the same for the weight averages (--ema_decay)
  double seconds = 0;                                  ///< training time of the epoch (no evaluation)
  double data_wait_seconds = 0;                        ///< time the loop waited for batches
};

/// What a run reports at the end.
struct RunSummary {
  std::string label;             ///< run_label(config)
  TrainConfig config;            ///< what ran
  std::string metric_name;       ///< "accuracy" or "perplexity"
  double train_seconds = 0;      ///< training steps only, this process (a resumed run: since resume)
  double eval_seconds = 0;       ///< evaluation passes
  double data_wait_seconds = 0;  ///< time the training loop waited for data
  int64_t peak_bytes = 0;        ///< peak tensor memory of the run above what was live before the model
  int64_t steps = 0;             ///< optimizer steps attempted (this process; grad_accum batches each)
  int64_t skipped_steps = 0;     ///< steps skipped for inf/NaN gradients (whole run)
  double final_loss_scale = 1;   ///< loss scale at the end (1 when scaling is off)
  double val_loss = 0;           ///< last evaluation
  double val_metric = 0;         ///< last evaluation's accuracy or perplexity
  std::optional<double> ema_val_loss, ema_val_metric;  ///< last evaluation of the weight averages (--ema_decay)
  int64_t best_epoch = 0;                              ///< the epoch (1-based) with the best evaluation so far, resumed
                                                       ///< processes included (0 = none yet)
  double best_val_metric = 0;       ///< its accuracy (highest) or perplexity (lowest); with --ema_decay
                                    ///< that of the weight averages
  std::string best_checkpoint;      ///< --save_best: best.safetensors when it holds that epoch (empty if not)
  double throughput = 0;            ///< images or tokens per second of training
  std::string throughput_unit;      ///< "img/s" or "tok/s"
  std::vector<EpochStats> epochs;   ///< per epoch run in this process
  std::vector<double> step_losses;  ///< every step's loss, in order (for curves)
  bool diverged = false;            ///< without loss scaling, a loss or gradient became inf/NaN: training stopped
                                    ///< before that step's update (with scaling such steps are skipped)
  std::string numerical_failure;    ///< when diverged: what happened, the first non-finite module, the
                                    ///< last-good checkpoint and what to try (the CLI's message)
  std::string last_good_file;       ///< the last-good state written when the run failed numerically (empty:
                                    ///< none; Note [stopping on a numerical failure] in src/train/train_loop.cpp)
  bool stopped_early = false;       ///< stop_after_steps or request_stop() ended the run (a checkpoint
                                    ///< holds the position when there is a checkpoint directory)
  bool interrupted = false;         ///< request_stop() ended it (the CLI's SIGINT/SIGTERM handler)
  KernelPathRecord kernel_paths;    ///< the 16-bit CPU kernel paths chosen so far in this process, and the
                                    ///< counters of how (measured, cache, record) during this run
};

/// Ask a running train() to stop after its current step, checkpointing there as stop_after_steps does (when it
/// has a checkpoint directory), so that `--resume` continues exactly. Async-signal-safe (it sets a lock-free
/// atomic flag): `mixprec train` calls it from its SIGINT/SIGTERM handler. The request stands until
/// clear_stop_request(); every train() that runs meanwhile stops after its first step.
void request_stop() noexcept;
/// Withdraw a request_stop().
void clear_stop_request() noexcept;

/// Run training as configured, printing progress to `out` (unless quiet). Throws mp::Error for bad
/// configs, missing data or damaged checkpoints.
RunSummary train(const TrainConfig& config, std::ostream& out);

/// Result of evaluate_checkpoint.
struct EvalResult {
  std::string metric_name;  ///< "accuracy" or "perplexity"
  double loss = 0;          ///< mean loss
  double metric = 0;        ///< accuracy in [0,1] or perplexity
  int64_t examples = 0;     ///< images or tokens evaluated
  double seconds = 0;       ///< wall time
};

/// What `mixprec eval` may change: the fields named in `given` (among eval_override_fields()), with their values
/// in `values`.
struct EvalOverrides {
  TrainConfig values;
  std::set<std::string> given;
};
/// The fields an evaluation may override: model (only to name a bare state dict's model), dataset, data_dir,
/// precision, opt_level, eval_batch_size, num_workers, device.
const std::vector<std::string>& eval_override_fields();

/// Load a checkpoint written by train() (its config tells the model and dataset) or a bare state dict (PyTorch's,
/// or `mixprec export`'s; overrides name its model and dataset) and evaluate it on the dataset's test split
/// (`split` = "test" or "valid"; images have only test). A new precision without an opt level takes that
/// precision's default level; a new precision or level drops the trained run's O2/O3 properties. `ema`: evaluate
/// the checkpoint's weight averages (--ema_decay) instead of the model's weights.
EvalResult evaluate_checkpoint(const std::string& path, const std::string& split, const EvalOverrides* overrides,
                               std::ostream& out, bool ema = false);

/// A RunSummary as a JSON object string (the per-run part of `mixprec compare`'s JSON).
std::string summary_to_json(const RunSummary& s);

}  // namespace mp::train

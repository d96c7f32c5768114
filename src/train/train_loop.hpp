#pragma once
// What the image and the text training loops share around their model-specific forward pass.
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mp/amp/auto_precision.hpp"
#include "mp/amp/grad_scaler.hpp"
#include "mp/amp/telemetry.hpp"
#include "mp/optim/lr_scheduler.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/train/progress.hpp"
#include "mp/train/run_log.hpp"
#include "mp/train/trainer.hpp"
#include "train/data_parallel.hpp"
#include "train/setup.hpp"

namespace mp::train::detail {

/// A replay of one batch's forward pass and loss for the overflow finder: `loss_of` computes the loss from
/// inputs it holds; the replay first puts the random generator (dropout) back where it stands now, so call
/// this before the forward pass that `loss_of` repeats.
std::function<Tensor()> replayable(std::function<Tensor()> loss_of);

/// The optimizer step with loss scaling, gradient accumulation, clipping and the LR schedule; per-step
/// records (loss curve, run log, progress bar); periodic and stop-after checkpoints; per-epoch records
/// and checkpoints; and the summary's totals. Usage per epoch: begin_epoch, step() per batch while it
/// returns true, end_training; then, if it returned true, evaluate and end_epoch. A "step" is an
/// optimizer step of c.grad_accum batches (Note [gradient accumulation]); batch indices and checkpoint
/// positions count batches.
class TrainLoop {
 public:
  /// The live objects of a run.
  struct Parts {
    amp::GradScaler& scaler;
    optim::Optimizer& optimizer;
    optim::LRScheduler& scheduler;
    std::vector<Tensor> params;        ///< clipped when clip_grad_norm > 0
    CheckpointRefs refs;               ///< what checkpoints save
    const DataParallel* dp = nullptr;  ///< the ranks of a data-parallel run (Note [data-parallel training]); null: one
    std::map<std::string, std::string> metadata;  ///< what every checkpoint carries besides (a gpt's tokenizer)
  };
  /// `start` is where the run resumes; `baseline` the allocated bytes before the model was built;
  /// `resumed` the metadata of the checkpoint it resumes from (empty for a fresh run), which carries the
  /// statistics of an epoch interrupted mid-way (Note [resumed epoch statistics]) and the config it was
  /// written with (a resume inside an optimizer step is refused; other changed settings are reported).
  TrainLoop(const TrainConfig& c, RunSummary& sum, Parts parts, const Progress& start, int64_t baseline,
            std::ostream& out, const std::map<std::string, std::string>& resumed = {});

  /// Start epoch `epoch` (0-based) at batch `first` of `batches` (a multiple of c.grad_accum).
  void begin_epoch(int64_t epoch, int64_t first, int64_t batches);
  /// Backward of `loss` / grad_accum (scaled). On the last batch of an optimizer step: clip, optimizer
  /// step (skipped on inf/NaN), zero the gradients, scale update, schedule step; then the step's records.
  /// `batch` is the batch index within the epoch, `units` its images or tokens, `data_wait` the epoch's
  /// data wait so far; `extra` supplies run-specific checkpoint tensors; `replay` recomputes the batch's loss
  /// from the same inputs (see replayable()) for the overflow finder should the step fail. Returns false
  /// when the epoch must stop (diverged, or stop_after_steps reached). Throws NumericalError when the loss
  /// scaler gives up (Note [stopping on a numerical failure]).
  bool step(const Tensor& loss, int64_t batch, double units, double data_wait,
            const std::function<nn::StateDict()>& extra = {}, const std::function<Tensor()>& replay = {});
  /// Close the epoch's training part; returns whether to evaluate (false when the run stops early).
  bool end_training(double data_wait);
  /// The evaluation of one set of weights: mean loss and accuracy or perplexity.
  struct Eval {
    double loss = 0, metric = 0;
  };
  /// Record the epoch's evaluation (`metric`: accuracy or perplexity) and, with --ema_decay, that of the
  /// weight averages; log them and checkpoint.
  void end_epoch(const Eval& model, const std::optional<Eval>& ema, double eval_seconds);
  /// Whether the run must end (diverged or stopped early).
  bool stopped() const { return sum_.diverged || sum_.stopped_early; }
  /// Fill the summary's totals (peak memory, skipped steps, scale, throughput).
  void finish();

 private:
  void save(const Progress& p, const nn::StateDict& extra, const std::string& path = {});
  /// Note [stopping on a numerical failure]: restore the buffers of the last applied update, write the
  /// last-good checkpoint (position `at`, where the failing step began), replay the step under the overflow
  /// finder; returns `what` completed with the module found and the checkpoint written (or why none was).
  std::string stop_for_numerical_failure(const std::string& what, const Progress& at, double scale);
  /// Copy the model's buffers into buffers_ (after an applied update), or back (restore).
  void snapshot_buffers();
  void restore_buffers();
  void check_resumed_config(const std::map<std::string, std::string>& resumed);
  /// Note [automatic precision]: arm the recorder when step `next` (global, 1-based) is recorded for the log or
  /// observed for automatic precision.
  void arm_for(int64_t next);
  /// Judge one observation's layers, whose gradients carried loss scale `scale` (the ranks' signs agreed), and make the
  /// moves it decides.
  void observe_precision(const std::vector<amp::LayerNumerics>& layers, double scale, int64_t global);
  /// Move `module` to f32 (amp::promote_to_f32) and point the run's parameter lists at the new tensors; returns the
  /// modules converted.
  std::vector<std::string> move_layer(const std::string& module);
  /// A resumed run: restore the decisions of metadata `json` and replay their moves, the moved layers' f32 weights
  /// taken from the checkpoint file (loading them into the 16-bit layers rounded them).
  void replay_precision(const std::string& json);
  void adopt_kernel_paths(const std::map<std::string, std::string>& resumed);
  /// Whether this process writes the run's files (rank 0 of a data-parallel run, or the only process).
  bool writes() const { return parts_.dp == nullptr || parts_.dp->writes(); }
  /// Whether this process is one rank of several.
  bool data_parallel() const { return parts_.dp != nullptr && parts_.dp->active(); }

  const TrainConfig& c_;
  RunSummary& sum_;
  Parts parts_;
  Progress start_;
  int64_t baseline_;
  std::ostream& out_;
  bool text_;
  Device dev_;  ///< where the run's tensors live (memory statistics)
  std::string ckpt_;
  /// The best evaluation so far (Note [the best epoch]); in meta_ under kBestKey once there is one.
  struct Best {
    int64_t epoch = 0;
    double metric = 0;
  };
  std::optional<Best> best_;
  std::map<std::string, std::string> meta_;
  KernelPathRecord paths_at_start_;  ///< the process's kernel-path counters when the run began
  std::optional<RunLog> log_;
  /// --numerics_every N: armed for every N-th step (docs/RUN_LOG.md "numerics"); null when off
  std::unique_ptr<amp::NumericsRecorder> numerics_;
  /// --auto_precision, or a resumed run whose checkpoint moved layers: the decisions (Note [automatic precision]);
  /// null otherwise
  std::unique_ptr<amp::AutoPrecision> auto_;
  bool observe_next_ = false;  ///< the last step was skipped: the next is observed
  bool auto_step_ = false;     ///< the armed step is an observation for automatic precision
  bool hinted_scaling_ = false;  ///< automatic precision has advised loss scaling (once a run)
  /// The running statistics of an epoch up to a mid-epoch checkpoint.
  struct EpochCarry {
    int64_t steps = 0;    ///< steps of the epoch done before
    double loss_sum = 0;  ///< their losses, summed in step order
    double units = 0, seconds = 0, data_wait = 0;
    LossEma ema;
  };
  std::optional<EpochCarry> resumed_;  ///< what the checkpoint resumed from carries (start_'s epoch)
  EpochCarry carry_;                   ///< what the current epoch carries (zero unless resumed mid-epoch)
  // the current epoch: loss_sum_, epoch_steps_ and ema_ continue the carried values; done_, units_,
  // data_wait_ and the times count this process's part
  int64_t epoch_ = 0, done_ = 0, epoch_steps_ = 0;
  // the optimizer step being accumulated: the losses of its batches backpropagated so far, their images
  // or tokens
  std::vector<Tensor> micro_losses_;
  std::vector<std::function<Tensor()>> micro_replays_;  ///< their replays, for the overflow finder
  /// The model's buffers (batch-norm running statistics) as the last applied update left them: a failing
  /// step's forward has already updated them (Note [stopping on a numerical failure]).
  std::vector<Tensor> buffers_;
  double micro_units_ = 0;
  double loss_sum_ = 0, units_ = 0, total_units_ = 0, ckpt_seconds_ = 0, epoch_seconds_ = 0, data_wait_ = 0;
  LossEma ema_;
  Clock::time_point t_epoch_;
  std::unique_ptr<ProgressBar> bar_;
  /// --bucket_mb > 0 in a data-parallel run: the gradient buckets (Note [bucketed gradient all-reduce])
  std::unique_ptr<GradBuckets> buckets_;
  /// --shard_optimizer in a data-parallel run: who updates which parameter (Note [sharded optimizer state])
  std::unique_ptr<OptimizerShards> shards_;
  /// --sync_batchnorm in a data-parallel run: batch norm over the global batch (Note [synchronised batch norm])
  std::unique_ptr<nn::SyncBatchNormScope> sync_bn_;
};

}  // namespace mp::train::detail

#pragma once
// The training loop behind `mixprec train` and `mixprec compare`: an image classifier or a word
// language model, in any precision and opt level, with a threaded loader, loss scaling, LR warm-up,
// checkpoints with exact resume, a JSONL run log and a progress bar.
#include <cstdint>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mp/amp/grad_scaler.hpp"
#include "mp/core/device.hpp"
#include "mp/kernel_paths.hpp"

namespace mp::train {

/// Everything that defines a training run. The CLI flags of `mixprec train` have these names.
struct TrainConfig {
  // ---- task ----
  std::string model = "resnet20";         ///< image: a models::create_image_model name; text: lstm, gru or rnn
  std::string dataset = "fashion-mnist";  ///< fashion-mnist, mnist, cifar10, cifar100 (images); kjv, text (words)
  std::string data_dir;                   ///< dataset folder/file (default: Debian's folder; kjv: runs `bible`)
  int64_t train_subset = 0;               ///< use only the first N training examples (0 = all)
  bool augment = true;                    ///< images: random crop with padding + horizontal flip
  // ---- schedule ----
  int64_t epochs = 1;               ///< passes over the training data
  int64_t batch_size = 128;         ///< examples (images, or token streams for text) per batch
  int64_t grad_accum = 1;           ///< batches whose gradients are summed per optimizer step
  int64_t max_steps_per_epoch = 0;  ///< stop each epoch after this many optimizer steps (0 = all)
  std::string optimizer = "sgd";    ///< sgd, adam or adamw
  double lr = 0;                    ///< 0 = the task's default (images: sgd 0.1, adam 1e-3; text: sgd 20, adam 1e-3)
  double momentum = -1;             ///< sgd momentum (-1 = task default: images 0.9, text 0)
  double weight_decay = -1;         ///< L2 (sgd/adam) or decoupled (adamw) decay (-1 = images 5e-4, text 0)
  bool nesterov = false;            ///< sgd Nesterov momentum
  bool decay_norm_and_bias = true;  ///< false: no weight decay on 1-dim parameters (biases, norm scales)
  double label_smoothing = 0;       ///< training loss: cross entropy against (1 - e) one-hot + e / classes
  double warmup_epochs = 0;         ///< linear LR warm-up length in epochs (fractions allowed)
  std::string schedule = "cosine";  ///< after warm-up: constant, linear, cosine or step (x0.1 per third)
  double clip_grad_norm = -1;       ///< clip the gradient norm (0 = off; -1 = task default: images 0, text 0.25)
  double ema_decay = 0;             ///< > 0: keep an f32 moving average of the weights, also evaluated
  // ---- precision ----
  std::string precision = "fp32";    ///< fp32, fp16 or bf16
  std::string opt_level;             ///< O0..O3; empty = O0 for fp32, O2 for fp16/bf16
  std::string loss_scale;            ///< dynamic, none or a number; empty = the opt level's default
  std::string keep_batchnorm_fp32;   ///< O2/O3: true or false; empty = the level's (O2 true, O3 false)
  std::string master_weights;        ///< O2/O3: true or false; empty = the level's (O2 true, O3 false)
  bool stochastic_rounding = false;  ///< 16-bit weights without masters: round their updates stochastically
  // ---- dynamic loss scaling (amp::GradScalerOptions, whose defaults these are) ----
  double init_scale = amp::GradScalerOptions{}.init_scale;          ///< starting scale
  double growth_factor = amp::GradScalerOptions{}.growth_factor;    ///< scale *= this after growth_interval clean steps
  double backoff_factor = amp::GradScalerOptions{}.backoff_factor;  ///< scale *= this on overflow
  int64_t growth_interval = amp::GradScalerOptions{}.growth_interval;  ///< clean steps between growths
  int64_t hysteresis = amp::GradScalerOptions{}.hysteresis;            ///< overflows tolerated before backing off
  double min_scale = amp::GradScalerOptions{}.min_scale;               ///< the scale never goes below this
  double max_scale = amp::GradScalerOptions{}.max_scale;               ///< the scale never goes above this
  int64_t max_overflows_at_min_scale = amp::GradScalerOptions{}.max_overflows_at_min_scale;  ///< then stop (0 = never)
  // ---- static loss scaling (--loss_scale N) ----
  int64_t max_consecutive_skips = amp::GradScalerOptions{}.max_consecutive_skips;  ///< skips in a row, then stop
  // ---- word LM ----
  int64_t bptt = 35;                   ///< truncated back-propagation window (tokens)
  int64_t embed_size = 200;            ///< word embedding size
  int64_t hidden_size = 200;           ///< recurrent state size
  int64_t num_layers = 2;              ///< stacked recurrent layers
  double dropout = 0.2;                ///< dropout on embeddings, between layers and on the output
  bool tie_weights = false;            ///< decoder shares the embedding matrix
  std::string lstm_impl = "fused";     ///< lstm: basic, fused, onednn (CPU) or cudnn (CUDA) (nn::LstmImpl)
  std::string memory_format = "auto";  ///< conv nets: auto, channels_last or contiguous (activation layout)
  int64_t max_vocab = 10000;           ///< vocabulary cap (others become <unk>)
  // ---- run ----
  uint64_t seed = 0;           ///< seeds initialisation, dropout, data order and augmentation
  int num_workers = 2;         ///< loader threads (0 = load on the training thread)
  double bucket_mb = 25;       ///< data-parallel: MiB per gradient all-reduce bucket (0 = one after backward)
  std::string device = "cpu";  ///< cpu, cuda or cuda:N: where the model and batches live
  std::string matmul_precision = "highest";  ///< f32 matmuls/convs on CUDA: highest (f32) or high (TF32)
  int64_t eval_batch_size = 500;             ///< images per evaluation batch (text: 10 streams)
  std::string checkpoint_dir;                ///< write checkpoint.safetensors here (empty = none)
  int64_t checkpoint_every = 0;              ///< also checkpoint every N steps (0 = at each epoch end only)
  bool save_best = false;                    ///< also keep best.safetensors: the epoch with the best evaluation
  bool resume = false;                       ///< continue from checkpoint_dir/checkpoint.safetensors
  std::string init_from;                     ///< start from these weights: a state dict or checkpoint (empty = none)
  bool init_from_partial = false;            ///< init_from: load the tensors whose name and shape match, not all
  int64_t stop_after_steps = 0;              ///< end this process after N steps, checkpointing there (0 = never)
  std::string log;                           ///< JSONL run log path (empty = none)
  int64_t numerics_every = 0;                ///< log per-layer numerics every N optimizer steps (0 = off)
  std::string label;                         ///< name of the run in tables (default: precision and opt level)
  bool quiet = false;                        ///< no progress bar
};

/// Call f(name, field, help) for every field of `c`, in declaration order: what the CLI turns into
/// flags (--name) and config_to_json/config_from_json into keys, so the three always agree.
template <class F>
void visit_fields(TrainConfig& c, F&& f) {
  f("model", c.model, "image: mlp, resnet8..110 (CIFAR), resnet18..152, wrn-D-K; text: lstm, gru or rnn");
  f("dataset", c.dataset, "fashion-mnist, mnist, cifar10, cifar100 (images); kjv, text (word LM)");
  f("data_dir", c.data_dir, "dataset folder or file (default: Debian's fashion-mnist folder; kjv runs `bible`)");
  f("train_subset", c.train_subset, "use only the first N training examples (0 = all)");
  f("augment", c.augment, "images: random crop with padding and horizontal flip");
  f("epochs", c.epochs, "passes over the training data");
  f("batch_size", c.batch_size, "examples per batch (text: parallel token streams)");
  f("grad_accum", c.grad_accum,
    "batches per optimizer step, their gradients summed (in f32 for 16-bit weights): an effective batch of "
    "batch_size x N in the memory of one batch");
  f("max_steps_per_epoch", c.max_steps_per_epoch, "stop each epoch after N steps (0 = all)");
  f("optimizer", c.optimizer, "sgd, adam or adamw");
  f("lr", c.lr, "learning rate (0 = task default: images sgd 0.1 / adam 1e-3; text sgd 20 / adam 1e-3)");
  f("momentum", c.momentum, "sgd momentum (-1 = task default: images 0.9, text 0)");
  f("weight_decay", c.weight_decay,
    "weight decay, L2 for sgd/adam, decoupled for adamw (-1 = task default: images 5e-4, text 0)");
  f("nesterov", c.nesterov, "sgd Nesterov momentum");
  f("decay_norm_and_bias", c.decay_norm_and_bias,
    "weight decay also on 1-dim parameters (biases, batch/layer norm scales); --no-decay_norm_and_bias exempts "
    "them, as many recipes do");
  f("label_smoothing", c.label_smoothing,
    "training loss against (1 - e) one-hot + e / classes targets (PyTorch's label_smoothing; evaluation uses "
    "the plain cross entropy)");
  f("warmup_epochs", c.warmup_epochs, "linear learning-rate warm-up, in epochs (fractions allowed)");
  f("schedule", c.schedule, "after warm-up: constant, linear, cosine or step (x0.1 after each third)");
  f("clip_grad_norm", c.clip_grad_norm,
    "clip the global gradient norm (0 = off, -1 = task default: images off, text 0.25)");
  f("ema_decay", c.ema_decay,
    "keep an exponential moving average of the weights in f32 (avg = d * avg + (1 - d) * w after each step; "
    "e.g. 0.999; 0 = off), evaluate it beside the model every epoch and save it in checkpoints; its metric "
    "picks --save_best's epoch");
  f("precision", c.precision, "fp32, fp16 or bf16");
  f("opt_level", c.opt_level, "O0, O1, O2 or O3 (default: O0 for fp32, O2 for fp16/bf16)");
  f("loss_scale", c.loss_scale, "dynamic, none or a number (default: dynamic for fp16, none for bf16)");
  f("keep_batchnorm_fp32", c.keep_batchnorm_fp32,
    "O2/O3: true keeps the batch-norm weights f32, false makes them 16-bit too (Apex's property; default: "
    "true for O2, false for O3)");
  f("master_weights", c.master_weights,
    "O2/O3: true keeps f32 master copies of the 16-bit weights for the optimizer step, false updates the "
    "16-bit weights themselves (Apex's property; default: true for O2, false for O3)");
  f("stochastic_rounding", c.stochastic_rounding,
    "O3 (or O2 with --master_weights false): round the 16-bit weights stochastically after each update, so updates "
    "below half an ulp survive "
    "in expectation (there are no f32 masters to keep them)");
  f("init_scale", c.init_scale, "dynamic loss scaling: the starting scale");
  f("growth_factor", c.growth_factor,
    "dynamic loss scaling: the scale grows by this after growth_interval clean steps");
  f("backoff_factor", c.backoff_factor, "dynamic loss scaling: the scale shrinks by this on an overflow");
  f("growth_interval", c.growth_interval, "dynamic loss scaling: clean steps between growths");
  f("hysteresis", c.hysteresis, "dynamic loss scaling: overflows tolerated before backing off (1 = at the first)");
  f("min_scale", c.min_scale, "dynamic loss scaling: the scale never goes below this");
  f("max_scale", c.max_scale, "dynamic loss scaling: the scale never goes above this");
  f("max_overflows_at_min_scale", c.max_overflows_at_min_scale,
    "dynamic loss scaling: stop the run after this many consecutive overflows at min_scale (0 = never)");
  f("max_consecutive_skips", c.max_consecutive_skips,
    "static loss scaling (--loss_scale N): stop the run after this many consecutive steps skipped for inf/NaN "
    "gradients (0 = never)");
  f("bptt", c.bptt, "word LM: truncated back-propagation window in tokens");
  f("embed_size", c.embed_size, "word LM: embedding size");
  f("hidden_size", c.hidden_size, "word LM: recurrent state size");
  f("num_layers", c.num_layers, "word LM: stacked recurrent layers");
  f("dropout", c.dropout, "word LM: dropout probability");
  f("tie_weights", c.tie_weights, "word LM: decoder shares the embedding matrix (needs embed_size == hidden_size)");
  f("lstm_impl", c.lstm_impl,
    "word LM (lstm): basic (per-step graph), fused (our sequence-level layer), onednn or cudnn (the library's LSTM on "
    "the CPU / CUDA)");
  f("memory_format", c.memory_format,
    "conv nets: activation layout, channels_last (NHWC), contiguous (NCHW) or auto (channels_last on every device)");
  f("max_vocab", c.max_vocab, "word LM: vocabulary cap, other words become <unk> (0 = all)");
  f("seed", c.seed, "random seed (initialisation, dropout, data order, augmentation)");
  f("num_workers", c.num_workers, "data loader threads (0 = load on the training thread)");
  f("bucket_mb", c.bucket_mb,
    "data-parallel runs (mpirun): gradients are averaged over the ranks in buckets of about this many MiB (f32), "
    "each all-reduced during backward as soon as its gradients are final (PyTorch DDP's bucket_cap_mb); 0 = one "
    "all-reduce of every gradient after backward");
  f("device", c.device, "cpu, cuda or cuda:N (the model, batches and optimizer state live there)");
  f("matmul_precision", c.matmul_precision, "f32 matmuls and convolutions on CUDA: highest (true f32) or high (TF32)");
  f("eval_batch_size", c.eval_batch_size, "images per evaluation batch");
  f("checkpoint_dir", c.checkpoint_dir, "write checkpoint.safetensors into this folder");
  f("checkpoint_every", c.checkpoint_every, "also checkpoint every N steps (0 = at epoch ends only)");
  f("save_best", c.save_best,
    "also write checkpoint_dir/best.safetensors (a full checkpoint) at each epoch end whose evaluation is the "
    "best so far: highest test accuracy or lowest valid perplexity");
  f("resume", c.resume, "continue from checkpoint_dir/checkpoint.safetensors");
  f("init_from", c.init_from,
    "start from the weights of this safetensors file instead of a random initialisation: a bare state dict (what "
    "PyTorch's save_file(model.state_dict()) writes, torch names) or a checkpoint's model; every name and shape "
    "must match the model (a fresh run: optimizer, scaler and schedule start anew; not with --resume)");
  f("init_from_partial", c.init_from_partial,
    "with --init_from: load only the tensors whose name and shape match the model and say what was left out "
    "(e.g. a classifier head for another number of classes)");
  f("stop_after_steps", c.stop_after_steps,
    "end the run after N steps of this process, checkpointing there (time-limited jobs; continue with --resume)");
  f("log", c.log, "JSONL run log path (one record per step and per epoch)");
  f("numerics_every", c.numerics_every,
    "every N optimizer steps, write per-layer numerics into the --log (per module with parameters: largest "
    "activation and output gradient, gradients underflowing f16 at the loss scale and at 1, zero gradients, "
    "16-bit updates lost to rounding; docs/RUN_LOG.md); `mixprec plot` draws them as heat maps (0 = off)");
  f("label", c.label, "name of the run in tables");
  f("quiet", c.quiet, "no progress bar");
}

/// The config as a JSON object string (what checkpoints store under metadata "config").
std::string config_to_json(const TrainConfig& c);
/// Parse config_to_json's output (unknown keys are refused naming them; absent keys keep defaults; an integer field
/// takes a whole number in its range, 2 or 2.0, and refuses 2.5).
TrainConfig config_from_json(const std::string& json);
/// Throws naming the field, what was expected and what was got, for any invalid value.
void validate(const TrainConfig& c);
/// Whether the config's dataset is a text corpus (word LM) rather than images.
bool is_text_task(const TrainConfig& c);
/// The device of the config (throws naming --device when it does not parse or, for cuda, does not exist).
Device run_device(const TrainConfig& c);
/// "fp32", "bf16 O2", "bf16 O3 SR" (stochastic rounding), ... (the label of a run in tables).
std::string run_label(const TrainConfig& c);

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

/// Load a checkpoint written by train() (its config tells the model and dataset) or a bare state dict (PyTorch's,
/// or `mixprec export`'s; overrides->model names its model, overrides->dataset its dataset) and evaluate it on
/// the dataset's test split (`split` = "test" or "valid"; images have only test). `overrides` may change
/// dataset, data_dir, precision, opt_level, eval_batch_size (an empty model / dataset / precision: as the file
/// says). `ema`: evaluate the checkpoint's weight averages (--ema_decay) instead of the model's weights.
EvalResult evaluate_checkpoint(const std::string& path, const std::string& split, const TrainConfig* overrides,
                               std::ostream& out, bool ema = false);

/// A RunSummary as a JSON object string (the per-run part of `mixprec compare`'s JSON).
std::string summary_to_json(const RunSummary& s);

}  // namespace mp::train

#pragma once
// A training run's settings, each declared once (Note [one table of settings]): the TrainConfig struct, the
// flags of `mixprec train` / `compare` / `eval` / `bench step`, the JSON of checkpoints and `--config` files.
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "mp/amp/auto_precision.hpp"
#include "mp/amp/grad_scaler.hpp"
#include "mp/amp/initialize.hpp"
#include "mp/core/device.hpp"
#include "mp/core/dtype.hpp"

namespace mp::train {

// Note [one table of settings]
// MP_TRAIN_CONFIG_FIELDS lists every setting once: its type, name (the flag --name and the JSON key), default
// and help text. The struct below, visit_fields (which the CLI, the JSON form and the overrides walk) and the
// flag help are all expanded from it, so a new setting is one line here (plus what reads it). Settings with a
// type beyond numbers, strings and bools (a dtype, an opt level, a loss scale, "true/false/unset") are typed
// fields: parsed from their text at the edge by FieldText<T>, with errors that list the valid values, and
// written back as that same text (so checkpoints written before these fields were typed still load).
// (X(type, name, default, help); a line comment cannot sit inside the macro: sections are /* */.)
#define MP_TRAIN_CONFIG_FIELDS(X)                                                                                   \
  /* ---- task ---- */                                                                                              \
  X(std::string, model, "resnet20",                                                                                 \
    "image: mlp, resnet8..110 (CIFAR), resnet18..152, wrn-D-K; text: lstm, gru, rnn (word LM) or gpt-nano, "        \
    "gpt-mini, gpt2 (GPT on BPE tokens)")                                                                           \
  X(std::string, dataset, "fashion-mnist",                                                                          \
    "fashion-mnist, mnist, cifar10, cifar100 (images); kjv, text (language models: words for lstm, gru, rnn; BPE "  \
    "tokens for gpt)")                                                                                              \
  X(std::string, data_dir, {}, "dataset folder or file (default: Debian's fashion-mnist folder; kjv runs `bible`)") \
  X(int64_t, train_subset, 0, "use only the first N training examples (0 = all)")                                   \
  X(bool, augment, true, "images: random crop with padding and horizontal flip")                                    \
  /* ---- schedule ---- */                                                                                          \
  X(int64_t, epochs, 1, "passes over the training data")                                                            \
  X(int64_t, batch_size, 128, "examples per batch (text: parallel token streams)")                                  \
  X(int64_t, grad_accum, 1,                                                                                         \
    "batches per optimizer step, their gradients summed (in f32 for 16-bit weights): an "                           \
    "effective batch of batch_size x N in the memory of one batch")                                                 \
  X(int64_t, max_steps_per_epoch, 0, "stop each epoch after N steps (0 = all)")                                     \
  X(std::string, optimizer, {}, "sgd, adam or adamw (empty = task default: sgd; adamw for gpt)")                    \
  X(double, lr, 0, "learning rate (0 = task default: images sgd 0.1 / adam 1e-3; text sgd 20 / adam 1e-3)")         \
  X(double, momentum, -1, "sgd momentum (-1 = task default: images 0.9, text 0)")                                   \
  X(double, weight_decay, -1,                                                                                       \
    "weight decay, L2 for sgd/adam, decoupled for adamw (-1 = task default: images 5e-4, word LM 0, gpt 0.1)")      \
  X(bool, nesterov, false, "sgd Nesterov momentum")                                                                 \
  X(bool, decay_norm_and_bias, true,                                                                                \
    "weight decay also on 1-dim parameters (biases, batch/layer norm scales); "                                     \
    "--no-decay_norm_and_bias exempts them, as many recipes do")                                                    \
  X(double, label_smoothing, 0,                                                                                     \
    "training loss against (1 - e) one-hot + e / classes targets (PyTorch's label_smoothing; "                      \
    "evaluation uses the plain cross entropy)")                                                                     \
  X(double, warmup_epochs, 0, "linear learning-rate warm-up, in epochs (fractions allowed)")                        \
  X(std::string, schedule, "cosine", "after warm-up: constant, linear, cosine or step (x0.1 after each third)")     \
  X(double, clip_grad_norm, -1,                                                                                     \
    "clip the global gradient norm (0 = off, -1 = task default: images off, word LM 0.25, gpt 1)")                  \
  X(double, ema_decay, 0,                                                                                           \
    "keep an exponential moving average of the weights in f32 (avg = d * avg + (1 - d) * w "                        \
    "after each step; e.g. 0.999; 0 = off), evaluate it beside the model every epoch and save "                     \
    "it in checkpoints; its metric picks --save_best's epoch")                                                      \
  /* ---- precision ---- */                                                                                         \
  X(DType, precision, DType::f32, "fp32, fp16 or bf16")                                                             \
  X(std::optional<amp::OptLevel>, opt_level, std::nullopt,                                                          \
    "O0, O1, O2 or O3 (default: O0 for fp32, O2 for fp16/bf16)")                                                    \
  X(std::optional<amp::LossScale>, loss_scale, std::nullopt,                                                        \
    "dynamic, none or a number (default: dynamic for fp16, none for bf16)")                                         \
  X(std::optional<bool>, keep_batchnorm_fp32, std::nullopt,                                                         \
    "O2/O3: true keeps the batch-norm weights f32, false makes them 16-bit too (Apex's "                            \
    "property; default: true for O2, false for O3)")                                                                \
  X(std::optional<bool>, master_weights, std::nullopt,                                                              \
    "O2/O3: true keeps f32 master copies of the 16-bit weights for the optimizer step, false "                      \
    "updates the 16-bit weights themselves (Apex's property; default: true for O2, false for "                      \
    "O3)")                                                                                                          \
  X(bool, stochastic_rounding, false,                                                                               \
    "O3 (or O2 with --master_weights false): round the 16-bit weights stochastically after "                        \
    "each update, so updates below half an ulp survive in expectation (there are no f32 "                           \
    "masters to keep them)")                                                                                        \
  X(bool, auto_precision, false,                                                                                    \
    "O2: start every layer O2 casts in 16-bit and move a layer to f32 for good when its telemetry shows it "        \
    "overflowing or underflowing (Note [automatic precision]; each move is printed, logged and checkpointed)")      \
  X(int64_t, auto_precision_every, amp::AutoPrecisionOptions{}.every,                                               \
    "--auto_precision: read the layers' telemetry every N optimizer steps, and on the step after a skipped one")    \
  X(double, auto_precision_overflow, amp::AutoPrecisionOptions{}.overflow,                                          \
    "--auto_precision: an overflow sign is a layer's forward output or output gradient (at scale 1) reaching this " \
    "share of its 16-bit largest value (f16 65504), or its output the step's first non-finite one")                 \
  X(double, auto_precision_underflow, amp::AutoPrecisionOptions{}.underflow,                                        \
    "--auto_precision: an underflow sign is an f16 layer whose output gradient's amax at the loss scale is below "  \
    "this (2^-14, f16's smallest normal: all of it subnormal or zero)")                                             \
  X(int64_t, auto_precision_patience, amp::AutoPrecisionOptions{}.patience,                                         \
    "--auto_precision: consecutive observations showing one sign before a layer moves to f32")                      \
  /* ---- dynamic loss scaling (amp::GradScalerOptions, whose defaults these are) ---- */                           \
  X(double, init_scale, amp::GradScalerOptions{}.init_scale, "dynamic loss scaling: the starting scale")            \
  X(double, growth_factor, amp::GradScalerOptions{}.growth_factor,                                                  \
    "dynamic loss scaling: the scale grows by this after growth_interval clean steps")                              \
  X(double, backoff_factor, amp::GradScalerOptions{}.backoff_factor,                                                \
    "dynamic loss scaling: the scale shrinks by this on an overflow")                                               \
  X(int64_t, growth_interval, amp::GradScalerOptions{}.growth_interval,                                             \
    "dynamic loss scaling: clean steps between growths")                                                            \
  X(int64_t, hysteresis, amp::GradScalerOptions{}.hysteresis,                                                       \
    "dynamic loss scaling: overflows tolerated before backing off (1 = at the first)")                              \
  X(double, min_scale, amp::GradScalerOptions{}.min_scale, "dynamic loss scaling: the scale never goes below this") \
  X(double, max_scale, amp::GradScalerOptions{}.max_scale, "dynamic loss scaling: the scale never goes above this") \
  X(int64_t, max_overflows_at_min_scale, amp::GradScalerOptions{}.max_overflows_at_min_scale,                       \
    "dynamic loss scaling: stop the run after this many consecutive overflows at min_scale (0 "                     \
    "= never)")                                                                                                     \
  /* ---- static loss scaling (--loss_scale N) ---- */                                                              \
  X(int64_t, max_consecutive_skips, amp::GradScalerOptions{}.max_consecutive_skips,                                 \
    "static loss scaling (--loss_scale N): stop the run after this many consecutive steps "                         \
    "skipped for inf/NaN gradients (0 = never)")                                                                    \
  /* ---- word LM ---- */                                                                                           \
  X(int64_t, bptt, 35, "word LM: truncated back-propagation window in tokens")                                      \
  X(int64_t, embed_size, 200, "word LM: embedding size")                                                            \
  X(int64_t, hidden_size, 200, "word LM: recurrent state size")                                                     \
  X(int64_t, num_layers, 2, "word LM: stacked recurrent layers")                                                    \
  X(double, dropout, 0.2, "language models (word LM, gpt): dropout probability")                                    \
  X(bool, tie_weights, false, "word LM: decoder shares the embedding matrix (needs embed_size == hidden_size)")     \
  X(std::string, lstm_impl, "fused",                                                                                \
    "word LM (lstm): basic (per-step graph), fused (our sequence-level layer), onednn or "                          \
    "cudnn (the library's LSTM on the CPU / CUDA)")                                                                 \
  X(std::string, memory_format, "auto",                                                                             \
    "conv nets: activation layout, channels_last (NHWC), contiguous (NCHW) or auto "                                \
    "(channels_last on every device)")                                                                              \
  X(int64_t, max_vocab, 10000,                                                                                      \
    "word LM: vocabulary cap, other words become <unk> (0 = all); gpt: the size of the BPE tokenizer trained on "   \
    "the training text (without --tokenizer)")                                                                      \
  /* ---- gpt ---- */                                                                                               \
  X(int64_t, context, 0,                                                                                            \
    "gpt: context length in tokens, of the training windows and the position embeddings (0 = the preset's: "        \
    "gpt-nano 64, gpt-mini 256, gpt2 1024)")                                                                        \
  X(std::string, tokenizer, {},                                                                                     \
    "gpt: a Hugging Face tokenizer.json (byte-level BPE, e.g. GPT-2's) instead of training one of --max_vocab "     \
    "tokens on the training text; either way the checkpoint stores it")                                             \
  X(int64_t, epoch_tokens, 0,                                                                                       \
    "gpt: training tokens per epoch, in random windows of --context tokens (0 = as many as the training split "     \
    "holds)")                                                                                                       \
  /* ---- run ---- */                                                                                               \
  X(uint64_t, seed, 0, "random seed (initialisation, dropout, data order, augmentation)")                           \
  X(int, num_workers, 2, "data loader threads (0 = load on the training thread)")                                   \
  X(double, bucket_mb, 25,                                                                                          \
    "data-parallel runs (mpirun): gradients are averaged over the ranks in buckets of about "                       \
    "this many MiB (f32), each all-reduced during backward as soon as its gradients are final "                     \
    "(PyTorch DDP's bucket_cap_mb); 0 = one all-reduce of every gradient after backward")                           \
  X(DType, grad_comm_dtype, DType::f32,                                                                             \
    "data-parallel runs: fp32, bf16 or fp16, the dtype gradients are sent and summed in (16-bit: half the bytes, "  \
    "each value divided by the rank count before the sum and rounded, each partial sum rounded)")                   \
  X(bool, sync_batchnorm, false,                                                                                    \
    "data-parallel runs: batch norm in training normalises with the statistics of the global batch (every rank's "  \
    "examples; two small all-reduces per layer per step), as one process at N x B; default: each rank's own")       \
  X(bool, shard_optimizer, false, "data-parallel runs: each f32 master and moment on one rank only (ZeRO-1)")       \
  X(double, dist_timeout, 300,                                                                                      \
    "data-parallel runs: seconds a rank waits for the others in one collective before it ends the run (exit "      \
    "status 4), naming the ranks that did not arrive (a rank died or hangs); above the longest time one rank "     \
    "works alone (rank 0 writing a checkpoint)")                                                                    \
  X(std::string, device, "cpu", "cpu, cuda or cuda:N (the model, batches and optimizer state live there)")          \
  X(std::string, matmul_precision, "highest",                                                                       \
    "f32 matmuls and convolutions on CUDA: highest (true f32) or high (TF32)")                                      \
  X(int64_t, eval_batch_size, 500, "images per evaluation batch")                                                   \
  X(std::string, checkpoint_dir, {}, "write checkpoint.safetensors into this folder")                               \
  X(int64_t, checkpoint_every, 0, "also checkpoint every N steps (0 = at epoch ends only)")                         \
  X(bool, save_best, false,                                                                                         \
    "also write checkpoint_dir/best.safetensors (a full checkpoint) at each epoch end whose "                       \
    "evaluation is the best so far: highest test accuracy or lowest valid perplexity")                              \
  X(bool, resume, false, "continue from checkpoint_dir/checkpoint.safetensors")                                     \
  X(std::string, init_from, {},                                                                                     \
    "start from the weights of this safetensors file instead of a random initialisation: a "                        \
    "bare state dict (what PyTorch's save_file(model.state_dict()) writes, torch names) or a "                      \
    "checkpoint's model; every name and shape must match the model (a fresh run: optimizer, "                       \
    "scaler and schedule start anew; not with --resume)")                                                           \
  X(bool, init_from_partial, false,                                                                                 \
    "with --init_from: load only the tensors whose name and shape match the model and say "                         \
    "what was left out (e.g. a classifier head for another number of classes)")                                     \
  X(int64_t, stop_after_steps, 0,                                                                                   \
    "end the run after N steps of this process, checkpointing there (time-limited jobs; "                           \
    "continue with --resume)")                                                                                      \
  X(std::string, log, {}, "JSONL run log path (one record per step and per epoch)")                                 \
  X(int64_t, numerics_every, 0,                                                                                     \
    "every N optimizer steps, write per-layer numerics into the --log (per module with "                            \
    "parameters: largest activation and output gradient, gradients underflowing f16 at the "                        \
    "loss scale and at 1, zero gradients, 16-bit updates lost to rounding; docs/RUN_LOG.md); "                      \
    "`mixprec plot` draws them as heat maps (0 = off)")                                                             \
  X(std::string, label, {}, "name of the run in tables")                                                            \
  X(bool, quiet, false, "no progress bar")                                                                          \
  /* end */

/// Everything that defines a training run (the fields: MP_TRAIN_CONFIG_FIELDS).
struct TrainConfig {
#define MP_TRAIN_CONFIG_DECLARE(type, name, init, help) type name = init;
  MP_TRAIN_CONFIG_FIELDS(MP_TRAIN_CONFIG_DECLARE)
#undef MP_TRAIN_CONFIG_DECLARE
};

/// Call f(name, field, help) for every field of `c`, in declaration order (c may be const).
template <class C, class F>
void visit_fields(C& c, F&& f) {
#define MP_TRAIN_CONFIG_VISIT(type, name, init, help) f(#name, c.name, help);
  MP_TRAIN_CONFIG_FIELDS(MP_TRAIN_CONFIG_VISIT)
#undef MP_TRAIN_CONFIG_VISIT
}

/// The text form of a typed field: what its flag takes, its JSON value, its default in the help. parse() throws
/// naming the flag, the valid values and what was got.
template <class T>
struct FieldText;
template <>
struct FieldText<DType> {  ///< a run's precision: fp32, fp16 or bf16
  static DType parse(const std::string& s, const char* name);
  static std::string format(DType v);
};
template <>
struct FieldText<std::optional<amp::OptLevel>> {  ///< O0..O3, or "" for the precision's default
  static std::optional<amp::OptLevel> parse(const std::string& s, const char* name);
  static std::string format(const std::optional<amp::OptLevel>& v);
};
template <>
struct FieldText<std::optional<amp::LossScale>> {  ///< dynamic, none, a number, or "" for the level's default
  static std::optional<amp::LossScale> parse(const std::string& s, const char* name);
  static std::string format(const std::optional<amp::LossScale>& v);
};
template <>
struct FieldText<std::optional<bool>> {  ///< true, false, or "" for the level's default
  static std::optional<bool> parse(const std::string& s, const char* name);
  static std::string format(const std::optional<bool>& v);
};
/// Whether T is a typed field (has a FieldText).
template <class T>
concept TextField = requires(const T& v) {
  FieldText<T>::format(v);
};

/// "fp32", "fp16" or "bf16" (the --precision text of a dtype).
inline std::string precision_name(DType d) { return FieldText<DType>::format(d); }

/// The config as a JSON object string (what checkpoints store under metadata "config").
std::string config_to_json(const TrainConfig& c);
/// Parse config_to_json's output (unknown keys are refused naming them; absent keys keep defaults; an integer field
/// takes a whole number in its range, 2 or 2.0, and refuses 2.5; a typed field its text).
TrainConfig config_from_json(const std::string& json);
/// `base` with the fields named in `given` taken from `values` (flags given on a command line over a file's
/// or a checkpoint's settings). Throws naming a name that is not a field.
TrainConfig with_fields(const TrainConfig& base, const TrainConfig& values, const std::set<std::string>& given);
/// Throws naming the field, what was expected and what was got, for any invalid value.
void validate(const TrainConfig& c);
/// Whether the config's dataset is a text corpus (word LM) rather than images.
bool is_text_task(const TrainConfig& c);
/// The device of the config (throws naming --device when it does not parse or, for cuda, does not exist).
Device run_device(const TrainConfig& c);
/// "fp32", "bf16 O2", "bf16 O3 SR" (stochastic rounding), ... (the label of a run in tables).
std::string run_label(const TrainConfig& c);

}  // namespace mp::train

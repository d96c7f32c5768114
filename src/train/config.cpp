// TrainConfig: validation and labels (its JSON form: config_json.cpp).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <type_traits>

#include "mp/amp/initialize.hpp"
#include "mp/core/error.hpp"
#include "mp/core/math_mode.hpp"
#include "mp/dist/device_group.hpp"
#include "mp/models/gpt.hpp"
#include "mp/models/registry.hpp"
#include "mp/nn/rnn.hpp"
#include "mp/system.hpp"
#include "mp/train/trainer.hpp"
#include "setup.hpp"

namespace mp::train {

bool is_text_task(const TrainConfig& c) { return c.dataset == "kjv" || c.dataset == "text"; }

namespace {

const std::set<std::string> kImageDatasets{"fashion-mnist", "mnist", "cifar10", "cifar100"};

template <class T>
void check_positive(const char* name, T v) {
  MP_CHECK(v > 0, "--", name, " must be positive, got ", v);
}
template <class T>
void check_non_negative(const char* name, T v) {
  MP_CHECK(v >= 0, "--", name, " must be >= 0, got ", v);
}

// `v` in the fewest digits that read back as v (16777216, not 1.67772e+07).
std::string num(double v) {
  char buf[32];
  for (int prec = 6; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// The scaler's settings: valid values (named by their flags), and given only where they act: the dynamic
// scale's where dynamic loss scaling runs, --max_consecutive_skips where a static scale runs (elsewhere they
// would be silently ignored).
void validate_loss_scaling(const TrainConfig& c) {
  const amp::GradScalerOptions d;
  MP_CHECK(c.init_scale > 0 && std::isfinite(c.init_scale), "--init_scale must be positive and finite, got ",
           num(c.init_scale), "; the default is ", num(d.init_scale), " (2^16)");
  MP_CHECK(c.growth_factor > 1 && std::isfinite(c.growth_factor), "--growth_factor must be > 1 and finite, got ",
           c.growth_factor, "; the default ", d.growth_factor,
           " doubles the scale (to keep the scale fixed use --loss_scale N)");
  MP_CHECK(c.backoff_factor > 0 && c.backoff_factor < 1, "--backoff_factor must be in (0, 1), got ", c.backoff_factor,
           "; the default ", d.backoff_factor, " halves the scale on an overflow");
  MP_CHECK(c.growth_interval > 0, "--growth_interval must be positive, got ", c.growth_interval,
           "; it counts the clean steps between growths (default ", d.growth_interval, ")");
  MP_CHECK(c.hysteresis >= 1, "--hysteresis must be >= 1 (1 = back off at the first overflow), got ", c.hysteresis);
  MP_CHECK(c.min_scale > 0 && c.min_scale <= c.max_scale && std::isfinite(c.max_scale),
           "--min_scale and --max_scale: expected 0 < min_scale <= ", "max_scale (finite), got ", c.min_scale, " and ",
           c.max_scale, "; the defaults are ", d.min_scale, " and ", d.max_scale);
  check_non_negative("max_overflows_at_min_scale", c.max_overflows_at_min_scale);
  std::string given;
  for (const auto& [flag, set] :
       {std::pair<const char*, bool>{"--init_scale", c.init_scale != d.init_scale},
        {"--growth_factor", c.growth_factor != d.growth_factor},
        {"--backoff_factor", c.backoff_factor != d.backoff_factor},
        {"--growth_interval", c.growth_interval != d.growth_interval},
        {"--hysteresis", c.hysteresis != d.hysteresis},
        {"--min_scale", c.min_scale != d.min_scale},
        {"--max_scale", c.max_scale != d.max_scale},
        {"--max_overflows_at_min_scale", c.max_overflows_at_min_scale != d.max_overflows_at_min_scale}})
    if (set) given += (given.empty() ? "" : ", ") + std::string(flag);
  check_non_negative("max_consecutive_skips", c.max_consecutive_skips);
  const bool skips_given = c.max_consecutive_skips != d.max_consecutive_skips;
  if (given.empty() && !skips_given) return;
  const amp::AmpOptions r = amp::resolve(amp_options(c));
  MP_CHECK(!skips_given || (r.scaler.enabled && !r.scaler.dynamic),
           "--max_consecutive_skips stops a run whose static loss scale (--loss_scale N) keeps overflowing, but this "
           "run has ",
           r.scaler.enabled ? "dynamic loss scaling, which stops by --max_overflows_at_min_scale instead"
                            : "no loss scaling, which stops at the first inf/NaN loss or gradient",
           "; drop --max_consecutive_skips");
  if (given.empty()) return;
  MP_CHECK(r.scaler.enabled && r.scaler.dynamic, given, " set dynamic loss scaling, but this run has ",
           r.scaler.enabled
               ? "a static loss scale (--loss_scale " + r.loss_scale->str() + "); for a scale that starts at " +
                     r.loss_scale->str() + " and adapts use --loss_scale dynamic --init_scale " + r.loss_scale->str()
               : "no loss scaling (--precision " + precision_name(c.precision) +
                     (c.loss_scale ? " --loss_scale " + c.loss_scale->str() : std::string(", whose default is none")) +
                     "); add --loss_scale dynamic, or drop " + given);
  // Dynamic scaling runs. The scaler would clamp a starting scale outside its bounds without a word: say so instead.
  MP_CHECK(c.init_scale >= c.min_scale && c.init_scale <= c.max_scale, "--init_scale ", num(c.init_scale),
           c.init_scale == d.init_scale ? " (the default)" : "", " lies outside [--min_scale, --max_scale] = [",
           num(c.min_scale), ", ", num(c.max_scale), "]: give an --init_scale within the bounds, or widen them");
}

}  // namespace

void validate(const TrainConfig& c) {
  MP_CHECK(kImageDatasets.count(c.dataset) != 0 || is_text_task(c), "unknown --dataset '", c.dataset,
           "': expected fashion-mnist, mnist, cifar10, cifar100 (images) or kjv, text (word language model)");
  if (is_text_task(c)) {
    const bool gpt = models::is_gpt_model(c.model);
    MP_CHECK(c.model == "lstm" || c.model == "gru" || c.model == "rnn" || gpt, "--model '", c.model,
             "' is not a language model; for --dataset ", c.dataset,
             " use lstm, gru or rnn (word LM) or gpt-nano, gpt-mini, gpt2 (GPT on BPE tokens)");
    if (gpt) {
      check_non_negative("context", c.context);
      check_non_negative("epoch_tokens", c.epoch_tokens);
      MP_CHECK(!c.tokenizer.empty() || c.max_vocab >= 258, "--model ", c.model,
               " trains a BPE tokenizer of --max_vocab ",
               "tokens (256 bytes, <|endoftext|> and merges), got --max_vocab ", c.max_vocab,
               "; give at least 258 (8192 suits the KJV), or a --tokenizer file");
      MP_CHECK(!c.tie_weights, "--tie_weights is a word-LM setting; a gpt model always ties its head to the token ",
               "embedding (nanoGPT's); drop the flag");
    } else {
      MP_CHECK(c.tokenizer.empty() && c.context == 0 && c.epoch_tokens == 0, "--tokenizer, --context and ",
               "--epoch_tokens apply to gpt models, got --model ", c.model, "; drop them");
    }
    MP_CHECK(c.dataset != "text" || !c.data_dir.empty(),
             "--dataset text needs --data_dir: a plain-text file or a folder with train/valid/test files");
    check_positive("bptt", c.bptt);
    check_positive("embed_size", c.embed_size);
    check_positive("hidden_size", c.hidden_size);
    check_positive("num_layers", c.num_layers);
    check_non_negative("max_vocab", c.max_vocab);
    if (c.model == "lstm") (void)nn::lstm_impl_from_flag(c.lstm_impl, device_from_flag(c.device, "--device"));
    (void)models::memory_format_from_flag(c.memory_format);
    MP_CHECK(c.model == "lstm" || c.lstm_impl == "fused", "--lstm_impl ", c.lstm_impl,
             " applies to --model lstm only, ", "got --model ", c.model, "; drop the flag");
    MP_CHECK(!c.tie_weights || c.embed_size == c.hidden_size, "--tie_weights needs --embed_size == --hidden_size, got ",
             c.embed_size, " and ", c.hidden_size);
  } else {
    MP_CHECK(models::is_image_model(c.model), "unknown --model '", c.model, "' for images; known: ", [] {
      std::string s;
      for (const auto& n : models::image_model_names()) s += (s.empty() ? "" : ", ") + n;
      return s;
    }());
    MP_CHECK((c.dataset != "cifar10" && c.dataset != "cifar100" && c.dataset != "mnist") || !c.data_dir.empty(),
             "--dataset ", c.dataset, " needs --data_dir (it cannot be downloaded here); for CIFAR pass the folder ",
             "of the binary version, for MNIST the folder of the IDX files");
  }
  MP_CHECK(c.dropout >= 0 && c.dropout < 1, "--dropout must be in [0, 1), got ", c.dropout);
  check_positive("epochs", c.epochs);
  check_positive("batch_size", c.batch_size);
  check_positive("grad_accum", c.grad_accum);
  MP_CHECK(std::isfinite(c.bucket_mb) && c.bucket_mb >= 0 && c.bucket_mb <= 8192,
           "--bucket_mb must be a size in MiB in [0, 8192] (0 = one all-reduce after backward), got ", c.bucket_mb,
           "; the default 25 suits most runs");
  MP_CHECK(std::isfinite(c.dist_timeout) && c.dist_timeout > 0 && c.dist_timeout <= 86400,
           "--dist_timeout must be a number of seconds in (0, 86400], got ", c.dist_timeout,
           "; the default 300 suits most runs (Note [rank failures] in src/dist/process_group.cpp)");
  MP_CHECK(c.grad_comm_dtype == DType::f32 || c.grad_comm_dtype == DType::bf16 || c.grad_comm_dtype == DType::f16,
           "--grad_comm_dtype must be fp32, bf16 or fp16, got ", dtype_name(c.grad_comm_dtype));
  MP_CHECK(!c.shard_optimizer || c.grad_comm_dtype == DType::f32, "--grad_comm_dtype ",
           precision_name(c.grad_comm_dtype),
           " applies to the gradient all-reduce, but --shard_optimizer reduce-scatters the gradients in f32; drop "
           "--grad_comm_dtype (or pass fp32) with --shard_optimizer, or train without --shard_optimizer");
  MP_CHECK(!c.shard_optimizer || c.numerics_every == 0,
           "--shard_optimizer spreads the gradients and the optimizer state over the ranks, but --numerics_every ",
           c.numerics_every,
           " records them whole; pass --numerics_every 0 with --shard_optimizer, or train without --shard_optimizer "
           "to record numerics");
  check_positive("eval_batch_size", c.eval_batch_size);
  check_non_negative("max_steps_per_epoch", c.max_steps_per_epoch);
  check_non_negative("train_subset", c.train_subset);
  check_non_negative("lr", c.lr);
  MP_CHECK(c.momentum >= 0 || c.momentum == -1, "--momentum must be >= 0 (or -1 for the task default), got ",
           c.momentum);
  MP_CHECK(c.weight_decay >= 0 || c.weight_decay == -1,
           "--weight_decay must be >= 0 (or -1 for the task default), got ", c.weight_decay);
  check_non_negative("warmup_epochs", c.warmup_epochs);
  MP_CHECK(c.warmup_epochs < static_cast<double>(c.epochs) || (c.schedule != "linear" && c.schedule != "cosine"),
           "--warmup_epochs ", c.warmup_epochs, " covers the whole run (--epochs ", c.epochs, "), but --schedule ",
           c.schedule, " decays the learning rate after the warm-up: use fewer --warmup_epochs than --epochs, or ",
           "--schedule constant");
  MP_CHECK(c.label_smoothing >= 0 && c.label_smoothing < 1, "--label_smoothing must be in [0, 1), got ",
           c.label_smoothing);
  MP_CHECK(c.clip_grad_norm >= 0 || c.clip_grad_norm == -1,
           "--clip_grad_norm must be >= 0 (or -1 for the task default), got ", c.clip_grad_norm);
  check_non_negative("checkpoint_every", c.checkpoint_every);
  check_non_negative("numerics_every", c.numerics_every);
  MP_CHECK(c.numerics_every == 0 || !c.log.empty(), "--numerics_every ", c.numerics_every,
           " writes per-layer numerics into the run log, but no --log was given: add --log FILE.jsonl, or drop "
           "--numerics_every");
  check_non_negative("stop_after_steps", c.stop_after_steps);
  MP_CHECK(c.num_workers >= 0 && c.num_workers <= 64, "--num_workers must be in [0, 64], got ", c.num_workers);
  MP_CHECK(c.optimizer.empty() || c.optimizer == "sgd" || c.optimizer == "adam" || c.optimizer == "adamw",
           "unknown --optimizer '", c.optimizer, "': expected sgd, adam or adamw");
  MP_CHECK(c.schedule == "constant" || c.schedule == "linear" || c.schedule == "cosine" || c.schedule == "step",
           "unknown --schedule '", c.schedule, "': expected constant, linear, cosine or step");
  const std::string precision = precision_name(c.precision);  // also refuses a dtype that is not a run's precision
  const std::string level = FieldText<std::optional<amp::OptLevel>>::format(c.opt_level);
  MP_CHECK(!c.opt_level || (c.precision == DType::f32) == (*c.opt_level == amp::OptLevel::O0), "--opt_level ", level,
           " does not fit --precision ", precision, ": O0 is fp32, O1-O3 need fp16 or bf16");
  // Apex's two properties of O2/O3: true, false or unset (the level's default).
  const bool sixteen_bit_weights = c.precision != DType::f32 && c.opt_level != amp::OptLevel::O1;
  for (const auto& [flag, value] :
       {std::pair<const char*, const std::optional<bool>&>{"keep_batchnorm_fp32", c.keep_batchnorm_fp32},
        {"master_weights", c.master_weights}}) {
    MP_CHECK(!value || sixteen_bit_weights, "--", flag, " applies to O2 and O3 (16-bit weights), got --precision ",
             precision, c.opt_level ? " --opt_level " + level : std::string(), ": O0 and O1 keep every weight in f32");
  }
  const bool masters = c.master_weights.value_or(c.opt_level != amp::OptLevel::O3);
  MP_CHECK(!c.stochastic_rounding || (sixteen_bit_weights && !masters),
           "--stochastic_rounding needs 16-bit weights without f32 masters (--opt_level O3, or O2 with ",
           "--master_weights false) and --precision fp16 or bf16, got --precision ", precision, " --opt_level ",
           c.opt_level ? level : "(default)",
           c.master_weights ? " --master_weights " + FieldText<std::optional<bool>>::format(c.master_weights)
                            : std::string(),
           "; f32 masters keep the small updates themselves and need no stochastic rounding");
  const bool o2 = c.precision != DType::f32 && c.opt_level.value_or(amp::OptLevel::O2) == amp::OptLevel::O2;
  MP_CHECK(!c.auto_precision || o2, "--auto_precision moves layers of an O2 model from 16-bit to f32, but got ",
           "--precision ", precision, c.opt_level ? " --opt_level " + level : std::string(),
           ": use --precision fp16 or bf16 with --opt_level O2 (the default for them), or drop --auto_precision");
  // A move turns a parameter's f32 master into the weight, and with --shard_optimizer only its owner keeps that
  // master (Note [sharded optimizer state]): the other ranks would widen their 16-bit copy instead.
  MP_CHECK(
      !c.auto_precision || !c.shard_optimizer,
      "--auto_precision moves a layer's f32 master weights into the model, but --shard_optimizer keeps each master "
      "on one rank only; train with one of the two");
  MP_CHECK(c.auto_precision_every >= 1, "--auto_precision_every must be at least 1 (steps between observations), got ",
           c.auto_precision_every);
  MP_CHECK(c.auto_precision_overflow > 0 && c.auto_precision_overflow <= 1,
           "--auto_precision_overflow must be in (0, 1] (a share of the 16-bit largest value; default ",
           amp::AutoPrecisionOptions{}.overflow, "), got ", c.auto_precision_overflow);
  MP_CHECK(c.auto_precision_underflow > 0 && c.auto_precision_underflow <= 1,
           "--auto_precision_underflow must be in (0, 1] (an output gradient's amax at the loss scale; default ",
           amp::AutoPrecisionOptions{}.underflow, "), got ", c.auto_precision_underflow);
  MP_CHECK(c.auto_precision_patience >= 1, "--auto_precision_patience must be at least 1 (observations), got ",
           c.auto_precision_patience);
  validate_loss_scaling(c);
  (void)run_device(c);
  (void)float32_matmul_precision_from_string(c.matmul_precision);
  MP_CHECK(c.ema_decay >= 0 && c.ema_decay < 1, "--ema_decay must be in [0, 1) (0 = off; 0.999 is usual), got ",
           c.ema_decay);
  MP_CHECK(!c.save_best || !c.checkpoint_dir.empty(), "--save_best needs --checkpoint_dir (the folder to write ",
           "best.safetensors into)");
  MP_CHECK(!c.resume || !c.checkpoint_dir.empty(), "--resume needs --checkpoint_dir (the folder holding ",
           "checkpoint.safetensors)");
  MP_CHECK(!c.resume || c.init_from.empty(), "--init_from '", c.init_from, "' and --resume were both given: --resume ",
           "continues the run in --checkpoint_dir from its own weights, --init_from starts a new run from other ",
           "weights; drop --init_from to continue the run, or --resume to start a new one");
  MP_CHECK(!c.init_from_partial || !c.init_from.empty(), "--init_from_partial needs --init_from FILE (the weights ",
           "to load part of)");
}

// A bare --device cuda under a launcher: one GPU per process (Note [device groups]).
Device run_device(const TrainConfig& c) {
  return dist::rank_device(device_from_flag(c.device, "--device"), c.device != "cuda");
}

std::string run_label(const TrainConfig& c) {
  if (!c.label.empty()) return c.label;
  if (c.precision == DType::f32) return "fp32";
  std::string label = precision_name(c.precision) + " " + amp::opt_level_name(c.opt_level.value_or(amp::OptLevel::O2));
  if (c.keep_batchnorm_fp32) label += *c.keep_batchnorm_fp32 ? " BN-f32" : " BN-16";
  if (c.master_weights) label += *c.master_weights ? " masters" : " no-masters";
  return label + (c.stochastic_rounding ? " SR" : "") + (c.auto_precision ? " auto" : "");
}

}  // namespace mp::train

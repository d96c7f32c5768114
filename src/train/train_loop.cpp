#include "train/train_loop.hpp"

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <ostream>
#include <set>

#include <unistd.h>

#include "mp/amp/diagnostics.hpp"
#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"
#include "mp/memory/allocator.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/clip_grad.hpp"
#include "mp/train/safetensors.hpp"
#include "train/numerics_log.hpp"
#include "train/precision_moves.hpp"

namespace mp::train {
namespace {
std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "request_stop() must be async-signal-safe");
}  // namespace

void request_stop() noexcept { g_stop_requested.store(true, std::memory_order_relaxed); }
void clear_stop_request() noexcept { g_stop_requested.store(false, std::memory_order_relaxed); }

}  // namespace mp::train

namespace mp::train::detail {
namespace {

std::string fmt(double v, int prec) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

// Note [resumed epoch statistics]
// A checkpoint taken within an epoch also stores that epoch's running statistics (steps done, their
// loss sum, images or tokens, training seconds, data wait, the progress bar's loss average) as the
// JSON metadata "epoch_stats", so that the resumed run's record of that epoch (train loss, time, data
// wait, throughput) covers the whole epoch as the uninterrupted run's does: the train loss is the same
// sum in the same order, bit for bit. Values are written as C99 hex floats ("%a"): exact, and NaN or
// inf (a diverged loss) survive. The run summary's totals still count only this process's work.
constexpr const char* kEpochStatsKey = "epoch_stats";

// Note [the best epoch]
// Each epoch's evaluation is compared with the best so far (highest test accuracy, lowest valid
// perplexity; a NaN/inf perplexity never counts), and the best one's epoch and metric (hex float) go
// into every later checkpoint's metadata as "best", so a resumed process keeps comparing with the whole
// run's best rather than its own. With --save_best the epoch-end checkpoint of each new best is also
// written, atomically like every checkpoint, as best.safetensors beside checkpoint.safetensors: a full
// checkpoint (`mixprec eval` and `convert` take it; copied over checkpoint.safetensors, --resume would
// continue after that epoch). The run summary reports the best epoch and metric, and names
// best.safetensors when the file holds that epoch (a first process without --save_best wrote none). With --ema_decay
// the weight averages' metric is the one judged (as timm's checkpoint saver does): the averages are what such a run is
// for.
constexpr const char* kBestKey = "best";

// The 16-bit CPU kernel paths the run used, key -> path: written into every checkpoint and adopted by a resumed
// run (the determinism contract of Note [kernel paths chosen by measurement] in src/backend/cpu/kernel_paths.cpp).
constexpr const char* kKernelPathsKey = "kernel_paths";

// The ranks of the data-parallel run that wrote a checkpoint (absent: one process), so that a resume compares global
// batches, ranks x --batch_size, rather than --batch_size (Note [data-parallel training] 2).
constexpr const char* kWorldSizeKey = "world_size";

// Note [gradient accumulation]
// With --grad_accum N an optimizer step takes N consecutive batches: each batch's loss is divided by N
// and backpropagated (scaled, when loss scaling is on), the gradients add up, and after the N-th batch
// the step runs once (unscale, clip, inf/NaN check, optimizer, scale update, schedule) and the gradients
// are cleared. The mean loss then equals that of one batch of N x batch_size examples, so the learning
// rate needs no change; batch statistics (batch norm) are still those of each batch, as in any
// accumulation. The loss scale is the same for all N batches (update() runs once per step), and an
// inf/NaN in any batch's gradient reaches the sum and skips the whole step. 16-bit gradients (O2/O3)
// are widened to f32 after the first batch (Note [gradient accumulation in f32]). Steps, the schedule,
// max_steps_per_epoch, checkpoint_every and stop_after_steps count optimizer steps; an epoch uses
// floor(batches / N) of them, so up to N - 1 batches at its end are left out, as drop_last leaves out
// a partial batch. Checkpoints are taken between optimizer steps only (their batch position is a
// multiple of N), so the resumed run continues exactly; resuming one with another N is refused unless
// the position is also a multiple of the new N.

// Note [stopping on a numerical failure]
// A run stops for a numerical failure in three ways: without loss scaling (bf16, fp32), a step whose loss or
// gradients hold inf/NaN (RunSummary::diverged; the CLI's exit status 3); with a dynamic scale stuck at its
// minimum, or a static scale that skipped --max_consecutive_skips steps in a row, the scaler's NumericalError
// (Note [giving up on a loss scale]). Before it stops, the run
//   1. writes the last good state: the weights, optimizer state (f32 masters, moments), scaler and schedule
//      as the failing step found them, at the failing step's position (its global_step the steps before it;
//      --resume from the file retries that step), under its own name: --checkpoint_dir/last-good.safetensors,
//      else RUN_LOG.last-good.safetensors beside --log, else a file in the temporary folder; never over
//      checkpoint.safetensors, which keeps the last periodic checkpoint (a diverged run writes no more of
//      them). Written atomically, like every checkpoint, without the word LM's hidden state (that of the
//      failing window is no good): a resumed window starts from zeros;
//   2. replays the failing step's batches (the same inputs and dropout draws, at the same scale) under the
//      overflow finder (amp::OverflowFinder) and names the first module whose forward output, or else whose
//      output gradient, was non-finite.
// Why the live state is the last good one, without keeping a copy of the weights: with no scaler, one
// read-only pass over the loss and the gradients (the scaler's found-inf check: one host synchronisation a
// step, which the loss read needs anyway) runs before the optimizer, so a non-finite step is never applied;
// with a scaler, such steps are skipped. Only the model's buffers (batch-norm running statistics, a few
// values per channel) are copied after each applied update, because the failing forward pass has already
// updated them. One case is left: an update beyond the weights' range (finite gradients times a huge
// learning rate) makes the weights themselves non-finite, and the next step finds them so; the weights
// before that update are gone (keeping them would cost a second copy of the weights and optimizer state),
// so the run names the first non-finite tensor and the newest periodic checkpoint and writes no file.
constexpr const char* kLastGoodFile = "last-good.safetensors";

// Where the last-good state goes (Note [stopping on a numerical failure]).
std::string last_good_path(const TrainConfig& c) {
  namespace fs = std::filesystem;
  if (!c.checkpoint_dir.empty()) return (fs::path(c.checkpoint_dir) / kLastGoodFile).string();
  if (!c.log.empty()) return fs::path(c.log).replace_extension().string() + "." + kLastGoodFile;
  static std::atomic<int> runs{0};  // several runs of one process (`mixprec compare`) write several files
  return (fs::temp_directory_path() /
          ("mixprec-" + std::to_string(::getpid()) + "-" + std::to_string(++runs) + "-" + kLastGoodFile))
      .string();
}

// The overflow finder's answer in one phrase.
std::string first_nonfinite_text(const amp::OverflowFinder& f) {
  if (f.first_forward())
    return "First non-finite: " + *f.first_forward() + ", forward output" +
           (f.first_backward() ? " (in backward: the gradient at the output of " + *f.first_backward() + ")" : "");
  if (f.first_backward())
    return "First non-finite: " + *f.first_backward() + ", gradient of its output (every forward output was finite)";
  return "First non-finite: no module's forward output or output gradient on replaying the step (the loss "
         "computation outside the model's modules, or the weights, overflowed)";
}

// A checkpoint's JSON metadata value; refused as damaged when it does not parse (`what` names it).
nlohmann::json parse_metadata(const std::string& what, const std::string& text) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    MP_FAIL(what, " is not valid JSON (", e.what(), "); the file is damaged: resume from another checkpoint");
  }
}

std::string hex_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

// Note [rank failures] (src/dist/process_group.cpp), the hook of its tests: MP_TEST_RANK_FAULT=R:S:KILL (or :STOP)
// makes rank R of a data-parallel run send itself SIGKILL (SIGSTOP) as it begins optimizer step S of the run, so that
// tests/dist/test_rank_failures.cpp fails one rank mid-epoch at a known step. Read here only; not for users.
void fail_this_rank_for_a_test(int rank, int64_t step) {
  static const char* const spec = std::getenv("MP_TEST_RANK_FAULT");
  if (spec == nullptr) return;
  int r = -1;
  long long s = -1;
  char what[8] = {};
  if (std::sscanf(spec, "%d:%lld:%7s", &r, &s, what) != 3 || r != rank || s != step) return;
  const std::string kind(what);
  MP_CHECK(kind == "KILL" || kind == "STOP", "MP_TEST_RANK_FAULT: expected RANK:STEP:KILL or RANK:STEP:STOP, got '",
           spec, "'");
  std::fflush(nullptr);
  std::raise(kind == "KILL" ? SIGKILL : SIGSTOP);
}

}  // namespace

std::function<Tensor()> replayable(std::function<Tensor()> loss_of) {
  const PhiloxState rng = default_generator().state();
  return [rng, f = std::move(loss_of)] {
    default_generator().set_state(rng.seed, rng.offset);
    return f();
  };
}

TrainLoop::TrainLoop(const TrainConfig& c, RunSummary& sum, Parts parts, const Progress& start, int64_t baseline,
                     std::ostream& out, const std::map<std::string, std::string>& resumed)
    : c_(c),
      sum_(sum),
      parts_(std::move(parts)),
      start_(start),
      baseline_(baseline),
      out_(out),
      text_(is_text_task(c)),
      dev_(run_device(c)),
      ckpt_(checkpoint_path(c)),
      meta_{{"config", config_to_json(c)}} {
  meta_.insert(parts_.metadata.begin(), parts_.metadata.end());
  if ((c.auto_precision || resumed.count(kAutoPrecisionKey) != 0) && parts_.refs.model != nullptr) {
    auto_ = std::make_unique<amp::AutoPrecision>(amp::AutoPrecisionOptions{.overflow = c.auto_precision_overflow,
                                                                           .underflow = c.auto_precision_underflow,
                                                                           .patience = c.auto_precision_patience,
                                                                           .every = c.auto_precision_every});
    if (const auto it = resumed.find(kAutoPrecisionKey); it != resumed.end()) replay_precision(it->second);
  }
  if (!ckpt_.empty() && writes()) std::filesystem::create_directories(c.checkpoint_dir);
  if (parts_.dp != nullptr) parts_.dp->agree_on_found_inf(parts_.scaler);  // Note [data-parallel training] 4
  if (data_parallel() && c.shard_optimizer) {  // Note [sharded optimizer state]: after the state is complete
    shards_ = parts_.dp->optimizer_shards(parts_.optimizer);
    for (const Tensor& p : parts_.params) (void)shards_->owner(p);  // each has one
  } else if (data_parallel() && c.bucket_mb > 0) {
    buckets_ = parts_.dp->gradient_buckets(parts_.params, c.bucket_mb, c.grad_comm_dtype);
  }
  if (c.sync_batchnorm)  // Note [synchronised batch norm]: before the first training forward; one process sums nothing
    sync_bn_ = std::make_unique<nn::SyncBatchNormScope>(data_parallel() ? parts_.dp->batch_norm_sum()
                                                                        : nn::BatchNormAllReduce([](const Tensor&) {}));
  snapshot_buffers();  // the state the run starts from (resumed or not) is good
  paths_at_start_ = kernel_path_record();
  if (c.resume) check_resumed_config(resumed);
  adopt_kernel_paths(resumed);
  if (!c.log.empty() && c.resume)  // Note [a resumed run's log]
    log_.emplace(c.log, RunLog::ResumePoint{.global_step = start.global_step, .epochs_done = start.epoch});
  else if (!c.log.empty())
    log_.emplace(c.log, /*append=*/false);
  // both off: no recorder, no hooks, nothing changes
  if ((c.numerics_every > 0 || c.auto_precision) && parts_.refs.model != nullptr) {
    numerics_ = std::make_unique<amp::NumericsRecorder>(*parts_.refs.model);
    arm_for(start.global_step + 1);
  }
  if (const auto b = resumed.find(kBestKey); b != resumed.end()) {  // Note [the best epoch]
    const std::string what = "checkpoint '" + ckpt_ + "': metadata '" + kBestKey + "'";
    const nlohmann::json j = parse_metadata(what, b->second);
    MP_CHECK(j.is_object() && j.contains("epoch") && j["epoch"].is_number_integer() && j.contains("metric") &&
                 j["metric"].is_string(),
             what, ": expected {\"epoch\": N, \"metric\": \"hex float\"}, got ", j.dump());
    const std::string text = j["metric"].get<std::string>();
    char* end = nullptr;
    const double metric = std::strtod(text.c_str(), &end);
    const int64_t epoch = j["epoch"].get<int64_t>();
    MP_CHECK(!text.empty() && end == text.c_str() + text.size() && std::isfinite(metric) && epoch >= 1 &&
                 epoch <= start_.epoch,
             what, ": expected a finite metric of an epoch in 1..", start_.epoch, ", got ", j.dump(),
             "; the file is damaged: resume from another checkpoint");
    best_ = Best{epoch, metric};
    meta_[kBestKey] = b->second;
  }
  const auto it = resumed.find(kEpochStatsKey);
  if (it == resumed.end()) return;  // a fresh run, a checkpoint at an epoch's end, or one written before this key
  const std::string what = "checkpoint '" + ckpt_ + "': metadata '" + kEpochStatsKey + "'";
  const nlohmann::json j = parse_metadata(what, it->second);
  auto number = [&](const char* key) {
    const auto f = j.find(key);
    MP_CHECK(j.is_object() && f != j.end() && f->is_string(), what, ": expected the hex-float string '", key, "', got ",
             f == j.end() || !j.is_object() ? std::string("nothing") : f->dump());
    const std::string text = f->get<std::string>();
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    MP_CHECK(!text.empty() && end == text.c_str() + text.size(), what, ": '", key, "' should be a number, got '", text,
             "'");
    return v;
  };
  EpochCarry r;
  const double epoch = number("epoch"), batch = number("batch"), steps = number("steps");
  MP_CHECK(epoch == static_cast<double>(start_.epoch) && batch == static_cast<double>(start_.batch) && steps >= 0 &&
               steps <= batch && steps == std::floor(steps),
           what, ": it describes ", steps, " steps up to epoch ", epoch, ", batch ", batch,
           " but the checkpoint stands at epoch ", start_.epoch, ", batch ", start_.batch,
           "; the file is inconsistent: resume from another checkpoint");
  r.steps = static_cast<int64_t>(steps);
  r.loss_sum = number("loss_sum");
  r.units = number("units");
  r.seconds = number("seconds");
  r.data_wait = number("data_wait");
  r.ema.value = number("ema");
  r.ema.started = number("ema_started") != 0;
  MP_CHECK(r.units >= 0 && r.seconds >= 0 && r.data_wait >= 0, what, ": units, seconds and data_wait must be ",
           "non-negative, got ", r.units, ", ", r.seconds, ", ", r.data_wait);
  resumed_ = r;
}

void TrainLoop::check_resumed_config(const std::map<std::string, std::string>& resumed) {
  std::optional<TrainConfig> saved;
  if (const auto it = resumed.find("config"); it != resumed.end()) {
    try {
      saved = config_from_json(it->second);
    } catch (const Error& e) {
      out_ << "warning: the training config stored in '" << ckpt_ << "' does not parse (" << e.what()
           << "); cannot tell which settings differ from it\n";
    }
  }
  const int64_t n = c_.grad_accum;
  MP_CHECK(start_.batch % n == 0, "--resume: checkpoint '", ckpt_, "' stands after batch ", start_.batch, " of epoch ",
           start_.epoch + 1, ", which is inside an optimizer step of --grad_accum ", n, " batches",
           saved ? "; it was written with --grad_accum " + std::to_string(saved->grad_accum) : std::string(),
           ": resume with the --grad_accum it was written with");
  if (!saved) return;
  // Settings that change what the run computes; the others (paths, workers, logging, checkpoint
  // cadence, evaluation batch, gradient buckets: Note [bucketed gradient all-reduce] 4) may change freely between
  // processes.
  static const std::set<std::string> kFree{"data_dir",
                                           "num_workers",
                                           "eval_batch_size",
                                           "checkpoint_dir",
                                           "checkpoint_every",
                                           "save_best",
                                           "resume",
                                           "stop_after_steps",
                                           "log",
                                           "label",
                                           "quiet",
                                           "numerics_every",
                                           "bucket_mb",
                                           "dist_timeout",
                                           "shard_optimizer"};
  const nlohmann::ordered_json was = nlohmann::ordered_json::parse(config_to_json(*saved));
  const nlohmann::ordered_json now = nlohmann::ordered_json::parse(meta_.at("config"));
  std::string changed;
  int64_t saved_ranks = 1;  // the global batch is what the data order depends on (Note [data-parallel batches])
  if (const auto w = resumed.find(kWorldSizeKey); w != resumed.end()) {
    const char* text = w->second.c_str();
    char* end = nullptr;
    saved_ranks = std::strtoll(text, &end, 10);
    MP_CHECK(!w->second.empty() && *end == '\0' && saved_ranks >= 1, "checkpoint '", ckpt_, "': metadata '",
             kWorldSizeKey, "' should be a rank count, got '", w->second, "'; the file is damaged");
  }
  const int64_t ranks = data_parallel() ? parts_.dp->size() : 1;
  if (saved_ranks != 1 || ranks != 1) {
    const int64_t was_global = saved->batch_size * saved_ranks, now_global = c_.batch_size * ranks;
    if (was_global != now_global)
      changed += "global batch (ranks x --batch_size) " + std::to_string(saved_ranks) + " x " +
                 std::to_string(saved->batch_size) + " -> " + std::to_string(ranks) + " x " +
                 std::to_string(c_.batch_size);
  }
  // The loss scaler resumes from its saved state, settings included (as PyTorch's GradScaler.load_state_dict):
  // a changed scaler flag does not apply, and the warning says so.
  static const std::set<std::string> kScalerKept{
      "init_scale",           "growth_factor", "backoff_factor", "growth_interval",
      "hysteresis",           "min_scale",     "max_scale",      "max_overflows_at_min_scale",
      "max_consecutive_skips"};
  std::string kept;
  for (auto it = now.begin(); it != now.end(); ++it) {
    if (kFree.count(it.key()) != 0) continue;
    if (it.key() == "batch_size" && (saved_ranks != 1 || ranks != 1)) continue;  // compared as the global batch
    const auto w = was.find(it.key());
    if (w == was.end() || *w == it.value()) continue;
    changed += (changed.empty() ? "" : ", ") + it.key() + " " + w->dump() + " -> " + it.value().dump();
    if (kScalerKept.count(it.key()) != 0) kept += (kept.empty() ? "" : ", ") + it.key();
  }
  if (!changed.empty())
    out_ << "warning: resuming with settings that differ from the checkpoint's run (" << changed
         << "): training continues from the checkpoint but will not retrace that run"
         << (kept.empty() ? ""
                          : "; the loss scaler resumes with its saved state and settings, so " + kept + " keep" +
                                (kept.find(',') == std::string::npos ? "s" : "") +
                                " the checkpoint's value (start a new run to change them)")
         << "\n";
}

void TrainLoop::arm_for(int64_t next) {
  const bool logged = c_.numerics_every > 0 && next % c_.numerics_every == 0;
  auto_step_ = auto_ && c_.auto_precision && (observe_next_ || next % c_.auto_precision_every == 0);
  if (logged || auto_step_) numerics_->arm();
}

void TrainLoop::adopt_kernel_paths(const std::map<std::string, std::string>& resumed) {
  const auto it = resumed.find(kKernelPathsKey);
  if (it == resumed.end()) return;  // a fresh run, an f32 run, or a checkpoint written before this key
  const std::string what = "checkpoint '" + ckpt_ + "': metadata '" + kKernelPathsKey + "'";
  const nlohmann::json j = parse_metadata(what, it->second);
  MP_CHECK(j.is_object(), what, ": expected an object of call -> path, got ", j.dump());
  std::map<std::string, std::string> paths;
  for (const auto& [key, v] : j.items()) {
    MP_CHECK(v.is_string(), what, ": expected a path name for '", key, "', got ", v.dump());
    paths[key] = v.get<std::string>();
  }
  mp::adopt_kernel_paths(paths);
}

void TrainLoop::save(const Progress& p, const nn::StateDict& extra, const std::string& path) {
  const auto t0 = Clock::now();
  std::optional<optim::OptimizerStateDict> gathered;
  if (shards_) {  // Note [sharded optimizer state] 3, 4: every rank sends its part, rank 0 writes the whole
    if (parts_.refs.ema != nullptr) shards_->all_gather_averages(*parts_.refs.ema, *parts_.refs.model);
    gathered = shards_->gather_state(0);
  }
  if (!writes()) return;  // Note [data-parallel training] 6: rank 0 writes
  std::map<std::string, std::string> md = meta_;
  if (const KernelPathRecord r = kernel_path_record(); !r.choices.empty())
    md[kKernelPathsKey] = nlohmann::json(r.choices).dump();
  if (data_parallel()) md[kWorldSizeKey] = std::to_string(parts_.dp->size());
  if (auto_) md[kAutoPrecisionKey] = precision_state_json(*auto_, observe_next_);
  if (p.batch > 0) {  // within an epoch: its statistics so far (Note [resumed epoch statistics])
    const nlohmann::ordered_json j{{"epoch", hex_double(static_cast<double>(p.epoch))},
                                   {"batch", hex_double(static_cast<double>(p.batch))},
                                   {"steps", hex_double(static_cast<double>(epoch_steps_))},
                                   {"loss_sum", hex_double(loss_sum_)},
                                   {"units", hex_double(carry_.units + units_)},
                                   {"seconds", hex_double(carry_.seconds + seconds_since(t_epoch_) - ckpt_seconds_)},
                                   {"data_wait", hex_double(carry_.data_wait + data_wait_)},
                                   {"ema", hex_double(ema_.value)},
                                   {"ema_started", hex_double(ema_.started ? 1 : 0)}};
    md[kEpochStatsKey] = j.dump();
  }
  CheckpointRefs refs = parts_.refs;
  if (gathered) refs.optimizer_state = &*gathered;
  save_checkpoint(path.empty() ? ckpt_ : path, refs, p, extra, md);
  ckpt_seconds_ += seconds_since(t0);
}

void TrainLoop::snapshot_buffers() {
  if (parts_.refs.model == nullptr) return;
  autograd::NoGradGuard ng;
  const std::vector<Tensor> live = parts_.refs.model->buffers();
  if (buffers_.size() != live.size()) {
    buffers_.clear();
    for (const Tensor& b : live) buffers_.push_back(b.detach().clone());
    return;
  }
  for (size_t i = 0; i < live.size(); ++i) buffers_[i].copy_(live[i]);
}

void TrainLoop::restore_buffers() {
  if (parts_.refs.model == nullptr) return;
  autograd::NoGradGuard ng;
  std::vector<Tensor> live = parts_.refs.model->buffers();
  MP_ASSERT(live.size() == buffers_.size(), "restore_buffers: the model has ", live.size(), " buffers, the copy ",
            buffers_.size());
  for (size_t i = 0; i < live.size(); ++i) live[i].copy_(buffers_[i]);
}

std::string TrainLoop::stop_for_numerical_failure(const std::string& what, const Progress& at, double scale) {
  MP_ASSERT(parts_.refs.model != nullptr, "stop_for_numerical_failure: the run's checkpoint refs hold no model");
  restore_buffers();
  std::string msg = what;
  // The live weights are the last good ones unless an update overflowed them (Note [stopping on a numerical
  // failure]); the check runs only here, once.
  std::string bad;
  for (const auto& [name, t] : parts_.refs.model->state_dict())
    if (amp::any_nonfinite({t})) {
      bad = name;
      break;
    }
  // Replay the step's batches under the overflow finder, the loss scaled as the step scaled it.
  std::string found = "First non-finite: not looked for (the step's batches cannot be replayed)";
  if (!micro_replays_.empty() && micro_replays_.front()) {
    amp::OverflowFinder finder(*parts_.refs.model);
    try {
      for (const auto& replay : micro_replays_) {
        parts_.optimizer.zero_grad();
        mul(replay().to(DType::f32), scale / static_cast<double>(c_.grad_accum)).backward();
        if (finder.first_forward() || finder.first_backward()) break;
      }
      found = first_nonfinite_text(finder);
    } catch (const Error& e) {
      found = std::string("First non-finite: unknown (replaying the step failed: ") + e.what() + ")";
    }
    parts_.optimizer.zero_grad();
    restore_buffers();
  }
  msg += ". " + found + ". ";
  const int64_t failing = at.global_step + 1;
  if (!bad.empty()) {
    std::error_code ec;
    msg += "The weights were already non-finite when step " + std::to_string(failing) + " began (first: '" + bad +
           "'): an earlier step overflowed them while its loss and gradients were finite (an update beyond the "
           "weights' range: finite gradients times a huge learning rate), and no finite copy is kept; " +
           (!ckpt_.empty() && std::filesystem::exists(ckpt_, ec)
                ? "the newest periodic checkpoint is " + ckpt_
                : std::string("there is no periodic checkpoint (--checkpoint_dir, --checkpoint_every)")) +
           "; no last-good file was written";
    return msg;
  }
  const std::string path = last_good_path(c_);
  if (const auto dir = std::filesystem::path(path).parent_path(); !dir.empty() && writes())
    std::filesystem::create_directories(dir);
  save(at, {}, path);
  sum_.last_good_file = path;
  msg += "Wrote the last good state (the finite weights step " + std::to_string(failing) +
         " began from; its update was not applied) to " + path +
         ": `mixprec eval` evaluates it; copied over checkpoint.safetensors, --resume retries the step from it";
  return msg;
}

void TrainLoop::begin_epoch(int64_t epoch, int64_t first, int64_t batches) {
  epoch_ = epoch;
  carry_ = {};
  if (resumed_ && epoch == start_.epoch && first == start_.batch) carry_ = *resumed_;
  resumed_.reset();
  done_ = 0;
  epoch_steps_ = carry_.steps;
  loss_sum_ = carry_.loss_sum;
  units_ = ckpt_seconds_ = data_wait_ = 0;
  ema_ = carry_.ema;
  micro_units_ = 0;
  micro_losses_.clear();
  micro_replays_.clear();
  MP_ASSERT(first % c_.grad_accum == 0 && batches % c_.grad_accum == 0, "begin_epoch: batches ", first, "..", batches,
            " are not whole optimizer steps of ", c_.grad_accum);
  bar_ = std::make_unique<ProgressBar>(out_, "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(c_.epochs),
                                       (batches - first) / c_.grad_accum, text_ ? "tok/s" : "img/s", out_is_tty(out_));
  t_epoch_ = Clock::now();
}

bool TrainLoop::step(const Tensor& loss, int64_t batch, double units, double data_wait,
                     const std::function<nn::StateDict()>& extra, const std::function<Tensor()>& replay) {
  amp::GradScaler& scaler = parts_.scaler;
  const int64_t n = c_.grad_accum;  // Note [gradient accumulation]
  const bool last = static_cast<int64_t>(micro_losses_.size()) + 1 == n;
  if (data_parallel() && micro_losses_.empty())
    fail_this_rank_for_a_test(parts_.dp->rank(), start_.global_step + sum_.steps + 1);
  if (buckets_ && last) buckets_->arm();  // Note [bucketed gradient all-reduce] 2: the step's last backward only
  scaler.scale(n == 1 ? loss : mul(loss, 1.0 / static_cast<double>(n))).backward();
  micro_losses_.push_back(loss.detach());  // with a scaler, read after the step: no device sync before it is queued
  micro_replays_.push_back(replay);
  micro_units_ += units;
  const auto batches = static_cast<int64_t>(micro_losses_.size());
  if (batches < n) {
    if (batches == 1) amp::accumulate_grads_in_f32(parts_.params);
    return true;
  }
  // Note [data-parallel training] 4: the ranks agree on the step's loss, inf/NaN and stop requests and average the
  // gradients, once per optimizer step
  std::optional<DataParallel::StepAgreement> agreed;
  if (data_parallel()) {
    double local = 0;
    for (const Tensor& b : micro_losses_) local += b.item<double>();
    agreed = parts_.dp->average_gradients(
        parts_.params, local / static_cast<double>(n), amp::any_nonfinite(micro_losses_),
        g_stop_requested.load(std::memory_order_relaxed), buckets_.get(), shards_.get(), c_.grad_comm_dtype);
  }
  // Note [stopping on a numerical failure]: where this step began, and the scale its gradients carry
  const Progress began{epoch_, batch + 1 - n, start_.global_step + sum_.steps};
  const double step_scale = scaler.get_scale();
  bool stepped = false;
  const bool record = numerics_ && numerics_->armed();
  if (record) numerics_->gradients(step_scale);  // as the backward left them: scaled, before any check
  if (!scaler.is_enabled()) {  // nothing else looks: check the loss and the gradients before the update
    std::vector<Tensor> check = agreed ? std::vector<Tensor>{} : micro_losses_;
    for (const Tensor& p : parts_.params) check.push_back(p.grad());
    bool nonfinite = (agreed && agreed->loss_nonfinite) || amp::any_nonfinite(check);
    if (shards_) nonfinite = shards_->sum(nonfinite ? 1 : 0) > 0;  // each rank checked its part of the gradients
    if (nonfinite) {
      const bool loss_bad = agreed ? agreed->loss_nonfinite : amp::any_nonfinite(micro_losses_);
      const std::string what =
          std::string(loss_bad ? "the loss" : "the gradients (of a finite loss)") + " became inf/NaN at step " +
          std::to_string(began.global_step + 1) + " with no loss scaling to skip it; lower --lr" +
          (c_.clip_grad_norm > 0 ? "" : ", or add --clip_grad_norm") +
          (c_.precision == DType::f16 ? ", or train in bf16 (f32's exponent range: no overflow at 65504)" : "");
      sum_.numerical_failure = stop_for_numerical_failure(what, began, step_scale);
      sum_.diverged = true;
      parts_.optimizer.zero_grad();
    }
  }
  if (!sum_.diverged) {
    if (c_.clip_grad_norm > 0) {
      scaler.unscale_(parts_.optimizer);
      std::function<double(double)> total;  // Note [sharded optimizer state] 2: the global norm
      if (shards_) total = [this](double sq) { return shards_->sum(sq); };
      optim::clip_grad_norm_(parts_.params, c_.clip_grad_norm, total);
    }
    if (record) numerics_->before_update(parts_.optimizer);
    stepped = scaler.step(parts_.optimizer);
    if (stepped && shards_) shards_->all_gather_weights();
    if (record) numerics_->after_update(parts_.optimizer, stepped);
    parts_.optimizer.zero_grad();
    try {
      scaler.update();
    } catch (const NumericalError& e) {  // the scaler gives up (Note [giving up on a loss scale])
      throw NumericalError(stop_for_numerical_failure(e.what(), began, step_scale));
    }
    if (stepped) parts_.scheduler.step();  // a skipped step does not advance the schedule
    if (stepped && parts_.refs.ema != nullptr) parts_.refs.ema->update(*parts_.refs.model, &parts_.optimizer);
    if (stepped) snapshot_buffers();
  }
  micro_replays_.clear();

  double l = 0;  // the mean loss of the step's batches (of every rank's)
  if (agreed) {
    l = agreed->loss;
  } else {
    for (const Tensor& b : micro_losses_) l += b.item<double>();
    l /= static_cast<double>(n);
  }
  units = micro_units_ * (agreed ? parts_.dp->size() : 1);  // every rank's part of the global batches
  micro_units_ = 0;
  micro_losses_.clear();
  ++sum_.steps;
  ++done_;
  ++epoch_steps_;
  loss_sum_ += l;
  ema_.add(l);
  sum_.step_losses.push_back(l);
  units_ += units;
  data_wait_ = data_wait;
  const int64_t global = start_.global_step + sum_.steps;
  if (log_) {
    const double elapsed = carry_.seconds + seconds_since(t_epoch_) - ckpt_seconds_;
    std::vector<std::pair<std::string, LogValue>> fields{
        {"type", std::string("step")},
        {"epoch", epoch_ + 1},
        {"step", global},
        {"loss", l},
        {"lr", parts_.optimizer.lr(0)},
        {"scale", scaler.get_scale()},
        {"skipped", !stepped},
        {"throughput", (carry_.units + units_) / std::max(elapsed, 1e-9)},
        {"data_wait", carry_.data_wait + data_wait},
        {"memory", memory::memory_stats(dev_).allocated - baseline_}};
    if (agreed) {  // docs/RUN_LOG.md: a data-parallel step's gradient communication
      fields.emplace_back("grad_all_reduces", agreed->grad_all_reduces);
      fields.emplace_back("grad_bytes", agreed->grad_bytes);
      fields.emplace_back("comm_wait", agreed->comm_wait);
      fields.emplace_back("comm_in_backward", agreed->comm_in_backward);
    }
    log_->write(fields);
  }
  if (record) {
    const std::vector<amp::LayerNumerics> layers = numerics_->take();
    if (log_ && c_.numerics_every > 0 && global % c_.numerics_every == 0)
      write_numerics(*log_, epoch_ + 1, global, step_scale, layers);
    if (auto_step_ && !sum_.diverged) observe_precision(layers, step_scale, global);  // Note [automatic precision]
  }
  if (auto_) observe_next_ = !stepped;
  if (numerics_) arm_for(global + 1);  // before the next step's forward
  if (!c_.quiet) {
    std::vector<std::pair<std::string, std::string>> fields{{"loss", fmt(ema_.value, text_ ? 3 : 4)}};
    if (text_) fields.emplace_back("ppl", fmt(perplexity(ema_.value), 1));
    fields.emplace_back("scale", fmt(scaler.get_scale(), 0));
    bar_->update(done_, units_, fields);
  }
  const Progress here{epoch_, batch + 1, global};
  const bool requested = agreed ? agreed->stop : g_stop_requested.load(std::memory_order_relaxed);
  if (requested) sum_.interrupted = true;
  const bool stop = requested || (c_.stop_after_steps > 0 && sum_.steps >= c_.stop_after_steps);
  if (!ckpt_.empty() && !sum_.diverged && (stop || (c_.checkpoint_every > 0 && global % c_.checkpoint_every == 0)))
    save(here, extra ? extra() : nn::StateDict{});
  if (stop) sum_.stopped_early = true;
  return !stopped();
}

bool TrainLoop::end_training(double data_wait) {
  if (!micro_losses_.empty()) {  // the data ended inside an optimizer step (not in whole-step epochs): drop it
    parts_.optimizer.zero_grad();
    micro_units_ = 0;
    micro_losses_.clear();
    micro_replays_.clear();
  }
  data_wait_ = data_wait;
  // Note [sharded optimizer state] 3: the averages evaluated next are the owners'
  if (shards_ && parts_.refs.ema != nullptr && !sum_.stopped_early)
    shards_->all_gather_averages(*parts_.refs.ema, *parts_.refs.model);
  const double process_seconds = seconds_since(t_epoch_) - ckpt_seconds_;  // this process's part
  epoch_seconds_ = carry_.seconds + process_seconds;
  if (!c_.quiet) bar_->finish({{"loss", fmt(ema_.value, text_ ? 3 : 4)}});
  bar_.reset();
  sum_.train_seconds += process_seconds;
  sum_.data_wait_seconds += data_wait;
  total_units_ += units_;
  return !sum_.stopped_early;  // a stopped run continues elsewhere with --resume: no evaluation here
}

void TrainLoop::end_epoch(const Eval& model, const std::optional<Eval>& ema, double eval_seconds) {
  sum_.eval_seconds += eval_seconds;
  const double wait = carry_.data_wait + data_wait_;
  const double val_loss = model.loss, val_metric = model.metric;
  EpochStats es{.epoch = epoch_ + 1,
                .train_loss = epoch_steps_ > 0 ? loss_sum_ / static_cast<double>(epoch_steps_) : 0,
                .val_loss = val_loss,
                .val_metric = val_metric,
                .seconds = epoch_seconds_,
                .data_wait_seconds = wait};
  if (ema) {
    es.ema_val_loss = ema->loss;
    es.ema_val_metric = ema->metric;
  }
  sum_.epochs.push_back(es);
  sum_.val_loss = val_loss;
  sum_.val_metric = val_metric;
  sum_.ema_val_loss = es.ema_val_loss;
  sum_.ema_val_metric = es.ema_val_metric;
  if (!c_.quiet) {
    out_ << "  epoch " << es.epoch << ": train loss " << fmt(es.train_loss, 4);
    if (text_)
      out_ << " (ppl " << fmt(perplexity(es.train_loss), 1) << "), valid loss " << fmt(val_loss, 4) << " (ppl "
           << fmt(val_metric, 2) << ")";
    else
      out_ << ", test loss " << fmt(val_loss, 4) << ", test accuracy " << fmt(100 * val_metric, 2) << "%";
    if (ema)
      out_ << (text_ ? ", EMA valid ppl " + fmt(ema->metric, 2)
                     : ", EMA test accuracy " + fmt(100 * ema->metric, 2) + "%");
    out_ << ", " << fmt(epoch_seconds_, 1) << " s (data wait " << fmt(wait, 1) << " s)\n";
  }
  if (log_) {
    std::vector<std::pair<std::string, LogValue>> fields{{"type", std::string("epoch")},
                                                         {"epoch", es.epoch},
                                                         {"train_loss", es.train_loss},
                                                         {"val_loss", val_loss},
                                                         {text_ ? "val_perplexity" : "val_accuracy", val_metric}};
    if (ema) {
      fields.emplace_back("ema_val_loss", ema->loss);
      fields.emplace_back(text_ ? "ema_val_perplexity" : "ema_val_accuracy", ema->metric);
    }
    fields.insert(fields.end(), {{"seconds", epoch_seconds_},
                                 {"data_wait", wait},
                                 {"peak_memory", memory::memory_stats(dev_).peak_allocated - baseline_},
                                 {"skipped_total", parts_.scaler.skipped_steps()},
                                 {"scale", parts_.scaler.get_scale()}});
    log_->write(fields);
  }
  // Note [the best epoch]
  const double judged = ema ? ema->metric : val_metric;
  const bool better = std::isfinite(judged) && (!best_ || (text_ ? judged < best_->metric : judged > best_->metric));
  if (better) {
    best_ = Best{es.epoch, judged};
    meta_[kBestKey] = nlohmann::ordered_json{{"epoch", es.epoch}, {"metric", hex_double(judged)}}.dump();
  }
  const Progress at{epoch_ + 1, 0, start_.global_step + sum_.steps};
  if (sum_.diverged) return;  // checkpoint.safetensors keeps the last state before the failure
  if (!ckpt_.empty()) save(at, {});
  if (better && c_.save_best) {
    const std::string path = (std::filesystem::path(c_.checkpoint_dir) / "best.safetensors").string();
    save(at, {}, path);
    if (!c_.quiet) out_ << "  best so far: wrote " << path << "\n";
  }
}

void TrainLoop::finish() {
  if (best_) {
    sum_.best_epoch = best_->epoch;
    sum_.best_val_metric = best_->metric;
  }
  if (best_ && c_.save_best) {  // a first process without --save_best wrote no file for its best epoch
    const std::string path = (std::filesystem::path(c_.checkpoint_dir) / "best.safetensors").string();
    std::map<std::string, std::string> md;
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      try {
        (void)read_safetensors_header(path, &md);
      } catch (const Error&) {
        md.clear();  // damaged: not the best epoch's file
      }
    }
    if (md.count(kBestKey) != 0 && md[kBestKey] == meta_[kBestKey]) sum_.best_checkpoint = path;
  }
  sum_.peak_bytes = memory::memory_stats(dev_).peak_allocated - baseline_;
  sum_.skipped_steps = parts_.scaler.skipped_steps();
  sum_.final_loss_scale = parts_.scaler.get_scale();
  sum_.throughput = sum_.train_seconds > 0 ? total_units_ / sum_.train_seconds : 0;
  KernelPathRecord r = kernel_path_record();  // the counters of this run: the difference since its start
  r.measured -= paths_at_start_.measured;
  r.from_cache -= paths_at_start_.from_cache;
  r.from_record -= paths_at_start_.from_record;
  r.defaults -= paths_at_start_.defaults;
  r.measure_seconds -= paths_at_start_.measure_seconds;
  sum_.kernel_paths = std::move(r);
}

}  // namespace mp::train::detail

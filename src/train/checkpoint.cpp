#include "mp/train/checkpoint.hpp"

#include <cstring>
#include <optional>
#include <string_view>

#include "mp/core/philox.hpp"
#include "mp/train/safetensors.hpp"

namespace mp::train {

// Note [exact resume]
// A resumed run repeats the uninterrupted one bit for bit on the CPU because every input of a step
// is either restored or a pure function of restored values:
//   - parameters and buffers in their stored dtype (a bf16 model is saved as bf16, not widened),
//     the optimizer's f32 masters and moments, the loss scale and its trackers, the schedule's step;
//   - default_generator()'s (seed, offset), so dropout draws continue the same Philox stream;
//   - the data order: the loader derives epoch e's permutation and batch b's augmentation seed from
//     (seed, e, b) alone, so the run restarts at (epoch, batch) of Progress;
//   - the weights' f32 moving averages (--ema_decay) and their update count, under "ema.";
//   - run-specific state such as the word LM's hidden state, saved by the trainer under "extra.".
// Kernels are deterministic for a given thread count (oneDNN and our OpenMP loops use static
// schedules), so CPU results repeat exactly on the same machine.

namespace {

constexpr std::string_view kModel = "model.", kOptim = "optimizer.", kScaler = "scaler.", kSched = "scheduler.",
                           kRng = "rng.", kExtra = "extra.", kEma = "ema.";

bool starts_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}

nn::StateDict section(const nn::StateDict& all, std::string_view prefix) {
  nn::StateDict out;
  for (const auto& [name, t] : all)
    if (starts_with(name, prefix)) out.insert(name.substr(prefix.size()), t);
  return out;
}

Tensor i64_scalar(int64_t v) { return from_vector(std::vector<int64_t>{v}, {}); }

int64_t read_i64(const nn::StateDict& sd, const std::string& key, const std::string& path) {
  const Tensor* t = sd.find(key);
  MP_CHECK(t != nullptr, "checkpoint '", path, "': tensor '", key, "' is missing; the file was not written by ",
           "mixprec's save_checkpoint or is damaged");
  MP_CHECK(t->dtype() == DType::i64 && t->numel() == 1, "checkpoint '", path, "': tensor '", key,
           "' should be one i64 value, got ", t->describe());
  return t->contiguous().data_ptr<int64_t>()[0];
}

int64_t read_meta_i64(const std::map<std::string, std::string>& md, const char* key, const std::string& path) {
  auto it = md.find(key);
  MP_CHECK(it != md.end(), "checkpoint '", path, "': metadata '", key, "' is missing");
  try {
    size_t pos = 0;
    const long long v = std::stoll(it->second, &pos);
    if (pos == it->second.size() && v >= 0) return v;
  } catch (...) {}
  MP_FAIL("checkpoint '", path, "': metadata '", key, "' should be a non-negative integer, got '", it->second, "'");
}

}  // namespace

void save_checkpoint(const std::string& path, const CheckpointRefs& refs, const Progress& progress,
                     const nn::StateDict& extra, const std::map<std::string, std::string>& metadata) {
  nn::StateDict all;
  if (refs.model != nullptr)
    for (const auto& [name, t] : refs.model->state_dict()) all.insert(std::string(kModel) + name, t);
  if (refs.optimizer_state != nullptr)
    for (const auto& [name, t] : refs.optimizer_state->flatten()) all.insert(std::string(kOptim) + name, t);
  else if (refs.optimizer != nullptr)
    for (const auto& [name, t] : refs.optimizer->state_dict().flatten()) all.insert(std::string(kOptim) + name, t);
  if (refs.scaler != nullptr)
    for (const auto& [name, t] : refs.scaler->state_dict()) all.insert(std::string(kScaler) + name, t);
  if (refs.scheduler != nullptr) {
    const optim::SchedulerStateDict s = refs.scheduler->state_dict();
    all.insert(std::string(kSched) + "last_step", i64_scalar(s.last_step));
    all.insert(std::string(kSched) + "base_lrs", from_vector(s.base_lrs, {static_cast<int64_t>(s.base_lrs.size())}));
  }
  if (refs.generator) {
    const PhiloxState st = default_generator().state();
    int64_t seed = 0, offset = 0;
    std::memcpy(&seed, &st.seed, sizeof seed);  // u64 stored bit for bit in an i64 tensor
    std::memcpy(&offset, &st.offset, sizeof offset);
    all.insert(std::string(kRng) + "seed", i64_scalar(seed));
    all.insert(std::string(kRng) + "offset", i64_scalar(offset));
  }
  if (refs.ema != nullptr)
    for (const auto& [name, t] : refs.ema->state_dict()) all.insert(std::string(kEma) + name, t);
  for (const auto& [name, t] : extra) all.insert(std::string(kExtra) + name, t);

  std::map<std::string, std::string> md = metadata;
  md[kCheckpointFormatKey] = kCheckpointFormat;
  md["epoch"] = std::to_string(progress.epoch);
  md["batch"] = std::to_string(progress.batch);
  md["global_step"] = std::to_string(progress.global_step);
  save_safetensors(path, all, md);
}

LoadedCheckpoint load_checkpoint(const std::string& path, const CheckpointRefs& refs) {
  SafetensorsFile f = load_safetensors(path);
  auto fmt = f.metadata.find(kCheckpointFormatKey);
  MP_CHECK(fmt != f.metadata.end() && fmt->second == kCheckpointFormat, "checkpoint '", path,
           "' is not a mixprec training checkpoint (metadata 'format' is ",
           fmt == f.metadata.end() ? std::string("absent") : "'" + fmt->second + "'", ", expected '", kCheckpointFormat,
           "'); to evaluate plain weights use `mixprec eval`");
  LoadedCheckpoint out;
  out.metadata = f.metadata;
  out.progress.epoch = read_meta_i64(f.metadata, "epoch", path);
  out.progress.batch = read_meta_i64(f.metadata, "batch", path);
  out.progress.global_step = read_meta_i64(f.metadata, "global_step", path);

  // Parse every section before restoring anything, so a bad file leaves the live objects untouched.
  const nn::StateDict model_sd = section(f.tensors, kModel);
  std::optional<optim::OptimizerStateDict> optim_sd;
  if (refs.optimizer != nullptr) {
    nn::StateDict flat = section(f.tensors, kOptim);
    MP_CHECK(!flat.empty(), "checkpoint '", path, "' holds no optimizer state");
    try {
      optim_sd = optim::OptimizerStateDict::unflatten(flat);
    } catch (const Error& e) { MP_FAIL("checkpoint '", path, "': optimizer state: ", e.what()); }
  }
  const nn::StateDict scaler_sd = section(f.tensors, kScaler);
  if (refs.scaler != nullptr) MP_CHECK(!scaler_sd.empty(), "checkpoint '", path, "' holds no loss-scaler state");
  optim::SchedulerStateDict sched_sd;
  if (refs.scheduler != nullptr) {
    const nn::StateDict s = section(f.tensors, kSched);
    sched_sd.last_step = read_i64(s, "last_step", path + " (scheduler)");
    const Tensor* b = s.find("base_lrs");
    MP_CHECK(b != nullptr && b->dtype() == DType::f64 && b->dim() == 1, "checkpoint '", path,
             "': scheduler.base_lrs should be an f64 vector");
    sched_sd.base_lrs = b->to_vector<double>();
  }
  const nn::StateDict ema_sd = section(f.tensors, kEma);
  if (refs.ema != nullptr)
    MP_CHECK(!ema_sd.empty(), "checkpoint '", path, "' holds no weight averages (section 'ema.'): it was written ",
             "by a run without --ema_decay; resume without it, or start a new run");
  int64_t rng_seed = 0, rng_offset = 0;
  if (refs.generator) {
    const nn::StateDict r = section(f.tensors, kRng);
    rng_seed = read_i64(r, "seed", path + " (rng)");
    rng_offset = read_i64(r, "offset", path + " (rng)");
  }

  auto restore = [&](const char* what, auto&& fn) {
    try {
      fn();
    } catch (const Error& e) { MP_FAIL("checkpoint '", path, "': cannot restore the ", what, ": ", e.what()); }
  };
  if (refs.model != nullptr) restore("model", [&] { refs.model->load_state_dict(model_sd, /*strict=*/true); });
  if (refs.optimizer != nullptr) restore("optimizer", [&] { refs.optimizer->load_state_dict(*optim_sd); });
  if (refs.scaler != nullptr) restore("loss scaler", [&] { refs.scaler->load_state_dict(scaler_sd); });
  if (refs.scheduler != nullptr) restore("LR schedule", [&] { refs.scheduler->load_state_dict(sched_sd); });
  if (refs.ema != nullptr) restore("weight averages", [&] { refs.ema->load_state_dict(ema_sd); });
  if (refs.generator) {
    uint64_t seed = 0, offset = 0;
    std::memcpy(&seed, &rng_seed, sizeof seed);
    std::memcpy(&offset, &rng_offset, sizeof offset);
    default_generator().set_state(seed, offset);
  }
  out.extra = section(f.tensors, kExtra);
  return out;
}

nn::StateDict read_model_state(const std::string& path, std::map<std::string, std::string>* metadata, bool ema) {
  SafetensorsFile f = load_safetensors(path);
  if (metadata != nullptr) *metadata = f.metadata;
  auto fmt = f.metadata.find(kCheckpointFormatKey);
  const bool checkpoint = fmt != f.metadata.end() && fmt->second == kCheckpointFormat;
  if (!ema) return checkpoint ? section(f.tensors, kModel) : std::move(f.tensors);
  nn::StateDict avg = checkpoint ? section(f.tensors, kEma) : nn::StateDict();
  MP_CHECK(!avg.empty(), "'", path, "' holds no weight averages (section 'ema.' of a checkpoint of `mixprec train ",
           "--ema_decay`); evaluate it without --ema");
  avg.erase("num_updates");
  return avg;
}

}  // namespace mp::train

// The image-classification training loop and the pieces both loops share.
#include "mp/train/trainer.hpp"

#include <algorithm>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <nlohmann/json.hpp>

#include "mp/amp/grad_scaler.hpp"
#include "mp/autograd/node.hpp"
#include "mp/core/math_mode.hpp"
#include "mp/core/philox.hpp"
#include "mp/data/data.hpp"
#include "mp/dist/device_group.hpp"
#include "mp/dist/process_group.hpp"
#include "mp/memory/allocator.hpp"
#include "mp/models/gpt.hpp"
#include "mp/models/registry.hpp"
#include "mp/nn/batch_norm.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/optim.hpp"
#include "mp/train/interop.hpp"
#include "mp/system.hpp"
#include "mp/train/progress.hpp"
#include "train/setup.hpp"
#include "train/train_loop.hpp"

namespace mp::train {
namespace detail {

std::unique_ptr<optim::WarmupSchedule> make_schedule(const TrainConfig& c, optim::Optimizer& opt,
                                                     int64_t steps_per_epoch) {
  const int64_t total = std::max<int64_t>(1, steps_per_epoch * c.epochs);
  optim::WarmupScheduleOptions o;
  o.warmup_steps = std::min<int64_t>(total, std::llround(c.warmup_epochs * static_cast<double>(steps_per_epoch)));
  o.total_steps = total;
  if (c.schedule == "constant") o.decay = optim::Decay::constant;
  if (c.schedule == "linear") o.decay = optim::Decay::linear;
  if (c.schedule == "cosine") o.decay = optim::Decay::cosine;
  if (c.schedule == "step") {
    o.decay = optim::Decay::step;
    o.step_size = std::max<int64_t>(1, (total - o.warmup_steps) / 3);
    o.gamma = 0.1;
  }
  // validate() compares epochs; here the rounding to steps can still leave no step to decay over.
  MP_CHECK(o.warmup_steps < total || (c.schedule != "linear" && c.schedule != "cosine"), "--warmup_epochs ",
           c.warmup_epochs, " is ", o.warmup_steps, " warm-up steps, the whole run of ", total, " steps (",
           steps_per_epoch, " per epoch, --epochs ", c.epochs, "), but --schedule ", c.schedule,
           " decays after the warm-up: use fewer --warmup_epochs, more --epochs, or --schedule constant");
  return std::make_unique<optim::WarmupSchedule>(opt, o);
}

std::string checkpoint_path(const TrainConfig& c) {
  if (c.checkpoint_dir.empty()) return "";
  return (std::filesystem::path(c.checkpoint_dir) / "checkpoint.safetensors").string();
}

bool out_is_tty(const std::ostream& out) { return &out == &std::cout && is_terminal(stdout); }

amp::AmpOptions convert_for_eval(const TrainConfig& c, nn::Module& model, const nn::StateDict& weights) {
  const amp::AmpOptions o = amp::resolve(amp_options(c));
  if (o.opt_level == amp::OptLevel::O2 || o.opt_level == amp::OptLevel::O3) {
    if (*o.keep_batchnorm_fp32)
      model.to(o.dtype, [](const nn::Module& m) { return !nn::is_batch_norm(m); });
    else
      model.to(o.dtype);
  }
  if (!c.auto_precision) return o;
  std::set<const nn::Module*> moved;  // the modules with 16-bit parameters stored in f32
  for (auto& [name, m] : model.named_modules()) {
    bool f32 = false, low = false;
    for (const auto& [pn, p] : m->named_parameters(false)) {
      const Tensor* t = weights.find(name.empty() ? pn : name + "." + pn);
      low = low || is_low_precision(p.dtype());
      f32 = f32 || (t != nullptr && is_low_precision(p.dtype()) && t->dtype() == DType::f32);
    }
    if (low && f32) moved.insert(m);
  }
  if (!moved.empty()) model.to(DType::f32, [&](const nn::Module& m) { return moved.count(&m) != 0; });
  return o;
}

void check_weights_fit(const TrainConfig& c, const nn::Module& model, const nn::StateDict& weights) {
  const StateDictDiff d = diff_state_dict(model, weights);
  MP_CHECK(d.empty(), "eval: the weights do not fit --model ", c.model, " for --dataset ", c.dataset, ":", d.describe(),
           "\nname the model (and dataset) the weights were saved for with --model and --dataset");
}

TrainObjects prepare_training(const TrainConfig& c, nn::Module& model, Device dev, const DataParallel& dp,
                              std::ostream& out) {
  model.to(dev);
  apply_init_from(c, model, out);
  dp.broadcast_model(model);  // Note [data-parallel training] 3
  TrainObjects t;
  t.optimizer = make_optimizer(c, model.parameters());
  t.amp = amp::prepare(model, *t.optimizer, amp_options(c));
  t.scaler = std::make_unique<amp::GradScaler>(t.amp.scaler);
  t.params = model.parameters();
  if (c.ema_decay > 0) t.ema = std::make_unique<optim::ModelEma>(model, c.ema_decay, t.optimizer.get());
  if (!c.quiet && dev.is_cpu() && t.amp.opt_level != amp::OptLevel::O0) {
    const std::string note = cpu_16bit_note(t.amp.dtype);
    if (!note.empty()) out << "note: " << note << "\n";
  }
  return t;
}

void apply_init_from(const TrainConfig& c, nn::Module& model, std::ostream& out) {
  if (c.init_from.empty()) return;
  const InitFromReport r = init_from_file(model, c.init_from, c.init_from_partial);
  if (!c.quiet || !r.diff.empty()) out << r.describe(c.init_from) << "\n";
}

}  // namespace detail

namespace {

using namespace detail;

struct ImageSets {
  std::shared_ptr<data::ImageDataset> train, test;
  int64_t channels = 0, size = 0, classes = 0;
};

data::ImageData load_split(const TrainConfig& c, data::Split split) {
  if (c.dataset == "fashion-mnist")
    return c.data_dir.empty() ? data::load_fashion_mnist(split) : data::load_fashion_mnist(split, c.data_dir);
  if (c.dataset == "mnist") return data::load_fashion_mnist(split, c.data_dir);  // same IDX file names
  if (c.dataset == "cifar10") return data::load_cifar10(split, c.data_dir);
  return data::load_cifar100(split, c.data_dir);
}

// Train split (optionally a prefix subset) with augmentation, test split without; both normalised
// with the training images' channel statistics.
ImageSets load_images(const TrainConfig& c, bool need_train) {
  data::ImageData train = load_split(c, data::Split::train);
  if (c.train_subset > 0 && c.train_subset < train.images.size(0)) {
    train.images = train.images.narrow(0, 0, c.train_subset).contiguous();
    train.labels = train.labels.narrow(0, 0, c.train_subset).contiguous();
  }
  auto [mean, stdev] = data::channel_stats(train);
  ImageSets s;
  s.channels = train.images.size(1);
  s.size = train.images.size(2);
  s.classes = train.num_classes;
  auto norm = data::normalize(mean, stdev);
  data::ImageData test = load_split(c, data::Split::test);
  s.test = std::make_shared<data::ImageDataset>(std::move(test), norm);
  if (need_train) {
    std::shared_ptr<data::Transform> t = norm;
    if (c.augment)
      t = data::compose({data::random_crop(s.size, s.size >= 32 ? 4 : 2), data::random_horizontal_flip(0.5), norm});
    s.train = std::make_shared<data::ImageDataset>(std::move(train), t);
  }
  return s;
}

struct ImageEval {
  double loss = 0, accuracy = 0;
  int64_t examples = 0;
};

// Images [begin, end) of a dataset: a rank's share of the test set (Note [data-parallel training] 6).
class DatasetRange final : public data::Dataset {
 public:
  DatasetRange(std::shared_ptr<const data::Dataset> all, int64_t begin, int64_t end)
      : all_(std::move(all)), begin_(begin), end_(end) {}
  int64_t size() const override { return end_ - begin_; }
  data::Batch get_batch(std::span<const int64_t> indices, uint64_t seed, uint64_t first_stream = 0) const override {
    std::vector<int64_t> shifted(indices.begin(), indices.end());
    for (int64_t& i : shifted) i += begin_;
    return all_->get_batch(shifted, seed, first_stream);
  }

 private:
  std::shared_ptr<const data::Dataset> all_;
  int64_t begin_, end_;
};

// The test set's mean loss and accuracy; on the ranks of a data-parallel run, each evaluates its share with rank 0's
// model and the sums are reduced (Note [data-parallel training] 6).
ImageEval evaluate_images_with(amp::AmpModel& model, const std::shared_ptr<data::ImageDataset>& test,
                               const TrainConfig& c, const DataParallel* dp = nullptr) {
  const bool was_training = model.module().is_training();
  model.module().eval();
  autograd::NoGradGuard ng;
  std::shared_ptr<const data::Dataset> part = test;
  if (dp != nullptr && dp->active()) {
    dp->broadcast_buffers(model.module());
    const auto [begin, end] = dp->share(test->size());
    part = std::make_shared<DatasetRange>(test, begin, end);
  }
  data::DataLoader loader(part, {.batch_size = c.eval_batch_size,
                                 .shuffle = false,
                                 .drop_last = false,
                                 .num_workers = c.num_workers,
                                 .prefetch = 2,
                                 .seed = c.seed});
  loader.start_epoch(0);
  double loss_sum = 0;
  int64_t correct = 0, n = 0;
  const Device dev = run_device(c);
  while (auto b = loader.next()) {
    const Tensor target = b->target.to(dev);
    Tensor logits = model(b->input.to(dev));
    const int64_t bs = target.size(0);
    loss_sum += cross_entropy(logits, target).item<double>() * static_cast<double>(bs);
    correct += sum(eq(argmax(logits, 1), target).to(DType::i64)).item<int64_t>();
    n += bs;
  }
  model.module().train(was_training);
  if (dp != nullptr && dp->active()) {
    const std::vector<double> all =
        dp->sum({loss_sum, static_cast<double>(correct), static_cast<double>(n)});  // counts: exact but for / N * N
    loss_sum = all[0];
    correct = std::llround(all[1]);
    n = std::llround(all[2]);
  }
  MP_CHECK(n > 0, "evaluation: the test split of ", c.dataset, " is empty");
  return {loss_sum / static_cast<double>(n), static_cast<double>(correct) / static_cast<double>(n), n};
}

}  // namespace

namespace detail {

RunSummary train_images(const TrainConfig& c, std::ostream& out, const DataParallel& dp) {
  RunSummary sum;
  sum.label = run_label(c);
  sum.config = c;
  sum.metric_name = "accuracy";
  sum.throughput_unit = "img/s";

  ImageSets sets = load_images(c, /*need_train=*/true);
  const Device dev = run_device(c);
  const int64_t baseline = memory::memory_stats(dev).allocated;
  memory::reset_peak_memory_stats(dev);

  manual_seed(c.seed);
  std::shared_ptr<nn::UnaryModule> model =
      models::create_image_model(c.model, {.in_channels = sets.channels,
                                           .image_size = sets.size,
                                           .num_classes = sets.classes,
                                           .memory_format = models::memory_format_from_flag(c.memory_format)});
  TrainObjects t = prepare_training(c, *model, dev, dp, out);
  std::unique_ptr<optim::Optimizer>& opt = t.optimizer;
  amp::GradScaler& scaler = *t.scaler;
  const std::vector<Tensor>& params = t.params;
  const std::unique_ptr<optim::ModelEma>& ema = t.ema;
  amp::AmpModel amp_model(model, t.amp);  // the forward under the opt level's casting

  data::DataLoader loader(sets.train, {.batch_size = c.batch_size,
                                       .shuffle = true,
                                       .drop_last = true,
                                       .num_workers = c.num_workers,
                                       .prefetch = 4,
                                       .seed = c.seed,
                                       .rank = dp.rank(),
                                       .world_size = dp.size()});
  const int64_t n = c.grad_accum;  // batches per optimizer step (Note [gradient accumulation])
  const std::string ranks = dp.active() ? std::to_string(dp.size()) + " ranks x " : "";  // Note [data-parallel batches]
  MP_CHECK(loader.num_batches() >= n, "train: the training split has ", sets.train->size(), " images, fewer than ",
           n == 1
               ? "one " + std::string(dp.active() ? "global " : "") + "batch of " + ranks + std::to_string(c.batch_size)
               : "one optimizer step of " + ranks + std::to_string(n) + " batches of " + std::to_string(c.batch_size),
           "; lower --batch_size", n == 1 ? "" : " or --grad_accum", dp.active() ? " or use fewer ranks" : "");
  const int64_t steps_per_epoch =
      c.max_steps_per_epoch > 0 ? std::min(c.max_steps_per_epoch, loader.num_batches() / n) : loader.num_batches() / n;
  const int64_t batches = steps_per_epoch * n;  // the batches each epoch uses
  std::unique_ptr<optim::WarmupSchedule> sched = make_schedule(c, *opt, steps_per_epoch);

  const CheckpointRefs refs{.model = model.get(),
                            .optimizer = opt.get(),
                            .scaler = &scaler,
                            .scheduler = sched.get(),
                            .ema = ema ? &*ema : nullptr};
  Progress pos;
  std::map<std::string, std::string> resumed_metadata;
  if (c.resume) {
    const std::string ckpt = checkpoint_path(c);
    MP_CHECK(std::filesystem::exists(ckpt), "--resume: no checkpoint at '", ckpt, "'; run without --resume first");
    LoadedCheckpoint lc = load_checkpoint(ckpt, refs);
    pos = lc.progress;
    resumed_metadata = std::move(lc.metadata);
    if (!c.quiet) out << "resuming from " << ckpt << " at epoch " << pos.epoch + 1 << ", batch " << pos.batch << "\n";
  }
  // Note [data-parallel training] 1, 3, 5
  dp.check_same_run("data and state", nlohmann::ordered_json{{"train_images", sets.train->size()},
                                                             {"test_images", sets.test->size()},
                                                             {"resume_at", {pos.epoch, pos.batch, pos.global_step}},
                                                             {"state", DataParallel::state_signature(refs)}}
                                          .dump());
  if (c.resume) dp.broadcast_state(refs);
  dp.shard_random_draws();
  TrainLoop loop(c, sum, {scaler, *opt, *sched, params, refs, &dp}, pos, baseline, out, resumed_metadata);
  if (!c.quiet)
    out << sum.label << ": " << amp::describe(t.amp) << "; " << c.model << " on " << c.dataset << " ("
        << sets.train->size() << " train / " << sets.test->size() << " test images, " << steps_per_epoch
        << " steps per epoch"
        << (n == 1 ? std::string() : " of " + std::to_string(n) + " x " + std::to_string(c.batch_size) + " images")
        << ")\n";

  for (int64_t epoch = pos.epoch; epoch < c.epochs && !loop.stopped(); ++epoch) {
    const int64_t first = epoch == pos.epoch ? pos.batch : 0;
    // first == batches: checkpointed after the epoch's last step, before its evaluation; the loop
    // below is empty and the epoch ends as it would have.
    model->train();
    loader.reset_wait_seconds();
    loader.start_epoch(epoch, first);
    loop.begin_epoch(epoch, first, batches);
    for (int64_t b = first; b < batches; ++b) {
      std::optional<data::Batch> batch = loader.next();
      if (!batch) break;
      const Tensor x = batch->input.to(dev), y = batch->target.to(dev);
      const auto loss_of = [&amp_model, &c, x, y] {
        return cross_entropy(amp_model(x), y, {.label_smoothing = c.label_smoothing});
      };
      const std::function<Tensor()> replay = replayable(loss_of);  // Note [stopping on a numerical failure]
      const Tensor loss = loss_of();
      if (!loop.step(loss, b, static_cast<double>(batch->target.size(0)), loader.wait_seconds(), {}, replay)) break;
    }
    if (!loop.end_training(loader.wait_seconds())) break;
    const auto t_eval = Clock::now();
    const ImageEval ev = evaluate_images_with(amp_model, sets.test, c, &dp);
    std::optional<TrainLoop::Eval> ema_ev;
    if (ema) {
      const optim::ModelEma::Swap swap = ema->swap_into(*model);
      const ImageEval e = evaluate_images_with(amp_model, sets.test, c, &dp);
      ema_ev = TrainLoop::Eval{e.loss, e.accuracy};
    }
    loop.end_epoch({ev.loss, ev.accuracy}, ema_ev, seconds_since(t_eval));
  }
  loop.finish();
  return sum;
}

EvalResult evaluate_images(const TrainConfig& c, const nn::StateDict& weights, std::ostream& out) {
  const auto t0 = Clock::now();
  ImageSets sets = load_images(c, /*need_train=*/false);
  std::shared_ptr<nn::UnaryModule> model =
      models::create_image_model(c.model, {.in_channels = sets.channels,
                                           .image_size = sets.size,
                                           .num_classes = sets.classes,
                                           .memory_format = models::memory_format_from_flag(c.memory_format)});
  const amp::AmpOptions o = convert_for_eval(c, *model, weights);
  model->to(run_device(c));
  check_weights_fit(c, *model, weights);
  model->load_state_dict(weights, /*strict=*/true);
  amp::AmpModel m(model, o);
  const ImageEval ev = evaluate_images_with(m, sets.test, c);
  return {.metric_name = "accuracy",
          .loss = ev.loss,
          .metric = ev.accuracy,
          .examples = ev.examples,
          .seconds = seconds_since(t0)};
}

}  // namespace detail

RunSummary train(const TrainConfig& config, std::ostream& out) {
  validate(config);
  const TrainConfig c = with_task_defaults(config);
  set_float32_matmul_precision(float32_matmul_precision_from_string(c.matmul_precision));
  dist::world().set_timeout(c.dist_timeout);  // Note [rank failures]: before the first collective
  // CPU tensors through MPI, a GPU run's tensors through NCCL (Note [device groups]).
  const std::shared_ptr<dist::ProcessGroup> group = dist::group_for_device(dist::world(), run_device(c));
  group->set_timeout(c.dist_timeout);
  const detail::DataParallel dp(*group);
  const auto run = [&dp](const TrainConfig& rc, std::ostream& o) {
    if (!is_text_task(rc)) return detail::train_images(rc, o, dp);
    return models::is_gpt_model(rc.model) ? detail::train_gpt(rc, o, dp) : detail::train_text(rc, o, dp);
  };
  if (!dp.active()) return run(c, out);
  // Note [data-parallel training] 1: one configuration (data folders and loader threads may differ per machine)
  nlohmann::ordered_json same = nlohmann::ordered_json::parse(config_to_json(c));
  same.erase("data_dir");
  same.erase("num_workers");
  dp.check_same_run("configuration", nlohmann::ordered_json{{"config", same}}.dump());
  if (dp.writes()) return run(c, out);
  // Note [data-parallel training] 6: the other ranks print nothing and write no log (checkpoints: TrainLoop)
  TrainConfig silent = c;
  silent.quiet = true;
  silent.log.clear();
  std::ostream discard(nullptr);
  return run(silent, discard);
}

const std::vector<std::string>& eval_override_fields() {
  static const std::vector<std::string> names{"model",     "dataset",         "data_dir",    "precision",
                                              "opt_level", "eval_batch_size", "num_workers", "device"};
  return names;
}

EvalResult evaluate_checkpoint(const std::string& path, const std::string& split, const EvalOverrides* overrides,
                               std::ostream& out, bool ema) {
  std::map<std::string, std::string> md;
  nn::StateDict weights = read_model_state(path, &md, ema);
  auto it = md.find("config");
  auto given = [&](const char* name) { return overrides != nullptr && overrides->given.count(name) != 0; };
  if (overrides != nullptr)
    for (const std::string& n : overrides->given)
      MP_CHECK(std::count(eval_override_fields().begin(), eval_override_fields().end(), n) != 0, "eval: --", n,
               " cannot be changed for an evaluation");
  const std::string model_flag = given("model") ? overrides->values.model : "";
  TrainConfig c;
  if (it != md.end()) {  // a checkpoint, or a file `mixprec export` wrote from one: its run names the model
    c = config_from_json(it->second);
    MP_CHECK(model_flag.empty() || model_flag == c.model, "eval: --model ", model_flag, " but '", path,
             "' was trained as ", c.model, " (its metadata 'config' says so); drop --model");
  } else {  // a bare state dict (PyTorch's, or weights without a run): the flags name the model
    MP_CHECK(!model_flag.empty(), "eval: '", path, "' is a bare state dict (no training config in its metadata, ",
             "key 'config'), so the model is unknown; name it with --model NAME (and --dataset, default ", c.dataset,
             "), e.g. `mixprec eval --model resnet8 ", path, "`");
    c.model = model_flag;
  }
  if (overrides != nullptr) {
    const TrainConfig& o = overrides->values;
    const bool other_precision = given("precision") && o.precision != c.precision;
    if (other_precision || (given("opt_level") && o.opt_level != c.opt_level)) {
      // the trained run's O2/O3 properties belong to its level; the new one takes its own defaults
      c.keep_batchnorm_fp32.reset();
      c.master_weights.reset();
      c.stochastic_rounding = false;
      c.auto_precision = false;  // the layers it moved follow the new level as every other layer
    }
    if (other_precision && !given("opt_level")) c.opt_level.reset();  // the new precision's default level
    std::set<std::string> rest = overrides->given;
    rest.erase("model");
    c = with_fields(c, o, rest);
  }
  c.resume = false;
  validate(c);
  c = with_task_defaults(c);
  if (ema && c.auto_precision) {
    // The averages are f32 whatever the layers' dtypes; the model's tensors in the file tell which layers the run
    // moved to f32 (convert_for_eval reads them off the dtypes): the others' averages go in their 16-bit dtype, as
    // the run's own evaluation of the averages rounded them.
    const nn::StateDict stored = read_model_state(path);
    nn::StateDict typed;
    for (const auto& [name, t] : weights) {
      const Tensor* m = stored.find(name);
      typed.insert(name,
                   m != nullptr && is_low_precision(m->dtype()) && t.dtype() == DType::f32 ? t.to(m->dtype()) : t);
    }
    weights = std::move(typed);
  }
  MP_CHECK(split == "test" || split == "valid", "eval: unknown split '", split, "': expected test or valid");
  if (is_text_task(c) && models::is_gpt_model(c.model))
    return detail::evaluate_gpt_checkpoint(c, weights, md, path, split, out);
  if (is_text_task(c)) return detail::evaluate_text(c, weights, split, out);
  MP_CHECK(split == "test", "eval: image datasets have only a test split, got '", split, "'");
  return detail::evaluate_images(c, weights, out);
}

std::string summary_to_json(const RunSummary& s) {
  nlohmann::ordered_json j;
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
  j["label"] = s.label;
  j["model"] = s.config.model;
  j["dataset"] = s.config.dataset;
  j["precision"] = precision_name(s.config.precision);
  j["opt_level"] = FieldText<std::optional<amp::OptLevel>>::format(s.config.opt_level);
  j["metric"] = s.metric_name;
  j["val_metric"] = num(s.val_metric);
  j["val_loss"] = num(s.val_loss);
  if (s.ema_val_metric) {
    j["ema_val_metric"] = num(*s.ema_val_metric);
    j["ema_val_loss"] = num(*s.ema_val_loss);
  }
  j["best_epoch"] = s.best_epoch;
  j["best_val_metric"] = num(s.best_val_metric);
  j["best_of_weight_averages"] = s.config.ema_decay > 0;
  j["best_checkpoint"] = s.best_checkpoint;
  j["train_seconds"] = s.train_seconds;
  j["eval_seconds"] = s.eval_seconds;
  j["data_wait_seconds"] = s.data_wait_seconds;
  j["peak_bytes"] = s.peak_bytes;
  j["steps"] = s.steps;
  j["skipped_steps"] = s.skipped_steps;
  j["final_loss_scale"] = s.final_loss_scale;
  j["throughput"] = s.throughput;
  j["throughput_unit"] = s.throughput_unit;
  j["diverged"] = s.diverged;
  j["last_good_file"] = s.last_good_file;
  nlohmann::ordered_json epochs = nlohmann::ordered_json::array();
  for (const EpochStats& e : s.epochs)
    epochs.push_back({{"epoch", e.epoch},
                      {"train_loss", num(e.train_loss)},
                      {"val_loss", num(e.val_loss)},
                      {"val_metric", num(e.val_metric)},
                      {"seconds", e.seconds},
                      {"data_wait_seconds", e.data_wait_seconds}});
  for (size_t i = 0; i < s.epochs.size(); ++i)
    if (s.epochs[i].ema_val_metric) {
      epochs[i]["ema_val_loss"] = num(*s.epochs[i].ema_val_loss);
      epochs[i]["ema_val_metric"] = num(*s.epochs[i].ema_val_metric);
    }
  j["epochs"] = epochs;
  j["kernel_paths"] = nlohmann::ordered_json::parse(kernel_path_record_json(s.kernel_paths));
  j["config"] = nlohmann::ordered_json::parse(config_to_json(s.config));
  return j.dump();
}

}  // namespace mp::train

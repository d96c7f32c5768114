// `mixprec bench step`: the time of one training step of one configuration (issue 6, item 6).
// A fixed synthetic batch (random images and labels, or random token windows and targets) drawn once;
// after `warmup` untimed steps, each of `steps` steps (zero_grad, forward, cross-entropy on f32 logits,
// loss-scaled backward, [LM: unscale + clip_grad_norm_ 0.25], scaler step and update) is timed with
// steady_clock. Prints one JSON object; bench/pytorch/bench_step.py prints the same object for PyTorch
// and bench/compare_pytorch.sh runs both side by side.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <numeric>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "bench_step.hpp"
#include "commands.hpp"
#include "mp/kernel_paths.hpp"
#include "mp/amp/amp.hpp"
#include "mp/core/error.hpp"
#include "mp/core/math_mode.hpp"
#include "mp/core/profiler.hpp"
#include "mp/core/philox.hpp"
#include "mp/memory/allocator.hpp"
#include "mp/models/models.hpp"
#include "mp/models/gpt.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/optim.hpp"
#include "mp/system.hpp"
#include "mp/train/run_parts.hpp"

namespace mixprec {
namespace {

using namespace mp;
using Clock = std::chrono::steady_clock;

// CPU time (user + system, all threads) consumed by this process so far, in milliseconds.
double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

using Json = nlohmann::ordered_json;

bool is_lm(const std::string& model) { return model == "lstm" || model == "gru" || model == "rnn"; }
bool is_gpt(const std::string& model) { return models::is_gpt_model(model); }

}  // namespace

const std::vector<std::string>& bench_config_fields() {
  static const std::vector<std::string> names{
      "model",     "batch_size",    "precision",  "opt_level",   "optimizer",       "lr",
      "bptt",      "context",       "embed_size", "hidden_size", "num_layers",      "dropout",
      "lstm_impl", "memory_format", "seed",       "device",      "matmul_precision"};
  return names;
}

namespace {

// The --device of a bench configuration (throws naming the flag when it does not parse or exist).
Device bench_device(const BenchStepOptions& o) { return device_from_flag(o.device, "bench step: --device"); }

// The TrainConfig of a bench configuration: the settings a step shares with `mixprec train` mean the same there
// (the optimizer, the AMP options and the O1 forward scope come from mp/train/run_parts.hpp, and train's
// validate() checks them); the benchmark's own defaults, PyTorch's side's: SGD momentum 0.9 without weight decay,
// AdamW with its default decay, lr 0 = 0.01 for sgd
// and 1e-3 otherwise, the word LM's gradient norm clipped at 0.25. The dataset only names the task: no data is
// read.
train::TrainConfig run_config(const BenchStepOptions& o) {
  const bool lm = is_lm(o.model);
  train::TrainConfig c = o;
  c.dataset = lm || is_gpt(o.model) ? "kjv" : "fashion-mnist";
  c.lr = o.lr != 0 ? o.lr : o.optimizer == "sgd" ? 0.01 : 1e-3;
  c.momentum = 0.9;
  c.weight_decay = o.optimizer == "adamw" ? optim::AdamWOptions{}.weight_decay : 0.0;  // torch.optim.AdamW's too
  c.clip_grad_norm = lm ? 0.25 : is_gpt(o.model) ? 1.0 : 0;                            // nanoGPT's grad_clip
  return c;
}

// The options with defaults filled in; throws mp::Error naming the flag for any invalid value (the shared
// settings through train's validate()).
BenchStepOptions resolved(BenchStepOptions o) {
  MP_CHECK(models::is_image_model(o.model) || is_lm(o.model) || is_gpt(o.model), "bench step: unknown --model '",
           o.model,
           "'; expected an image model (mlp, mlp-WxL, resnet8..110, resnet18..152, wrn-D-K), lstm, gru, rnn or "
           "gpt-nano, gpt-mini, gpt2");
  const bool lm = is_lm(o.model) || is_gpt(o.model);
  if (o.batch_size == 0) o.batch_size = is_gpt(o.model) ? 16 : lm ? 20 : 32;
  auto positive = [](const char* flag, int64_t v) {
    MP_CHECK(v > 0, "bench step: --", flag, " must be positive, got ", v);
  };
  positive("batch_size", o.batch_size);
  positive("steps", o.steps);
  if (lm) {
    positive("vocab_size", o.vocab_size);
    positive("bptt", o.bptt);
  } else {
    positive("image_size", o.image_size);
    positive("in_channels", o.in_channels);
    positive("num_classes", o.num_classes);
  }
  MP_CHECK(o.warmup >= 0, "bench step: --warmup must be >= 0, got ", o.warmup);
  MP_CHECK(o.optimizer != "adam",
           "bench step: --optimizer adam is not a benchmark configuration; expected sgd or "
           "adamw (PyTorch's side has the same two)");
  if (is_gpt(o.model)) {  // train's check of a gpt config asks for a tokenizer size; a benchmark draws random ids
    train::TrainConfig v = run_config(o);
    v.max_vocab = std::max<int64_t>(v.max_vocab, 258);
    train::validate(v);
  } else {
    train::validate(run_config(o));
  }
  const train::TrainConfig c = train::with_task_defaults(run_config(o));
  o.opt_level = c.opt_level;
  o.lr = c.lr;
  return o;
}

// "O2 bf16, loss scale none" / "O0 fp32".
std::string short_description(const amp::AmpOptions& r) {
  if (r.opt_level == amp::OptLevel::O0) return "O0 fp32";
  return std::string(amp::opt_level_name(r.opt_level)) + " " + dtype_name(r.dtype) + ", loss scale " +
         r.loss_scale->str();
}

/// One configuration ready to step.
struct Workload {
  std::function<Tensor()> step;      ///< one training step; returns the f32 loss
  std::function<int64_t()> skipped;  ///< steps the loss scaler skipped so far
  double units_per_step = 0;         ///< images or tokens per step
  std::string unit;                  ///< "img/s" or "tok/s"
  std::string amp;                   ///< describe() of the resolved amp options
  Json config;                       ///< what defines the workload (the same keys as PyTorch's side)
};

Workload image_workload(const BenchStepOptions& o) {
  const models::ImageModelSpec spec{.in_channels = o.in_channels,
                                    .image_size = o.image_size,
                                    .num_classes = o.num_classes,
                                    .memory_format = models::memory_format_from_flag(o.memory_format)};
  std::shared_ptr<nn::UnaryModule> model = models::create_image_model(o.model, spec);
  const Device dev = bench_device(o);
  model->to(dev);
  model->train();
  const int64_t num_params = model->num_parameters();
  const train::TrainConfig c = run_config(o);
  std::shared_ptr<optim::Optimizer> opt = train::make_optimizer(c, model->parameters());
  auto setup = std::make_shared<amp::AmpSetup>(amp::initialize(model, *opt, train::amp_options(c)));
  const Tensor x = randn({o.batch_size, o.in_channels, o.image_size, o.image_size}).to(dev);
  const Tensor y = randint(0, o.num_classes, {o.batch_size}).to(dev);
  Workload w;
  w.step = [setup, opt, x, y] {
    opt->zero_grad();
    Tensor loss = cross_entropy(setup->model(x), y);
    setup->scaler.scale(loss).backward();
    setup->scaler.step(*opt);
    setup->scaler.update();
    return loss;
  };
  w.skipped = [setup] { return setup->scaler.skipped_steps(); };
  w.units_per_step = static_cast<double>(o.batch_size);
  w.unit = "img/s";
  w.amp = short_description(setup->options());
  w.config = {{"batch_size", o.batch_size}, {"in_channels", o.in_channels},
              {"image_size", o.image_size}, {"num_classes", o.num_classes},
              {"optimizer", o.optimizer},   {"lr", o.lr},
              {"parameters", num_params},   {"memory_format", memory_format_name(spec.memory_format)}};
  return w;
}

// A language model's step on a fixed batch of random token ids of `shape` and next-token targets: cross entropy
// on f32 logits, loss-scaled backward, unscale, the gradient norm clipped (run_config: the word LM's 0.25,
// nanoGPT's 1), scaler step and update. The caller fills in w.config.
Workload token_workload(const BenchStepOptions& o, const std::shared_ptr<nn::Module>& model, const Shape& shape,
                        std::function<Tensor(const Tensor&)> logits_of) {
  const Device dev = bench_device(o);
  model->to(dev);
  model->train();
  const train::TrainConfig c = run_config(o);
  std::shared_ptr<optim::Optimizer> opt = train::make_optimizer(c, model->parameters());
  const amp::AmpOptions r = amp::prepare(*model, *opt, train::amp_options(c));
  auto scaler = std::make_shared<amp::GradScaler>(r.scaler);
  const std::vector<Tensor> params = model->parameters();  // the converted ones (O2/O3)
  const Tensor tokens = randint(0, o.vocab_size, shape).to(dev);
  const Tensor targets = randint(0, o.vocab_size, {shape_numel(shape)}).to(dev);
  Workload w;
  const double clip = c.clip_grad_norm;
  w.step = [logits_of, opt, scaler, params, tokens, targets, r, clip] {
    opt->zero_grad();
    Tensor logits;
    {
      const train::ForwardScope scope(r);  // O1: per-op casting around the forward
      logits = logits_of(tokens);
    }
    Tensor loss = cross_entropy(logits.to(DType::f32).view({targets.numel(), -1}), targets);
    scaler->scale(loss).backward();
    scaler->unscale_(*opt);
    optim::clip_grad_norm_(params, clip);
    scaler->step(*opt);
    scaler->update();
    return loss;
  };
  w.skipped = [scaler] { return scaler->skipped_steps(); };
  w.units_per_step = static_cast<double>(shape_numel(shape));
  w.unit = "tok/s";
  w.amp = short_description(r);
  return w;
}

Workload lm_workload(const BenchStepOptions& o) {
  auto model = std::make_shared<models::WordLM>(
      models::WordLMOptions{.vocab_size = o.vocab_size,
                            .embed_size = o.embed_size,
                            .hidden_size = o.hidden_size,
                            .num_layers = o.num_layers,
                            .cell = o.model,
                            .dropout = o.dropout,
                            .lstm_impl = nn::lstm_impl_from_flag(o.lstm_impl, bench_device(o))});
  const int64_t num_params = model->num_parameters();
  Workload w = token_workload(o, model, {o.bptt, o.batch_size}, [model](const Tensor& tokens) {
    return model->forward(tokens).first;  // zero initial state every step
  });
  w.config = {{"batch_size", o.batch_size},
              {"seq_len", o.bptt},
              {"vocab_size", o.vocab_size},
              {"embed_size", o.embed_size},
              {"hidden_size", o.hidden_size},
              {"num_layers", o.num_layers},
              {"dropout", o.dropout},
              {"optimizer", o.optimizer},
              {"lr", o.lr},
              {"parameters", num_params}};
  return w;
}

// A GPT step: random token windows [B, T] and next-token targets; nanoGPT's train.py step (AdamW, gradient
// norm clipped at 1).
Workload gpt_workload(const BenchStepOptions& o) {
  const models::GptOptions mo = train::gpt_run_options(o, o.vocab_size);
  auto model = std::make_shared<models::Gpt>(mo);
  const int64_t num_params = model->nn::Module::num_parameters();  // all of them, as PyTorch's side counts
  const int64_t T = mo.block_size;
  Workload w =
      token_workload(o, model, {o.batch_size, T}, [model](const Tensor& tokens) { return model->forward(tokens); });
  w.config = {{"batch_size", o.batch_size},
              {"context", T},
              {"vocab_size", o.vocab_size},
              {"n_layer", mo.n_layer},
              {"n_head", mo.n_head},
              {"n_embd", mo.n_embd},
              {"dropout", o.dropout},
              {"optimizer", o.optimizer},
              {"lr", o.lr},
              {"parameters", num_params}};
  return w;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int64_t max_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

}  // namespace

bool bench_is_lm(const std::string& model) { return is_lm(model); }

Json run_bench_step(const BenchStepOptions& raw) {
  const BenchStepOptions o = resolved(raw);
  set_float32_matmul_precision(float32_matmul_precision_from_string(o.matmul_precision));
  manual_seed(o.seed);
  Workload w = is_gpt(o.model) ? gpt_workload(o) : is_lm(o.model) ? lm_workload(o) : image_workload(o);

  const Device dev = bench_device(o);
  for (int64_t i = 0; i < o.warmup; ++i) w.step();
  synchronize(dev);
  memory::reset_peak_memory_stats(dev);
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(o.steps));
  Tensor loss;
  std::optional<profiler::Session> prof;
  if (o.profile) prof.emplace();
  // CPU time of the whole process per step beside wall time: on a shared machine another process's
  // load stretches wall time but not (much) the CPU time of a 1-thread run (OMP_NUM_THREADS=1), so
  // cpu_median_ms gives steadier A/B comparisons there. With several threads it includes OpenMP's
  // spin-waiting, and on a GPU it is the host's time only.
  std::vector<double> cpu_ms;
  cpu_ms.reserve(static_cast<size_t>(o.steps));
  // On a GPU, the host's time to queue a step (until step() returns, before the end-of-step synchronize):
  // when it is close to the step's time the step is bound by the host (launches, dispatch), not the device.
  std::vector<double> enqueue_ms;
  enqueue_ms.reserve(static_cast<size_t>(o.steps));
  const int64_t syncs0 = cuda_host_syncs();
  for (int64_t i = 0; i < o.steps; ++i) {
    const auto t0 = Clock::now();
    const double c0 = process_cpu_ms();
    loss = w.step();
    enqueue_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    synchronize(dev);  // GPU kernels run asynchronously: a step ends when its work has
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    cpu_ms.push_back(process_cpu_ms() - c0);
  }
  const int64_t syncs = cuda_host_syncs() - syncs0;
  prof.reset();
  const int64_t peak = memory::memory_stats(dev).peak_allocated;
  const double med = median(ms);
  const double last_loss = loss.item<double>();

  const SystemInfo s = system_info();
  Json j;
  j["framework"] = "mixprec";
  j["version"] = s.version;
  j["model"] = o.model;
  j["config"] = w.config;
  j["precision"] = train::precision_name(o.precision);
  j["opt_level"] = train::FieldText<std::optional<amp::OptLevel>>::format(o.opt_level);
  j["matmul_precision"] = o.matmul_precision;
  j["amp"] = w.amp;
  j["warmup"] = o.warmup;
  j["steps"] = o.steps;
  j["median_ms"] = med;
  j["min_ms"] = *std::min_element(ms.begin(), ms.end());
  j["max_ms"] = *std::max_element(ms.begin(), ms.end());
  j["step_ms"] = ms;
  j["cpu_median_ms"] = median(cpu_ms);
  j["throughput"] = w.units_per_step / (med / 1000.0);
  j["unit"] = w.unit;
  j["peak_bytes"] = peak;
  j["max_rss_bytes"] = max_rss_bytes();
  j["final_loss"] = std::isfinite(last_loss) ? Json(last_loss) : Json(nullptr);
  j["skipped_steps"] = w.skipped();
  j["threads"] = omp_get_max_threads();
  j["kernel_paths"] = Json::parse(mp::kernel_path_record_json(mp::kernel_path_record()));
  j["device"] = "cpu: " + (s.cpu.brand.empty() ? std::string("unknown CPU") : s.cpu.brand);
  if (dev.is_cuda()) {
    for (const GpuInfo& g : s.gpus)
      if (g.index == dev.index) j["device"] = dev.str() + ": " + g.name;
    // Note [conv layout counters]: a channels-last run whose convolutions fell back to NCHW says so.
    const CudnnConvCounts cc = cudnn_conv_counts();
    j["cudnn_conv"] = {{"calls", cc.calls},
                       {"nhwc_calls", cc.nhwc_calls},
                       {"nchw_fallbacks", cc.nchw_fallbacks},
                       {"graph_calls", cc.graph_calls}};
    // Note [host synchronisation counter]: host waits per timed step, this benchmark's own end-of-step
    // synchronize included (so 1 is the least a step can show).
    j["host_syncs_per_step"] = static_cast<double>(syncs) / static_cast<double>(std::max<int64_t>(o.steps, 1));
    j["enqueue_median_ms"] = median(enqueue_ms);
  }
  if (o.profile) {
    // Per kernel label, per timed step. "kernel_ms" is their sum; the rest of a step is framework
    // time (autograd, allocation, dispatch). On a GPU "host_ms" is the host's time inside each kernel call
    // (queueing it) and "kernel_host_ms" their sum: beside enqueue_median_ms, the host time outside the
    // kernel calls is the framework's (Note [device time in the profiler]).
    const double n = static_cast<double>(o.steps);
    Json ops = Json::array();
    double kernel_ms = 0, kernel_host_ms = 0;
    for (const profiler::OpStats& op : profiler::snapshot()) {
      Json row{{"name", op.name},
               {"calls", static_cast<double>(op.calls) / n},
               {"ms", op.seconds * 1e3 / n},
               {"bytes", op.bytes / n}};
      if (dev.is_cuda()) row["host_ms"] = op.host_seconds * 1e3 / n;
      ops.push_back(row);
      kernel_ms += op.seconds * 1e3 / n;
      kernel_host_ms += op.host_seconds * 1e3 / n;
    }
    j["kernel_ms"] = kernel_ms;
    if (dev.is_cuda()) j["kernel_host_ms"] = kernel_host_ms;
    j["mean_ms"] = std::accumulate(ms.begin(), ms.end(), 0.0) / n;
    j["ops"] = ops;
  }
  return j;
}

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks (see bench/ for the suites and the PyTorch side by side)");
  bench->require_subcommand(1);
  auto* cmd = bench->add_subcommand(
      "step", "Time training steps of one configuration on a fixed synthetic batch and print them as JSON");
  auto o = std::make_shared<BenchStepOptions>();
  add_config_options_only(cmd, *o, bench_config_fields());  // Note [one table of settings]
  // What a benchmark step means differently from a training run (PyTorch's side, bench/pytorch/bench_step.py,
  // has the same): run_config().
  cmd->get_option("--optimizer")->description("sgd (momentum 0.9, no weight decay) or adamw (its default decay)");
  cmd->get_option("--lr")->description("learning rate (0 = 0.01 for sgd, 1e-3 for adamw)");
  visit_bench_fields(*o, [&](const char* name, auto& field, const char* help) {
    if constexpr (std::is_same_v<std::remove_reference_t<decltype(field)>, bool>)
      cmd->add_flag(std::string("--") + name, field, help);
    else
      cmd->add_option(std::string("--") + name, field, help)->capture_default_str();
  });
  cmd->callback([o] {
    std::ofstream f;
    if (!o->json.empty()) {  // opened first: a bad path fails before minutes of benchmarking
      f.open(o->json, std::ios::app);
      MP_CHECK(f.good(), "bench step: cannot open --json file '", o->json, "' for appending; check the folder exists");
    }
    const std::string line = run_bench_step(*o).dump();
    if (f.is_open()) {
      f << line << "\n" << std::flush;
      MP_CHECK(f.good(), "bench step: writing --json file '", o->json, "' failed");
    }
    std::printf("%s\n", line.c_str());
  });
  add_bench_suites(bench);
  add_bench_kernels(bench);
}

}  // namespace mixprec

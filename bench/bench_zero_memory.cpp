// Optimizer-state and gradient bytes per parameter on each rank, with and without --shard_optimizer (ZeRO stage 1,
// Note [sharded optimizer state] in src/train/optimizer_shards.cpp), beside what the ZeRO formula predicts. Run it
// under `mpirun -np N` (N = 1 without). For each optimizer (SGD with momentum, AdamW) and precision (fp32 O0, bf16 O2)
// it builds the model as `mixprec train` does (make_optimizer, amp::initialize), takes one step on a random batch the
// way a data-parallel step does (unsharded: all-reduce, update everything; sharded: reduce-scatter, update this rank's
// part, all-gather), and counts the bytes of the tensors that exist: the weights, the gradients after backward and at
// the update (a sharded rank drops the others' after the reduce-scatter), and the optimizer's state (f32 masters;
// moments); at_bwd (weights + every gradient + state: the step's peak of these) is what the ZeRO-1 formula predicts.
// The collectives' transient buffers are not counted (bench/RESULTS.md says what they add).
// Usage: bench_zero_memory [model=resnet20]
#include <cstdio>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "mp/train/run_parts.hpp"
#include "train/optimizer_shards.hpp"

using namespace mp;

namespace {

struct Bytes {
  double weights = 0, grads_backward = 0, grads_step = 0, masters = 0, moments = 0, owned = 0;
};

double grad_bytes(const std::vector<Tensor>& ps) {
  double b = 0;
  for (const Tensor& p : ps)
    if (p.grad().defined()) b += static_cast<double>(p.grad().numel() * static_cast<int64_t>(p.grad().element_size()));
  return b;
}

Bytes measure(const std::string& model_name, const std::string& optimizer, DType precision, bool shard) {
  dist::ProcessGroup& w = dist::world();
  train::TrainConfig c;
  c.model = model_name;
  c.optimizer = optimizer;
  c.precision = precision;
  if (precision != DType::f32) c.opt_level = amp::OptLevel::O2;
  c = train::with_task_defaults(c);
  manual_seed(1);
  std::shared_ptr<nn::UnaryModule> model =
      models::create_image_model(model_name, {.in_channels = 1, .image_size = 28, .num_classes = 10});
  std::unique_ptr<optim::Optimizer> opt = train::make_optimizer(c, model->parameters());
  amp::AmpSetup setup = amp::initialize(model, *opt, train::amp_options(c));
  std::unique_ptr<train::detail::OptimizerShards> shards;
  if (shard && w.size() > 1) shards = std::make_unique<train::detail::OptimizerShards>(w, *opt);
  const std::vector<Tensor> ps = opt->parameters();
  manual_seed(2 + static_cast<uint64_t>(w.rank()));
  const Tensor x = randn({8, 1, 28, 28}), y = randint(0, 10, {8});
  cross_entropy(setup.model(x), y).backward();
  Bytes b;
  b.grads_backward = grad_bytes(ps);
  if (shards) {
    shards->reduce_scatter_gradients();
  } else {
    std::vector<Tensor> gs;
    for (const Tensor& p : ps) gs.push_back(p.grad());
    w.all_reduce_mean(gs);
  }
  b.grads_step = grad_bytes(ps);
  opt->step();
  opt->zero_grad();
  if (shards) shards->all_gather_weights();
  for (const Tensor& p : ps) {
    b.weights += static_cast<double>(p.numel() * static_cast<int64_t>(p.element_size()));
    if (!shards || shards->owner(p) == w.rank()) b.owned += static_cast<double>(p.numel());
    if (const optim::ParamState* st = opt->state(p))
      for (const auto& [name, t] : st->buffers)
        (name == "master" ? b.masters : b.moments) +=
            static_cast<double>(t.numel() * static_cast<int64_t>(t.element_size()));
  }
  return b;
}

// The ZeRO formula per parameter: weights + gradients (16-bit under O2, f32 at O0) + K / N for the f32 state (masters
// 4 under O2; momentum 4, or Adam's two moments 8), N = 1 unsharded.
double formula(const std::string& optimizer, DType precision, int n) {
  const double w = precision == DType::f32 ? 4 : 2;
  const double k = (precision == DType::f32 ? 0 : 4) + (optimizer == "sgd" ? 4 : 8);
  return w + w + k / n;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "resnet20";
  dist::ProcessGroup& w = dist::world();
  const int n = w.size(), me = w.rank();
  int64_t total = 0;
  {
    const auto m = models::create_image_model(model, {.in_channels = 1, .image_size = 28, .num_classes = 10});
    for (const Tensor& p : m->parameters()) total += p.numel();
  }
  if (me == 0)
    std::printf(
        "%s (%lld parameters), %d rank%s; bytes per parameter of the model on each rank\n"
        "%-6s %-9s %-8s %4s %7s %7s %8s %8s %7s %7s %7s %7s %7s\n",
        model.c_str(), static_cast<long long>(total), n, n == 1 ? "" : "s", "optim", "precision", "sharded", "rank",
        "owned", "weights", "grad_bwd", "grad_upd", "master", "moments", "at_bwd", "at_upd", "ZeRO-1");
  for (const std::string opt : {"sgd", "adamw"})
    for (const DType dt : {DType::f32, DType::bf16})
      for (const bool shard : {false, true}) {
        const Bytes b = measure(model, opt, dt, shard);
        const std::vector<double> mine{b.owned, b.weights, b.grads_backward, b.grads_step, b.masters, b.moments};
        const auto k = static_cast<int64_t>(mine.size());
        const Tensor all = zeros({k * n}, {.dtype = DType::f64});
        for (int64_t i = 0; i < k; ++i) all.data_ptr<double>()[me * k + i] = mine[static_cast<size_t>(i)];
        w.all_gather(all, std::vector<int64_t>(static_cast<size_t>(n), k));
        if (me != 0) continue;
        for (int r = 0; r < n; ++r) {
          const double* v = all.data_ptr<double>() + r * k;
          const double t = static_cast<double>(total);
          // what a step holds at the end of backward (every gradient) and at the update (this rank's): weights,
          // gradients, state
          const double at_bwd = (v[1] + v[2] + v[4] + v[5]) / t, at_upd = (v[1] + v[3] + v[4] + v[5]) / t;
          std::printf("%-6s %-9s %-8s %4d %6.1f%% %7.2f %7.2f %8.2f %8.2f %7.2f %7.2f %7.2f %7.2f\n", opt.c_str(),
                      dt == DType::f32 ? "fp32 O0" : "bf16 O2", shard ? "yes" : "no", r, 100 * v[0] / t, v[1] / t,
                      v[2] / t, v[3] / t, v[4] / t, v[5] / t, at_bwd, at_upd, formula(opt, dt, shard ? n : 1));
        }
      }
  return 0;
}

// The mixed-precision engine's costs: the fused master-weight optimizer step and the multi-tensor
// unscale pass in GB/s against the machine's copy bandwidth (measured in the same run), and the peak
// memory of one CNN training step at O2 (bf16) against O0 (f32).
// Usage: bench_amp [elements=16777216] [repeats=11]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "bench_util.hpp"
#include "mp/mp.hpp"

using namespace mp;
using mp::bench::median_seconds;

namespace {

std::shared_ptr<nn::Sequential> cnn() {
  auto conv = [](int64_t in, int64_t out) {
    return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = in, .out_channels = out, .padding = {1, 1}});
  };
  auto block = [&](int64_t in, int64_t out) {
    return std::vector<std::shared_ptr<nn::UnaryModule>>{conv(in, out), std::make_shared<nn::BatchNorm2d>(out),
                                                         std::make_shared<nn::ReLU>()};
  };
  auto seq = std::make_shared<nn::Sequential>();
  for (auto& m : block(3, 64)) seq->push_back(m);
  for (auto& m : block(64, 64)) seq->push_back(m);
  seq->push_back(std::make_shared<nn::MaxPool2d>(Pool2dOptions{.kernel = {2, 2}}));
  for (auto& m : block(64, 128)) seq->push_back(m);
  for (auto& m : block(128, 128)) seq->push_back(m);
  seq->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(std::array<int64_t, 2>{1, 1}));
  seq->push_back(std::make_shared<nn::Flatten>());
  seq->push_back(std::make_shared<nn::Linear>(128, 10));
  return seq;
}

int64_t peak_step_bytes(amp::OptLevel level) {
  manual_seed(0);
  auto model = cnn();
  optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  amp::AmpSetup setup = amp::initialize(model, opt, {.opt_level = level, .dtype = DType::bf16});
  Tensor x = randn({64, 3, 32, 32});
  Tensor y = randint(0, 10, {64});
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = cross_entropy(setup.model(x), y);
    setup.scaler.scale(loss).backward();
    setup.scaler.step(opt);
    setup.scaler.update();
  };
  step();  // optimizer state and masters exist from here on, as in steady-state training
  memory::reset_peak_memory_stats();
  step();
  return memory::memory_stats().peak_allocated;  // weights, masters, optimizer state and activations
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{1} << 24);
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 11;
  std::printf("# amp engine: n = %lld elements per tensor, %d threads, median of %d\n\n", static_cast<long long>(n),
              omp_get_max_threads(), repeats);
  const double copy_gbs = mp::bench::copy_bandwidth_gbs(n, repeats);
  std::printf("| operation | bytes/element | GB/s | %% of copy |\n|---|---:|---:|---:|\n");
  std::printf("| memcpy (reference) | 8 | %.1f | 100%% |\n", copy_gbs);
  auto row = [&](const char* name, double bytes, const std::function<void()>& fn) {
    const double t = median_seconds(fn, repeats);
    const double gbs = bytes * static_cast<double>(n) / t / 1e9;
    std::printf("| %s | %.0f | %.1f | %.0f%% |\n", name, bytes, gbs, 100.0 * gbs / copy_gbs);
  };
  {
    // SGD momentum on a bf16 parameter with an f32 master, unscaling fused in:
    // reads grad (2) + master (4) + momentum (4), writes master (4) + momentum (4) + param (2).
    Tensor p = randn({n}, {.dtype = DType::bf16}).requires_grad_();
    p.set_grad(randn({n}, {.dtype = DType::bf16}));
    optim::SGD opt({p}, {.lr = 1e-3, .momentum = 0.9});
    opt.set_master_weights(true);
    opt.set_grad_scale_inv(1.0 / 1024);
    row("SGD momentum step, bf16 param + f32 master, unscale fused", 20, [&] { opt.step(); });
    optim::AdamW adam({p}, {.lr = 1e-3});
    adam.set_master_weights(true);
    // reads grad 2 + master 4 + m 4 + v 4, writes master 4 + m 4 + v 4 + param 2.
    row("AdamW step, bf16 param + f32 master", 28, [&] { adam.step(); });
    Tensor q = randn({n}).requires_grad_();
    q.set_grad(randn({n}));
    optim::AdamW adam32({q}, {.lr = 1e-3});
    // f32 without master: reads grad 4 + w 4 + m 4 + v 4, writes w 4 + m 4 + v 4.
    row("AdamW step, f32 param (reference)", 28, [&] { adam32.step(); });
  }
  {
    // GradScaler's finite check alone (the fused path) and check + unscale (explicit unscale_), over
    // 64 tensors of n/64 bf16 gradients.
    std::vector<Tensor> params;
    for (int i = 0; i < 64; ++i) {
      Tensor p = zeros({n / 64}, {.dtype = DType::bf16}).requires_grad_();
      p.set_grad(randn({n / 64}, {.dtype = DType::bf16}));
      params.push_back(p);
    }
    optim::SGD opt(params, {.lr = 0.0});
    amp::GradScaler scaler({.init_scale = 1.0});
    std::vector<Tensor> grads;
    for (const Tensor& p : params) grads.push_back(p.grad());
    row("underflow_stats (64 bf16 tensors, two read passes)", 4, [&] { (void)amp::underflow_stats(grads, 1024.0); });
    row("GradScaler unscale_ (64 bf16 tensors, one read + write pass)", 4, [&] {
      scaler.unscale_(opt);
      scaler.update();
    });
  }
  const int64_t o0 = peak_step_bytes(amp::OptLevel::O0);
  const int64_t o2 = peak_step_bytes(amp::OptLevel::O2);
  std::printf("\n| CNN training step (4 conv 3x3 64/128 ch, batch 64, 32x32) | peak memory (MiB) |\n|---|---:|\n");
  std::printf("| O0 f32 | %.1f |\n| O2 bf16 (f32 batch norm, f32 masters) | %.1f |\n| ratio O2/O0 | %.2f |\n",
              static_cast<double>(o0) / (1 << 20), static_cast<double>(o2) / (1 << 20),
              static_cast<double>(o2) / static_cast<double>(o0));
  return 0;
}

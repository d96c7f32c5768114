// `mixprec demo`: a short CNN training run on a synthetic image task in f32 and in bf16, printing
// time, loss, accuracy and peak memory per precision. It is the main job until the data/models
// issue replaces it with Fashion-MNIST.
#include <chrono>
#include <cstdio>
#include <memory>

#include "commands.hpp"
#include "mp/mp.hpp"

namespace mixprec {
namespace {

using namespace mp;

struct DemoOptions {
  int64_t steps = 100;
  int64_t batch_size = 128;
  int64_t image_size = 28;
  int64_t width = 64;
  double lr = 3e-3;
  uint64_t seed = 0;
};

// A batch of noisy 1-pixel-wide bars in one of 4 orientations (the label).
std::pair<Tensor, Tensor> make_batch(int64_t n, int64_t s) {
  autograd::NoGradGuard ng;
  std::vector<float> img(static_cast<size_t>(n * s * s));
  std::vector<int64_t> label(static_cast<size_t>(n));
  Tensor r = rand({n, 3});
  auto rv = r.to_vector<float>();
  Tensor noise = randn({n, 1, s, s}, {}, 0.0, 0.3);
  auto nv = noise.to_vector<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t cls = std::min<int64_t>(3, static_cast<int64_t>(rv[i * 3] * 4));
    const int64_t off = static_cast<int64_t>(rv[i * 3 + 1] * static_cast<float>(s - 4)) + 2;
    label[i] = cls;
    for (int64_t y = 0; y < s; ++y)
      for (int64_t x = 0; x < s; ++x) {
        bool on = false;
        if (cls == 0) on = y == off;
        if (cls == 1) on = x == off;
        if (cls == 2) on = x - y == off - s / 2;
        if (cls == 3) on = x + y == off + s / 2;
        img[(i * s + y) * s + x] = (on ? 1.0f : 0.0f) + nv[(i * s + y) * s + x];
      }
  }
  return {from_vector(img, {n, 1, s, s}), from_vector(label, {n})};
}

std::shared_ptr<nn::Sequential> make_model(int64_t w) {
  auto conv = [](int64_t in, int64_t out) {
    return std::make_shared<nn::Conv2d>(nn::Conv2dOptions{.in_channels = in, .out_channels = out, .padding = {1, 1}});
  };
  return std::make_shared<nn::Sequential>(
      conv(1, w / 2), std::make_shared<nn::BatchNorm2d>(w / 2), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MaxPool2d>(Pool2dOptions{.kernel = {2, 2}}), conv(w / 2, w),
      std::make_shared<nn::BatchNorm2d>(w), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::AdaptiveAvgPool2d>(std::array<int64_t, 2>{1, 1}), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(w, 4));
}

struct Row {
  const char* name;
  double seconds = 0, loss = 0, accuracy = 0;
  int64_t peak_bytes = 0;
};

Row run(const char* name, amp::OptLevel level, DType dtype, const DemoOptions& o) {
  manual_seed(o.seed);
  auto model = make_model(o.width);
  optim::AdamW opt(model->parameters(), {.lr = o.lr, .weight_decay = 0.0});
  // O2: convolutions and the classifier in 16-bit (AMX for bf16), batch norm f32, f32 master weights.
  amp::AmpSetup amp = amp::initialize(model, opt, {.opt_level = level, .dtype = dtype});
  std::printf("  [%s] %s\n", name, amp.describe().c_str());
  memory::reset_peak_memory_stats();
  Row row{name};
  const auto t0 = std::chrono::steady_clock::now();
  double ema = 0;
  for (int64_t step = 0; step < o.steps; ++step) {
    auto [x, y] = make_batch(o.batch_size, o.image_size);
    Tensor logits = amp.model(x);
    Tensor loss = cross_entropy(logits, y);
    opt.zero_grad();
    amp.scaler.scale(loss).backward();
    amp.scaler.step(opt);
    amp.scaler.update();
    const double l = loss.item<double>();
    ema = step == 0 ? l : 0.9 * ema + 0.1 * l;
    if ((step + 1) % 50 == 0)
      std::printf("  [%s] step %3lld  loss %.4f\n", name, static_cast<long long>(step + 1), ema);
  }
  row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  row.loss = ema;
  row.peak_bytes = memory::memory_stats().peak_allocated;
  model->eval();
  autograd::NoGradGuard ng;
  auto [x, y] = make_batch(1024, o.image_size);
  Tensor pred = argmax(amp.model(x), 1);
  row.accuracy = mean(eq(pred, y).to(DType::f32)).item<double>();
  return row;
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("demo", "Train a small CNN on a synthetic task in f32 and bf16 and compare");
  auto o = std::make_shared<DemoOptions>();
  cmd->add_option("--steps", o->steps, "training steps per precision")->check(CLI::PositiveNumber);
  cmd->add_option("--batch_size", o->batch_size, "images per step")->check(CLI::PositiveNumber);
  cmd->add_option("--lr", o->lr, "AdamW learning rate")->check(CLI::PositiveNumber);
  cmd->add_option("--image_size", o->image_size, "image height and width")->check(CLI::Range(8, 256));
  cmd->add_option("--width", o->width, "channels of the second convolution (the first has half)")
      ->check(CLI::Range(2, 1024));
  cmd->add_option("--seed", o->seed, "random seed");
  cmd->callback([o] {
    std::printf(
        "mixprec demo: 4-way bar-orientation task, %lld steps of %lld images (%lldx%lld), CNN with batch norm\n",
        static_cast<long long>(o->steps), static_cast<long long>(o->batch_size), static_cast<long long>(o->image_size),
        static_cast<long long>(o->image_size));
    std::vector<Row> rows{run("f32", amp::OptLevel::O0, DType::f32, *o),
                          run("bf16 O2", amp::OptLevel::O2, DType::bf16, *o)};
    std::printf("\n| precision | time (s) | final loss | accuracy | peak memory (MiB) | speed-up |\n");
    std::printf("|---|---:|---:|---:|---:|---:|\n");
    for (const Row& r : rows)
      std::printf("| %s | %.2f | %.4f | %.1f%% | %.1f | %.2fx |\n", r.name, r.seconds, r.loss, 100 * r.accuracy,
                  static_cast<double>(r.peak_bytes) / (1 << 20), rows[0].seconds / r.seconds);
  });
}

}  // namespace mixprec

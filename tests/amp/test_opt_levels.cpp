// Opt levels O0-O3 (docs/DESIGN.md 1.5, mp/amp/initialize.hpp): what initialize() does to the model and the
// optimizer, the per-level defaults, parsing, and end to end: a small CNN trains on a synthetic task to
// the same accuracy at O0, O1 and O2 in f16 and bf16; O3 is run and its outcome printed.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using amp::OptLevel;

namespace {

using mp::test::bitwise_equal;

// Conv2d-BatchNorm2d-ReLU-MaxPool-Conv-BN-ReLU-AdaptiveAvgPool-Flatten-Linear, `w` channels.
std::shared_ptr<nn::Sequential> make_cnn(int64_t w) {
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

// Synthetic images: a short line segment (length 6-9 pixels, brightness 0.7-1.3, anywhere in the image)
// in one of 4 orientations (the label: -, |, \, /) on Gaussian noise of std 0.3. The class is
// decided by which direction the bright pixels line up in, which two small conv layers can learn;
// the random position and length make it a real (translation-invariant) detection task.
struct Images {
  Tensor x, y;
};

Images make_images(int64_t n, int64_t s) {
  autograd::NoGradGuard ng;
  const auto r = rand({n, 5}).to_vector<float>();
  auto img = randn({n, 1, s, s}, {}, 0.0, 0.3).to_vector<float>();
  std::vector<int64_t> label(static_cast<size_t>(n));
  static constexpr int kDir[4][2] = {{0, 1}, {1, 0}, {1, 1}, {1, -1}};  // (dy, dx) per class
  for (int64_t i = 0; i < n; ++i) {
    const float* ri = &r[static_cast<size_t>(i * 5)];
    const int cls = std::min(3, static_cast<int>(ri[0] * 4));
    const int len = 6 + std::min(3, static_cast<int>(ri[1] * 4));
    const float bright = 0.7f + 0.6f * ri[2];
    const auto [dy, dx] = std::pair{kDir[cls][0], kDir[cls][1]};
    // Start so that the whole segment fits.
    const int64_t span = s - len;
    int64_t y0 = static_cast<int64_t>(ri[3] * static_cast<float>(dy != 0 ? span : s));
    int64_t x0 = static_cast<int64_t>(ri[4] * static_cast<float>(dx != 0 ? span : s));
    if (dx < 0) x0 += len - 1;
    label[static_cast<size_t>(i)] = cls;
    for (int k = 0; k < len; ++k) {
      const int64_t yy = y0 + k * dy, xx = x0 + k * dx;
      img[static_cast<size_t>((i * s + yy) * s + xx)] += bright;
    }
  }
  return {from_vector(img, {n, 1, s, s}), from_vector(label, {n})};
}

constexpr int64_t kImage = 16, kWidth = 24, kBatch = 128, kSteps = 150, kHeldOut = 1024;

// The same data for every level: generated once.
const std::vector<Images>& train_batches() {
  static const std::vector<Images> batches = [] {
    manual_seed(2024);
    std::vector<Images> b;
    for (int64_t i = 0; i < kSteps; ++i) b.push_back(make_images(kBatch, kImage));
    return b;
  }();
  return batches;
}

const Images& held_out() {
  static const Images data = [] {
    manual_seed(4048);
    return make_images(kHeldOut, kImage);
  }();
  return data;
}

struct RunResult {
  double accuracy = 0;
  double final_loss = 0;  // mean of the last 10 steps' losses
  bool loss_nan = false;  // some step's loss was NaN or inf
  int64_t skipped = 0;
  double final_scale = 1;
  double seconds = 0;
  std::string describe;
};

RunResult train_level(OptLevel level, DType dtype) {
  manual_seed(7);  // the same initial f32 weights at every level
  auto model = make_cnn(kWidth);
  optim::Adam opt(model->parameters(), {.lr = 1e-2});
  amp::AmpSetup setup = amp::initialize(model, opt, {.opt_level = level, .dtype = dtype});
  RunResult r;
  r.describe = setup.describe();
  const auto t0 = std::chrono::steady_clock::now();
  double tail = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    const Images& b = train_batches()[static_cast<size_t>(step)];
    opt.zero_grad();
    Tensor loss = cross_entropy(setup.model(b.x), b.y);
    const double l = loss.item<double>();
    if (!std::isfinite(l)) r.loss_nan = true;
    if (step >= kSteps - 10) tail += l / 10;
    setup.scaler.scale(loss).backward();
    setup.scaler.step(opt);
    setup.scaler.update();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.final_loss = tail;
  r.skipped = setup.scaler.skipped_steps();
  r.final_scale = setup.scaler.get_scale();
  model->eval();
  autograd::NoGradGuard ng;
  const Tensor pred = argmax(setup.model(held_out().x), 1);
  const auto p = pred.to_vector<int64_t>(), t = held_out().y.to_vector<int64_t>();
  int64_t ok = 0;
  for (size_t i = 0; i < t.size(); ++i) ok += p[i] == t[i];
  r.accuracy = static_cast<double>(ok) / static_cast<double>(t.size());
  return r;
}

void print(const char* name, const RunResult& r) {
  std::printf("  [%-9s] %-58s accuracy %5.1f%%  final loss %.4f  NaN/inf loss: %s  skipped %lld  scale %g  (%.1f s)\n",
              name, r.describe.c_str(), 100 * r.accuracy, r.final_loss, r.loss_nan ? "yes" : "no",
              static_cast<long long>(r.skipped), r.final_scale, r.seconds);
}

}  // namespace

// ============================================================================ end to end (d)

TEST(OptLevels, SmallCnnTrainsToTheSameAccuracyAtO0O1O2) {
  // Thresholds. With this setup O0 reaches 98.4-99.7% on the 1024 held-out images (chance is 25%) over
  // 6 data/initialisation seeds tried while writing the test, and every O1/O2 run was within 0.4 points of
  // its O0 run. 95% is far above what a broken level reaches (lost updates or underflowed gradients
  // leave it near chance; a mis-cast layer gives NaN) yet 3+ points below the worst run seen. "Within 3
  // points of O0": the held-out estimate's standard error at ~98% is sqrt(0.98 * 0.02 / 1024) = 0.44
  // points, so 3 points is ~5 standard errors of the difference of two estimates, plus room for the
  // different (rounded) trajectories; a level that costs real accuracy on this task shows a larger gap.
  // (For this network O1 and O2 are the same computation: O2's bf16/f16 weights are the rounded f32
  // masters, exactly what O1's autocast makes of its f32 weights, so their lines print equal numbers.)
  const RunResult o0 = train_level(OptLevel::O0, DType::f32);
  print("O0 f32", o0);
  EXPECT_FALSE(o0.loss_nan);
  EXPECT_GE(o0.accuracy, 0.95);
  struct Level {
    const char* name;
    OptLevel level;
    DType dtype;
  };
  for (const Level& l : {Level{"O1 bf16", OptLevel::O1, DType::bf16}, Level{"O1 f16", OptLevel::O1, DType::f16},
                         Level{"O2 bf16", OptLevel::O2, DType::bf16}, Level{"O2 f16", OptLevel::O2, DType::f16}}) {
    const RunResult r = train_level(l.level, l.dtype);
    print(l.name, r);
    EXPECT_FALSE(r.loss_nan) << l.name;
    EXPECT_GE(r.accuracy, 0.95) << l.name;
    EXPECT_LE(o0.accuracy - r.accuracy, 0.03) << l.name;
    // bf16 needs no loss scaling: nothing skipped. f16 starts at 65536 and may skip a few steps while the
    // scale finds its level (each overflow halves it); more than 10% skipped would mean it never settles.
    if (l.dtype == DType::bf16) { EXPECT_EQ(r.skipped, 0) << l.name; }
    EXPECT_LE(r.skipped, kSteps / 10) << l.name;
  }
}

TEST(OptLevels, O3IsRunAndItsOutcomeReported) {
  // O3 (pure 16-bit, no masters, no loss scaling, 16-bit batch norm) is a speed ceiling that is expected
  // not to converge on many nets; the test only shows that it runs and prints what happened.
  for (DType dt : {DType::f16, DType::bf16}) {
    const RunResult r = train_level(OptLevel::O3, dt);
    const std::string name = std::string("O3 ") + dtype_name(dt);
    print(name.c_str(), r);
    std::printf("  O3 %s outcome: accuracy %.1f%%, loss %s\n", dtype_name(dt), 100 * r.accuracy,
                r.loss_nan ? "became NaN/inf" : "stayed finite");
    EXPECT_GE(r.accuracy, 0.0);  // ran to the end and evaluated
  }
}

// ===================================================================== initialize() in detail

TEST(OptLevels, O2ConvertsLayersKeepsBatchNormAndMastersHoldOriginalValues) {
  manual_seed(3);
  auto model = make_cnn(8);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  std::vector<std::pair<std::string, Tensor>> original;
  for (const auto& [name, p] : model->named_parameters()) original.emplace_back(name, p.detach().clone());
  amp::AmpSetup setup = amp::initialize(model, opt, {.opt_level = OptLevel::O2, .dtype = DType::bf16});

  EXPECT_EQ(setup.options().opt_level, OptLevel::O2);
  EXPECT_TRUE(*setup.options().keep_batchnorm_fp32);
  EXPECT_TRUE(*setup.options().master_weights);
  EXPECT_TRUE(opt.master_weights());
  EXPECT_FALSE(setup.scaler.is_enabled());  // bf16: no loss scaling
  EXPECT_EQ(setup.describe(), "O2 bf16, batch norm f32, f32 master weights, loss scale none");

  const auto params = model->named_parameters();
  const std::vector<Tensor> in_opt = opt.parameters();
  ASSERT_EQ(params.size(), in_opt.size());
  int rounded = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    SCOPED_TRACE(name);
    // The optimizer's parameters are the converted tensors themselves, in the same order.
    EXPECT_EQ(in_opt[i].impl_ptr(), p.impl_ptr());
    EXPECT_TRUE(p.is_leaf());
    EXPECT_TRUE(p.requires_grad());
    const bool bn = name.rfind("1.", 0) == 0 || name.rfind("5.", 0) == 0;  // children 1 and 5 are BatchNorm2d
    if (bn) {
      EXPECT_EQ(p.dtype(), DType::f32);
      EXPECT_FALSE(opt.master(p).defined());
      EXPECT_TRUE(bitwise_equal(p.detach(), original[i].second));
      continue;
    }
    EXPECT_EQ(p.dtype(), DType::bf16);
    const Tensor m = opt.master(p);
    ASSERT_TRUE(m.defined());
    // The master holds the ORIGINAL f32 values, not the bf16-rounded ones.
    EXPECT_TRUE(bitwise_equal(m, original[i].second));
    EXPECT_TRUE(bitwise_equal(p.detach(), original[i].second.to(DType::bf16)));
    rounded += !bitwise_equal(m, p.detach().to(DType::f32));
  }
  EXPECT_EQ(rounded, 6);  // 2 convs + linear, weight and bias: random values are never all bf16-exact
  for (const auto& [name, b] : model->named_buffers())
    if (name.find("running") != std::string::npos) { EXPECT_EQ(b.dtype(), DType::f32) << name; }

  // One step: the optimizer updates the masters from the original values and writes bf16 weights.
  Tensor x = randn({4, 1, 8, 8});
  Tensor loss = cross_entropy(setup.model(x), from_vector<int64_t>({0, 1, 2, 3}, {4}));
  EXPECT_EQ(loss.dtype(), DType::f32);
  setup.scaler.scale(loss).backward();
  EXPECT_TRUE(setup.scaler.step(opt));
  setup.scaler.update();
  const Tensor w0 = model->named_parameters().at(0).second;
  EXPECT_EQ(w0.dtype(), DType::bf16);
  EXPECT_TRUE(bitwise_equal(w0.detach(), opt.master(w0).to(DType::bf16)));
  EXPECT_FALSE(bitwise_equal(opt.master(w0), original[0].second));
}

TEST(OptLevels, O2WithoutKeepBatchnormAndO3ConvertEverything) {
  for (auto [level, keep] :
       {std::pair{OptLevel::O2, std::optional<bool>(false)}, std::pair{OptLevel::O3, std::optional<bool>()}}) {
    manual_seed(4);
    auto model = make_cnn(8);
    optim::SGD opt(model->parameters(), {.lr = 0.1});
    amp::AmpSetup setup =
        amp::initialize(model, opt, {.opt_level = level, .dtype = DType::f16, .keep_batchnorm_fp32 = keep});
    for (const auto& [name, p] : model->named_parameters()) EXPECT_EQ(p.dtype(), DType::f16) << name;
    for (const auto& [name, b] : model->named_buffers())
      if (name.find("running") != std::string::npos) { EXPECT_EQ(b.dtype(), DType::f16) << name; }
    EXPECT_EQ(opt.master_weights(), level == OptLevel::O2);
    EXPECT_EQ(opt.parameters().at(0).impl_ptr(), model->parameters().at(0).impl_ptr());
    // The output is f32 at every level.
    Tensor y = setup.model(randn({2, 1, 8, 8}));
    EXPECT_EQ(y.dtype(), DType::f32);
  }
}

TEST(OptLevels, O0AndO1LeaveTheModelF32) {
  for (OptLevel level : {OptLevel::O0, OptLevel::O1}) {
    manual_seed(5);
    auto model = make_cnn(8);
    const std::vector<Tensor> before = model->parameters();
    optim::SGD opt(model->parameters(), {.lr = 0.1});
    amp::AmpSetup setup = amp::initialize(model, opt, {.opt_level = level, .dtype = DType::f16});
    const std::vector<Tensor> after = model->parameters();
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_EQ(after[i].impl_ptr(), before[i].impl_ptr());
      EXPECT_EQ(after[i].dtype(), DType::f32);
      EXPECT_EQ(opt.parameters()[i].impl_ptr(), before[i].impl_ptr());
    }
    EXPECT_FALSE(opt.master_weights());
    EXPECT_EQ(setup.scaler.is_enabled(), level == OptLevel::O1);  // f16 O1: dynamic loss scaling
    Tensor y = setup.model(randn({2, 1, 8, 8}));
    EXPECT_EQ(y.dtype(), DType::f32);
    if (level == OptLevel::O1) {
      // O1 runs the layers under autocast: a hook sees the conv output in f16 (and batch norm, a "none"
      // op, keeps its input's dtype).
      DType conv_out = DType::f32;
      const size_t id = model->at<nn::Conv2d>(0)->register_forward_hook(
          [&](nn::Module&, const Tensor&, const Tensor& out) { conv_out = out.dtype(); });
      (void)setup.model(randn({2, 1, 8, 8}));
      model->at<nn::Conv2d>(0)->remove_forward_hook(id);
      EXPECT_EQ(conv_out, DType::f16);
      EXPECT_EQ(amp::autocast_cache_size(), 0u);  // the region ended with the forward
    }
  }
}

TEST(OptLevels, AmpModelOutputIsF32AtEveryLevel) {
  for (OptLevel level : {OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3}) {
    for (DType dt : {DType::f16, DType::bf16}) {
      manual_seed(6);
      auto model = make_cnn(8);
      optim::Adam opt(model->parameters());
      amp::AmpSetup setup = amp::initialize(model, opt, {.opt_level = level, .dtype = dt});
      Tensor x = randn({3, 1, 8, 8});
      EXPECT_EQ(setup.model(x).dtype(), DType::f32) << amp::opt_level_name(level) << " " << dtype_name(dt);
      model->eval();
      EXPECT_EQ(setup.model.forward(x).dtype(), DType::f32);
    }
  }
}

TEST(OptLevels, InitializeRejectsA16BitModelAndBadDtypes) {
  auto model = make_cnn(8);
  model->to(DType::bf16);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  EXPECT_THROW(amp::initialize(model, opt, {.opt_level = OptLevel::O2}), Error);
  EXPECT_THROW(amp::resolve({.opt_level = OptLevel::O1, .dtype = DType::f32}), Error);
  EXPECT_THROW(amp::initialize(nullptr, opt, {}), Error);
}

// ======================================================================== defaults and parsing

TEST(OptLevels, ResolveDefaultsPerLevelAndDtype) {
  using K = amp::LossScale::Kind;
  struct Row {
    OptLevel level;
    DType dtype;
    K loss_scale;
    bool keep_bn, masters;
  };
  const Row rows[] = {
      {OptLevel::O0, DType::f16, K::none, true, false},    {OptLevel::O0, DType::f32, K::none, true, false},
      {OptLevel::O1, DType::f16, K::dynamic, true, false}, {OptLevel::O1, DType::bf16, K::none, true, false},
      {OptLevel::O2, DType::f16, K::dynamic, true, true},  {OptLevel::O2, DType::bf16, K::none, true, true},
      {OptLevel::O3, DType::f16, K::none, false, false},   {OptLevel::O3, DType::bf16, K::none, false, false},
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(std::string(amp::opt_level_name(r.level)) + " " + dtype_name(r.dtype));
    const amp::AmpOptions o = amp::resolve({.opt_level = r.level, .dtype = r.dtype});
    EXPECT_EQ(o.loss_scale->kind, r.loss_scale);
    EXPECT_EQ(*o.keep_batchnorm_fp32, r.keep_bn);
    EXPECT_EQ(*o.master_weights, r.masters);
    EXPECT_EQ(o.scaler.enabled, r.loss_scale != K::none);
    if (r.loss_scale == K::dynamic) {
      EXPECT_TRUE(o.scaler.dynamic);
      EXPECT_EQ(o.scaler.init_scale, 65536.0);
    }
  }
  // Explicit settings win over the defaults; a fixed scale makes a static scaler.
  const amp::AmpOptions fixed = amp::resolve({.opt_level = OptLevel::O2,
                                              .dtype = DType::bf16,
                                              .loss_scale = amp::LossScale::parse("128"),
                                              .master_weights = false});
  EXPECT_TRUE(fixed.scaler.enabled);
  EXPECT_FALSE(fixed.scaler.dynamic);
  EXPECT_EQ(fixed.scaler.init_scale, 128.0);
  EXPECT_FALSE(*fixed.master_weights);
  const amp::AmpOptions none = amp::resolve(
      {.opt_level = OptLevel::O1, .dtype = DType::f16, .loss_scale = amp::LossScale{amp::LossScale::Kind::none}});
  EXPECT_FALSE(none.scaler.enabled);
  // The scaler options ride along (growth interval etc.).
  const amp::AmpOptions interval =
      amp::resolve({.opt_level = OptLevel::O2, .dtype = DType::f16, .scaler = {.growth_interval = 7}});
  EXPECT_EQ(interval.scaler.growth_interval, 7);
}

TEST(OptLevels, ToFp16AndToBf16) {
  manual_seed(8);
  auto m16 = make_cnn(8);
  optim::Adam o16(m16->parameters());
  amp::AmpSetup s16 = amp::to_fp16(m16, o16);
  EXPECT_EQ(s16.options().opt_level, OptLevel::O2);
  EXPECT_EQ(m16->at<nn::Conv2d>(0)->weight().dtype(), DType::f16);
  EXPECT_EQ(m16->at<nn::BatchNorm2d>(1)->weight().dtype(), DType::f32);
  EXPECT_TRUE(s16.scaler.is_enabled());
  EXPECT_TRUE(s16.scaler.options().dynamic);
  EXPECT_TRUE(o16.master_weights());
  auto mb = make_cnn(8);
  optim::Adam ob(mb->parameters());
  amp::AmpSetup sb = amp::to_bf16(mb, ob);
  EXPECT_EQ(mb->at<nn::Linear>(9)->weight().dtype(), DType::bf16);
  EXPECT_FALSE(sb.scaler.is_enabled());
  EXPECT_TRUE(ob.master_weights());
}

TEST(OptLevels, LossScaleParse) {
  using K = amp::LossScale::Kind;
  EXPECT_EQ(amp::LossScale::parse("dynamic").kind, K::dynamic);
  EXPECT_EQ(amp::LossScale::parse("none").kind, K::none);
  EXPECT_EQ(amp::LossScale::parse("off").kind, K::none);
  const amp::LossScale f = amp::LossScale::parse("512");
  EXPECT_EQ(f.kind, K::fixed);
  EXPECT_EQ(f.value, 512.0);
  EXPECT_EQ(amp::LossScale::parse("0.5").value, 0.5);
  EXPECT_EQ(amp::LossScale::parse("1e3").value, 1000.0);
  for (const char* s : {"dynamic", "none", "128"}) EXPECT_EQ(amp::LossScale::parse(s).str(), s);
  for (const char* bad : {"", "abc", "-1", "0", "12x", "inf", "nan", "Dynamic"}) {
    try {
      (void)amp::LossScale::parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      // The message names the accepted forms.
      EXPECT_NE(std::string(e.what()).find("dynamic"), std::string::npos) << bad;
    }
  }
}

TEST(OptLevels, OptLevelFromString) {
  EXPECT_EQ(amp::opt_level_from_string("O0"), OptLevel::O0);
  EXPECT_EQ(amp::opt_level_from_string("o1"), OptLevel::O1);
  EXPECT_EQ(amp::opt_level_from_string("2"), OptLevel::O2);
  EXPECT_EQ(amp::opt_level_from_string("O3"), OptLevel::O3);
  for (OptLevel l : {OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3})
    EXPECT_EQ(amp::opt_level_from_string(amp::opt_level_name(l)), l);
  for (const char* bad : {"O4", "", "O", "x", "O12", "00", "-1"}) {
    try {
      (void)amp::opt_level_from_string(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("O0, O1, O2 or O3"), std::string::npos) << bad; }
  }
}

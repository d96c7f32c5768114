// Loss scaling (docs/DESIGN.md 1.3, mp/amp/grad_scaler.hpp): why it is needed (gradients ~1e-8 vanish in
// f16 and survive at scale 65536), and GradScaler's contract: skip on inf/NaN without touching
// parameters or optimizer state, back off / grow / hysteresis / static / clamping, the stuck-at-minimum
// error, unscale_ rules, gradient accumulation, clipping, the fused path, LR schedules, the disabled
// scaler and state dicts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "backend/amp_kernels.hpp"
#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using amp::GradScaler;
using amp::GradScalerOptions;
using mp::test::bitwise_equal;
using mp::test::max_rel_diff;
using mp::test::requires_grad;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A small f32 regression problem: loss = mse(x W^T + b, t). Parameters live in the struct.
struct Toy {
  Tensor w, b, x, t;
  explicit Toy(uint64_t seed) {
    manual_seed(seed);
    w = requires_grad(randn({3, 5}, {}, 0.0, 0.5));
    b = requires_grad(randn({3}, {}, 0.0, 0.1));
    x = randn({8, 5});
    t = randn({8, 3});
  }
  std::vector<Tensor> params() const { return {w, b}; }
  Tensor loss() const { return mse_loss(linear(x, w, b), t); }
};

// scaler.scale(loss).backward(), then optionally poison one gradient entry (an overflow in backward).
void scaled_backward(const GradScaler& scaler, const Toy& toy, double poison = 0.0) {
  scaler.scale(toy.loss()).backward();
  if (poison != 0.0) toy.w.grad().data_ptr<float>()[2] = static_cast<float>(poison);
}

// One full training step; returns whether the optimizer stepped.
bool train_step(GradScaler& scaler, optim::Optimizer& opt, const Toy& toy, double poison = 0.0) {
  opt.zero_grad();
  scaled_backward(scaler, toy, poison);
  const bool stepped = scaler.step(opt);
  scaler.update();
  return stepped;
}

// Deep copy of an optimizer's per-parameter state (buffers cloned).
std::map<int64_t, optim::ParamState> snapshot(const optim::Optimizer& opt) {
  auto sd = opt.state_dict().state;
  for (auto& [i, st] : sd)
    for (auto& [name, t] : st.buffers) t = t.clone();
  return sd;
}

}  // namespace

// =========================================================== (b) why: f16 gradient underflow at 1e-8

TEST(GradScaler, InfSkipsTheStepAndHalvesTheScale) {
  for (double poison : {kInf, -kInf, std::nan("")}) {
    Toy toy(1);
    optim::Adam opt(toy.params(), {.lr = 1e-2});
    GradScaler scaler({.init_scale = 1024.0});
    ASSERT_TRUE(train_step(scaler, opt, toy));  // a clean step first, so there is state to protect
    EXPECT_EQ(scaler.get_scale(), 1024.0);
    const Tensor w = toy.w.detach().clone(), b = toy.b.detach().clone();
    const auto state = snapshot(opt);

    opt.zero_grad();
    scaled_backward(scaler, toy, poison);
    EXPECT_FALSE(scaler.step(opt));
    EXPECT_TRUE(scaler.last_step_skipped());
    EXPECT_EQ(scaler.skipped_steps(), 1);
    EXPECT_TRUE(bitwise_equal(toy.w.detach(), w));
    EXPECT_TRUE(bitwise_equal(toy.b.detach(), b));
    const auto after = snapshot(opt);
    ASSERT_EQ(after.size(), state.size());
    for (const auto& [i, st] : state) {
      EXPECT_EQ(after.at(i).step, st.step) << "optimizer step count advanced on a skipped step";
      for (const auto& [name, t] : st.buffers) EXPECT_TRUE(bitwise_equal(after.at(i).buffers.at(name), t)) << name;
    }
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 512.0);
    EXPECT_EQ(scaler.growth_tracker(), 0);
    // The next clean step steps again.
    EXPECT_TRUE(train_step(scaler, opt, toy));
    EXPECT_FALSE(scaler.last_step_skipped());
    EXPECT_EQ(scaler.skipped_steps(), 1);
    EXPECT_FALSE(bitwise_equal(toy.w.detach(), w));
  }
}

TEST(GradScaler, InfFoundByExplicitUnscaleAlsoSkips) {
  Toy toy(2);
  optim::SGD opt(toy.params(), {.lr = 0.1, .momentum = 0.9});
  GradScaler scaler({.init_scale = 256.0});
  const Tensor w = toy.w.detach().clone();
  scaled_backward(scaler, toy, kInf);
  scaler.unscale_(opt);
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_TRUE(bitwise_equal(toy.w.detach(), w));
  EXPECT_EQ(opt.state(toy.w), nullptr);  // no momentum buffer was created
  EXPECT_EQ(scaler.get_scale(), 128.0);
}

TEST(GradScaler, GrowsAfterGrowthIntervalCleanSteps) {
  Toy toy(3);
  optim::SGD opt(toy.params(), {.lr = 1e-3});
  GradScaler scaler({.init_scale = 8.0, .growth_interval = 3});
  for (int k = 1; k <= 2; ++k) {
    ASSERT_TRUE(train_step(scaler, opt, toy));
    EXPECT_EQ(scaler.get_scale(), 8.0);
    EXPECT_EQ(scaler.growth_tracker(), k);
  }
  ASSERT_TRUE(train_step(scaler, opt, toy));
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  // An overflow resets the count of clean steps: 2 clean, 1 overflow, 2 clean -> no growth.
  train_step(scaler, opt, toy);
  train_step(scaler, opt, toy);
  EXPECT_FALSE(train_step(scaler, opt, toy, kInf));
  EXPECT_EQ(scaler.get_scale(), 8.0);
  train_step(scaler, opt, toy);
  train_step(scaler, opt, toy);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  train_step(scaler, opt, toy);
  EXPECT_EQ(scaler.get_scale(), 16.0);
}

TEST(GradScaler, CustomGrowthAndBackoffFactors) {
  Toy toy(4);
  optim::SGD opt(toy.params(), {.lr = 1e-3});
  GradScaler scaler({.init_scale = 100.0, .growth_factor = 3.0, .backoff_factor = 0.25, .growth_interval = 1});
  train_step(scaler, opt, toy);
  EXPECT_EQ(scaler.get_scale(), 300.0);
  train_step(scaler, opt, toy, kInf);
  EXPECT_EQ(scaler.get_scale(), 75.0);
}

TEST(GradScaler, HysteresisToleratesOverflowsBeforeBackingOff) {
  Toy toy(5);
  optim::SGD opt(toy.params(), {.lr = 1e-3});
  GradScaler scaler({.init_scale = 1024.0, .hysteresis = 3});
  EXPECT_FALSE(train_step(scaler, opt, toy, kInf));
  EXPECT_EQ(scaler.get_scale(), 1024.0);  // 1st overflow tolerated (the step is still skipped)
  EXPECT_FALSE(train_step(scaler, opt, toy, kInf));
  EXPECT_EQ(scaler.get_scale(), 1024.0);  // 2nd tolerated
  EXPECT_FALSE(train_step(scaler, opt, toy, kInf));
  EXPECT_EQ(scaler.get_scale(), 512.0);  // 3rd backs off
  EXPECT_EQ(scaler.skipped_steps(), 3);
  // After backing off the tolerance starts again.
  train_step(scaler, opt, toy, kInf);
  train_step(scaler, opt, toy, kInf);
  EXPECT_EQ(scaler.get_scale(), 512.0);
  train_step(scaler, opt, toy, kInf);
  EXPECT_EQ(scaler.get_scale(), 256.0);
  // Without hysteresis (the default, 1) the first overflow backs off.
  GradScaler plain({.init_scale = 1024.0});
  train_step(plain, opt, toy, kInf);
  EXPECT_EQ(plain.get_scale(), 512.0);
}

TEST(GradScaler, StaticScaleNeverChangesButStillSkips) {
  Toy toy(6);
  optim::SGD opt(toy.params(), {.lr = 1e-3});
  GradScaler scaler({.init_scale = 128.0, .growth_interval = 2, .dynamic = false});
  const Tensor w = toy.w.detach().clone();
  EXPECT_FALSE(train_step(scaler, opt, toy, kInf));
  EXPECT_TRUE(bitwise_equal(toy.w.detach(), w));
  EXPECT_EQ(scaler.get_scale(), 128.0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  for (int k = 0; k < 6; ++k) EXPECT_TRUE(train_step(scaler, opt, toy));
  EXPECT_EQ(scaler.get_scale(), 128.0);
  // Static scaling at the minimum never raises the stuck error (it does not adapt, so it cannot be stuck).
  GradScaler at_min({.init_scale = 1.0, .dynamic = false, .max_overflows_at_min_scale = 2});
  for (int k = 0; k < 5; ++k) EXPECT_NO_THROW(train_step(at_min, opt, toy, kInf));
}

TEST(GradScaler, MinAndMaxScaleClamp) {
  Toy toy(7);
  optim::SGD opt(toy.params(), {.lr = 1e-3});
  GradScaler low({.init_scale = 8.0, .min_scale = 3.0, .max_overflows_at_min_scale = 0});
  train_step(low, opt, toy, kInf);
  EXPECT_EQ(low.get_scale(), 4.0);
  train_step(low, opt, toy, kInf);
  EXPECT_EQ(low.get_scale(), 3.0);  // 2 would be below min_scale
  train_step(low, opt, toy, kInf);
  EXPECT_EQ(low.get_scale(), 3.0);
  GradScaler high({.init_scale = 16.0, .growth_interval = 1, .max_scale = 40.0});
  train_step(high, opt, toy);
  EXPECT_EQ(high.get_scale(), 32.0);
  train_step(high, opt, toy);
  EXPECT_EQ(high.get_scale(), 40.0);
  train_step(high, opt, toy);
  EXPECT_EQ(high.get_scale(), 40.0);
  // An initial scale outside [min, max] is clamped at construction.
  EXPECT_EQ(GradScaler({.init_scale = 1e9}).get_scale(), 16777216.0);
}

TEST(GradScaler, StuckAtMinimumScaleThrowsWithAdvice) {
  Toy toy(8);
  optim::SGD opt(toy.params(), {.lr = 1e-3});
  GradScaler scaler({.init_scale = 2.0, .min_scale = 1.0, .max_overflows_at_min_scale = 3});
  train_step(scaler, opt, toy, kInf);  // 2 -> 1 (was above the minimum: not counted)
  EXPECT_EQ(scaler.get_scale(), 1.0);
  train_step(scaler, opt, toy, kInf);  // at the minimum: 1
  train_step(scaler, opt, toy, kInf);  // 2
  train_step(scaler, opt, toy);        // a clean step resets the count
  train_step(scaler, opt, toy, kInf);  // 1
  train_step(scaler, opt, toy, kInf);  // 2
  opt.zero_grad();
  scaled_backward(scaler, toy, kInf);
  EXPECT_FALSE(scaler.step(opt));
  try {
    scaler.update();  // 3 consecutive overflows at the minimum
    FAIL() << "expected the stuck-at-minimum error";
  } catch (const NumericalError& e) {  // a numerical failure, not an input error (the CLI's exit status 3)
    const std::string msg = e.what();
    EXPECT_NE(msg.find("bf16"), std::string::npos) << msg;
    EXPECT_NE(msg.find("learning rate"), std::string::npos) << msg;
    EXPECT_NE(msg.find("minimum"), std::string::npos) << msg;
  }
  // 0 disables the check.
  GradScaler never({.init_scale = 1.0, .min_scale = 1.0, .max_overflows_at_min_scale = 0});
  for (int k = 0; k < 20; ++k) EXPECT_NO_THROW(train_step(never, opt, toy, kInf));
}

// Note [giving up on a loss scale]: a static scale stops the run after max_consecutive_skips skipped steps in a
// row (a clean step resets the count; 0 never stops); the count survives a state dict round trip, and a state
// dict saved before the limit existed still loads.
TEST(GradScaler, StaticScaleGivesUpAfterConsecutiveSkips) {
  Toy toy(10);
  optim::SGD opt(toy.params(), {.lr = 1e-3});
  GradScaler scaler({.init_scale = 128.0, .dynamic = false, .max_consecutive_skips = 3});
  train_step(scaler, opt, toy, kInf);  // 1
  train_step(scaler, opt, toy, kInf);  // 2
  train_step(scaler, opt, toy);        // a clean step resets the count
  train_step(scaler, opt, toy, kInf);  // 1
  train_step(scaler, opt, toy, kInf);  // 2
  nn::StateDict sd = scaler.state_dict();
  EXPECT_EQ(sd.at("consecutive_skips").item<int64_t>(), 2);
  GradScaler restored({.init_scale = 128.0, .dynamic = false, .max_consecutive_skips = 0});
  restored.load_state_dict(sd);
  EXPECT_EQ(restored.options().max_consecutive_skips, 3);
  for (GradScaler* s : {&scaler, &restored}) {
    opt.zero_grad();
    scaled_backward(*s, toy, kInf);
    EXPECT_FALSE(s->step(opt));
    try {
      s->update();  // the third skipped step in a row
      FAIL() << "expected the static scale to give up";
    } catch (const NumericalError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("3 consecutive steps were skipped"), std::string::npos) << msg;
      EXPECT_NE(msg.find("static loss scale 128"), std::string::npos) << msg;
      EXPECT_NE(msg.find("--loss_scale dynamic"), std::string::npos) << msg;
    }
  }
  // A state dict without the entries (saved before they existed) loads: the count starts at 0, the limit stays.
  sd.erase("consecutive_skips");
  sd.erase("max_consecutive_skips");
  GradScaler old({.init_scale = 128.0, .dynamic = false, .max_consecutive_skips = 2});
  old.load_state_dict(sd);
  EXPECT_EQ(old.options().max_consecutive_skips, 2);
  EXPECT_NO_THROW(train_step(old, opt, toy, kInf));
  EXPECT_THROW(train_step(old, opt, toy, kInf), NumericalError);
  // 0 never gives up; a dynamic scale ignores the limit (its own is max_overflows_at_min_scale).
  GradScaler never({.init_scale = 128.0, .dynamic = false, .max_consecutive_skips = 0});
  for (int k = 0; k < 30; ++k) EXPECT_NO_THROW(train_step(never, opt, toy, kInf));
  GradScaler dynamic({.init_scale = 1e6, .max_overflows_at_min_scale = 0, .max_consecutive_skips = 1});
  for (int k = 0; k < 5; ++k) EXPECT_NO_THROW(train_step(dynamic, opt, toy, kInf));
}

// Note [finite check on 16-bit bits]: the check-only pass over bf16 and f16 gradients reads bits. Every 16-bit
// pattern, placed in a tensor of finite values (in the middle of a block and as a tensor's last element), is found
// non-finite exactly when the scalar conversion makes it inf or NaN; the check writes nothing.
TEST(GradScaler, TheFiniteCheckReadsEvery16BitPattern) {
  const auto unscale = backend::unscale_kernel.get(DeviceType::cpu);
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor big = full({36000}, -0.75, {.dtype = dt}), last = full({37}, 3.0, {.dtype = dt});
    auto* bb = static_cast<uint16_t*>(big.raw_data());
    auto* lb = static_cast<uint16_t*>(last.raw_data());
    const uint16_t bfill = bb[0], lfill = lb[0];
    int wrong = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      const auto bits = static_cast<uint16_t>(i);
      const float v = dt == DType::bf16 ? detail::bf16_bits_to_float(bits) : detail::half_bits_to_float(bits);
      const bool nonfinite = !std::isfinite(v);
      bb[20000 + i % 7] = bits;
      lb[36] = bits;
      const std::vector<Tensor> one{big}, two{last, big};
      wrong += unscale(one, 1.0, false) != nonfinite;
      bb[20000 + i % 7] = bfill;
      wrong += unscale(two, 1.0, false) != nonfinite;
      ASSERT_EQ(lb[36], bits);  // nothing written
      lb[36] = lfill;
    }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(GradScaler, UnscaleRules) {
  Toy toy(9);
  optim::SGD opt(toy.params(), {.lr = 1e-3});
  GradScaler scaler({.init_scale = 64.0});
  scaled_backward(scaler, toy);
  scaler.unscale_(opt);
  EXPECT_THROW(scaler.unscale_(opt), Error);  // twice before update()
  EXPECT_TRUE(scaler.step(opt));
  EXPECT_THROW(scaler.step(opt), Error);      // step twice
  EXPECT_THROW(scaler.unscale_(opt), Error);  // after step
  scaler.update();
  // A new step may unscale again.
  opt.zero_grad();
  scaled_backward(scaler, toy);
  EXPECT_NO_THROW(scaler.unscale_(opt));
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
}

TEST(GradScaler, UnscaleDividesTheGradientsByTheScale) {
  Toy toy(10);
  optim::SGD opt(toy.params(), {.lr = 1e-3});
  toy.loss().backward();
  const Tensor gw = toy.w.grad().clone(), gb = toy.b.grad().clone();
  opt.zero_grad();
  GradScaler scaler({.init_scale = 4096.0});
  scaled_backward(scaler, toy);
  // Scaling by a power of two is exact in binary floating point (no overflow/underflow here), so the
  // scaled gradients are exactly 4096 times the plain ones and unscale_ gives them back bit for bit.
  EXPECT_TRUE(bitwise_equal(toy.w.grad(), gw * 4096.0));
  scaler.unscale_(opt);
  EXPECT_TRUE(bitwise_equal(toy.w.grad(), gw));
  EXPECT_TRUE(bitwise_equal(toy.b.grad(), gb));
}

// ================================================================= accumulation, clipping, fused

TEST(GradScaler, GradientAccumulationMatchesTheF32Reference) {
  // 3 micro-batches, each scaled and backpropagated; one unscale_/step/update. The reference
  // accumulates the plain f32 gradients of the same micro-batches and steps once. The scale is a power
  // of two, so every scaled gradient and partial sum is exactly 2^16 times the reference's (same order
  // of summation), and the results agree bit for bit.
  manual_seed(12);
  std::vector<Tensor> xs, ts;
  for (int i = 0; i < 3; ++i) {
    xs.push_back(randn({6, 5}));
    ts.push_back(randn({6, 3}));
  }
  for (bool explicit_unscale : {false, true}) {
    Toy ref(13), run(13);
    optim::Adam opt_ref(ref.params(), {.lr = 1e-2}), opt_run(run.params(), {.lr = 1e-2});
    GradScaler scaler({.init_scale = 65536.0});
    for (int step = 0; step < 3; ++step) {
      opt_ref.zero_grad();
      opt_run.zero_grad();
      for (int i = 0; i < 3; ++i) {
        (mse_loss(linear(xs[i], ref.w, ref.b), ts[i]) * (1.0 / 3)).backward();
        scaler.scale(mse_loss(linear(xs[i], run.w, run.b), ts[i]) * (1.0 / 3)).backward();
      }
      opt_ref.step();
      if (explicit_unscale) scaler.unscale_(opt_run);
      ASSERT_TRUE(scaler.step(opt_run));
      scaler.update();
    }
    EXPECT_TRUE(bitwise_equal(run.w.detach(), ref.w.detach())) << explicit_unscale;
    EXPECT_TRUE(bitwise_equal(run.b.detach(), ref.b.detach())) << explicit_unscale;
  }
}

TEST(GradScaler, SixteenBitGradientsAccumulateInF32) {
  // Note [gradient accumulation in f32]. A 16-bit parameter's gradient over 8 micro-batches: the first
  // contributes 1, the other 7 each contribute a quarter of the 16-bit ulp of 1 (2^-9 for bf16, 2^-12
  // for f16), below half an ulp: in 16-bit every addition rounds back to 1, in f32 the sum is exact.
  for (DType dt : {DType::bf16, DType::f16}) {
    const double small = dt == DType::bf16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12);
    const double want = 1.0 + 7 * small;
    for (bool widen : {true, false}) {
      Tensor p = requires_grad(ones({16}, {.dtype = dt}));
      for (int k = 0; k < 8; ++k) {
        sum(mul(p, full({16}, k == 0 ? 1.0 : small, {.dtype = dt}))).backward();
        if (k == 0 && widen) amp::accumulate_grads_in_f32({p});
      }
      if (widen) {
        ASSERT_EQ(p.grad().dtype(), DType::f32) << dtype_name(dt);
        for (double v : p.grad().to_vector<double>()) ASSERT_EQ(v, want) << dtype_name(dt);
      } else {  // what the widening prevents (the test above can fail)
        ASSERT_EQ(p.grad().dtype(), dt);
        for (double v : p.grad().to_vector<double>()) ASSERT_EQ(v, 1.0) << dtype_name(dt);
      }
    }
  }
  // f32 gradients and parameters without one are left alone.
  Tensor f = requires_grad(ones({4})), none = requires_grad(ones({4}, {.dtype = DType::bf16}));
  sum(f).backward();
  const Tensor before = f.grad();
  amp::accumulate_grads_in_f32({f, none});
  EXPECT_EQ(f.grad().raw_data(), before.raw_data());
  EXPECT_FALSE(none.grad().defined());
}

TEST(GradScaler, AccumulatedBf16StepEqualsTheF32GradientSum) {
  // O2 with SGD and f32 masters: 4 micro-batches accumulated in f32 then one step, against the same
  // step taken from the f32 sum of the 16-bit micro-batch gradients computed separately.
  manual_seed(21);
  const Tensor w0 = randn({32}).to(DType::bf16);
  std::vector<Tensor> xs;
  for (int i = 0; i < 4; ++i) xs.push_back(randn({32}).to(DType::bf16));
  // Reference: each micro-batch's gradient alone (x_i / 4 in bf16), summed in f32.
  Tensor g_sum = zeros({32});
  for (const Tensor& x : xs) {
    Tensor p = requires_grad(w0.clone());
    (sum(mul(p, x)) * 0.25).backward();
    add_(g_sum, p.grad().to(DType::f32));
  }
  Tensor p = requires_grad(w0.clone());
  optim::SGD opt({p}, {.lr = 0.5});
  opt.set_master_weights(true);
  for (int i = 0; i < 4; ++i) {
    (sum(mul(p, xs[i])) * 0.25).backward();
    if (i == 0) amp::accumulate_grads_in_f32({p});
  }
  GradScaler scaler(amp::grad_scaler_defaults(DType::bf16));
  ASSERT_TRUE(scaler.step(opt));
  const std::vector<double> got = p.detach().to_vector<double>(), w = w0.to_vector<double>(),
                            g = g_sum.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) {
    const float master = static_cast<float>(w[i]) - 0.5f * static_cast<float>(g[i]);
    EXPECT_EQ(got[i], scalar_tensor(master).to(DType::bf16).item<double>()) << i;
  }
}

namespace {

// Total L2 norm of the gradients (what clip_grad_norm_ computes), in f64.
double grad_norm(const std::vector<Tensor>& params) {
  double s = 0;
  for (const Tensor& p : params)
    for (double v : p.grad().to_vector<double>()) s += v * v;
  return std::sqrt(s);
}

// clip_grad_norm_: scale every gradient by max_norm / norm when the norm exceeds max_norm.
void clip(const std::vector<Tensor>& params, double max_norm) {
  const double n = grad_norm(params);
  if (n <= max_norm) return;
  autograd::NoGradGuard ng;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    mul_(g, max_norm / n);
  }
}

}  // namespace

TEST(GradScaler, ClippingAfterUnscaleSeesTrueGradients) {
  Toy ref(14), run(14);
  optim::SGD opt_ref(ref.params(), {.lr = 0.1}), opt_run(run.params(), {.lr = 0.1});
  GradScaler scaler({.init_scale = 32768.0});
  ref.loss().backward();
  const double true_norm = grad_norm(ref.params());
  ASSERT_GT(true_norm, 0.5);  // so clipping at 0.5 does something
  clip(ref.params(), 0.5);
  opt_ref.step();

  scaled_backward(scaler, run);
  EXPECT_NEAR(grad_norm(run.params()), 32768.0 * true_norm, 1e-5 * 32768.0 * true_norm);  // still scaled
  scaler.unscale_(opt_run);
  // Power-of-two scale: the unscaled gradients are the reference's exactly, so is their norm.
  EXPECT_EQ(grad_norm(run.params()), true_norm);
  clip(run.params(), 0.5);
  EXPECT_NEAR(grad_norm(run.params()), 0.5, 1e-6);
  EXPECT_TRUE(scaler.step(opt_run));  // does not unscale a second time
  scaler.update();
  EXPECT_TRUE(bitwise_equal(run.w.detach(), ref.w.detach()));
  EXPECT_TRUE(bitwise_equal(run.b.detach(), ref.b.detach()));
}

TEST(GradScaler, FusedStepEqualsExplicitUnscale) {
  // Note [GradScaler fused step]: step() without unscale_ multiplies by 1/S inside the optimizer pass;
  // unscale_ then step() multiplies first. Both compute g * float(1/S) in f32, so the parameters are
  // identical bit for bit, also for a scale that is not a power of two.
  for (double scale : {65536.0, 3000.0}) {
    Toy a(15), b(15);
    optim::Adam oa(a.params(), {.lr = 1e-2, .weight_decay = 1e-3}), ob(b.params(), {.lr = 1e-2, .weight_decay = 1e-3});
    GradScaler sa({.init_scale = scale, .growth_interval = 2}), sb({.init_scale = scale, .growth_interval = 2});
    for (int step = 0; step < 5; ++step) {
      oa.zero_grad();
      ob.zero_grad();
      scaled_backward(sa, a);
      scaled_backward(sb, b);
      sa.unscale_(oa);
      EXPECT_TRUE(sa.step(oa));
      EXPECT_TRUE(sb.step(ob));
      sa.update();
      sb.update();
      EXPECT_EQ(sa.get_scale(), sb.get_scale());
    }
    EXPECT_TRUE(bitwise_equal(a.w.detach(), b.w.detach())) << scale;
    EXPECT_TRUE(bitwise_equal(a.b.detach(), b.b.detach())) << scale;
    // The fused path leaves the gradient scaled (it is not written), and resets the optimizer's multiplier.
    EXPECT_EQ(ob.grad_scale_inv(), 1.0);
  }
}

TEST(GradScaler, SkippedStepDoesNotAdvanceTheLrSchedule) {
  Toy toy(16);
  optim::SGD opt(toy.params(), {.lr = 0.1});
  optim::LambdaLR sched(opt, [](int64_t step) { return 1.0 / static_cast<double>(step + 1); });
  GradScaler scaler({.init_scale = 512.0});
  auto step = [&](double poison) {
    opt.zero_grad();
    scaled_backward(scaler, toy, poison);
    if (scaler.step(opt)) sched.step();
    scaler.update();
  };
  step(0.0);
  EXPECT_EQ(sched.last_step(), 1);
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.05);
  step(kInf);
  EXPECT_EQ(sched.last_step(), 1);  // the skipped update does not consume a schedule step
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.05);
  step(0.0);
  EXPECT_EQ(sched.last_step(), 2);
  EXPECT_DOUBLE_EQ(opt.lr(0), 0.1 / 3);
}

TEST(GradScaler, InfInOneOptimizerSkipsOnlyThatOneAndBacksOff) {
  Toy a(17), b(18);
  optim::SGD oa(a.params(), {.lr = 0.1}), ob(b.params(), {.lr = 0.1});
  GradScaler scaler({.init_scale = 64.0});
  const Tensor wa = a.w.detach().clone(), wb = b.w.detach().clone();
  scaled_backward(scaler, a, kInf);
  scaled_backward(scaler, b);
  EXPECT_FALSE(scaler.step(oa));
  EXPECT_TRUE(scaler.step(ob));
  scaler.update();
  EXPECT_TRUE(bitwise_equal(a.w.detach(), wa));
  EXPECT_FALSE(bitwise_equal(b.w.detach(), wb));
  EXPECT_EQ(scaler.get_scale(), 32.0);
}

TEST(GradScaler, DisabledScalerIsTheIdentity) {
  Toy ref(19), run(19);
  optim::SGD opt_ref(ref.params(), {.lr = 0.1, .momentum = 0.9}), opt_run(run.params(), {.lr = 0.1, .momentum = 0.9});
  GradScaler scaler({.init_scale = 1024.0, .enabled = false});
  EXPECT_FALSE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 1.0);
  Tensor loss = run.loss();
  Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.impl_ptr(), loss.impl_ptr());
  scaled.backward();
  const Tensor g = run.w.grad().clone();
  scaler.unscale_(opt_run);
  scaler.unscale_(opt_run);  // a no-op, so calling it twice is harmless
  EXPECT_TRUE(bitwise_equal(run.w.grad(), g));
  EXPECT_TRUE(scaler.step(opt_run));
  scaler.update();
  ref.loss().backward();
  opt_ref.step();
  EXPECT_TRUE(bitwise_equal(run.w.detach(), ref.w.detach()));
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(GradScaler, DefaultsAndValidation) {
  const GradScalerOptions d;
  EXPECT_EQ(d.init_scale, 65536.0);
  EXPECT_EQ(d.growth_factor, 2.0);
  EXPECT_EQ(d.backoff_factor, 0.5);
  EXPECT_EQ(d.growth_interval, 2000);
  EXPECT_TRUE(amp::grad_scaler_defaults(DType::f16).enabled);
  EXPECT_FALSE(amp::grad_scaler_defaults(DType::bf16).enabled);
  EXPECT_FALSE(amp::grad_scaler_defaults(DType::f32).enabled);
  EXPECT_THROW(GradScaler({.init_scale = 0.0}), Error);
  EXPECT_THROW(GradScaler({.init_scale = kInf}), Error);
  EXPECT_THROW(GradScaler({.growth_factor = 1.0}), Error);
  EXPECT_THROW(GradScaler({.backoff_factor = 1.0}), Error);
  EXPECT_THROW(GradScaler({.growth_interval = 0}), Error);
  EXPECT_THROW(GradScaler({.hysteresis = 0}), Error);
  EXPECT_THROW(GradScaler({.min_scale = 10.0, .max_scale = 1.0}), Error);
  EXPECT_THROW(GradScaler().scale(arange(3)), Error);  // an integer "loss"
  // scale() keeps the graph and returns f32 even for a 16-bit loss.
  Tensor w = requires_grad(ones({2}));
  Tensor s = GradScaler({.init_scale = 8.0}).scale(sum(w * 3.0).to(DType::bf16));
  EXPECT_EQ(s.dtype(), DType::f32);
  EXPECT_EQ(s.item<double>(), 48.0);
  s.backward();
  for (double v : w.grad().to_vector<double>()) EXPECT_EQ(v, 24.0);
}

// ============================================================================ (f) state dicts

TEST(GradScaler, StateDictRoundTripContinuesIdentically) {
  Toy toy(20);
  optim::SGD opt(toy.params(), {.lr = 1e-3});
  const GradScalerOptions o{.init_scale = 1024.0,
                            .growth_factor = 4.0,
                            .backoff_factor = 0.25,
                            .growth_interval = 3,
                            .hysteresis = 2,
                            .min_scale = 2.0,
                            .max_scale = 1e6};
  GradScaler scaler(o);
  // Reach a state where every tracker is nonzero: 1 clean step, 1 overflow (hysteresis 2 leaves its
  // tracker at 1 and the scale unchanged), then 2 clean steps (growth tracker 2).
  train_step(scaler, opt, toy);
  train_step(scaler, opt, toy, kInf);
  train_step(scaler, opt, toy);
  train_step(scaler, opt, toy);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 2);
  EXPECT_EQ(scaler.skipped_steps(), 1);

  const nn::StateDict sd = scaler.state_dict();
  EXPECT_TRUE(sd.contains("scale"));
  EXPECT_TRUE(sd.contains("growth_tracker"));
  EXPECT_TRUE(sd.contains("hysteresis_tracker"));
  GradScaler fresh;  // default options: everything comes from the state dict
  fresh.load_state_dict(sd);
  EXPECT_EQ(fresh.get_scale(), 1024.0);
  EXPECT_EQ(fresh.growth_tracker(), 2);
  EXPECT_EQ(fresh.skipped_steps(), 1);
  EXPECT_EQ(fresh.options().growth_interval, 3);
  EXPECT_EQ(fresh.options().growth_factor, 4.0);
  EXPECT_EQ(fresh.options().hysteresis, 2);
  EXPECT_EQ(fresh.options().min_scale, 2.0);

  // The same sequence on both: one overflow backs off at once (hysteresis tracker restored at 1),
  // then growth after 3 clean steps, then overflows down to the minimum.
  const std::vector<double> poisons{kInf, 0, 0, 0, 0, kInf, kInf, kInf, kInf, kInf, 0};
  Toy t1(21), t2(21);
  optim::SGD o1(t1.params(), {.lr = 1e-3}), o2(t2.params(), {.lr = 1e-3});
  std::vector<double> scales;
  for (double p : poisons) {
    const bool s1 = train_step(scaler, o1, t1, p), s2 = train_step(fresh, o2, t2, p);
    EXPECT_EQ(s1, s2);
    EXPECT_EQ(scaler.get_scale(), fresh.get_scale());
    EXPECT_EQ(scaler.growth_tracker(), fresh.growth_tracker());
    scales.push_back(fresh.get_scale());
  }
  EXPECT_EQ(scales.front(), 256.0);  // backed off at the first overflow: the tracker was carried over
  EXPECT_EQ(scales[3], 1024.0);      // grown by 4 after 3 clean steps
  EXPECT_EQ(scaler.skipped_steps(), fresh.skipped_steps());
  EXPECT_TRUE(bitwise_equal(t1.w.detach(), t2.w.detach()));

  // A malformed state dict names the entry.
  nn::StateDict bad = sd.clone();
  bad.erase("growth_tracker");
  try {
    GradScaler().load_state_dict(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("growth_tracker"), std::string::npos); }
}

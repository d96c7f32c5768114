// LR schedules: values at key steps, optimizer updates, state dicts.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "mp/optim/optim.hpp"

using namespace mp;
using namespace mp::optim;

namespace {
// Schedules are double arithmetic on a handful of values: 1e-12 covers the rounding.
constexpr double kTol = 1e-12;

Tensor parameter() { return zeros({2}).requires_grad_(); }

std::vector<double> run(const WarmupScheduleOptions& o, int64_t steps, double base = 1.0) {
  Tensor p = parameter();
  SGD opt({p}, {.lr = base});
  WarmupSchedule s(opt, o);
  std::vector<double> lrs{opt.lr(0)};
  for (int64_t i = 0; i < steps; ++i) {
    s.step();
    lrs.push_back(opt.lr(0));
    EXPECT_DOUBLE_EQ(s.get_last_lr()[0], opt.lr(0));
  }
  return lrs;
}
}  // namespace

TEST(OptimLRScheduler, WarmupThenLinearDecay) {
  const auto lr = run({.warmup_steps = 4, .total_steps = 10, .decay = Decay::linear, .min_lr = 0.1}, 20);
  EXPECT_NEAR(lr[0], 0.25, kTol);  // warm-up: (s + 1) / W
  EXPECT_NEAR(lr[1], 0.5, kTol);
  EXPECT_NEAR(lr[3], 1.0, kTol);  // base reached at step W - 1
  EXPECT_NEAR(lr[4], 1.0, kTol);  // decay starts from base
  EXPECT_NEAR(lr[5], 0.1 + 0.9 * 5.0 / 6.0, kTol);
  EXPECT_NEAR(lr[7], 0.1 + 0.9 * 0.5, kTol);
  EXPECT_NEAR(lr[10], 0.1, kTol);  // total_steps: min_lr
  EXPECT_NEAR(lr[20], 0.1, kTol);  // and held
}

TEST(OptimLRScheduler, CosineDecay) {
  const auto lr = run({.total_steps = 100, .decay = Decay::cosine}, 120, 0.5);
  EXPECT_NEAR(lr[0], 0.5, kTol);
  EXPECT_NEAR(lr[25], 0.25 * (1 + std::cos(std::numbers::pi / 4)), kTol);
  EXPECT_NEAR(lr[50], 0.25, kTol);
  EXPECT_NEAR(lr[100], 0.0, kTol);
  EXPECT_NEAR(lr[120], 0.0, kTol);
  for (size_t i = 1; i <= 100; ++i) EXPECT_LT(lr[i], lr[i - 1]) << i;  // strictly decreasing
}

TEST(OptimLRScheduler, StepDecayAfterWarmup) {
  const auto lr = run({.warmup_steps = 2, .decay = Decay::step, .step_size = 3, .gamma = 0.5}, 9);
  const std::vector<double> want{0.5, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(lr[i], want[i], kTol) << i;
}

TEST(OptimLRScheduler, ConstantAfterWarmupAndMinLrFloor) {
  const auto lr = run({.warmup_steps = 3}, 5, 0.3);
  EXPECT_NEAR(lr[0], 0.1, kTol);
  EXPECT_NEAR(lr[2], 0.3, kTol);
  EXPECT_NEAR(lr[5], 0.3, kTol);
  const auto floored = run({.decay = Decay::step, .min_lr = 0.2, .step_size = 1, .gamma = 0.5}, 4);
  EXPECT_NEAR(floored[1], 0.5, kTol);
  EXPECT_NEAR(floored[3], 0.2, kTol);  // 0.125 floored
}

TEST(OptimLRScheduler, ScalesEveryGroupFromItsBase) {
  Tensor a = parameter(), b = parameter();
  Adam opt({{{a}, AdamOptions{.lr = 1.0}}, {{b}, AdamOptions{.lr = 0.1}}}, AdamOptions{});
  WarmupSchedule s(opt, {.warmup_steps = 2, .total_steps = 4, .decay = Decay::linear});
  EXPECT_NEAR(opt.lr(0), 0.5, kTol);
  EXPECT_NEAR(opt.lr(1), 0.05, kTol);
  s.step();
  s.step();
  s.step();
  EXPECT_NEAR(s.get_last_lr()[0], 0.5, kTol);
  EXPECT_NEAR(s.get_last_lr()[1], 0.05, kTol);
  EXPECT_EQ(s.base_lrs(), (std::vector<double>{1.0, 0.1}));
  EXPECT_EQ(s.last_step(), 3);
}

TEST(OptimLRScheduler, StateDictResumes) {
  const WarmupScheduleOptions o{.warmup_steps = 5, .total_steps = 50, .decay = Decay::cosine, .min_lr = 0.01};
  Tensor a = parameter(), b = parameter();
  SGD oa({a}, {.lr = 0.2}), ob({b}, {.lr = 0.2});
  WarmupSchedule sa(oa, o);
  for (int i = 0; i < 17; ++i) sa.step();
  WarmupSchedule sb(ob, o);
  sb.load_state_dict(sa.state_dict());
  EXPECT_DOUBLE_EQ(ob.lr(0), oa.lr(0));
  for (int i = 0; i < 5; ++i) {
    sa.step();
    sb.step();
    EXPECT_DOUBLE_EQ(ob.lr(0), oa.lr(0));
  }
  EXPECT_DOUBLE_EQ(sa.lr_at(22), oa.lr(0));
}

TEST(OptimLRScheduler, LambdaAndErrors) {
  Tensor a = parameter();
  SGD opt({a}, {.lr = 2.0});
  LambdaLR s(opt, [](int64_t step) { return 1.0 / static_cast<double>(step + 1); });
  EXPECT_DOUBLE_EQ(opt.lr(0), 2.0);
  s.step();
  EXPECT_DOUBLE_EQ(opt.lr(0), 1.0);
  EXPECT_THROW(WarmupSchedule(opt, {.warmup_steps = 10, .total_steps = 10, .decay = Decay::linear}), Error);
  EXPECT_THROW(WarmupSchedule(opt, {.decay = Decay::step, .step_size = 0}), Error);
  EXPECT_THROW(LambdaLR(opt, nullptr), Error);
}

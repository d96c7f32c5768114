// Why loss scaling is needed (docs/DESIGN.md 1.3): gradients ~1e-8 vanish in f16 without scaling and survive at
// scale 65536, and unscaling keeps their values (the GradScaler contract itself: test_grad_scaler.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using amp::GradScaler;
using amp::GradScalerOptions;
using mp::test::bitwise_equal;
using mp::test::max_rel_diff;

namespace {

// A computation whose true gradient w.r.t. w is ~1e-8: loss = 2.5e-9 * sum(x W^T) with x in [0.5, 1.5),
// so dL/dW[o, j] = 2.5e-9 * sum_n x[n, j] in [5e-9, 1.5e-8] (4 rows), all below f16's smallest
// subnormal 2^-24 = 6e-8 and even below 2^-25, where rounding goes to 0.
struct TinyGrad {
  Tensor x, w;
  TinyGrad() {
    manual_seed(31);
    x = rand({4, 16}, {}, 0.5, 1.5);
    w = mp::test::requires_grad(randn({8, 16}, {}, 0.0, 0.5));
  }
  Tensor loss_of(const Tensor& y) const { return sum(y) * 2.5e-9; }
  // The f32 reference gradient.
  Tensor reference() const {
    w.set_grad(Tensor());
    loss_of(linear(x, w)).backward();
    Tensor g = w.grad().clone();
    w.set_grad(Tensor());
    return g;
  }
};

// Tolerance of an unscaled f16 gradient against the f32 one: x, the output gradient and the weight
// gradient are each rounded to f16 once (relative error <= 2^-11 each; the 4-term dot product
// accumulates in f32), so <= 3 * 2^-11 = 1.5e-3; 4e-3 leaves margin, and an underflowed (0) or
// wrongly scaled gradient is off by 100%.
constexpr double kF16GradRelTol = 4e-3;

}  // namespace

TEST(LossScaling, TinyGradientsUnderflowInF16AutocastWithoutScaling) {
  TinyGrad c;
  const Tensor ref = c.reference();
  for (double v : ref.to_vector<double>()) {
    ASSERT_GT(v, 4e-9);
    ASSERT_LT(v, 2e-8);
  }
  // O1 f16 without loss scaling: linear runs in f16, the gradient of its f16 output rounds to 0.
  {
    amp::Autocast guard({.dtype = DType::f16});
    c.loss_of(linear(c.x, c.w)).backward();
  }
  ASSERT_TRUE(c.w.grad().defined());
  EXPECT_EQ(c.w.grad().dtype(), DType::f32);
  for (double v : c.w.grad().to_vector<double>()) EXPECT_EQ(v, 0.0) << "expected the f16 gradient to underflow";
  // ... while bf16 (f32's exponent range) keeps it without scaling.
  c.w.set_grad(Tensor());
  {
    amp::Autocast guard({.dtype = DType::bf16});
    c.loss_of(linear(c.x, c.w)).backward();
  }
  // Three bf16 roundings (x, the output gradient, the weight gradient) of <= 2^-9 relative each; 3 * 2^-8
  // leaves a factor 2.
  EXPECT_LT(max_rel_diff(c.w.grad(), ref), 3 * std::ldexp(1.0, -8));
}

TEST(LossScaling, TinyGradientsSurviveAtScale65536) {
  TinyGrad c;
  const Tensor ref = c.reference();
  optim::SGD opt({c.w}, {.lr = 1e6});  // see the step below
  GradScaler scaler({.init_scale = 65536.0});
  {
    amp::Autocast guard({.dtype = DType::f16});
    Tensor loss = c.loss_of(linear(c.x, c.w));
    scaler.scale(loss).backward();
  }
  // Scaled gradient = 65536 * ~1e-8 ~ 6.5e-4: an f16 normal.
  const auto stats = amp::underflow_stats_of_scaled_grads({c.w}, scaler.get_scale());
  EXPECT_EQ(stats.nonzero, ref.numel());
  EXPECT_EQ(stats.underflow_unscaled, 1.0);
  EXPECT_EQ(stats.underflow_scaled, 0.0);
  scaler.unscale_(opt);
  EXPECT_LT(max_rel_diff(c.w.grad(), ref), kF16GradRelTol);
  // And the step applies it: w moves by -lr * g like the f32 reference. lr = 1e6 makes the update ~1e-2,
  // so the f32 rounding of w - lr g (|w| < 2: <= 2^-23 absolute, 1e-5 relative to the update) is negligible.
  const Tensor w0 = c.w.detach().clone();
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
  EXPECT_LT(max_rel_diff((w0 - c.w.detach()) * 1e-6, ref), kF16GradRelTol + 1e-4);
}

TEST(LossScaling, UnderflowStatsOfTheTinyGradients) {
  TinyGrad c;
  const Tensor ref = c.reference();
  const auto at1 = amp::underflow_stats({ref}, 1.0);
  EXPECT_EQ(at1.nonzero, ref.numel());
  EXPECT_EQ(at1.underflow_unscaled, 1.0);  // every value is below 2^-24 unscaled
  EXPECT_EQ(at1.underflow_scaled, 1.0);    // "scaled" at S = 1 is the same
  const auto at65536 = amp::underflow_stats({ref}, 65536.0);
  EXPECT_EQ(at65536.underflow_unscaled, 1.0);
  EXPECT_EQ(at65536.underflow_scaled, 0.0);
  EXPECT_EQ(at65536.subnormal_scaled, 0.0);  // 65536 * 5e-9 = 3.3e-4 > 2^-14: an f16 normal
  EXPECT_EQ(at65536.scale, 65536.0);
}

TEST(LossScaling, F16ModelGradientsSurviveAtScale65536) {
  // The same with an f16 layer (O2/O3 style): the f16 parameter's gradient itself is f16.
  TinyGrad c;
  const Tensor ref = c.reference();
  Tensor w16 = mp::test::requires_grad(c.w.detach().to(DType::f16));
  Tensor x16 = c.x.to(DType::f16);
  c.loss_of(linear(x16, w16).to(DType::f32)).backward();
  ASSERT_EQ(w16.grad().dtype(), DType::f16);
  for (double v : w16.grad().to_vector<double>()) EXPECT_EQ(v, 0.0);
  w16.set_grad(Tensor());
  GradScaler scaler({.init_scale = 65536.0});
  scaler.scale(c.loss_of(linear(x16, w16).to(DType::f32))).backward();
  // Scaled, the f16 gradient holds ~6.5e-4 * (rounding); divide in f32 to read the true value.
  EXPECT_LT(max_rel_diff(w16.grad().to(DType::f32) * (1.0 / 65536.0), ref), kF16GradRelTol);
  // The fused step unscales in f32 inside the optimizer: the f32 master moves by exactly -lr * g16 / S.
  optim::SGD opt({w16}, {.lr = 1e6});
  opt.set_master_weights(true);
  opt.set_master(w16, c.w.detach().clone());
  EXPECT_TRUE(scaler.step(opt));
  const Tensor moved = (c.w.detach() - opt.master(w16)) * 1e-6;
  // lr * g ~ 1e-2 against |w| ~ 1: the f32 subtraction keeps ~2^-24 / 1e-2 relative, far below the f16 tolerance.
  EXPECT_LT(max_rel_diff(moved, ref), kF16GradRelTol + 1e-4);
}

TEST(LossScaling, UnscaleOfF16GradientsKeepsTheirValues) {
  // Clipping with an f16 model needs unscale_ before step: the unscaled values (~1e-8) must not be
  // rounded back into f16 storage, where they would underflow again (Note [unscaling f16 gradients]).
  TinyGrad c;
  const Tensor ref = c.reference();
  Tensor x16 = c.x.to(DType::f16);
  Tensor wa = mp::test::requires_grad(c.w.detach().to(DType::f16)),
         wb = mp::test::requires_grad(c.w.detach().to(DType::f16));
  optim::SGD oa({wa}, {.lr = 1e6}), ob({wb}, {.lr = 1e6});
  for (optim::SGD* o : {&oa, &ob}) o->set_master_weights(true);
  oa.set_master(wa, c.w.detach().clone());
  ob.set_master(wb, c.w.detach().clone());
  GradScaler scaler({.init_scale = 65536.0});
  scaler.scale(c.loss_of(linear(x16, wa).to(DType::f32))).backward();
  scaler.scale(c.loss_of(linear(x16, wb).to(DType::f32))).backward();
  scaler.unscale_(oa);
  ASSERT_TRUE(wa.grad().defined());
  EXPECT_EQ(wa.grad().dtype(), DType::f32);  // widened: f16 cannot hold ~1e-8
  EXPECT_LT(max_rel_diff(wa.grad(), ref), kF16GradRelTol);
  // Stepping after unscale_ equals the fused path (which unscales in f32 inside the optimizer); the
  // scale is a power of two, so both compute the same f32 values.
  EXPECT_TRUE(scaler.step(oa));
  EXPECT_TRUE(scaler.step(ob));
  scaler.update();
  EXPECT_TRUE(bitwise_equal(oa.master(wa), ob.master(wb)));
  EXPECT_TRUE(bitwise_equal(wa.detach(), wb.detach()));
  EXPECT_FALSE(bitwise_equal(oa.master(wa), c.w.detach()));  // and the update was not lost
}

// ==================================================================== (c) skipping and the scale

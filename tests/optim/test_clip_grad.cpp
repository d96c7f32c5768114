#include <gtest/gtest.h>

#include <cmath>

#include "mp/mp.hpp"

using namespace mp;

TEST(ClipGrad, ScalesToMaxNormAndReturnsTheOldNorm) {
  Tensor a = zeros({2}).requires_grad_(), b = zeros({1}).requires_grad_();
  a.set_grad(from_vector<float>({3, 0}, {2}));
  b.set_grad(from_vector<float>({4}, {1}));
  EXPECT_NEAR(optim::clip_grad_norm_({a, b}, 10.0), 5.0, 1e-6);  // under the limit: unchanged
  EXPECT_EQ(a.grad().to_vector<float>()[0], 3.0f);
  EXPECT_NEAR(optim::clip_grad_norm_({a, b}, 1.0), 5.0, 1e-6);
  // coefficient 1 / (5 + 1e-6): the new norm is 1 within 2e-7 relative.
  EXPECT_NEAR(a.grad().to_vector<float>()[0], 0.6f, 1e-6);
  EXPECT_NEAR(b.grad().to_vector<float>()[0], 0.8f, 1e-6);
}

TEST(ClipGrad, Bf16GradientsAccumulateTheNormInF32) {
  // 4096 bf16 gradients of 1: a bf16 running sum of squares would stall at 256 (norm 16); f32 gives 64.
  Tensor p = zeros({4096}, {.dtype = DType::bf16}).requires_grad_();
  p.set_grad(ones({4096}, {.dtype = DType::bf16}));
  EXPECT_NEAR(optim::clip_grad_norm_({p}, 1000.0), 64.0, 1e-4);
}

TEST(ClipGrad, NonFiniteNormLeavesGradientsForTheScalerToSkip) {
  Tensor p = zeros({2}).requires_grad_();
  p.set_grad(from_vector<float>({INFINITY, 1}, {2}));
  EXPECT_TRUE(std::isinf(optim::clip_grad_norm_({p}, 1.0)));
  EXPECT_EQ(p.grad().to_vector<float>()[1], 1.0f);
  EXPECT_THROW(optim::clip_grad_norm_({p}, 0.0), Error);
}

TEST(ClipGrad, AfterUnscaleClipsTrueGradients) {
  // With loss scaling, unscale_ then clip: the result equals clipping the unscaled f32 gradients.
  Tensor w = full({3}, 1.0).requires_grad_();
  Tensor w_ref = full({3}, 1.0).requires_grad_();
  Tensor x = from_vector<float>({1, 2, 3}, {3});
  optim::SGD opt({w}, {.lr = 0.1});
  amp::GradScaler scaler({.init_scale = 1024.0});
  scaler.scale(sum(w * x)).backward();
  scaler.unscale_(opt);
  const double n = optim::clip_grad_norm_({w}, 1.0);
  sum(w_ref * x).backward();
  const double n_ref = optim::clip_grad_norm_({w_ref}, 1.0);
  EXPECT_DOUBLE_EQ(n, n_ref);  // powers of two scale and unscale exactly
  EXPECT_EQ(w.grad().to_vector<float>(), w_ref.grad().to_vector<float>());
  EXPECT_TRUE(scaler.step(opt));
  scaler.update();
}

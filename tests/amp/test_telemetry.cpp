// Per-layer numerics telemetry (mp/amp/telemetry.hpp) on hand-built cases: one Linear layer with weights,
// input and loss chosen so that every statistic is a power-of-two sum computable by hand (the expected values
// are derived in the comments).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "mp/mp.hpp"

using namespace mp;

namespace {

// Set a parameter's values (any dtype) from f32 values.
void set_values(const Tensor& p, const std::vector<float>& v) {
  autograd::NoGradGuard ng;
  Tensor(p).copy_(from_vector<float>(v, p.sizes()).to(p.dtype()));
}

// loss = sum(out * c) over the one row of out, in f32: dL/dout = c exactly.
Tensor loss_of(const Tensor& out, const std::vector<float>& c) {
  return sum(mul(out.to(DType::f32), from_vector<float>(c, {1, static_cast<int64_t>(c.size())})));
}

}  // namespace

TEST(Telemetry, HalfUlpOf16BitValues) {
  EXPECT_EQ(amp::half_ulp(1.0, DType::f16), std::ldexp(1.0, -11));  // ulp(1) = 2^-10
  EXPECT_EQ(amp::half_ulp(-1.5, DType::f16), std::ldexp(1.0, -11));
  EXPECT_EQ(amp::half_ulp(2.0, DType::f16), std::ldexp(1.0, -10));
  EXPECT_EQ(amp::half_ulp(65504.0, DType::f16), 16.0);               // ulp 32 at 2^15
  EXPECT_EQ(amp::half_ulp(0.0, DType::f16), std::ldexp(1.0, -25));   // the subnormal spacing 2^-24
  EXPECT_EQ(amp::half_ulp(3e-5, DType::f16), std::ldexp(1.0, -25));  // below 2^-14: subnormal
  EXPECT_EQ(amp::half_ulp(std::ldexp(1.0, -14), DType::f16), std::ldexp(1.0, -25));
  EXPECT_EQ(amp::half_ulp(1.0, DType::bf16), std::ldexp(1.0, -8));    // ulp(1) = 2^-7
  EXPECT_EQ(amp::half_ulp(0.0, DType::bf16), std::ldexp(1.0, -134));  // 2^-133 / 2
  EXPECT_THROW((void)amp::half_ulp(1.0, DType::f32), Error);
}

// f32 weights, scale 32: Linear(3 -> 2) with W = [[1, 0, 0], [0, 2, 0]], b = [0.5, -3], x = [1, 2^-28, 0],
// c = dL/dout = [1, 2^-2].
//   out = W x + b = [1.5, 2^-27 - 3], which f32 rounds to -3 (its ulp at 3 is 2^-22): act_amax = 3.
//   grad at out (true) = c: grad_amax = 1.
//   dW = c x^T = [[1, 2^-28, 0], [2^-2, 2^-30, 0]], db = c = [1, 2^-2]: 8 values, 2 zeros -> grad_zero 2/8;
//   6 nonzero; at scale 1 below 2^-24: 2^-28, 2^-30 -> 2/6; at scale 32 (x 2^5): 2^-23 is not, 2^-25 is -> 1/6.
//   f32 weights: no update_lost.
TEST(Telemetry, HandBuiltF32Layer) {
  auto model = std::make_shared<nn::Linear>(3, 2);
  set_values(model->weight(), {1, 0, 0, 0, 2, 0});
  set_values(model->named_parameters().at(1).second, {0.5f, -3});
  auto opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 1});
  amp::GradScaler scaler({.init_scale = 32, .dynamic = false});
  amp::NumericsRecorder rec(*model);
  EXPECT_FALSE(rec.armed());
  rec.arm();
  ASSERT_TRUE(rec.armed());
  const Tensor x = from_vector<float>({1, std::ldexp(1.0f, -28), 0}, {1, 3});
  scaler.scale(loss_of((*model)(x), {1, 0.25f})).backward();
  rec.gradients(scaler.get_scale());
  rec.before_update(*opt);
  rec.after_update(*opt, scaler.step(*opt));
  const std::vector<amp::LayerNumerics> r = rec.take();
  EXPECT_FALSE(rec.armed());
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].module, "");
  EXPECT_EQ(r[0].type, "Linear");
  EXPECT_EQ(r[0].dtype, "f32");
  EXPECT_EQ(r[0].act_amax, 3.0);
  EXPECT_EQ(r[0].grad_amax, 1.0);
  EXPECT_EQ(r[0].grad_values, 8);
  EXPECT_DOUBLE_EQ(r[0].grad_zero, 2.0 / 8);
  EXPECT_DOUBLE_EQ(r[0].grad_underflow_unscaled, 2.0 / 6);
  EXPECT_DOUBLE_EQ(r[0].grad_underflow, 1.0 / 6);
  EXPECT_FALSE(r[0].has_update);
}

// f16 weights with f32 masters, static scale 4, SGD lr 1 (update = -true gradient): Linear(4 -> 2) with
// W = [[2, 0, 0, 0], [0.5, 0, 0, 0]], b = [0, 0], x = [1, 2^-11, 0, 2^-10], c = [1, 2^-16].
//   out = [2, 0.5]: act_amax = 2. The gradient reaching out (f16) is c * 4 = [4, 2^-14]: grad_amax = 1.
//   dW stored (x 4) = [[4, 2^-9, 0, 2^-8], [2^-14, 2^-25 -> 0 in f16 (a tie, to even), 0, 2^-24]], db = [4, 2^-14]:
//   10 values, 3 zeros (one flushed by f16) -> grad_zero 3/10; 7 nonzero; at scale 4 none below 2^-24 -> 0;
//   at scale 1 (/4) 2^-24 -> 2^-26 is -> 1/7.
//   Updates (the masters' change) = dW/4 and db/4: [[1, 2^-11, -, 2^-10], [2^-16, -, -, 2^-26]], [1, 2^-16]:
//   7 moved; half an ulp of W is 2^-10 at 2, 2^-12 at 0.5, 2^-25 at 0: lost where 2^-16 < 2^-12 (at 0.5) and
//   2^-26 < 2^-25 (at 0) -> 2/7.
TEST(Telemetry, HandBuiltF16LayerWithMasters) {
  auto model = std::make_shared<nn::Linear>(4, 2);
  model->to(DType::f16);
  set_values(model->weight(), {2, 0, 0, 0, 0.5f, 0, 0, 0});
  set_values(model->named_parameters().at(1).second, {0, 0});
  auto opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 1});
  opt->set_master_weights(true);
  amp::GradScaler scaler({.init_scale = 4, .dynamic = false});
  amp::NumericsRecorder rec(*model);
  rec.arm();
  const Tensor x = from_vector<float>({1, std::ldexp(1.0f, -11), 0, std::ldexp(1.0f, -10)}, {1, 4}).to(DType::f16);
  scaler.scale(loss_of((*model)(x), {1, std::ldexp(1.0f, -16)})).backward();
  rec.gradients(scaler.get_scale());
  rec.before_update(*opt);
  const bool stepped = scaler.step(*opt);
  ASSERT_TRUE(stepped);
  rec.after_update(*opt, stepped);
  const amp::LayerNumerics r = rec.take().at(0);
  EXPECT_EQ(r.dtype, "f16");
  EXPECT_EQ(r.act_amax, 2.0);
  EXPECT_EQ(r.grad_amax, 1.0);
  EXPECT_EQ(r.grad_values, 10);
  EXPECT_DOUBLE_EQ(r.grad_zero, 3.0 / 10);
  EXPECT_DOUBLE_EQ(r.grad_underflow, 0.0);
  EXPECT_DOUBLE_EQ(r.grad_underflow_unscaled, 1.0 / 7);
  ASSERT_TRUE(r.has_update);
  EXPECT_DOUBLE_EQ(r.update_lost, 2.0 / 7);
  // The lost updates live on in the masters: 0.5 - 2^-16 there, 0.5 in the f16 weight.
  EXPECT_EQ(opt->master(model->weight()).to(DType::f64).data_ptr<double>()[4], 0.5 - std::ldexp(1.0, -16));
  EXPECT_EQ(model->weight().to(DType::f64).data_ptr<double>()[4], 0.5);
}

// Without masters (O3) the update is read off the result: of the weights whose gradient was nonzero, the share
// whose f16 value did not change. The same layer as above: nonzero gradients at W[0][0,1,3], W[1][0,3], b[0,1];
// W[1][0] = 0.5 - 2^-16 rounds back to 0.5 and W[1][3] = -2^-26 rounds to -0 (== 0: unchanged); b[1] = -2^-16 is
// representable (a subnormal) -> 2 of 7 unchanged.
TEST(Telemetry, HandBuiltF16LayerWithoutMasters) {
  auto model = std::make_shared<nn::Linear>(4, 2);
  model->to(DType::f16);
  set_values(model->weight(), {2, 0, 0, 0, 0.5f, 0, 0, 0});
  set_values(model->named_parameters().at(1).second, {0, 0});
  auto opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 1});
  amp::GradScaler scaler({.init_scale = 4, .dynamic = false});
  amp::NumericsRecorder rec(*model);
  rec.arm();
  const Tensor x = from_vector<float>({1, std::ldexp(1.0f, -11), 0, std::ldexp(1.0f, -10)}, {1, 4}).to(DType::f16);
  scaler.scale(loss_of((*model)(x), {1, std::ldexp(1.0f, -16)})).backward();
  rec.gradients(scaler.get_scale());
  rec.before_update(*opt);
  rec.after_update(*opt, scaler.step(*opt));
  const amp::LayerNumerics r = rec.take().at(0);
  ASSERT_TRUE(r.has_update);
  EXPECT_DOUBLE_EQ(r.update_lost, 2.0 / 7);
}

// A skipped step has no update (NaN); an evaluation forward without grad mode is not recorded; unarmed, the
// recorder leaves no hook on the model.
TEST(Telemetry, SkippedStepsEvaluationAndDisarm) {
  auto model = std::make_shared<nn::Linear>(2, 1);
  model->to(DType::f16);
  set_values(model->weight(), {1, 1});
  set_values(model->named_parameters().at(1).second, {0});
  auto opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 1});
  amp::GradScaler scaler({.init_scale = 1e30, .dynamic = false});  // overflows f16: the step is skipped
  amp::NumericsRecorder rec(*model);
  EXPECT_FALSE(model->has_forward_hooks());
  rec.arm();
  EXPECT_TRUE(model->has_forward_hooks());
  {
    autograd::NoGradGuard ng;  // an evaluation pass: large output, not recorded
    (void)(*model)(from_vector<float>({100, 100}, {1, 2}).to(DType::f16));
  }
  const Tensor x = from_vector<float>({1, 2}, {1, 2}).to(DType::f16);
  scaler.scale(loss_of((*model)(x), {1})).backward();
  rec.gradients(scaler.get_scale());
  rec.before_update(*opt);
  const bool stepped = scaler.step(*opt);
  EXPECT_FALSE(stepped);
  rec.after_update(*opt, stepped);
  const amp::LayerNumerics r = rec.take().at(0);
  EXPECT_FALSE(model->has_forward_hooks());
  EXPECT_EQ(r.act_amax, 3.0);            // 1 + 2: the training pass only, not the evaluation's 400
  EXPECT_TRUE(std::isinf(r.grad_amax));  // the gradient reaching the f16 output is 1e30: inf in f16
  ASSERT_TRUE(r.has_update);
  EXPECT_TRUE(std::isnan(r.update_lost));
}

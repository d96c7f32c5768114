#include <gtest/gtest.h>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using autograd::gradcheck;

namespace {
using mp::test::expect_ok;
using mp::test::leaf;
using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
}  // namespace

TEST(Autograd, SimpleChainAndAccumulation) {
  Tensor x = full({3}, 2.0, {.dtype = DType::f64}).requires_grad_();
  Tensor y = sum(x * x * 3.0);
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{12, 12, 12}));
  sum(x).backward();  // accumulates
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{13, 13, 13}));
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_EQ(y.grad_fn()->name(), "SumBackward");
}

TEST(Autograd, NoGradAndDetach) {
  Tensor x = ones({2}).requires_grad_();
  {
    autograd::NoGradGuard ng;
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_FALSE(x.detach().requires_grad());
  EXPECT_TRUE((x * 2.0).requires_grad());
  EXPECT_THROW(sum(x.detach()).backward(), Error);
}

TEST(Autograd, SavedTensorsFreedAfterBackward) {
  Tensor x = ones({4}, {.dtype = DType::f64}).requires_grad_();
  Tensor y = sum(exp(x));
  y.backward();
  EXPECT_THROW(y.backward(), Error);  // saved output of exp was released
  Tensor z = sum(exp(x));
  z.backward(Tensor(), /*retain_graph=*/true);
  z.backward();
  EXPECT_NEAR(x.grad().to_vector<double>()[0], 3 * std::exp(1.0), 1e-12);
}

TEST(Autograd, DiamondGraph) {
  Tensor x = full({1}, 3.0, {.dtype = DType::f64}).requires_grad_();
  Tensor a = x * 2.0, b = x * x;
  Tensor y = sum(a * b);  // 2x^3 -> 6x^2 = 54
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 54.0);
}

TEST(Autograd, GradFunctionDoesNotTouchDotGrad) {
  Tensor x = full({2}, 3.0, {.dtype = DType::f64}).requires_grad_();
  auto g = autograd::grad({sum(x * x)}, {x});
  EXPECT_EQ(g[0].to_vector<double>(), (std::vector<double>{6, 6}));
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, HooksSeeGradients) {
  Tensor x = ones({2}, {.dtype = DType::f64}).requires_grad_();
  Tensor h = x * 3.0;
  double seen = 0;
  autograd::register_hook(h, [&](const Tensor& g) {
    seen = sum(g).item<double>();
    return mul(g, 2.0);
  });
  sum(h).backward();
  EXPECT_EQ(seen, 2.0);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{6, 6}));
}

TEST(Autograd, PostAccumulateHooksSeeTheAccumulatedGradientOncePerPass) {
  Tensor x = ones({2}, {.dtype = DType::f64}).requires_grad_();
  Tensor unused = ones({2}, {.dtype = DType::f64}).requires_grad_();
  std::vector<double> seen;
  int unused_calls = 0;
  autograd::register_post_accumulate_grad_hook(
      x, [&](const Tensor& leaf) { seen.push_back(sum(leaf.grad()).item<double>()); });
  autograd::register_post_accumulate_grad_hook(unused, [&](const Tensor&) { ++unused_calls; });
  sum(x * 3.0 + x * 2.0).backward();  // two paths into x: one AccumulateGrad call, one hook call
  sum(x * 1.0).backward();            // a second pass adds into x.grad
  EXPECT_EQ(seen, (std::vector<double>{10.0, 12.0}));
  EXPECT_EQ(unused_calls, 0);
  autograd::grad({sum(x * x)}, {x});  // autograd::grad leaves .grad alone, so no hook runs
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_THROW(autograd::register_post_accumulate_grad_hook(x * 2.0, [](const Tensor&) {}), Error);
}

TEST(Autograd, LowPrecisionCastGradFlowsBackInInputDtype) {
  Tensor w = ones({4}, {.dtype = DType::f32}).requires_grad_();
  Tensor y = sum(w.to(DType::bf16) * 2.0);
  y.backward();
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(w.grad().to_vector<float>()[0], 2.0f);
}

TEST(Gradcheck, DetectsAWrongGradient) {
  Tensor x = leaf({3});
  // A deliberately wrong backward: say d/dx x^2 = x.
  Fn wrong = [](const std::vector<Tensor>& in) {
    Tensor out = empty_like(in[0]);
    {
      autograd::NoGradGuard ng;
      out.copy_(in[0] * in[0]);
    }
    Tensor xd = in[0].detach();
    autograd::record("WrongBackward", {in[0]}, {out},
                     [xd](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0] * xd}; });
    return std::vector<Tensor>{out};
  };
  EXPECT_FALSE(gradcheck(wrong, {x}).ok);
}

TEST(Gradcheck, Pointwise) {
  manual_seed(7);
  Tensor a = leaf({3, 4}), b = leaf({4}), c = leaf({3, 1}, 0.5, 2.0);
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0] + in[1]}; }, {a, b}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{add(in[0], in[1], -0.7)}; }, {a, b}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0] - in[1]}; }, {a, b}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0] * in[1]}; }, {a, b}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0] / in[1]}; }, {a, c}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{pow(in[1], in[0])}; }, {a, c}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{pow(in[0], 3.0)}; }, {c}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{neg(in[0])}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{exp(in[0])}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{log(in[0])}; }, {c}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{sqrt(in[0])}; }, {c}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{rsqrt(in[0])}; }, {c}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{relu(in[0])}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{gelu(in[0])}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{gelu(in[0], GeluApproximate::tanh)}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{tanh(in[0])}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{sigmoid(in[0])}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{abs(in[0])}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{square(in[0])}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{clamp(in[0], -0.3, 0.4)}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{maximum(in[0], in[1])}; }, {a, b}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{minimum(in[0], in[1])}; }, {a, b}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{where(gt(in[0], in[1]), in[0], in[1])}; }, {a, b}));
}

TEST(Gradcheck, ReductionsAndViews) {
  manual_seed(8);
  Tensor a = leaf({2, 3, 4});
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{sum(in[0], {1})}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{sum(in[0], {0, 2}, true)}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{mean(in[0], {-1})}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{var(in[0], {0, 2})}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{amax(in[0], {1})}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{max(in[0], 2).first}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0].transpose(0, 2).reshape({4, 6})}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0].narrow(1, 1, 2) * 2.0}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0].slice(2, 0, 4, 2)}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0].select(0, 1)}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0].unsqueeze(0).expand({3, 2, 3, 4})}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0].permute({1, 2, 0}).contiguous()}; }, {a}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{in[0].to(DType::f32).to(DType::f64)}; }, {a},
                      {.eps = 1e-3, .atol = 1e-4, .rtol = 1e-3}));
}

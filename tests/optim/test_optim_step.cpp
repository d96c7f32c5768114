// SGD, Adam and AdamW updates against hand-computed values, parameter groups, state dicts.
//
// Reference values: w0 = [1, -0.5, 2] and gradients g1 = [1, -2, 0.5], g2 = [2, 0, -0.25],
// g3 = [-1, 1, 0.75], computed in double by following PyTorch's documented single-tensor
// algorithms step by step (e.g. SGD momentum 0.9, lr 0.1, element 0: buf = 1, w = 0.9; buf = 2.9,
// w = 0.61; buf = 1.61, w = 0.449). The library computes in f32: each step does about ten f32
// roundings of values of magnitude <= 2 (relative error 2^-24 each), so after 3 steps the
// results agree to well within kTol = 2e-6.
#include <gtest/gtest.h>

#include <cmath>

#include "mp/autograd/node.hpp"
#include "mp/nn/state_dict.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/optim.hpp"

using namespace mp;
using namespace mp::optim;

namespace {

constexpr double kTol = 2e-6;
using Rows = std::vector<std::vector<double>>;

const Rows kGrads = {{1.0, -2.0, 0.5}, {2.0, 0.0, -0.25}, {-1.0, 1.0, 0.75}};

Tensor param(DType dt = DType::f32) {
  return from_vector<double>({1.0, -0.5, 2.0}, {3}, {.dtype = dt}).requires_grad_();
}

void set_grad(const Tensor& p, const std::vector<double>& g) {
  p.set_grad(from_vector<double>(g, {3}, {.dtype = p.dtype()}));
}

// Run three steps with kGrads and compare w after each with the expected rows.
void expect_trajectory(Optimizer& opt, const Tensor& p, const Rows& expected, double tol = kTol) {
  for (size_t k = 0; k < 3; ++k) {
    set_grad(p, kGrads[k]);
    opt.step();
    const std::vector<double> w = p.to_vector<double>();
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(w[i], expected[k][i], tol) << "step " << k + 1 << " element " << i;
  }
}

}  // namespace

TEST(OptimSGD, PlainWithWeightDecay) {
  Tensor p = param();
  SGD opt({p}, {.lr = 0.1, .weight_decay = 0.01});
  expect_trajectory(
      opt, p, {{0.899, -0.2995, 1.948}, {0.698101, -0.2992005, 1.971052}, {0.797402899, -0.3989012995, 1.894080948}});
  EXPECT_TRUE(opt.state(p)->buffers.empty());  // no momentum buffer without momentum
}

TEST(OptimSGD, Momentum) {
  Tensor p = param();
  SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  expect_trajectory(opt, p, {{0.9, -0.3, 1.95}, {0.61, -0.12, 1.93}, {0.449, -0.058, 1.837}});
  const Tensor buf = opt.state(p)->buffers.at("momentum_buffer");
  EXPECT_EQ(buf.dtype(), DType::f32);
  EXPECT_NEAR(buf.to_vector<double>()[0], 1.61, kTol);
}

TEST(OptimSGD, Nesterov) {
  Tensor p = param();
  SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  expect_trajectory(opt, p, {{0.81, -0.12, 1.905}, {0.349, 0.042, 1.912}, {0.3041, -0.0022, 1.7533}});
}

TEST(OptimSGD, DampeningAndWeightDecay) {
  Tensor p = param();
  SGD opt({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5, .weight_decay = 0.1});
  // The first step stores the gradient undamped (PyTorch clones it into the buffer).
  expect_trajectory(opt, p,
                    {{0.89, -0.295, 1.93}, {0.68655, -0.109025, 1.86985}, {0.55001225, 0.008897625, 1.76886575}});
}

TEST(OptimAdam, Default) {
  Tensor p = param();
  Adam opt({p}, {.lr = 0.1});
  expect_trajectory(opt, p,
                    {{0.900000001, -0.4000000005, 1.900000002},
                     {0.803481799, -0.3329941756, 1.873366299},
                     {0.761472869, -0.3152674559, 1.809834282}});
  const ParamState* st = opt.state(p);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->step, 3);
  EXPECT_EQ(st->buffers.count("exp_avg"), 1u);
  EXPECT_EQ(st->buffers.count("exp_avg_sq"), 1u);
  EXPECT_EQ(st->buffers.count("max_exp_avg_sq"), 0u);
}

TEST(OptimAdam, L2WeightDecayAndAmsgrad) {
  Tensor p = param();
  Adam opt({p}, {.lr = 0.01, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 0.1, .amsgrad = true});
  expect_trajectory(opt, p,
                    {{0.9900000091, -0.4900000049, 1.990000014},
                     {0.980137514, -0.4835430237, 1.984301352},
                     {0.9759894815, -0.4822843241, 1.97615753}});
  EXPECT_EQ(opt.state(p)->buffers.count("max_exp_avg_sq"), 1u);
}

TEST(OptimAdamW, DecoupledWeightDecay) {
  Tensor p = param();
  AdamW opt({p}, {.lr = 0.1, .weight_decay = 0.1});
  expect_trajectory(opt, p,
                    {{0.890000001, -0.3950000005, 1.880000002},
                     {0.784581799, -0.3240441756, 1.834566299},
                     {0.734727051, -0.3030770141, 1.752688619}});
  EXPECT_DOUBLE_EQ(AdamWOptions{}.weight_decay, 1e-2);  // PyTorch's default
}

TEST(OptimAdam, Bf16ParameterComputesInF32AndRounds) {
  Tensor pf = param(), pb = param(DType::bf16);
  Adam of({pf}, {.lr = 0.1}), ob({pb}, {.lr = 0.1});
  for (size_t k = 0; k < 3; ++k) {
    set_grad(pf, kGrads[k]);
    set_grad(pb, kGrads[k]);
    of.step();
    ob.step();
    EXPECT_EQ(pb.dtype(), DType::bf16);
    if (k == 0) {
      // Same inputs (all exact in bf16), same f32 arithmetic: the bf16 result is the f32 one rounded.
      EXPECT_EQ(pb.to_vector<float>(), pf.detach().to(DType::bf16).to_vector<float>());
    }
  }
  // Moments depend only on the gradients, so the runs differ only by one rounding per step:
  // at most 3 half-ulps of bf16 (2^-8 relative each) apart.
  const auto wf = pf.to_vector<double>(), wb = pb.to_vector<double>();
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(wb[i], wf[i], 3 * std::abs(wf[i]) * std::ldexp(1.0, -8)) << i;
  EXPECT_EQ(ob.state(pb)->buffers.at("exp_avg").dtype(), DType::f32);
  EXPECT_EQ(ob.state(pb)->buffers.at("exp_avg").to_vector<float>(),
            of.state(pf)->buffers.at("exp_avg").to_vector<float>());
}

TEST(OptimAdam, F64ParameterKeepsF64State) {
  Tensor p = param(DType::f64);
  Adam opt({p}, {.lr = 0.1});
  // f64 computes in double: matches the double reference far more tightly.
  expect_trajectory(opt, p,
                    {{0.900000001, -0.4000000005, 1.900000002},
                     {0.803481799, -0.3329941756, 1.873366299},
                     {0.761472869, -0.3152674559, 1.809834282}},
                    1e-9);
  EXPECT_EQ(opt.state(p)->buffers.at("exp_avg_sq").dtype(), DType::f64);
}

TEST(Optim, SkipsParametersWithoutGradient) {
  Tensor a = param(), b = param();
  SGD opt({a, b}, {.lr = 0.1, .momentum = 0.9});
  set_grad(a, kGrads[0]);
  opt.step();
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{1.0, -0.5, 2.0}));
  EXPECT_EQ(opt.state(b), nullptr);
  EXPECT_NE(a.to_vector<double>(), b.to_vector<double>());
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
}

TEST(Optim, ParamGroupsHaveTheirOwnOptions) {
  Tensor a = param(), b = param(), c = param();
  SGD opt({{{a}, SGDOptions{.lr = 0.1}}, {{b}, SGDOptions{.lr = 0.01}}}, SGDOptions{.lr = 1.0});
  opt.add_param_group({c});  // gets the defaults
  ASSERT_EQ(opt.num_param_groups(), 3u);
  EXPECT_DOUBLE_EQ(opt.lr(2), 1.0);
  for (const Tensor& p : {a, b, c}) set_grad(p, {1.0, 1.0, 1.0});
  opt.step();
  EXPECT_NEAR(a.to_vector<double>()[0], 0.9, kTol);
  EXPECT_NEAR(b.to_vector<double>()[0], 0.99, kTol);
  EXPECT_NEAR(c.to_vector<double>()[0], 0.0, kTol);
  opt.param_groups()[1].options.lr = 0.5;
  EXPECT_DOUBLE_EQ(opt.group_options(1).at("lr"), 0.5);
  EXPECT_EQ(opt.parameters().size(), 3u);
}

TEST(Optim, RejectsBadParametersAndOptions) {
  Tensor a = param();
  EXPECT_THROW(SGD({a, a}, {.lr = 0.1}), Error);                 // twice in a group
  EXPECT_THROW(SGD({a * 2.0}, {.lr = 0.1}), Error);              // not a leaf
  EXPECT_THROW(SGD({a}, {.lr = 0.1, .nesterov = true}), Error);  // nesterov without momentum
  EXPECT_THROW(SGD({a}, {.lr = -1.0}), Error);
  EXPECT_THROW(Adam({a}, {.betas = {0.9, 1.0}}), Error);
  SGD opt({a}, {.lr = 0.1});
  EXPECT_THROW(opt.add_param_group({a}), Error);                    // already in group 0
  EXPECT_THROW(opt.set_group_options(0, {{"betas", 0.5}}), Error);  // unknown hyper-parameter
}

TEST(Optim, NonContiguousParameterIsUpdatedInPlace) {
  Tensor base = zeros({3, 2});
  Tensor p = base.t();  // [2, 3] view with strides (1, 2), a leaf
  p.requires_grad_();
  ASSERT_FALSE(p.is_contiguous());
  SGD opt({p}, {.lr = 0.5});
  p.set_grad(ones({2, 3}));
  opt.step();
  EXPECT_EQ(base.to_vector<float>(), std::vector<float>(6, -0.5f));
}

namespace {

// Three steps, save (flattened and deep-copied, as a checkpoint would), then two more steps; a
// second optimizer on a copy of the parameters restored from the save must follow identically.
template <class Opt, class Options>
void expect_resume_identical(const Options& options) {
  Tensor p1 = param(), q1 = from_vector<float>({0.5f, 0.25f}, {2}).requires_grad_();
  Opt a({p1, q1}, options);
  for (size_t k = 0; k < 3; ++k) {
    set_grad(p1, kGrads[k]);
    q1.set_grad(from_vector<float>({0.1f * static_cast<float>(k), -1.0f}, {2}));
    a.step();
  }
  const nn::StateDict saved = a.state_dict().flatten().clone();
  Tensor p2 = p1.detach().clone().requires_grad_(), q2 = q1.detach().clone().requires_grad_();
  Opt b({p2, q2}, Options{});  // different hyper-parameters until loaded
  b.load_state_dict(OptimizerStateDict::unflatten(saved));
  EXPECT_EQ(b.group_options(0), a.group_options(0));
  for (size_t k = 0; k < 2; ++k) {
    for (const Tensor& p : {p1, p2}) set_grad(p, kGrads[2 - k]);
    for (const Tensor& q : {q1, q2}) q.set_grad(from_vector<float>({0.3f, 0.7f}, {2}));
    a.step();
    b.step();
  }
  EXPECT_EQ(p1.to_vector<float>(), p2.to_vector<float>());
  EXPECT_EQ(q1.to_vector<float>(), q2.to_vector<float>());
  EXPECT_EQ(b.state(p2)->step, a.state(p1)->step);
}

}  // namespace

TEST(OptimStateDict, SgdResumesIdentically) {
  expect_resume_identical<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
}

TEST(OptimStateDict, AdamResumesIdentically) {
  expect_resume_identical<Adam>(AdamOptions{.lr = 0.05, .weight_decay = 0.01, .amsgrad = true});
}

TEST(OptimStateDict, AdamWResumesIdentically) { expect_resume_identical<AdamW>(AdamWOptions{.lr = 0.05}); }

TEST(OptimStateDict, ContentsAndErrors) {
  Tensor a = param(), b = param();
  Adam opt({a, b}, {.lr = 0.1});
  set_grad(b, kGrads[0]);
  opt.step();
  const OptimizerStateDict sd = opt.state_dict();
  ASSERT_EQ(sd.state.size(), 1u);  // only b has been updated
  EXPECT_EQ(sd.state.begin()->first, 1);
  EXPECT_EQ(sd.state.at(1).step, 1);
  ASSERT_EQ(sd.param_groups.size(), 1u);
  EXPECT_EQ(sd.param_groups[0].params, (std::vector<int64_t>{0, 1}));
  EXPECT_DOUBLE_EQ(sd.param_groups[0].options.at("beta2"), 0.999);
  const nn::StateDict flat = sd.flatten();
  EXPECT_TRUE(flat.contains("state.1.exp_avg"));
  EXPECT_TRUE(flat.contains("state.1.step"));
  EXPECT_TRUE(flat.contains("param_groups.0.lr"));
  // Mismatches throw and change nothing.
  Tensor c = param();
  Adam one({c}, {.lr = 0.2});
  EXPECT_THROW(one.load_state_dict(sd), Error);  // 2 parameters saved, 1 here
  Tensor d = zeros({4}).requires_grad_(), e = param();
  Adam shaped({d, e}, {.lr = 0.2});
  OptimizerStateDict wrong = sd;
  wrong.state.emplace(0, ParamState{1, {{"exp_avg", zeros({3})}, {"exp_avg_sq", zeros({3})}}});
  EXPECT_THROW(shaped.load_state_dict(wrong), Error);  // exp_avg [3] for a [4] parameter
  EXPECT_DOUBLE_EQ(shaped.lr(0), 0.2);
  EXPECT_EQ(shaped.state(d), nullptr);
}

TEST(Optim, LargeTensorsMatchSmallOnes) {
  // 100005 elements (over the parallel grain, a ragged last block) holding w0 tiled: every element
  // must follow exactly the trajectory of its 3-element twin, for f32 and bf16 parameters.
  constexpr int64_t kReps = 33335;
  auto tile = [&](const std::vector<double>& v) {
    std::vector<double> out;
    for (int64_t r = 0; r < kReps; ++r) out.insert(out.end(), v.begin(), v.end());
    return out;
  };
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor small = param(dt);
    Tensor big = from_vector<double>(tile({1.0, -0.5, 2.0}), {3 * kReps}, {.dtype = dt}).requires_grad_();
    AdamW os({small}, {.lr = 0.1}), ob({big}, {.lr = 0.1});
    for (size_t k = 0; k < 3; ++k) {
      set_grad(small, kGrads[k]);
      big.set_grad(from_vector<double>(tile(kGrads[k]), {3 * kReps}, {.dtype = dt}));
      os.step();
      ob.step();
    }
    const std::vector<float> s = small.to_vector<float>(), b = big.to_vector<float>();
    for (int64_t i = 0; i < 3 * kReps; ++i) ASSERT_EQ(b[i], s[i % 3]) << "element " << i << " " << dtype_name(dt);
  }
}

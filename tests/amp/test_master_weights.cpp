// f32 master weights (docs/DESIGN.md 1.2; Optimizer::set_master_weights, Note [master weights in the fused
// step] in src/backend/cpu/optim.cpp): an update smaller than half an ulp of a 16-bit weight is lost
// when the optimizer writes the 16-bit weight directly, and kept when it accumulates in an f32 master.
// Also the optimizer plumbing amp::initialize relies on (set_master, replace_parameter) and state
// dicts carrying the masters.
//
// Arithmetic used below (exact, not approximate): at w = 1.0 the next f16 value up is 1 + 2^-10 and the
// next bf16 value up is 1 + 2^-7, so w + d rounds back to 1.0 for every d < 2^-11 (f16) or d < 2^-8
// (bf16) and at d equal to those half-ulps (ties go to the even mantissa, which is 1.0's).
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;

namespace {

using mp::test::bitwise_equal;

// A 16-bit parameter of n elements, all 1.0.
Tensor ones_param(int64_t n, DType dt) {
  Tensor p = ones({n}, {.dtype = dt});
  p.requires_grad_(true);
  return p;
}

// Every element of t as double.
std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

struct SmallCase {
  DType dtype;
  int log2_update;   // the update is 2^log2_update, below half an ulp of 1.0
  int first_change;  // the step at which the master has moved past half an ulp (ties round to 1.0)
};

// f16: 2^-12 < 2^-11 (half an ulp above 1.0); after k steps the master is 1 + k 2^-12, which rounds
// away from 1.0 first at k = 3 (k = 2 is the tie 1 + 2^-11). bf16 likewise with 2^-9 < 2^-8.
const SmallCase kF16{DType::f16, -12, 3};
const SmallCase kBf16{DType::bf16, -9, 3};

// Run `steps` SGD steps of lr * grad = 2^log2_update (upwards) on a 16-bit parameter of ones.
// Checks the parameter (and, with masters, the master) after every step.
void run_small_updates(const SmallCase& c, bool masters, int steps) {
  const double d = std::ldexp(1.0, c.log2_update);
  Tensor p = ones_param(16, c.dtype);
  optim::SGD opt({p}, {.lr = d});  // gradient -1: w += lr = d
  opt.set_master_weights(masters);
  for (int k = 1; k <= steps; ++k) {
    p.set_grad(full({16}, -1.0, {.dtype = c.dtype}));
    opt.step();
    const Tensor m = opt.master(p);
    if (!masters) {
      EXPECT_FALSE(m.defined());
      for (double v : values(p)) ASSERT_EQ(v, 1.0) << dtype_name(c.dtype) << " step " << k << ": the update was lost";
      continue;
    }
    ASSERT_TRUE(m.defined());
    ASSERT_EQ(m.dtype(), DType::f32);
    // 1 + k d has at most 13 significant bits for k <= 64, so the f32 master holds it exactly.
    for (double v : values(m)) ASSERT_EQ(v, 1.0 + k * d) << "step " << k;
    // The parameter is the master rounded to nearest even.
    ASSERT_TRUE(bitwise_equal(p.detach(), m.to(c.dtype))) << "step " << k;
    if (k < c.first_change) {
      for (double v : values(p)) ASSERT_EQ(v, 1.0) << "step " << k;
    } else {
      for (double v : values(p)) ASSERT_GT(v, 1.0) << "step " << k;
    }
  }
}

}  // namespace

// ------------------------------------------------------------------------ the technique's claim

TEST(MasterWeights, F16UpdateBelowHalfUlpIsLostInPureF16) { run_small_updates(kF16, false, 64); }

TEST(MasterWeights, F16UpdateBelowHalfUlpAccumulatesInTheMaster) {
  run_small_updates(kF16, true, 64);
  // After 64 steps of 2^-12 the master is 1 + 2^-6, which f16 holds exactly: the f16 weight carries
  // the whole accumulated update.
  Tensor p = ones_param(4, DType::f16);
  optim::SGD opt({p}, {.lr = std::ldexp(1.0, -12)});
  opt.set_master_weights(true);
  for (int k = 0; k < 64; ++k) {
    p.set_grad(full({4}, -1.0, {.dtype = DType::f16}));
    opt.step();
  }
  for (double v : values(p)) EXPECT_EQ(v, 1.0 + std::ldexp(1.0, -6));
}

TEST(MasterWeights, Bf16UpdateBelowHalfUlpIsLostInPureBf16) { run_small_updates(kBf16, false, 64); }

TEST(MasterWeights, Bf16UpdateBelowHalfUlpAccumulatesInTheMaster) { run_small_updates(kBf16, true, 64); }

TEST(MasterWeights, UpdateAtExactlyHalfAnUlpIsAlsoLost) {
  // The boundary of the claim: 2^-11 (f16) and 2^-8 (bf16) are ties at 1.0 and round to the even 1.0.
  for (auto [dt, log2] : {std::pair{DType::f16, -11}, std::pair{DType::bf16, -8}}) {
    Tensor p = ones_param(4, dt);
    optim::SGD opt({p}, {.lr = std::ldexp(1.0, log2)});
    for (int k = 0; k < 10; ++k) {
      p.set_grad(full({4}, -1.0, {.dtype = dt}));
      opt.step();
    }
    for (double v : values(p)) EXPECT_EQ(v, 1.0) << dtype_name(dt);
  }
}

TEST(MasterWeights, AdamSmallStepsAccumulateOnlyWithMasters) {
  // Adam's step is ~lr whatever the gradient, so lr = 2^-12 on an f16 weight of 1 is the same situation
  // with the state (moments) in f32 either way.
  const double lr = std::ldexp(1.0, -12);
  for (bool masters : {false, true}) {
    Tensor p = ones_param(8, DType::f16);
    optim::Adam opt({p}, {.lr = lr});
    opt.set_master_weights(masters);
    Tensor g = randn({8}, {}, -1.0, 0.1).to(DType::f16);  // all negative: every step moves w up by ~lr
    for (int k = 0; k < 40; ++k) {
      p.set_grad(g.clone());
      opt.step();
    }
    if (!masters) {
      for (double v : values(p)) EXPECT_EQ(v, 1.0);
      continue;
    }
    // Each step is lr * m_hat / (sqrt(v_hat) + eps) with a constant gradient: m_hat = g, sqrt(v_hat) = |g|,
    // so lr * (1 - eps/|g|) ~ lr to 1e-7 relative; f32 rounding of the sums adds < 40 * 2^-24.
    for (double v : values(opt.master(p))) EXPECT_NEAR(v, 1.0 + 40 * lr, 1e-5);
    EXPECT_TRUE(bitwise_equal(p.detach(), opt.master(p).to(DType::f16)));
  }
}

// ----------------------------------------------- stochastic rounding instead of masters (O3)

namespace {

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// 64 SGD steps of +2^log2_update on n 16-bit ones without masters, rounding stochastically (seed 9).
Tensor sr_run(const SmallCase& c, int64_t n, uint64_t seed = 9) {
  Tensor p = ones_param(n, c.dtype);
  optim::SGD opt({p}, {.lr = std::ldexp(1.0, c.log2_update)});
  opt.set_stochastic_rounding(true, seed);
  for (int k = 0; k < 64; ++k) {
    p.set_grad(full({n}, -1.0, {.dtype = c.dtype}));
    opt.step();
  }
  return p.detach();
}

}  // namespace

TEST(MasterWeights, UpdatesBelowHalfAnUlpSurviveInExpectationWithStochasticRounding) {
  // Note [stochastic rounding]. The updates that nearest-even rounding loses entirely (the tests above)
  // move each weight by their sum on average: 64 x 2^-9 = 0.125 in bf16 (a quarter ulp per step), 64 x
  // 2^-12 = 2^-6 in f16. Each step adds a rounding error of mean 0 and variance <= ulp^2 / 4, so a weight's
  // 64-step sum has standard deviation <= 4 ulp, and the mean of 4096 weights <= ulp / 16: bf16 4.9e-4,
  // f16 6.1e-5. The test allows 10 standard deviations (deterministic anyway: the seed is fixed).
  for (const SmallCase& c : {kBf16, kF16}) {
    const double want = 1.0 + 64 * std::ldexp(1.0, c.log2_update);
    const double ulp = c.dtype == DType::bf16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
    const std::vector<double> w = values(sr_run(c, 4096));
    EXPECT_NEAR(mean(w), want, 10 * ulp / 16) << dtype_name(c.dtype);
    // The weights spread over several 16-bit values around the expectation, none below 1.
    std::set<double> distinct(w.begin(), w.end());
    EXPECT_GE(distinct.size(), 3u) << dtype_name(c.dtype);
    EXPECT_GE(*distinct.begin(), 1.0);
  }
}

TEST(MasterWeights, StochasticRoundingIsReproducibleAndIgnoredWithMasters) {
  // The same seed gives the same bits, with one thread or several (the random words depend on the
  // element's index only); another seed gives other bits.
  const int64_t n = int64_t{1} << 18;  // large enough for the parallel loop
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Tensor one = sr_run(kBf16, n);
  omp_set_num_threads(std::max(2, threads));
  const Tensor many = sr_run(kBf16, n);
  omp_set_num_threads(threads);
  EXPECT_TRUE(bitwise_equal(one, many));
  EXPECT_FALSE(bitwise_equal(one, sr_run(kBf16, n, 10)));
  // With f32 masters the parameter is the master rounded to nearest even, stochastic rounding or not.
  Tensor p = ones_param(64, DType::bf16);
  optim::SGD opt({p}, {.lr = std::ldexp(1.0, -9)});
  opt.set_master_weights(true);
  opt.set_stochastic_rounding(true, 9);
  for (int k = 0; k < 5; ++k) {
    p.set_grad(full({64}, -1.0, {.dtype = DType::bf16}));
    opt.step();
  }
  EXPECT_TRUE(bitwise_equal(p.detach(), opt.master(p).to(DType::bf16)));
}

TEST(MasterWeights, AdamWithStochasticRoundingMovesBf16WeightsWithoutMasters) {
  // Adam's steps of ~lr = 2^-10 (an eighth of bf16's ulp at 1): lost with nearest-even rounding
  // (AdamSmallStepsAccumulateOnlyWithMasters), kept on average with stochastic rounding.
  const double lr = std::ldexp(1.0, -10);
  Tensor p = ones_param(4096, DType::bf16);
  optim::Adam opt({p}, {.lr = lr});
  opt.set_stochastic_rounding(true, 3);
  const Tensor g = full({4096}, -0.5, {.dtype = DType::bf16});
  for (int k = 0; k < 40; ++k) {
    p.set_grad(g.clone());
    opt.step();
  }
  // 40 steps of lr (to 1e-7 relative, as above); the mean of 4096 weights is within 10 x ulp / 2^4.
  EXPECT_NEAR(mean(values(p)), 1.0 + 40 * lr, 10 * std::ldexp(1.0, -7) / 16);
}

TEST(MasterWeights, AmpOptionsChecksStochasticRounding) {
  auto model = std::make_shared<nn::Linear>(4, 3);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  try {
    amp::initialize(model, opt, {.opt_level = amp::OptLevel::O2, .dtype = DType::bf16, .stochastic_rounding = true});
    FAIL() << "O2 with stochastic rounding was accepted";
  } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find("use O3"), std::string::npos) << e.what(); }
  amp::AmpSetup s = amp::initialize(
      model, opt,
      {.opt_level = amp::OptLevel::O3, .dtype = DType::bf16, .stochastic_rounding = true, .rounding_seed = 5});
  EXPECT_TRUE(opt.stochastic_rounding());
  EXPECT_NE(s.describe().find("stochastic rounding"), std::string::npos) << s.describe();
}

// ------------------------------------------------------------------------- optimizer plumbing

TEST(MasterWeights, OnlySixteenBitParametersGetMasters) {
  Tensor p32 = ones_param(4, DType::f32), p16 = ones_param(4, DType::bf16);
  optim::SGD opt({p32, p16}, {.lr = 0.1});
  opt.set_master_weights(true);
  EXPECT_TRUE(opt.master_weights());
  p32.set_grad(ones({4}));
  p16.set_grad(ones({4}, {.dtype = DType::bf16}));
  opt.step();
  EXPECT_FALSE(opt.master(p32).defined());
  ASSERT_TRUE(opt.master(p16).defined());
  EXPECT_EQ(opt.state(p16)->buffers.count("master"), 1u);
  EXPECT_EQ(opt.state(p32)->buffers.count("master"), 0u);
  // Masters off (the default): no master buffers at all.
  Tensor q = ones_param(4, DType::bf16);
  optim::SGD plain({q}, {.lr = 0.1});
  EXPECT_FALSE(plain.master_weights());
  q.set_grad(ones({4}, {.dtype = DType::bf16}));
  plain.step();
  EXPECT_FALSE(plain.master(q).defined());
}

TEST(MasterWeights, SetMasterSuppliesTheF32Values) {
  // What amp::initialize does: the master holds values the 16-bit parameter cannot represent.
  Tensor original = from_vector<float>({1.0001f, -2.0003f, 3.1415927f, 1e-6f}, {4});
  Tensor p = original.to(DType::bf16);
  p.requires_grad_(true);
  optim::SGD opt({p}, {.lr = 0.5});
  opt.set_master_weights(true);
  opt.set_master(p, original.clone());
  EXPECT_TRUE(bitwise_equal(opt.master(p), original));
  // A step with a gradient starts from the master, not from the rounded parameter.
  p.set_grad(full({4}, 2e-4, {.dtype = DType::bf16}));
  opt.step();
  const auto m = values(opt.master(p)), o = values(original);
  const double g = static_cast<double>(static_cast<float>(BFloat16(2e-4f)));
  for (size_t i = 0; i < m.size(); ++i) EXPECT_NEAR(m[i], o[i] - 0.5 * g, 1e-6 * (1 + std::abs(o[i])));
  EXPECT_TRUE(bitwise_equal(p.detach(), opt.master(p).to(DType::bf16)));
  // Validation: dtype and shape.
  EXPECT_THROW(opt.set_master(p, original.to(DType::f64)), Error);
  EXPECT_THROW(opt.set_master(p, zeros({3})), Error);
}

TEST(MasterWeights, ReplaceParameterKeepsItsState) {
  Tensor p = ones_param(4, DType::f32);
  optim::SGD opt({p}, {.lr = 0.1, .momentum = 0.9});
  p.set_grad(ones({4}));
  opt.step();
  const Tensor buf = opt.state(p)->buffers.at("momentum_buffer").clone();
  Tensor q = p.detach().to(DType::bf16);
  q.requires_grad_(true);
  opt.replace_parameter(p, q);
  EXPECT_EQ(opt.parameters().at(0).impl_ptr(), q.impl_ptr());
  EXPECT_EQ(opt.state(p), nullptr);
  ASSERT_NE(opt.state(q), nullptr);
  EXPECT_EQ(opt.state(q)->step, 1);
  EXPECT_TRUE(bitwise_equal(opt.state(q)->buffers.at("momentum_buffer"), buf));
  EXPECT_THROW(opt.replace_parameter(p, q), Error);  // p is no longer there
  Tensor r = ones_param(5, DType::bf16);
  EXPECT_THROW(opt.replace_parameter(q, r), Error);  // shape differs
}

TEST(MasterWeights, GradScaleInvIsAppliedInsideTheFusedStep) {
  // set_grad_scale_inv: the fused pass multiplies the gradient before the update (what GradScaler's
  // fused step uses), with the master path too.
  Tensor a = ones_param(4, DType::f16), b = ones_param(4, DType::f16);
  optim::SGD oa({a}, {.lr = 0.25}), ob({b}, {.lr = 0.25});
  oa.set_master_weights(true);
  ob.set_master_weights(true);
  a.set_grad(full({4}, 1024.0, {.dtype = DType::f16}));  // a gradient scaled by 1024
  b.set_grad(full({4}, 1.0, {.dtype = DType::f16}));
  oa.set_grad_scale_inv(1.0 / 1024);
  oa.step();
  ob.step();
  EXPECT_TRUE(bitwise_equal(oa.master(a), ob.master(b)));
  EXPECT_TRUE(bitwise_equal(a.detach(), b.detach()));
  for (double v : values(a)) EXPECT_EQ(v, 0.75);
}

// ---------------------------------------------------------------- state dicts carry the masters

namespace {

std::shared_ptr<nn::Sequential> small_mlp() {
  return std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::ReLU>(),
                                          std::make_shared<nn::Linear>(16, 3));
}

struct Batch {
  Tensor x, y;
};

void train_steps(amp::AmpSetup& setup, optim::Optimizer& opt, const std::vector<Batch>& batches, size_t from,
                 size_t to) {
  for (size_t i = from; i < to; ++i) {
    opt.zero_grad();
    Tensor loss = cross_entropy(setup.model(batches[i].x), batches[i].y);
    setup.scaler.scale(loss).backward();
    setup.scaler.step(opt);
    setup.scaler.update();
  }
}

}  // namespace

TEST(MasterWeights, O2StateDictRoundTripContinuesIdentically) {
  for (DType dt : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    manual_seed(11);
    std::vector<Batch> batches;
    for (int i = 0; i < 8; ++i) batches.push_back({randn({12, 6}), randint(0, 3, {12})});

    auto model = small_mlp();
    optim::Adam opt(model->parameters(), {.lr = 1e-2});
    amp::AmpSetup setup = amp::initialize(model, opt, {.opt_level = amp::OptLevel::O2, .dtype = dt});
    train_steps(setup, opt, batches, 0, 4);

    // Snapshot everything a checkpoint holds.
    const nn::StateDict model_sd = model->state_dict().clone();
    const nn::StateDict opt_flat = opt.state_dict().flatten().clone();
    const nn::StateDict scaler_sd = setup.scaler.state_dict().clone();
    ASSERT_TRUE(opt_flat.contains("state.0.master")) << "the optimizer state dict must carry the f32 masters";
    EXPECT_EQ(opt_flat.at("state.0.master").dtype(), DType::f32);
    EXPECT_TRUE(opt_flat.contains("state.0.exp_avg"));
    // The masters are not just the 16-bit weights widened: they hold bits the weights lost.
    const Tensor w0 = model->named_parameters().at(0).second;
    EXPECT_EQ(w0.dtype(), dt);
    EXPECT_FALSE(bitwise_equal(opt_flat.at("state.0.master"), w0.detach().to(DType::f32)));

    train_steps(setup, opt, batches, 4, 8);

    // A fresh process: same architecture, initialize, then load the three state dicts.
    manual_seed(999);  // different initial values, all overwritten by the load
    auto model2 = small_mlp();
    optim::Adam opt2(model2->parameters(), {.lr = 1e-2});
    amp::AmpSetup setup2 = amp::initialize(model2, opt2, {.opt_level = amp::OptLevel::O2, .dtype = dt});
    model2->load_state_dict(model_sd);
    opt2.load_state_dict(optim::OptimizerStateDict::unflatten(opt_flat));
    setup2.scaler.load_state_dict(scaler_sd);
    EXPECT_TRUE(bitwise_equal(opt2.master(model2->parameters().at(0)), opt_flat.at("state.0.master")));
    train_steps(setup2, opt2, batches, 4, 8);

    const auto p1 = model->named_parameters(), p2 = model2->named_parameters();
    ASSERT_EQ(p1.size(), p2.size());
    for (size_t i = 0; i < p1.size(); ++i) {
      // Same operations on the same bits in the same order: identical results, bit for bit.
      EXPECT_TRUE(bitwise_equal(p1[i].second.detach(), p2[i].second.detach())) << p1[i].first;
      const Tensor m1 = opt.master(p1[i].second), m2 = opt2.master(p2[i].second);
      EXPECT_EQ(m1.defined(), m2.defined()) << p1[i].first;
      if (m1.defined()) { EXPECT_TRUE(bitwise_equal(m1, m2)) << p1[i].first; }
    }
    EXPECT_EQ(setup.scaler.get_scale(), setup2.scaler.get_scale());
  }
}

// Automatic per-layer precision (mp/amp/auto_precision.hpp, Note [automatic precision]): the decision rule on
// hand-built telemetry, and the move of a layer to f32 (its master becomes the weight, the optimizer keeps its
// moments and drops the master, tied weights stay tied, the model still trains).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "mp/mp.hpp"

using namespace mp;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A 16-bit layer's telemetry with nothing alarming: amax 1, no underflow.
amp::LayerNumerics calm(const std::string& module, const std::string& dtype = "f16") {
  return {.module = module,
          .type = "Linear",
          .dtype = dtype,
          .act_amax = 1,
          .grad_amax = 1e-3,
          .grad_values = 100,
          .grad_underflow = 0.01};
}

std::vector<amp::LayerSign> assess_all(const std::vector<amp::LayerNumerics>& ls, const amp::AutoPrecisionOptions& o) {
  std::vector<amp::LayerSign> s;
  for (const auto& l : ls) s.push_back(amp::assess(l, o, 1.0));
  return s;
}

}  // namespace

TEST(AutoPrecisionRule, CalmLayersShowNoSign) {
  const amp::AutoPrecisionOptions o;
  const amp::LayerSign s = amp::assess(calm("fc"), o, 1.0);
  EXPECT_FALSE(s.overflow);
  EXPECT_FALSE(s.underflow);
  EXPECT_EQ(s.why, "");
}

TEST(AutoPrecisionRule, OverflowSignsAtTheThreshold) {
  const amp::AutoPrecisionOptions o{.overflow = 0.5};
  amp::LayerNumerics l = calm("fc");
  l.act_amax = 32751;  // just below 0.5 x 65504 = 32752
  EXPECT_FALSE(amp::assess(l, o, 1.0).overflow);
  l.act_amax = 32752;
  EXPECT_TRUE(amp::assess(l, o, 1.0).overflow);
  EXPECT_NE(amp::assess(l, o, 1.0).why.find("forward output amax 3.275e+04"), std::string::npos)
      << amp::assess(l, o, 1.0).why;
  // The output gradient at scale 1 likewise.
  l = calm("fc");
  l.grad_amax = 40000;
  EXPECT_TRUE(amp::assess(l, o, 1.0).overflow);
  EXPECT_NE(amp::assess(l, o, 1.0).why.find("output gradient"), std::string::npos);
  // A stricter threshold.
  l = calm("fc");
  l.act_amax = 7000;
  EXPECT_FALSE(amp::assess(l, o, 1.0).overflow);
  EXPECT_TRUE(amp::assess(l, {.overflow = 0.1}, 1.0).overflow);  // 0.1 x 65504 = 6550.4
}

TEST(AutoPrecisionRule, OnlyTheFirstNonFiniteOutputIsBlamed) {
  const amp::AutoPrecisionOptions o;
  amp::LayerNumerics first = calm("a"), later = calm("b");
  first.act_amax = later.act_amax = kNaN;  // both outputs non-finite
  first.act_first_nonfinite = true;        // a's came first: b only passed it on
  EXPECT_TRUE(amp::assess(first, o, 1.0).overflow);
  EXPECT_EQ(amp::assess(first, o, 1.0).why, "forward output non-finite (the step's first)");
  EXPECT_FALSE(amp::assess(later, o, 1.0).overflow);
}

TEST(AutoPrecisionRule, Bf16RangeIsF32s) {
  amp::LayerNumerics l = calm("fc", "bf16");
  l.act_amax = 1e6;  // would overflow f16, not bf16
  EXPECT_FALSE(amp::assess(l, {}, 1.0).overflow);
  l.act_amax = 2e38;
  EXPECT_TRUE(amp::assess(l, {}, 1.0).overflow);
  // f16's underflow threshold does not apply to bf16 (its smallest normal is 2^-126).
  l = calm("fc", "bf16");
  l.grad_amax = 1e-10;
  EXPECT_FALSE(amp::assess(l, {}, 1.0).underflow);
}

// The output gradient's amax times the loss scale against f16's smallest normal (2^-14 by default).
TEST(AutoPrecisionRule, UnderflowSignBelowTheSmallestNormalAtTheScale) {
  const amp::AutoPrecisionOptions o;
  ASSERT_EQ(o.underflow, std::ldexp(1.0, -14));
  amp::LayerNumerics l = calm("emb");
  l.grad_amax = std::ldexp(1.0, -20);
  EXPECT_TRUE(amp::assess(l, o, 1.0).underflow);    // 2^-20 at scale 1: subnormal
  EXPECT_FALSE(amp::assess(l, o, 64.0).underflow);  // 2^-14 at scale 2^6: normal, not below
  EXPECT_TRUE(amp::assess(l, o, 32.0).underflow);   // 2^-15
  EXPECT_FALSE(amp::assess(l, o, 32.0).overflow);
  EXPECT_EQ(amp::assess(l, o, 32.0).why, "output gradient amax 3.052e-05 at loss scale 32 < 6.104e-05");
  l.grad_amax = 0;  // everything flushed
  EXPECT_TRUE(amp::assess(l, o, 65536.0).underflow);
  l.grad_amax = kNaN;  // not seen (or non-finite): nothing to judge
  EXPECT_FALSE(amp::assess(l, o, 1.0).underflow);
  l.grad_amax = std::ldexp(1.0, -20);
  EXPECT_FALSE(amp::assess(l, {.underflow = std::ldexp(1.0, -21)}, 1.0).underflow);  // a lower threshold
}

TEST(AutoPrecisionRule, F32LayersAreNotEligible) {
  amp::LayerNumerics l = calm("bn", "f32");
  l.act_amax = 1e30;
  l.act_first_nonfinite = true;
  l.grad_amax = 0;
  const amp::LayerSign s = amp::assess(l, {}, 1.0);
  EXPECT_FALSE(s.overflow);
  EXPECT_FALSE(s.underflow);
}

TEST(AutoPrecisionRule, MovesAfterPatienceConsecutiveSignsOnce) {
  amp::AutoPrecision ap({.patience = 3});
  amp::LayerNumerics hot = calm("fc"), cool = calm("conv");
  hot.act_amax = 60000;
  const std::vector<amp::LayerNumerics> both{cool, hot};
  EXPECT_TRUE(ap.observe(both, assess_all(both, ap.options()), 10).empty());
  EXPECT_EQ(ap.streaks().at("fc").overflow, 1);
  EXPECT_EQ(ap.streaks().count("conv"), 0u);
  EXPECT_TRUE(ap.observe(both, assess_all(both, ap.options()), 20).empty());
  const std::vector<amp::PrecisionMove> moved = ap.observe(both, assess_all(both, ap.options()), 30);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].module, "fc");
  EXPECT_EQ(moved[0].type, "Linear");
  EXPECT_EQ(moved[0].from, DType::f16);
  EXPECT_EQ(moved[0].to, DType::f32);
  EXPECT_EQ(moved[0].step, 30);
  EXPECT_EQ(moved[0].reason.rfind("overflow in 3 consecutive observations: forward output amax", 0), 0u)
      << moved[0].reason;
  EXPECT_EQ(ap.moves().size(), 1u);
  EXPECT_EQ(ap.streaks().count("fc"), 0u);  // moved: no streak kept
}

TEST(AutoPrecisionRule, AnInterruptedStreakStartsOver) {
  amp::AutoPrecision ap({.patience = 2});
  amp::LayerNumerics hot = calm("fc");
  hot.act_amax = 60000;
  const std::vector<amp::LayerNumerics> h{hot}, c{calm("fc")};
  EXPECT_TRUE(ap.observe(h, assess_all(h, ap.options()), 1).empty());
  EXPECT_TRUE(ap.observe(c, assess_all(c, ap.options()), 2).empty());  // calm: back to 0
  EXPECT_EQ(ap.streaks().count("fc"), 0u);
  EXPECT_TRUE(ap.observe(h, assess_all(h, ap.options()), 3).empty());
  EXPECT_EQ(ap.observe(h, assess_all(h, ap.options()), 4).size(), 1u);
}

TEST(AutoPrecisionRule, SignsFromOutsideCountAsGiven) {
  // Data-parallel ranks add up their signs and hand the agreed ones in: observe() trusts them.
  amp::AutoPrecision ap({.patience = 1});
  const std::vector<amp::LayerNumerics> l{calm("fc")};
  const std::vector<amp::LayerSign> agreed{{.underflow = true, .why = "a sign seen on another rank"}};
  const auto moved = ap.observe(l, agreed, 7);
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_EQ(moved[0].reason, "underflow in 1 consecutive observation: a sign seen on another rank");
}

TEST(AutoPrecisionRule, RestoreContinuesTheStreaks) {
  amp::AutoPrecision ap({.patience = 2});
  ap.restore({{.module = "x", .type = "Conv2d", .step = 5, .reason = "r"}}, {{"fc", {.overflow = 1}}});
  amp::LayerNumerics hot = calm("fc");
  hot.act_amax = 60000;
  const std::vector<amp::LayerNumerics> h{hot};
  const auto moved = ap.observe(h, assess_all(h, ap.options()), 9);
  ASSERT_EQ(moved.size(), 1u);  // 1 restored + 1 now = patience
  EXPECT_EQ(ap.moves().size(), 2u);
  EXPECT_EQ(ap.moves()[0].module, "x");
}

TEST(AutoPrecisionRule, RefusesBadThresholds) {
  EXPECT_THROW(amp::AutoPrecision({.overflow = 0}), Error);
  EXPECT_THROW(amp::AutoPrecision({.overflow = 1.5}), Error);
  EXPECT_THROW(amp::AutoPrecision({.underflow = 0}), Error);
  EXPECT_THROW(amp::AutoPrecision({.patience = 0}), Error);
}

// The move: an O2 f16 model of two Linears, one Adam step taken (so the masters and moments exist), then fc2 moves.
TEST(AutoPrecisionMove, MasterBecomesTheWeightAndMomentsStay) {
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(4, 8));
  model->push_back(std::make_shared<nn::Linear>(8, 2));
  optim::Adam opt(model->parameters(), {.lr = 1e-3});
  amp::AmpSetup setup = amp::initialize(model, opt, {.opt_level = amp::OptLevel::O2, .dtype = DType::f16});
  const Tensor x = randn({3, 4});
  sum(setup.model(x)).backward();
  opt.step();
  opt.zero_grad();
  const Tensor w_old = model->named_parameters().at(2).second;  // "1.weight"
  ASSERT_EQ(w_old.dtype(), DType::f16);
  const Tensor master = opt.master(w_old).clone();
  ASSERT_TRUE(master.defined());
  // The master holds more than the 16-bit weight: the move must keep the master's value, not the rounding.
  ASSERT_GT(max(abs(sub(master, w_old.to(DType::f32)))).item<double>(), 0.0);
  const Tensor m_old = opt.state(w_old)->buffers.at("exp_avg").clone();
  const int64_t step_old = opt.state(w_old)->step;

  const std::vector<std::string> converted = amp::promote_to_f32(*model, "1", opt);
  EXPECT_EQ(converted, std::vector<std::string>{"1"});
  const Tensor w_new = model->named_parameters().at(2).second;
  EXPECT_EQ(w_new.dtype(), DType::f32);
  EXPECT_EQ(model->named_parameters().at(3).second.dtype(), DType::f32);  // its bias
  EXPECT_EQ(model->named_parameters().at(0).second.dtype(), DType::f16);  // layer 0 stays
  EXPECT_TRUE(w_new.requires_grad());
  EXPECT_EQ(max(abs(sub(w_new, master))).item<double>(), 0.0);  // bit for bit the master
  ASSERT_NE(opt.state(w_new), nullptr);
  EXPECT_FALSE(opt.master(w_new).defined());  // an f32 parameter needs no master
  EXPECT_EQ(opt.state(w_new)->step, step_old);
  EXPECT_EQ(max(abs(sub(opt.state(w_new)->buffers.at("exp_avg"), m_old))).item<double>(), 0.0);
  EXPECT_EQ(opt.state(w_old), nullptr);  // the old tensor left the optimizer
  bool found = false;
  for (const Tensor& p : opt.parameters()) found = found || p.impl_ptr() == w_new.impl_ptr();
  EXPECT_TRUE(found);

  // It still trains: f16 input meets f32 weights and the output is f32 (type promotion); the step moves w_new.
  const Tensor y = (*model)(x.to(DType::f16));
  EXPECT_EQ(y.dtype(), DType::f32);
  sum(y).backward();
  ASSERT_TRUE(w_new.grad().defined());
  EXPECT_EQ(w_new.grad().dtype(), DType::f32);
  const Tensor before = w_new.clone();
  opt.step();
  EXPECT_GT(max(abs(sub(w_new, before))).item<double>(), 0.0);
}

TEST(AutoPrecisionMove, TiedWeightsMoveTogether) {
  auto model = std::make_shared<nn::Sequential>();
  auto a = std::make_shared<nn::Linear>(4, 4);
  auto b = std::make_shared<nn::Linear>(4, 4);
  b->tie_weight(a->weight());
  model->push_back(a);
  model->push_back(b);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  (void)amp::initialize(model, opt, {.opt_level = amp::OptLevel::O2, .dtype = DType::f16});
  ASSERT_EQ(a->weight().impl_ptr(), b->weight().impl_ptr());
  const std::vector<std::string> converted = amp::promote_to_f32(*model, "1", opt);
  EXPECT_EQ(converted, (std::vector<std::string>{"1", "0"}));  // the asked module first
  EXPECT_EQ(a->weight().dtype(), DType::f32);
  EXPECT_EQ(a->weight().impl_ptr(), b->weight().impl_ptr());  // still one tensor
}

TEST(AutoPrecisionMove, UnknownModuleIsRefusedByName) {
  auto model = std::make_shared<nn::Linear>(2, 2);
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  try {
    (void)amp::promote_to_f32(*model, "encoder.3", opt);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no module named 'encoder.3'"), std::string::npos) << e.what();
  }
}

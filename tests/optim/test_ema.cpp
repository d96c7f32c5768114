#include <gtest/gtest.h>

#include <cmath>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;

namespace {

float value_of(const Tensor& t) { return t.to(DType::f32).to_vector<float>()[0]; }

}  // namespace

// Note [weight EMA in f32]: a move of 0.1% of a bf16 ulp per step survives in the f32 average.
TEST(ModelEma, MovesBelowA16BitUlpSurviveInF32) {
  nn::Linear lin(1, 1, /*bias=*/false);
  lin.to(DType::bf16);
  Tensor w = lin.parameters()[0];
  w.copy_(full({1, 1}, 1.0));
  optim::ModelEma ema(lin, 0.999);
  EXPECT_EQ(ema.averages().at("weight").dtype(), DType::f32);
  w.copy_(full({1, 1}, 1.0078125));  // one bf16 ulp above 1
  ema.update(lin);
  const float once = value_of(ema.averages().at("weight"));
  EXPECT_GT(once, 1.0f);
  EXPECT_NEAR(once, 1.0 + 0.001 * 0.0078125, 2e-7);                        // f32 rounding of the two steps
  EXPECT_EQ(value_of(ema.averages().at("weight").to(DType::bf16)), 1.0f);  // a bf16 average would stall here
  for (int i = 1; i < 1000; ++i) ema.update(lin);
  // 1000 updates cover 1 - 0.999^1000 = 63.2% of the way to the new weight.
  EXPECT_NEAR(value_of(ema.averages().at("weight")), 1.0 + (1 - std::pow(0.999, 1000)) * 0.0078125, 1e-5);
  EXPECT_EQ(ema.num_updates(), 1000);
}

TEST(ModelEma, AveragesBuffersAndCopiesCounters) {
  nn::BatchNorm2d bn(2);
  optim::ModelEma ema(bn, 0.75);
  const nn::StateDict sd = bn.state_dict();
  Tensor mean = sd.at("running_mean");
  mean.copy_(from_vector<float>({4, -8}, {2}));
  Tensor count = sd.at("num_batches_tracked");
  count.copy_(full({}, 5.0, {.dtype = DType::i64}));
  ema.update(bn);
  EXPECT_EQ(ema.averages().at("running_mean").to_vector<float>(), (std::vector<float>{1, -2}));  // 0.25 of the way
  EXPECT_EQ(ema.averages().at("num_batches_tracked").dtype(), DType::i64);
  EXPECT_EQ(ema.averages().at("num_batches_tracked").item<int64_t>(), 5);
  EXPECT_THROW(optim::ModelEma(bn, 1.0), Error);
  EXPECT_THROW(optim::ModelEma(bn, -0.1), Error);
}

// With O2 the f32 master is averaged, not its 16-bit rounding.
TEST(ModelEma, AveragesTheF32MasterWhereTheOptimizerKeepsOne) {
  nn::Linear lin(1, 1, /*bias=*/false);
  lin.to(DType::bf16);
  Tensor w = lin.parameters()[0];
  w.copy_(full({1, 1}, 1.0));
  optim::SGD opt(lin.parameters(), {.lr = 0.1});
  opt.set_master_weights(true);
  opt.set_master(w, full({1, 1}, 1.001));  // not a bf16 number
  EXPECT_EQ(value_of(optim::ModelEma(lin, 0.5).averages().at("weight")), 1.0f);
  optim::ModelEma ema(lin, 0.5, &opt);
  EXPECT_EQ(value_of(ema.averages().at("weight")), 1.001f);
  opt.set_master(w, full({1, 1}, 1.003));
  ema.update(lin, &opt);
  EXPECT_NEAR(value_of(ema.averages().at("weight")), 1.002, 1e-7);
  // An optimizer without master weights (O3) may still hold a stale master (restored from an O2
  // checkpoint): the weight itself is averaged then.
  opt.set_master_weights(false);
  EXPECT_EQ(value_of(optim::ModelEma(lin, 0.5, &opt).averages().at("weight")), 1.0f);
}

// A tied weight (the word LM's decoder.weight IS encoder.weight) is one parameter under two names: both
// names average its master.
TEST(ModelEma, TiedWeightsAverageTheirMasterUnderBothNames) {
  models::WordLM lm({.vocab_size = 12, .embed_size = 8, .hidden_size = 8, .num_layers = 1, .tie_weights = true});
  lm.to(DType::bf16);
  optim::SGD opt(lm.parameters(), {.lr = 0.1});
  opt.set_master_weights(true);
  Tensor enc;
  for (const auto& [name, p] : lm.named_parameters())
    if (name == "encoder.weight") enc = p;
  ASSERT_TRUE(enc.defined());
  opt.set_master(enc, full(enc.sizes(), 0.3));  // 0.3 is not a bf16 number
  const optim::ModelEma ema(lm, 0.9, &opt);
  const std::vector<float> want(static_cast<size_t>(enc.numel()), 0.3f);
  EXPECT_EQ(ema.averages().at("encoder.weight").to_vector<float>(), want);
  EXPECT_EQ(ema.averages().at("decoder.weight").to_vector<float>(), want);
}

TEST(ModelEma, SwapEvaluatesTheAveragesAndRestoresTheModelBitForBit) {
  manual_seed(4);
  nn::Sequential net;
  net.push_back(std::make_shared<nn::Linear>(3, 4));
  net.push_back(std::make_shared<nn::ReLU>());
  net.push_back(std::make_shared<nn::Linear>(4, 2));
  net.to(DType::bf16);
  optim::ModelEma ema(net, 0.5);
  for (Tensor p : net.parameters()) p.copy_(p.to(DType::f32) * 3.0 + 0.25);  // move away from the average
  ema.update(net);
  const nn::StateDict before = net.state_dict().clone();
  const Tensor x = randn({5, 3}).to(DType::bf16);
  const std::vector<float> own = net(x).to(DType::f32).to_vector<float>();
  std::vector<float> averaged;
  {
    const optim::ModelEma::Swap swap = ema.swap_into(net);
    for (const auto& [name, t] : net.state_dict())
      EXPECT_EQ(t.to(DType::f32).to_vector<float>(),
                ema.averages().at(name).to(DType::bf16).to(DType::f32).to_vector<float>())
          << name;
    averaged = net(x).to(DType::f32).to_vector<float>();
  }
  EXPECT_NE(averaged, own);
  for (const auto& [name, t] : net.state_dict()) {
    EXPECT_EQ(t.dtype(), DType::bf16) << name;
    EXPECT_EQ(t.to(DType::f32).to_vector<float>(), before.at(name).to(DType::f32).to_vector<float>()) << name;
  }
  EXPECT_EQ(net(x).to(DType::f32).to_vector<float>(), own);
}

TEST(ModelEma, StateDictRoundTripsAndRefusesAnotherModel) {
  nn::Linear a(3, 2), b(3, 2), other(4, 2);
  optim::ModelEma ea(a, 0.9), eb(b, 0.9), eo(other, 0.9);
  for (int i = 0; i < 3; ++i) ea.update(a);
  eb.load_state_dict(ea.state_dict());
  EXPECT_EQ(eb.num_updates(), 3);
  EXPECT_EQ(eb.averages().at("weight").to_vector<float>(), ea.averages().at("weight").to_vector<float>());
  const std::string m = test::error_of([&] { eo.load_state_dict(ea.state_dict()); });
  EXPECT_NE(m.find("'weight' is"), std::string::npos) << m;
  nn::StateDict no_count = ea.state_dict();
  no_count.erase("num_updates");
  EXPECT_NE(test::error_of([&] { eb.load_state_dict(no_count); }).find("'num_updates'"), std::string::npos);
}

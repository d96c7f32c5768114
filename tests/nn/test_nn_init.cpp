// Initialisers and the layers' default initialisation (PyTorch's formulas), checked statistically.
// Tolerances: each statistic of n i.i.d. draws is compared with a margin of >= 6 standard errors
// of that statistic (stated per test), so a correct implementation fails with negligible chance,
// while a wrong bound or std (the bugs these catch) is off by far more than the margin.
#include <gtest/gtest.h>

#include <cmath>

#include "mp/core/philox.hpp"
#include "mp/nn/nn.hpp"

using namespace mp;
using namespace mp::nn;

namespace {

struct Stats {
  double mean = 0, var = 0, min = 0, max = 0;
};

Stats stats(const Tensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  Stats s{0, 0, v[0], v[0]};
  for (double x : v) {
    s.mean += x;
    s.min = std::min(s.min, x);
    s.max = std::max(s.max, x);
  }
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.var += (x - s.mean) * (x - s.mean);
  s.var /= static_cast<double>(v.size() - 1);
  return s;
}

// A uniform(-b, b) sample of n values: inside the bounds, reaching near them, mean ~0, var ~b^2/3.
void expect_uniform(const Tensor& t, double b) {
  const Stats s = stats(t);
  const auto n = static_cast<double>(t.numel());
  EXPECT_GE(s.min, -b * (1 + 1e-6));  // f32 rounding of the bound
  EXPECT_LE(s.max, b * (1 + 1e-6));
  // P(no draw within 1e-3 b of an end) = (1 - 5e-4)^n < e^-50 for n >= 1e5 (skipped for small n).
  if (n >= 1e5) {
    EXPECT_GT(s.max, b * (1 - 1e-3));
    EXPECT_LT(s.min, -b * (1 - 1e-3));
  }
  const double sd = b / std::sqrt(3.0);
  EXPECT_NEAR(s.mean, 0.0, 6 * sd / std::sqrt(n));  // 6 standard errors of the mean
  // Standard error of the sample variance of a uniform: var * sqrt(0.8 / n).
  EXPECT_NEAR(s.var, sd * sd, 6 * sd * sd * std::sqrt(0.8 / n));
}

// A normal(0, sd) sample: mean within 6 standard errors, std within 6 standard errors (sd / sqrt(2n)).
void expect_normal(const Tensor& t, double sd) {
  const Stats s = stats(t);
  const auto n = static_cast<double>(t.numel());
  EXPECT_NEAR(s.mean, 0.0, 6 * sd / std::sqrt(n));
  EXPECT_NEAR(std::sqrt(s.var), sd, 6 * sd / std::sqrt(2 * n));
}

}  // namespace

TEST(NnInit, LinearDefaultsAreKaimingUniformSqrt5) {
  manual_seed(11);
  Linear fc(1000, 500);
  // kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / 6), bound = gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
  const double bound = 1.0 / std::sqrt(1000.0);
  expect_uniform(fc.weight(), bound);
  const Stats b = stats(fc.bias());
  EXPECT_GE(b.min, -bound);
  EXPECT_LE(b.max, bound);
  EXPECT_EQ(fc.weight().sizes(), (Shape{500, 1000}));
  EXPECT_EQ(fc.weight().dtype(), DType::f32);
}

TEST(NnInit, Conv2dDefaults) {
  manual_seed(12);
  Conv2d conv(nn::Conv2dOptions{.in_channels = 64, .out_channels = 128, .kernel_size = {3, 3}});
  // fan_in = 64 * 3 * 3 = 576 -> bound 1/24.
  expect_uniform(conv.weight(), 1.0 / 24.0);
  const Stats b = stats(conv.bias());
  EXPECT_GE(b.min, -1.0 / 24.0);
  EXPECT_LE(b.max, 1.0 / 24.0);
  // Grouped: weight [out, in / groups, kH, kW], fan_in = in / groups * kH * kW.
  Conv2d grouped(nn::Conv2dOptions{.in_channels = 8, .out_channels = 8, .kernel_size = {3, 3}, .groups = 4});
  EXPECT_EQ(grouped.weight().sizes(), (Shape{8, 2, 3, 3}));
  EXPECT_LE(stats(grouped.weight()).max, 1.0 / std::sqrt(18.0));
}

TEST(NnInit, EmbeddingIsStandardNormalWithZeroPaddingRow) {
  manual_seed(13);
  Embedding emb(EmbeddingOptions{.num_embeddings = 2000, .embedding_dim = 64, .padding_idx = -1});
  EXPECT_EQ(emb.padding_idx(), 1999);  // negative wraps, as PyTorch
  expect_normal(emb.weight().narrow(0, 0, 1999), 1.0);
  for (float v : emb.weight().select(0, 1999).to_vector<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(NnInit, RecurrentAndNormalisationDefaults) {
  manual_seed(14);
  LSTM lstm(LSTMOptions{.input_size = 100, .hidden_size = 64, .num_layers = 2});
  for (const auto& [name, p] : lstm.named_parameters()) {
    const Stats s = stats(p);
    EXPECT_GE(s.min, -0.125) << name;  // 1 / sqrt(64)
    EXPECT_LE(s.max, 0.125) << name;
  }
  expect_uniform(lstm.weight_ih(0), 0.125);
  BatchNorm2d bn(16);
  EXPECT_EQ(bn.weight().to_vector<float>(), std::vector<float>(16, 1.0f));
  EXPECT_EQ(bn.bias().to_vector<float>(), std::vector<float>(16, 0.0f));
  EXPECT_EQ(bn.running_mean().to_vector<float>(), std::vector<float>(16, 0.0f));
  EXPECT_EQ(bn.running_var().to_vector<float>(), std::vector<float>(16, 1.0f));
  EXPECT_EQ(bn.num_batches_tracked().dtype(), DType::i64);
  EXPECT_EQ(bn.num_batches_tracked().dim(), 0);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 0);
  LayerNorm ln(Shape{4, 5});
  EXPECT_EQ(ln.weight().to_vector<float>(), std::vector<float>(20, 1.0f));
  EXPECT_EQ(ln.bias().to_vector<float>(), std::vector<float>(20, 0.0f));
}

TEST(NnInit, InitialiserFormulas) {
  manual_seed(15);
  Tensor w = empty({256, 512});
  init::kaiming_normal_(w, {.nonlinearity = init::Nonlinearity::relu});
  expect_normal(w, std::sqrt(2.0 / 512.0));
  init::kaiming_normal_(w, {.mode = init::FanMode::fan_out, .nonlinearity = init::Nonlinearity::relu});
  expect_normal(w, std::sqrt(2.0 / 256.0));
  init::kaiming_uniform_(w, {.nonlinearity = init::Nonlinearity::relu});
  expect_uniform(w, std::sqrt(2.0) * std::sqrt(3.0 / 512.0));
  init::xavier_uniform_(w);
  expect_uniform(w, std::sqrt(6.0 / 768.0));
  init::xavier_normal_(w, 2.0);
  expect_normal(w, 2.0 * std::sqrt(2.0 / 768.0));
  init::uniform_(w, 2.0, 4.0);
  EXPECT_NEAR(stats(w).mean, 3.0, 6 * (1.0 / std::sqrt(3.0)) / std::sqrt(131072.0));
  init::normal_(w, -1.0, 0.5);
  EXPECT_NEAR(stats(w).mean, -1.0, 6 * 0.5 / std::sqrt(131072.0));
  init::constant_(w, 0.75);
  EXPECT_EQ(stats(w).min, 0.75);
  EXPECT_EQ(stats(w).max, 0.75);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::tanh), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::leaky_relu, std::sqrt(5.0)), std::sqrt(1.0 / 3.0));
  EXPECT_EQ(init::calculate_fan_in_and_fan_out(empty({8, 3, 5, 5})), (std::pair<int64_t, int64_t>{75, 200}));
  EXPECT_THROW(init::xavier_uniform_(empty({10})), Error);  // fans need 2 dims
  // Low-precision tensors are drawn in f32 and rounded.
  Tensor h = empty({64, 64}, {.dtype = DType::bf16});
  init::uniform_(h, -1.0, 1.0);
  EXPECT_EQ(h.dtype(), DType::bf16);
  EXPECT_LE(stats(h).max, 1.0);
}

TEST(NnInit, SeededAndReproducible) {
  manual_seed(42);
  Linear a(16, 8);
  manual_seed(42);
  Linear b(16, 8);
  Linear c(16, 8);  // the next draws: different
  EXPECT_EQ(a.weight().to_vector<float>(), b.weight().to_vector<float>());
  EXPECT_EQ(a.bias().to_vector<float>(), b.bias().to_vector<float>());
  EXPECT_NE(a.weight().to_vector<float>(), c.weight().to_vector<float>());
}

// models::sample_token (Note [sampling the next token]): greedy, top-k, reproducible draws, and frequencies that
// match softmax(logits / T) over the k largest logits.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "mp/core/error.hpp"
#include "mp/models/sampling.hpp"
#include "mp/ops/ops.hpp"
#include "test_util.hpp"

using namespace mp;
using namespace mp::models;

namespace {

const std::vector<float> kLogits = {0.5f, 2.0f, -1.0f, 1.5f, 3.0f, 0.0f, 2.5f, -0.5f, 1.0f, 2.9f};

}  // namespace

TEST(Sampling, GreedyAndTopOneTakeTheArgmax) {
  for (uint64_t pos = 0; pos < 20; ++pos) {
    EXPECT_EQ(sample_token(kLogits, {.temperature = 0.0, .top_k = 0, .seed = 3}, pos), 4);
    EXPECT_EQ(sample_token(kLogits, {.temperature = 0.0, .top_k = 5, .seed = 3}, pos), 4);
    EXPECT_EQ(sample_token(kLogits, {.temperature = 1.5, .top_k = 1, .seed = pos}, pos), 4);
  }
  // Ties: the lowest id, greedy or top-1.
  const std::vector<float> tie = {1.0f, 7.0f, 7.0f, 3.0f};
  EXPECT_EQ(sample_token(tie, {.temperature = 0.0}, 0), 1);
  EXPECT_EQ(sample_token(tie, {.temperature = 1.0, .top_k = 1}, 0), 1);
  // A tensor in any floating dtype, [V] or [1, V].
  const Tensor t = from_vector(kLogits, {1, 10}).to(DType::bf16);
  EXPECT_EQ(sample_token(t, {.temperature = 0.0}, 0), 4);
  EXPECT_EQ(sample_token(t.reshape({10}), {.temperature = 0.0}, 0), 4);
}

TEST(Sampling, AFixedSeedGivesTheSameTokens) {
  std::vector<int64_t> a, b, c;
  for (uint64_t pos = 0; pos < 200; ++pos) {
    a.push_back(sample_token(kLogits, {.temperature = 1.0, .top_k = 0, .seed = 42}, pos));
    b.push_back(sample_token(kLogits, {.temperature = 1.0, .top_k = 0, .seed = 42}, pos));
    c.push_back(sample_token(kLogits, {.temperature = 1.0, .top_k = 0, .seed = 43}, pos));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Sampling leaves the default generator alone.
  manual_seed(5);
  const uint64_t before = default_generator().offset();
  (void)sample_token(kLogits, {.temperature = 1.0}, 0);
  EXPECT_EQ(default_generator().offset(), before);
}

// Over N draws a token of probability p appears N p +- sqrt(N p (1 - p)) times; every count must be within 5 of those
// standard deviations (for the 10 tokens together a false failure has probability < 1e-5), and the tokens outside
// the top k never appear.
TEST(Sampling, FrequenciesMatchTheSoftmaxOverTheTopK) {
  const int64_t N = 200000;
  for (const auto& [T, k] : std::vector<std::pair<double, int64_t>>{{1.0, 0}, {0.7, 4}, {2.0, 6}}) {
    SCOPED_TRACE("temperature " + std::to_string(T) + ", top_k " + std::to_string(k));
    std::vector<float> sorted = kLogits;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    const float threshold = k == 0 ? -INFINITY : sorted[static_cast<size_t>(k - 1)];
    std::vector<double> p(kLogits.size(), 0.0);
    double total = 0;
    for (size_t i = 0; i < p.size(); ++i)
      if (kLogits[i] >= threshold) total += p[i] = std::exp(kLogits[i] / T);
    for (double& x : p) x /= total;
    std::vector<int64_t> count(kLogits.size(), 0);
    for (int64_t n = 0; n < N; ++n) ++count[static_cast<size_t>(sample_token(kLogits, {T, k, 7}, n))];
    for (size_t i = 0; i < p.size(); ++i) {
      const double mean = static_cast<double>(N) * p[i], sd = std::sqrt(static_cast<double>(N) * p[i] * (1 - p[i]));
      if (p[i] == 0) {
        EXPECT_EQ(count[i], 0) << "token " << i << " is outside the top " << k;
      } else {
        EXPECT_NEAR(static_cast<double>(count[i]), mean, 5 * sd) << "token " << i << ", p = " << p[i];
      }
    }
  }
}

TEST(Sampling, RefusesBadOptionsAndNaN) {
  EXPECT_THROW((void)sample_token(kLogits, {.temperature = -1.0}, 0), Error);
  EXPECT_THROW((void)sample_token(kLogits, {.temperature = 1.0, .top_k = -2}, 0), Error);
  EXPECT_THROW((void)sample_token(std::vector<float>{}, {}, 0), Error);
  EXPECT_THROW((void)sample_token(std::vector<float>{1.0f, NAN}, {}, 0), Error);
  EXPECT_THROW((void)sample_token(from_vector(kLogits, {2, 5}), {}, 0), Error);
}

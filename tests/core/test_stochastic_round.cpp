// Stochastic rounding to f16/bf16 (Note [stochastic rounding], mp/core/stochastic_round.hpp): the
// probability of rounding up is exactly the position of x between its two neighbours, on a grid of
// random words; exact values, NaN, inf and overflow round as nearest-even does; signs are symmetric;
// subnormals work; the random words of a stream depend on (seed, step, tensor, element) only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>

#include "mp/core/stochastic_round.hpp"

using namespace mp;

namespace {

template <class T>
double value(T v) {
  return static_cast<double>(static_cast<float>(v));
}

// How many of the 65536 random words r = k << 16 (u = k 2^-16, evenly spread over [0, 1)) round x up
// in magnitude; checks that every result is one of the two neighbours lo, hi.
template <class T>
int64_t count_up(float x, double lo, double hi) {
  int64_t up = 0;
  for (uint32_t k = 0; k < 65536; ++k) {
    const double v = value(stochastic_round<T>(x, k << 16));
    if (std::abs(v) == std::abs(hi)) {
      ++up;
    } else {
      EXPECT_EQ(std::abs(v), std::abs(lo)) << x << " rounded to " << v;
      if (std::abs(v) != std::abs(lo)) return -1;
    }
    EXPECT_EQ(std::signbit(v), std::signbit(x)) << x;
  }
  return up;
}

template <class T>
void check_fractions(const char* name, double lo, double gap) {
  // x at 1/8, 3/8, 1/2 (a tie for nearest-even rounding) and 7/8 of the way from lo to lo + gap: exactly
  // that fraction of the grid rounds up, for +x and -x.
  for (int eighths : {1, 3, 4, 7}) {
    const double x = lo + gap * eighths / 8;
    ASSERT_EQ(static_cast<double>(static_cast<float>(x)), x) << name;
    for (double sign : {1.0, -1.0}) {
      EXPECT_EQ(count_up<T>(static_cast<float>(sign * x), sign * lo, sign * (lo + gap)), 65536 / 8 * eighths)
          << name << " x = " << sign * x << " (" << eighths << "/8 of the gap above " << lo << ")";
    }
  }
}

}  // namespace

TEST(StochasticRound, RoundsUpWithTheProbabilityOfTheDistance) {
  check_fractions<BFloat16>("bf16 at 1", 1.0, std::ldexp(1.0, -7));
  check_fractions<BFloat16>("bf16 at 3e5", 299008.0, 2048.0);  // 2^18 .. 2^19: ulp 2^11
  check_fractions<BFloat16>("bf16 subnormal", std::ldexp(5.0, -133), std::ldexp(1.0, -133));
  check_fractions<BFloat16>("bf16 from zero", 0.0, std::ldexp(1.0, -133));
  check_fractions<Half>("f16 at 1", 1.0, std::ldexp(1.0, -10));
  check_fractions<Half>("f16 at 1000", 1000.0, 0.5);
  check_fractions<Half>("f16 subnormal", std::ldexp(3.0, -24), std::ldexp(1.0, -24));
  check_fractions<Half>("f16 from zero", 0.0, std::ldexp(1.0, -24));
  check_fractions<Half>("f16 below its largest value", 65472.0, 32.0);
}

TEST(StochasticRound, ExactNanInfAndOverflowRoundAsNearestEven) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (uint32_t r : {0u, 0x7fffffffu, 0xffffffffu, 0x12345678u}) {
    // f16: exact values, +-inf, and values beyond the overflow threshold (nearest-even gives inf)
    for (float x : {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 0x1p-24f, inf, -inf, 70000.0f, -1e6f, 3.0e38f})
      EXPECT_EQ(stochastic_round<Half>(x, r).bits(), Half(x).bits()) << x << " r " << r;
    // bf16: exact values (its range is f32's: no finite overflow) and +-inf
    for (float x : {0.0f, -0.0f, 1.0f, -2.5f, 65536.0f, 0x1p-133f, 0x1p127f, -0x1.fep127f, inf, -inf})
      EXPECT_EQ(stochastic_round<BFloat16>(x, r).bits(), BFloat16(x).bits()) << x << " r " << r;
    EXPECT_TRUE(std::isnan(value(stochastic_round<Half>(nan, r))));
    EXPECT_TRUE(std::isnan(value(stochastic_round<BFloat16>(nan, r))));
    EXPECT_EQ(stochastic_round<BFloat16>(inf, r).bits(), BFloat16(inf).bits());
  }
  // Beyond f16's overflow threshold (65520) nearest-even gives inf, and so does stochastic rounding;
  // between the largest finite value and the threshold the result stays finite whatever r is.
  EXPECT_TRUE(std::isinf(value(stochastic_round<Half>(65536.0f, 0xffffffffu))));
  EXPECT_EQ(value(stochastic_round<Half>(65510.0f, 0u)), 65504.0);
  EXPECT_EQ(value(stochastic_round<Half>(65510.0f, 0xffffffffu)), 65504.0);
}

TEST(StochasticRound, SignsAreSymmetric) {
  for (uint32_t k = 0; k < 4096; ++k) {
    const uint32_t r = k * 2654435761u;
    const float x = 1.0f + static_cast<float>(k) * 3.1e-5f;
    EXPECT_EQ(value(stochastic_round<BFloat16>(-x, r)), -value(stochastic_round<BFloat16>(x, r))) << x;
    EXPECT_EQ(value(stochastic_round<Half>(-x, r)), -value(stochastic_round<Half>(x, r))) << x;
  }
}

TEST(StochasticRound, StreamWordsDependOnSeedStepTensorAndElementOnly) {
  const RoundingStream s{.on = true, .seed = 42, .step = 3, .tensor = 1};
  const U32x4 a = rounding_block(s, 10), b = rounding_block(s, 10);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(a.v[w], b.v[w]);
  // Blocks, steps, tensors and seeds each give other words (a collision of all four words has
  // probability 2^-128).
  std::set<std::string> seen;
  auto key = [](const U32x4& u) {
    return std::to_string(u.v[0]) + "," + std::to_string(u.v[1]) + "," + std::to_string(u.v[2]) + "," +
           std::to_string(u.v[3]);
  };
  seen.insert(key(a));
  EXPECT_TRUE(seen.insert(key(rounding_block(s, 11))).second);
  EXPECT_TRUE(seen.insert(key(rounding_block({.on = true, .seed = 42, .step = 4, .tensor = 1}, 10))).second);
  EXPECT_TRUE(seen.insert(key(rounding_block({.on = true, .seed = 42, .step = 3, .tensor = 2}, 10))).second);
  EXPECT_TRUE(seen.insert(key(rounding_block({.on = true, .seed = 43, .step = 3, .tensor = 1}, 10))).second);
  // Sub-stream (0, 0) is the plain stream of the seed (Note [Philox stream convention]).
  const U32x4 plain = philox4x32_10(U32x4{{10, 0, 0, 0}}, 42, 0);
  const U32x4 sub = rounding_block({.on = true, .seed = 42, .step = 0, .tensor = 0}, 10);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(sub.v[w], plain.v[w]);
}

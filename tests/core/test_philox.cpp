// Philox4x32-10 known answers, the stream convention, distribution checks with stated bounds,
// determinism and independence from the partitioning, and the Generator.
#include "mp/core/philox.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace {

using mp::U32x4;

void expect_block(const U32x4& got, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  EXPECT_EQ(got.v[0], a);
  EXPECT_EQ(got.v[1], b);
  EXPECT_EQ(got.v[2], c);
  EXPECT_EQ(got.v[3], d);
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

constexpr uint64_t kSeed = 0x0123456789abcdefull;
constexpr size_t kN = size_t{1} << 22;  // draws per statistical test

}  // namespace

// Random123 kat_vectors, "philox4x32 10" lines (counter words, key words -> output words).
TEST(Philox, KnownAnswerVectors) {
  expect_block(mp::philox4x32_10(U32x4{{0, 0, 0, 0}}, 0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
  expect_block(mp::philox4x32_10(U32x4{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu),
               0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
  expect_block(mp::philox4x32_10(U32x4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u),
               0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

// Note [Philox stream convention]: draw j = word j % 4 of block j / 4, counter {lo, hi, 0, 0}, key = seed.
TEST(Philox, StreamConvention) {
  for (uint64_t offset : {uint64_t{0}, uint64_t{4}, uint64_t{7}, (uint64_t{1} << 34) - 3, ~uint64_t{0} - 16}) {
    for (uint64_t i = 0; i < 12; ++i) {
      const uint64_t j = offset + i;
      const U32x4 b = mp::philox4x32_10(U32x4{{static_cast<uint32_t>(j >> 2), static_cast<uint32_t>(j >> 34), 0, 0}},
                                        static_cast<uint32_t>(kSeed), static_cast<uint32_t>(kSeed >> 32));
      EXPECT_EQ(mp::philox_u32(kSeed, offset, i), b.v[j & 3]) << "offset " << offset << " i " << i;
      EXPECT_EQ(mp::philox_u32(kSeed, offset, i), mp::philox_u32(kSeed, 0, j));  // depends on offset + i only
      EXPECT_EQ(bits_of(mp::philox_uniform(kSeed, offset, i)),
                bits_of(static_cast<float>(b.v[j & 3] >> 8) * std::ldexp(1.0f, -24)));
    }
  }
  // The seed's high word is part of the key.
  EXPECT_NE(mp::philox_u32(1, 0, 0), mp::philox_u32(1 | (uint64_t{1} << 32), 0, 0));
}

TEST(Philox, BlocksSoaMatchTheScalarBlocks) {
  // philox_blocks_soa computes kPhiloxLanes blocks side by side; every word must equal philox_block's,
  // for partial last groups and across the carry of the counter's low word into its high word.
  for (uint64_t first : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) - 7, ~uint64_t{0} - 40}) {
    for (int64_t n : {1, 15, 16, 17, 40}) {
      std::vector<uint32_t> out(static_cast<size_t>(4 * n) + 64, 0xdeadbeefu);
      mp::philox_blocks_soa(kSeed, first, n, out.data());
      for (int64_t k = 0; k < n; ++k) {
        const U32x4 b = mp::philox_block(kSeed, first + static_cast<uint64_t>(k));
        for (int w = 0; w < 4; ++w)
          ASSERT_EQ(out[static_cast<size_t>(4 * k + w)], b.v[w])
              << "first " << first << " block " << k << " word " << w;
      }
      EXPECT_EQ(out[static_cast<size_t>(4 * n)], 0xdeadbeefu) << "wrote past the last block";
    }
  }
}

TEST(Philox, UniformRangeMeanVariance) {
  std::vector<float> u(kN);
  mp::philox_fill_uniform(kSeed, 0, u.data(), kN);
  double sum = 0, sum_sq = 0;
  for (float x : u) {
    ASSERT_GE(x, 0.0f);
    ASSERT_LT(x, 1.0f);
    ASSERT_EQ(std::ldexp(x, 24), std::floor(std::ldexp(x, 24)));  // on the 2^-24 grid
    sum += x;
  }
  const double mean = sum / kN;
  for (float x : u) sum_sq += (x - mean) * (x - mean);
  const double var = sum_sq / kN;
  // 5 sigma bounds: sd(mean) = sqrt(1/12 / N) = 1.4e-4; sd(var) = sqrt((1/80 - 1/144) / N) = 3.6e-5.
  EXPECT_NEAR(mean, 0.5, 7.2e-4);
  EXPECT_NEAR(var, 1.0 / 12.0, 1.9e-4);
}

// Chi-square goodness of fit on 1024 equal bins, N = 4M draws (4096 expected per bin).
// With 1023 degrees of freedom chi2 has mean 1023 and sd sqrt(2 * 1023) = 45.2; we accept
// 1023 +- 6 sd = [752, 1294] (too small would mean "too uniform", also a defect).
TEST(Philox, UniformChiSquare) {
  constexpr int kBins = 1024;
  std::vector<float> u(kN);
  mp::philox_fill_uniform(kSeed ^ 0x5555u, 12345 * 4, u.data(), kN);
  std::vector<double> count(kBins, 0.0);
  for (float x : u) count[static_cast<size_t>(x * kBins)] += 1;
  const double expected = static_cast<double>(kN) / kBins;
  double chi2 = 0;
  for (double c : count) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_GT(chi2, 752.0);
  EXPECT_LT(chi2, 1294.0);
  // The same on the low byte of the raw words (bits the uniform mapping drops): 256 bins,
  // 255 dof, mean 255, sd 22.6, accepted [119, 391].
  std::vector<double> low(256, 0.0);
  for (uint64_t i = 0; i < kN; ++i) low[mp::philox_u32(kSeed, 0, i) & 0xffu] += 1;
  const double expected_low = static_cast<double>(kN) / 256;
  double chi2_low = 0;
  for (double c : low) chi2_low += (c - expected_low) * (c - expected_low) / expected_low;
  EXPECT_GT(chi2_low, 119.0);
  EXPECT_LT(chi2_low, 391.0);
}

// Normal moments, N = 4M, 5 sigma bounds: sd(mean) = 1/sqrt(N) = 4.9e-4; sd(var) = sqrt(2/N) = 6.9e-4
// (so std within 1 +- 1.8e-3); P(|z| < 1) = 0.682689 with sd sqrt(p(1-p)/N) = 2.3e-4;
// P(|z| > 3) = 0.0026998 with sd 2.5e-5; kurtosis 3 with sd sqrt(96/N) = 4.8e-3.
TEST(Philox, NormalMoments) {
  std::vector<float> z(kN);
  mp::philox_fill_normal(kSeed, 0, z.data(), kN);
  double sum = 0;
  for (float x : z) {
    ASSERT_TRUE(std::isfinite(x));
    ASSERT_LE(std::fabs(x), 6.67f);  // sqrt(-2 ln 2^-32)
    sum += x;
  }
  const double mean = sum / kN;
  double m2 = 0, m4 = 0, within1 = 0, beyond3 = 0;
  for (float x : z) {
    const double d = x - mean;
    m2 += d * d;
    m4 += d * d * d * d;
    within1 += std::fabs(x) < 1.0f ? 1 : 0;
    beyond3 += std::fabs(x) > 3.0f ? 1 : 0;
  }
  m2 /= kN;
  m4 /= kN;
  EXPECT_NEAR(mean, 0.0, 2.5e-3);
  EXPECT_NEAR(std::sqrt(m2), 1.0, 1.8e-3);
  EXPECT_NEAR(within1 / kN, 0.682689, 1.2e-3);
  EXPECT_NEAR(beyond3 / kN, 0.0026998, 1.3e-4);
  EXPECT_NEAR(m4 / (m2 * m2), 3.0, 2.4e-2);
}

// Serial correlation of neighbours (lag 1, 2, 4) and of the Box-Muller partners (2k, 2k + 1):
// each |r| < 5 / sqrt(N) = 2.4e-3.
TEST(Philox, NeighboursUncorrelated) {
  std::vector<float> u(kN), z(kN);
  mp::philox_fill_uniform(kSeed, 0, u.data(), kN);
  mp::philox_fill_normal(kSeed, 0, z.data(), kN);
  auto corr = [](const std::vector<float>& v, size_t lag, size_t stride) {
    double sa = 0, sb = 0, saa = 0, sbb = 0, sab = 0, m = 0;
    for (size_t i = 0; i + lag < v.size(); i += stride) {
      const double a = v[i], b = v[i + lag];
      sa += a, sb += b, saa += a * a, sbb += b * b, sab += a * b, m += 1;
    }
    const double cov = sab / m - (sa / m) * (sb / m);
    return cov / std::sqrt((saa / m - (sa / m) * (sa / m)) * (sbb / m - (sb / m) * (sb / m)));
  };
  for (size_t lag : {1, 2, 4}) {
    EXPECT_LT(std::fabs(corr(u, lag, 1)), 2.4e-3) << "uniform lag " << lag;
    EXPECT_LT(std::fabs(corr(z, lag, 1)), 2.4e-3) << "normal lag " << lag;
  }
  EXPECT_LT(std::fabs(corr(z, 1, 2)), 3.4e-3) << "Box-Muller partners";  // N/2 pairs: 5 / sqrt(N/2)
}

TEST(Philox, DeterministicAndSeedSensitive) {
  std::vector<float> a(1000), b(1000), c(1000);
  mp::philox_fill_normal(42, 8, a.data(), a.size());
  mp::philox_fill_normal(42, 8, b.data(), b.size());
  mp::philox_fill_normal(43, 8, c.data(), c.size());
  EXPECT_EQ(a, b);
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == c[i] ? 1 : 0;
  EXPECT_LT(same, 3u);
}

// Element i depends only on (seed, offset, i): the per-element functions (what a CUDA thread
// computes), the parallel bulk fill and any split into pieces at odd boundaries agree bit for bit.
TEST(Philox, IndependentOfPartitioning) {
  constexpr size_t n = 200003;  // above the parallel threshold, not a multiple of 4
  for (uint64_t offset : {uint64_t{0}, uint64_t{4096}, uint64_t{6}}) {
    std::vector<float> bulk_u(n), bulk_z(n), split_u(n), split_z(n);
    mp::philox_fill_uniform(kSeed, offset, bulk_u.data(), n);
    mp::philox_fill_normal(kSeed, offset, bulk_z.data(), n);
    const size_t cuts[] = {0, 1, 7, 4099, 65541, 131077, n};
    for (size_t c = 0; c + 1 < std::size(cuts); ++c) {
      const size_t b = cuts[c], e = cuts[c + 1];
      mp::philox_fill_uniform(kSeed, offset + b, split_u.data() + b, e - b);
      mp::philox_fill_normal(kSeed, offset + b, split_z.data() + b, e - b);
    }
    for (size_t k = 0; k < n; ++k) {
      const size_t i = n - 1 - k;  // reverse order, one element at a time
      ASSERT_EQ(bits_of(bulk_u[i]), bits_of(mp::philox_uniform(kSeed, offset, i))) << i;
      ASSERT_EQ(bits_of(bulk_z[i]), bits_of(mp::philox_normal(kSeed, offset, i))) << i;
      ASSERT_EQ(bits_of(bulk_u[i]), bits_of(split_u[i])) << i;
      ASSERT_EQ(bits_of(bulk_z[i]), bits_of(split_z[i])) << i;
    }
  }
}

TEST(Generator, AdvanceReservesWholeBlocks) {
  mp::Generator g(7);
  EXPECT_EQ(g.seed(), 7u);
  EXPECT_EQ(g.offset(), 0u);
  EXPECT_EQ(g.advance(10), 0u);  // 10 draws -> 12 (3 blocks)
  EXPECT_EQ(g.advance(0), 12u);
  EXPECT_EQ(g.advance(4), 12u);
  EXPECT_EQ(g.offset(), 16u);
  const mp::PhiloxState s = g.reserve(1);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_EQ(s.offset, 16u);
  EXPECT_EQ(g.offset(), 20u);
  g.set_state(99, 5);
  EXPECT_EQ(g.state().seed, 99u);
  EXPECT_EQ(g.state().offset, 5u);
  const mp::Generator copy = g;
  EXPECT_EQ(copy.offset(), 5u);
  EXPECT_EQ(copy.seed(), 99u);
}

// Tensors drawn one after another never share a draw.
TEST(Generator, ConsecutiveDrawsDoNotOverlap) {
  mp::Generator g(11);
  const uint64_t a = g.advance(6), b = g.advance(3);
  EXPECT_GE(b, a + 6);
  std::set<uint32_t> seen;
  for (uint64_t i = 0; i < 6; ++i) seen.insert(mp::philox_u32(g.seed(), a, i));
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(seen.count(mp::philox_u32(g.seed(), b, i)), 0u);
}

TEST(Generator, ThreadSafeReservations) {
  mp::Generator g(3);
  constexpr int kThreads = 4, kPerThread = 5000;
  std::vector<std::vector<uint64_t>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&g, &got, t] {
      for (int k = 0; k < kPerThread; ++k) got[t].push_back(g.advance(5));  // 8 draws each
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint64_t> all;
  for (const auto& v : got) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
  EXPECT_EQ(g.offset(), uint64_t{8} * kThreads * kPerThread);
  EXPECT_EQ(*all.rbegin(), uint64_t{8} * (kThreads * kPerThread - 1));
}

TEST(Generator, ManualSeedResetsDefault) {
  mp::manual_seed(1234);
  EXPECT_EQ(mp::default_generator().seed(), 1234u);
  EXPECT_EQ(mp::default_generator().offset(), 0u);
  const uint64_t first = mp::default_generator().advance(100);
  mp::manual_seed(1234);
  EXPECT_EQ(mp::default_generator().advance(100), first);
  EXPECT_EQ(&mp::default_generator(), &mp::default_generator());
  mp::manual_seed(mp::Generator::kDefaultSeed);
}

// Note [draws keyed by the global batch]: three shards of a batch-major tensor of 3 x 5 draws take the draws the
// whole tensor takes in one process (rows in rank order), every shard's stream ends where the whole one does, and a
// generator without a shard reserves as reserve() does.
TEST(Generator, BatchShardsTakeTheWholeBatchsDraws) {
  mp::Generator whole(21);
  whole.advance(2);  // an offset that is not a block boundary after the shards' parts
  const mp::PhiloxState w = whole.reserve_batch(15);
  EXPECT_EQ(whole.offset(), 4u + 16u);
  for (int r = 0; r < 3; ++r) {
    mp::Generator part(21);
    part.advance(2);
    part.set_batch_shard(r, 3);
    const mp::PhiloxState p = part.reserve_batch(5);
    EXPECT_EQ(part.offset(), whole.offset()) << r;
    for (uint64_t i = 0; i < 5; ++i)
      EXPECT_EQ(mp::philox_u32(p.seed, p.offset, i), mp::philox_u32(w.seed, w.offset, 5 * r + i)) << r << " " << i;
  }
  mp::Generator g(5);
  EXPECT_THROW(g.set_batch_shard(3, 3), std::exception);
  EXPECT_THROW(g.set_batch_shard(0, 0), std::exception);
}

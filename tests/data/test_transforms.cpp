// Rng, image transforms, ImageDataset and channel_stats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "mp/data/dataset.hpp"
#include "mp/data/transforms.hpp"
#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using namespace mp::data;
using mp::test::error_of;

namespace {

// An f32 [C,H,W] image with pixel (c,y,x) = 1 + c*100 + y*10 + x (all distinct and non-zero).
Tensor ramp_image(int64_t C, int64_t H, int64_t W) {
  std::vector<float> v;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) v.push_back(static_cast<float>(1 + c * 100 + y * 10 + x));
  return from_vector<float>(v, {C, H, W});
}

float at(const std::vector<float>& v, int64_t H, int64_t W, int64_t c, int64_t y, int64_t x) {
  return v[static_cast<size_t>((c * H + y) * W + x)];
}

TEST(Rng, DeterministicPerSeedAndStream) {
  Rng a(42, 7), b(42, 7), c(42, 8), d(43, 7);
  std::vector<uint32_t> va, vb, vc, vd;
  for (int i = 0; i < 10; ++i) {
    va.push_back(a.next_u32());
    vb.push_back(b.next_u32());
    vc.push_back(c.next_u32());
    vd.push_back(d.next_u32());
  }
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  EXPECT_NE(va, vd);
  // Stream 0 is Philox with counter words 2-3 = 0: the factories' stream of the same key
  // (Note [data random streams]), so these words are philox_u32's.
  Rng z(42, 0);
  for (uint64_t i = 0; i < 6; ++i) EXPECT_EQ(z.next_u32(), philox_u32(42, 0, i));
}

TEST(Rng, UniformAndRandintRanges) {
  Rng r(1, 2);
  std::vector<int> hist(10, 0);
  const int draws = 100000;
  for (int i = 0; i < draws; ++i) {
    const float u = r.uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    const int64_t k = r.randint(10);
    ASSERT_GE(k, 0);
    ASSERT_LT(k, 10);
    ++hist[static_cast<size_t>(k)];
  }
  // Each bucket ~ Binomial(1e5, 0.1): std 95, so +-600 is over 6 sigma.
  for (int c : hist) EXPECT_NEAR(c, draws / 10, 600);
  EXPECT_EQ(r.randint(1), 0);
  EXPECT_THROW(r.randint(0), Error);
}

TEST(Transforms, RandomCropWithPaddingShiftsContent) {
  const int64_t C = 2, H = 5, W = 6, p = 2;
  const Tensor img = ramp_image(C, H, W);
  const std::vector<float> in = img.to_vector<float>();
  const auto crop = random_crop(H, p);  // crop back to the height: output 5x5 from the padded 9x10
  std::set<std::pair<int64_t, int64_t>> shifts;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    Rng rng(seed, 0);
    const Tensor out = (*crop)(img, rng);
    ASSERT_EQ(out.sizes(), (Shape{C, H, H}));
    const std::vector<float> o = out.to_vector<float>();
    // The output is the input shifted by (top, left) in [-p, p] x [-p, W - H + p], zeros outside.
    // Find the shift from the first non-zero pixel of channel 0, then check every pixel.
    int64_t found = 0;
    for (int64_t top = -p; top <= H + p - H; ++top) {
      for (int64_t left = -p; left <= W + p - H; ++left) {
        bool match = true;
        for (int64_t c = 0; c < C && match; ++c)
          for (int64_t y = 0; y < H && match; ++y)
            for (int64_t x = 0; x < H && match; ++x) {
              const int64_t sy = y + top, sx = x + left;
              const float want = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? at(in, H, W, c, sy, sx) : 0.0f;
              match = at(o, H, H, c, y, x) == want;
            }
        if (match) {
          ++found;
          shifts.insert({top, left});
        }
      }
    }
    ASSERT_EQ(found, 1) << "seed " << seed << ": the crop is not exactly one shifted window";
  }
  // All (2p+1) x (W-H+2p+1) = 5 x 6 windows occur in 400 draws (each has probability 1/30: the chance
  // that a given one never appears is (29/30)^400 ~ 1e-6).
  EXPECT_EQ(shifts.size(), 30u);
  // Padding 0 and the full size: the identity.
  Rng rng(3, 0);
  EXPECT_EQ((*random_crop(H, 0))(ramp_image(1, H, H), rng).to_vector<float>(), ramp_image(1, H, H).to_vector<float>());
  EXPECT_NE(error_of([&] { (*random_crop(10, 2))(img, rng); }).find("at least the crop size 10"), std::string::npos);
}

TEST(Transforms, HorizontalFlipMirrors) {
  const int64_t C = 3, H = 4, W = 5;
  const Tensor img = ramp_image(C, H, W);
  const std::vector<float> in = img.to_vector<float>();
  Rng rng(0, 0);
  const std::vector<float> f = (*random_horizontal_flip(1.0))(img, rng).to_vector<float>();
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) EXPECT_EQ(at(f, H, W, c, y, x), at(in, H, W, c, y, W - 1 - x));
  EXPECT_EQ((*random_horizontal_flip(0.0))(img, rng).to_vector<float>(), in);
  // p = 0.5: the number flipped in 1000 examples ~ Binomial(1000, 0.5), std 15.8; +-100 is over 6 sigma.
  int flipped = 0;
  const auto flip = random_horizontal_flip(0.5);
  for (uint64_t s = 0; s < 1000; ++s) {
    Rng r(s, 0);
    flipped += (*flip)(img, r).to_vector<float>() != in;
  }
  EXPECT_NEAR(flipped, 500, 100);
}

TEST(Transforms, NormalizePerChannel) {
  const Tensor img = ramp_image(2, 3, 3);
  Rng rng(0, 0);
  const std::vector<float> mean = {10.0f, 150.0f}, std = {2.0f, 4.0f};
  const std::vector<float> in = img.to_vector<float>(), out = (*normalize(mean, std))(img, rng).to_vector<float>();
  for (size_t i = 0; i < in.size(); ++i) {
    const size_t c = i / 9;
    // Multiplying by 1/std (a power of two here) is exact, so the results match exactly.
    EXPECT_EQ(out[i], (in[i] - mean[c]) / std[c]) << i;
  }
  // One value for every channel.
  EXPECT_EQ((*normalize({1.0f}, {0.5f}))(img, rng).to_vector<float>()[0], 0.0f);
  EXPECT_NE(error_of([&] {
              (*normalize({0.1f, 0.2f, 0.3f}, {1, 1, 1}))(img, rng);
            }).find("3-channel"),
            std::string::npos);
  EXPECT_NE(error_of([&] { normalize({0.1f}, {0.0f}); }).find("std > 0"), std::string::npos);
  EXPECT_NE(error_of([&] { normalize({0.1f, 0.2f}, {1.0f}); }).find("same non-zero length"), std::string::npos);
}

TEST(Transforms, ResizeBilinear) {
  Rng rng(0, 0);
  // A constant stays constant (the weights of each output pixel sum to 1 and blend equal values).
  const Tensor c = full({3, 7, 5}, 0.37);
  for (int64_t s : {1, 3, 7, 16}) {
    const Tensor r = (*resize(s))(c, rng);
    ASSERT_EQ(r.sizes(), (Shape{3, s, s}));
    for (float v : r.to_vector<float>()) ASSERT_EQ(v, 0.37f) << "size " << s;
  }
  // 2x2 -> 4x4, half-pixel centres: source coordinates 0, 0.25, 0.75, 1 along each axis
  // (torch.nn.functional.interpolate(mode="bilinear", align_corners=False) gives the same table).
  const Tensor small = from_vector<float>({0, 1, 2, 3}, {1, 2, 2});
  const std::vector<float> want = {0.0f, 0.25f, 0.75f, 1.0f, 0.5f, 0.75f, 1.25f, 1.5f,
                                   1.5f, 1.75f, 2.25f, 2.5f, 2.0f, 2.25f, 2.75f, 3.0f};
  EXPECT_EQ((*resize(4))(small, rng).to_vector<float>(), want);  // exact: dyadic weights and values
  // 4x4 -> 2x2 samples at source 0.5 and 2.5: the mean of each 2x2 block of a linear ramp.
  const Tensor big = from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {1, 4, 4});
  EXPECT_EQ((*resize(2))(big, rng).to_vector<float>(), (std::vector<float>{2.5f, 4.5f, 10.5f, 12.5f}));
}

TEST(Transforms, ComposeIsDeterministicPerSeed) {
  const Tensor img = ramp_image(3, 8, 8);
  const auto t = compose({random_crop(8, 2), random_horizontal_flip(), nullptr, normalize({1, 2, 3}, {2, 2, 2})});
  std::set<std::vector<float>> distinct;
  for (uint64_t s = 0; s < 20; ++s) {
    Rng a(s, 5), b(s, 5);
    const std::vector<float> x = (*t)(img, a).to_vector<float>();
    EXPECT_EQ(x, (*t)(img, b).to_vector<float>()) << "seed " << s;
    distinct.insert(x);
  }
  // 25 crops x 2 flips = 50 outcomes; 20 draws all landing on <= 5 of them would mean the seed is ignored.
  EXPECT_GT(distinct.size(), 5u);
  // The input is never modified.
  EXPECT_EQ(img.to_vector<float>(), ramp_image(3, 8, 8).to_vector<float>());
}

ImageData small_images(int64_t N, int64_t C, int64_t H, int64_t W) {
  std::vector<uint8_t> px(static_cast<size_t>(N * C * H * W));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 13 + 5) % 256);
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < N; ++i) labels.push_back(i % 3);
  return {from_vector<uint8_t>(px, {N, C, H, W}), from_vector<int64_t>(labels, {N}), 3, {"a", "b", "c"}};
}

TEST(ImageDataset, ScalesBytesAndGathersLabels) {
  const ImageDataset ds(small_images(6, 2, 3, 4));
  EXPECT_EQ(ds.size(), 6);
  EXPECT_EQ(ds.channels(), 2);
  EXPECT_EQ(ds.height(), 3);
  EXPECT_EQ(ds.width(), 4);
  const std::vector<int64_t> idx = {4, 0, 4};
  const Batch b = ds.get_batch(idx, 0);
  ASSERT_EQ(b.input.sizes(), (Shape{3, 2, 3, 4}));
  EXPECT_EQ(b.input.dtype(), DType::f32);
  EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1}));
  const std::vector<uint8_t> px = ds.data().images.to_vector<uint8_t>();
  const std::vector<float> in = b.input.to_vector<float>();
  for (size_t p = 0; p < idx.size(); ++p)
    for (size_t k = 0; k < 24; ++k)  // exactly torchvision's ToTensor: v / 255 in float
      ASSERT_EQ(in[p * 24 + k], static_cast<float>(px[static_cast<size_t>(idx[p]) * 24 + k]) / 255.0f);
  const std::vector<int64_t> bad = {6};
  EXPECT_NE(error_of([&] { ds.get_batch(bad, 0); }).find("expected indices in [0, 6), got 6"), std::string::npos);
  EXPECT_THROW(ds.get_batch({}, 0), Error);
  EXPECT_THROW(ImageDataset(ImageData{zeros({2, 3, 3}), zeros({2}, {.dtype = DType::i64})}), Error);
}

TEST(ImageDataset, TransformPerExampleWithPositionStream) {
  const ImageData data = small_images(5, 3, 6, 6);
  const auto t = compose({random_crop(4, 1), random_horizontal_flip()});
  const ImageDataset ds(data, t);
  const ImageDataset plain(data);
  const std::vector<int64_t> idx = {3, 1, 4, 1};
  const Batch b = ds.get_batch(idx, 99);
  ASSERT_EQ(b.input.sizes(), (Shape{4, 3, 4, 4}));
  // Example at position p = the transform of the scaled image with Rng(seed, p).
  const Tensor scaled = plain.get_batch(idx, 0).input;
  for (int64_t p = 0; p < 4; ++p) {
    Rng rng(99, static_cast<uint64_t>(p));
    EXPECT_EQ(b.input.select(0, p).to_vector<float>(), (*t)(scaled.select(0, p).contiguous(), rng).to_vector<float>());
  }
  // The same seed gives the same batch; another seed another one.
  EXPECT_EQ(ds.get_batch(idx, 99).input.to_vector<float>(), b.input.to_vector<float>());
  EXPECT_NE(ds.get_batch(idx, 100).input.to_vector<float>(), b.input.to_vector<float>());
}

TEST(ChannelStats, MeanAndStdPerChannel) {
  // Channel 0: all 255 (mean 1, std 0). Channel 1: half 0, half 255 (mean 0.5, std 0.5).
  // Channel 2: 51 everywhere (mean 0.2, std 0).
  std::vector<uint8_t> px;
  for (int n = 0; n < 2; ++n) {
    for (int k = 0; k < 4; ++k) px.push_back(255);
    for (int k = 0; k < 4; ++k) px.push_back(k < 2 ? 0 : 255);
    for (int k = 0; k < 4; ++k) px.push_back(51);
  }
  const ImageData d{from_vector<uint8_t>(px, {2, 3, 2, 2}), zeros({2}, {.dtype = DType::i64}), 1, {}};
  const auto [mean, std] = channel_stats(d);
  // Computed in double from exact integer sums, rounded once to float.
  EXPECT_EQ(mean, (std::vector<float>{1.0f, 0.5f, 0.2f}));
  EXPECT_EQ(std, (std::vector<float>{0.0f, 0.5f, 0.0f}));
}

}  // namespace

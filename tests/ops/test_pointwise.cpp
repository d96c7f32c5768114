#include <gtest/gtest.h>

#include <cmath>

#include "mp/mp.hpp"

using namespace mp;

namespace {
Tensor f64(std::vector<double> v, Shape s) { return from_vector(v, s); }
}  // namespace

TEST(Pointwise, BroadcastArithmetic) {
  Tensor a = f64({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = f64({10, 20, 30}, {3});
  EXPECT_EQ((a + b).to_vector<double>(), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ((a - b).to_vector<double>(), (std::vector<double>{-9, -18, -27, -6, -15, -24}));
  EXPECT_EQ((a * b).to_vector<double>(), (std::vector<double>{10, 40, 90, 40, 100, 180}));
  EXPECT_EQ(add(a, b, 2.0).to_vector<double>(), (std::vector<double>{21, 42, 63, 24, 45, 66}));
  Tensor c = f64({1, 2}, {2, 1});
  EXPECT_EQ((a / c).to_vector<double>(), (std::vector<double>{1, 2, 3, 2, 2.5, 3}));
  EXPECT_EQ((a * 2.0).to_vector<double>(), (std::vector<double>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ((1.0 - a).to_vector<double>()[5], -5.0);
}

TEST(Pointwise, TypePromotion) {
  Tensor f = ones({2}, {.dtype = DType::f32});
  Tensor h = ones({2}, {.dtype = DType::f16});
  Tensor b = ones({2}, {.dtype = DType::bf16});
  Tensor i = ones({2}, {.dtype = DType::i64});
  EXPECT_EQ((f + h).dtype(), DType::f32);
  EXPECT_EQ((h + b).dtype(), DType::f32);
  EXPECT_EQ((h + h).dtype(), DType::f16);
  EXPECT_EQ((i + i).dtype(), DType::i64);
  EXPECT_EQ((i / i).dtype(), DType::f32);
  EXPECT_EQ((b + i).dtype(), DType::bf16);
  EXPECT_EQ(gt(f, h).dtype(), DType::b8);
}

TEST(Pointwise, UnaryValues) {
  Tensor x = f64({-2.0, -0.5, 0.0, 0.5, 3.0}, {5});
  auto r = relu(x).to_vector<double>();
  EXPECT_EQ(r, (std::vector<double>{0, 0, 0, 0.5, 3.0}));
  auto s = sigmoid(f64({-1000.0, 0.0, 1000.0}, {3})).to_vector<double>();
  EXPECT_EQ(s[0], 0.0);
  EXPECT_EQ(s[1], 0.5);
  EXPECT_EQ(s[2], 1.0);
  EXPECT_NEAR(gelu(f64({1.0}, {1})).item<double>(), 0.8413447460685429, 1e-15);
  // PyTorch's F.gelu(x, approximate='tanh') in f64 at 1, -2 and 3.
  EXPECT_NEAR(gelu(f64({1.0}, {1}), GeluApproximate::tanh).item<double>(), 0.8411919906082768, 1e-15);
  EXPECT_NEAR(gelu(f64({-2.0}, {1}), GeluApproximate::tanh).item<double>(), -0.04540230591222494, 1e-15);
  EXPECT_NEAR(gelu(f64({3.0}, {1}), GeluApproximate::tanh).item<double>(), 2.996362607918227, 1e-15);
  EXPECT_NEAR(tanh(f64({0.5}, {1})).item<double>(), std::tanh(0.5), 1e-15);
  EXPECT_EQ(clamp(x, -1.0, 1.0).to_vector<double>(), (std::vector<double>{-1, -0.5, 0, 0.5, 1}));
  EXPECT_TRUE(std::isnan(relu(f64({NAN}, {1})).item<double>()));
  EXPECT_EQ(where(gt(x, zeros({1}, {.dtype = DType::f64})), x, neg(x)).to_vector<double>(),
            (std::vector<double>{2, 0.5, 0, 0.5, 3}));
}

TEST(Pointwise, LowPrecisionComputesInFloat) {
  // 1 + 2^-9 is not representable in bf16, but (1 + 2^-9) * 2 - 1 computed per op rounds each time.
  Tensor a = full({1000}, 3.0, {.dtype = DType::bf16});
  Tensor b = exp(a);
  EXPECT_EQ(b.dtype(), DType::bf16);
  // exp(3) = 20.0855; bf16 spacing at 16..32 is 0.125 -> 20.125 is nearest.
  EXPECT_EQ(b.to_vector<float>()[999], 20.125f);
}

TEST(Pointwise, StridedAndLargeInputs) {
  Tensor a = randn({300, 257}, {.dtype = DType::f32});
  Tensor t = a.t();  // non-contiguous
  Tensor s = t + t;
  auto av = a.to_vector<float>();
  auto sv = s.to_vector<float>();
  for (int i = 0; i < 257; ++i)
    for (int j = 0; j < 300; ++j) ASSERT_EQ(sv[i * 300 + j], 2 * av[j * 257 + i]);
}

TEST(Pointwise, InPlace) {
  Tensor a = ones({3});
  Tensor b = full({3}, 2.0);
  add_(a, b, 0.5);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{2, 2, 2}));
  mul_(a, 3.0);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{6, 6, 6}));
  Tensor bf = ones({3}, {.dtype = DType::bf16});
  add_(bf, b);  // f32 into bf16, rounded
  EXPECT_EQ(bf.to_vector<float>()[0], 3.0f);
}

TEST(Pointwise, AxpbyInPlaceIsOnePassRunningAverage) {
  // self = 0.9 self + 0.1 other (batch norm's running statistics), other broadcast; the version moves.
  Tensor r = from_vector(std::vector<float>{1, 2, 3, 4}, {4});
  const Tensor batch = from_vector(std::vector<float>{11, 12, 13, 14}, {4});
  const uint64_t v0 = r.version();
  axpby_(r, 0.9, batch, 0.1);
  const std::vector<float> got = r.to_vector<float>();
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(got[i], 0.9f * (i + 1) + 0.1f * (i + 11), 1e-6f) << i;
  EXPECT_GT(r.version(), v0);
  Tensor m = zeros({2, 3});
  axpby_(m, 1.0, from_vector(std::vector<float>{1, 2, 3}, {3}), 2.0);
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{2, 4, 6, 2, 4, 6}));
  Tensor small = zeros({4});
  EXPECT_THROW(axpby_(small, 1.0, zeros({2, 4}), 1.0), Error);  // would need broadcasting self
}

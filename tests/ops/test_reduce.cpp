#include <gtest/gtest.h>

#include "mp/mp.hpp"

using namespace mp;

TEST(Reduce, SumMeanOverDims) {
  Tensor a = arange(0.0, 24.0, 1.0, {.dtype = DType::f64}).reshape({2, 3, 4});
  EXPECT_EQ(sum(a).item<double>(), 276.0);
  EXPECT_EQ(sum(a, {2}).to_vector<double>(), (std::vector<double>{6, 22, 38, 54, 70, 86}));
  EXPECT_EQ(sum(a, {0}).sizes(), (Shape{3, 4}));
  EXPECT_EQ(sum(a, {0}).to_vector<double>()[0], 12.0);
  EXPECT_EQ(sum(a, {0, 2}).to_vector<double>(), (std::vector<double>{60, 92, 124}));
  EXPECT_EQ(sum(a, {1}, true).sizes(), (Shape{2, 1, 4}));
  EXPECT_EQ(mean(a, {-1}).to_vector<double>()[0], 1.5);
  EXPECT_EQ(sum(a.transpose(0, 2), {0}).to_vector<double>(), sum(a, {2}).t().contiguous().to_vector<double>());
}

TEST(Reduce, VarMaxArgmax) {
  Tensor a = from_vector<double>({1, 5, 3, 2, 9, 0}, {2, 3});
  EXPECT_NEAR(var(a, {1}).to_vector<double>()[0], 4.0, 1e-12);
  EXPECT_NEAR(var(a, {1}, 0).to_vector<double>()[0], 8.0 / 3.0, 1e-12);
  EXPECT_EQ(amax(a, {1}).to_vector<double>(), (std::vector<double>{5, 9}));
  EXPECT_EQ(amin(a, {0}).to_vector<double>(), (std::vector<double>{1, 5, 0}));
  auto [v, i] = max(a, 1);
  EXPECT_EQ(v.to_vector<double>(), (std::vector<double>{5, 9}));
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(argmax(a, 0).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(max(a).item<double>(), 9.0);
}

TEST(Reduce, LargeSumsAccumulateInFloat) {
  // 2^20 bf16 ones: a bf16 accumulator would stall at 256; f32 accumulation gives the exact count,
  // then the result rounds to bf16 (2^20 is representable).
  Tensor a = ones({1 << 20}, {.dtype = DType::bf16});
  EXPECT_EQ(sum(a).item<float>(), 1048576.0f);
  Tensor b = ones({1024, 1024}, {.dtype = DType::f32});
  EXPECT_EQ(sum(b, {0}).to_vector<float>()[7], 1024.0f);
  EXPECT_EQ(sum(b, {1}).to_vector<float>()[7], 1024.0f);
}

TEST(Reduce, SumToSize) {
  Tensor g = ones({4, 2, 3});
  EXPECT_EQ(sum_to_size(g, {2, 1}).to_vector<float>(), (std::vector<float>{12, 12}));
  EXPECT_EQ(sum_to_size(g, {3}).to_vector<float>(), (std::vector<float>{8, 8, 8}));
}

#include <gtest/gtest.h>

#include "mp/mp.hpp"

using namespace mp;
using autograd::gradcheck;

namespace {
Tensor leaf(Shape s) { return rand(s, {.dtype = DType::f64}, -1.0, 1.0).requires_grad_(); }
void expect_ok(const autograd::GradcheckResult& r) { EXPECT_TRUE(r.ok) << r.message; }

// Naive reference of a 2-D product in double.
std::vector<double> ref_mm(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k, int64_t n) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + p] * b[p * n + j];
  return c;
}
}  // namespace

TEST(Linalg, MatmulShapes) {
  EXPECT_EQ(matmul(ones({3}), ones({3})).dim(), 0);
  EXPECT_EQ(matmul(ones({3}), ones({3})).item<float>(), 3.0f);
  EXPECT_EQ(matmul(ones({2, 3}), ones({3})).sizes(), (Shape{2}));
  EXPECT_EQ(matmul(ones({3}), ones({3, 4})).sizes(), (Shape{4}));
  EXPECT_EQ(matmul(ones({5, 2, 3}), ones({3, 4})).sizes(), (Shape{5, 2, 4}));
  EXPECT_EQ(matmul(ones({5, 1, 2, 3}), ones({6, 3, 4})).sizes(), (Shape{5, 6, 2, 4}));
  EXPECT_EQ(linear(ones({7, 5, 3}), ones({4, 3}), ones({4})).sizes(), (Shape{7, 5, 4}));
  EXPECT_EQ(linear(ones({7, 5, 3}), ones({4, 3}), ones({4})).to_vector<float>()[0], 4.0f);
  EXPECT_THROW(matmul(ones({2, 3}), ones({4, 2})), Error);
  EXPECT_THROW(linear(ones({2, 3}), ones({4, 5})), Error);
}

TEST(Linalg, F32MatchesReferenceIncludingTransposedViews) {
  manual_seed(3);
  Tensor a = randn({37, 53}, {.dtype = DType::f64}), b = randn({53, 29}, {.dtype = DType::f64});
  auto ref = ref_mm(a.to_vector<double>(), b.to_vector<double>(), 37, 53, 29);
  Tensor c = matmul(a.to(DType::f32), b.to(DType::f32));
  // Same values through column-major (transposed-view) operands: passed to oneDNN as strides, no copy.
  Tensor at = a.to(DType::f32).t().contiguous().t(), bt = b.to(DType::f32).t().contiguous().t();
  ASSERT_FALSE(at.is_contiguous());
  Tensor ct = matmul(at, bt);
  auto cv = c.to_vector<float>(), ctv = ct.to_vector<float>();
  // f32 products of N(0,1) values over k=53: rounding error ~ sqrt(k) * 2^-24 * |terms| -> 1e-4 is ample.
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_NEAR(cv[i], ref[i], 1e-4);
    ASSERT_NEAR(ctv[i], ref[i], 1e-4);
  }
}

TEST(Linalg, Bf16UsesF32Accumulation) {
  // k = 4096 products of bf16 ones: a bf16 accumulator would stop at 256; f32 accumulation is exact.
  Tensor a = ones({4, 4096}, {.dtype = DType::bf16}), b = ones({4096, 8}, {.dtype = DType::bf16});
  Tensor c = matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::bf16);
  EXPECT_EQ(c.to_vector<float>()[0], 4096.0f);
  Tensor h = matmul(ones({4, 4096}, {.dtype = DType::f16}), ones({4096, 8}, {.dtype = DType::f16}));
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.to_vector<float>()[0], 4096.0f);
}

TEST(Gradcheck, MatmulAndLinear) {
  manual_seed(11);
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; }, {leaf({3, 4}), leaf({4, 5})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; }, {leaf({2, 3, 4}), leaf({4, 2})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; }, {leaf({2, 1, 3, 4}), leaf({3, 4, 2})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; }, {leaf({4}), leaf({4, 3})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; }, {leaf({4}), leaf({4})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{bmm(in[0], in[1])}; }, {leaf({2, 3, 4}), leaf({2, 4, 5})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{linear(in[0], in[1], in[2])}; },
                      {leaf({2, 3, 4}), leaf({5, 4}), leaf({5})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{linear(in[0], in[1])}; }, {leaf({3, 4}), leaf({5, 4})}));
}

TEST(Linalg, GradientsInF32MatchF64) {
  manual_seed(12);
  Tensor x = randn({16, 32}, {.dtype = DType::f64}), w = randn({8, 32}, {.dtype = DType::f64});
  Tensor x64 = x.clone().requires_grad_(), w64 = w.clone().requires_grad_();
  Tensor x32 = x.to(DType::f32).requires_grad_(), w32 = w.to(DType::f32).requires_grad_();
  sum(square(linear(x64, w64))).backward();
  sum(square(linear(x32, w32))).backward();
  auto g64 = w64.grad().to_vector<double>();
  auto g32 = w32.grad().to_vector<float>();
  for (size_t i = 0; i < g64.size(); ++i) ASSERT_NEAR(g32[i], g64[i], 1e-3 * (1 + std::abs(g64[i])));
}

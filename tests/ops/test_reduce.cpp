#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/loops.hpp"
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

TEST(Reduce, SumSquaresOnePassAnyDtype) {
  // Against the two-pass reference (square in f32, then sum) on the same values: equal up to the
  // summation order of f32 partial sums (2e-6 relative over 100k elements of similar magnitude).
  Tensor x = randn({317, 331});
  const double ref = sum(square(x.to(DType::f64))).item<double>();
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    Tensor xd = x.to(dt);
    const double want = sum(square(xd.to(DType::f64))).item<double>();
    Tensor s = sum_squares(xd);
    EXPECT_EQ(s.dtype(), DType::f32) << dtype_name(dt);
    EXPECT_EQ(s.dim(), 0);
    EXPECT_NEAR(s.item<double>(), want, 2e-6 * want) << dtype_name(dt);
  }
  EXPECT_NEAR(sum_squares(x.to(DType::f64)).item<double>(), ref, 1e-12 * ref);
  EXPECT_EQ(sum_squares(x.to(DType::f64)).dtype(), DType::f64);
  // Strided views, a 0-dim tensor and an empty tensor.
  Tensor t = x.t();
  EXPECT_NEAR(sum_squares(t.narrow(0, 3, 100)).item<double>(),
              sum(square(t.narrow(0, 3, 100).to(DType::f64))).item<double>(), 1e-5 * ref);
  EXPECT_FLOAT_EQ(sum_squares(scalar_tensor(-3.0, {.dtype = DType::f32})).item<float>(), 9.0f);
  EXPECT_EQ(sum_squares(empty({0, 4})).item<float>(), 0.0f);
  // Gradient 2x (f64 gradcheck), and integer input is refused.
  Tensor g = rand({3, 4}, {.dtype = DType::f64}).requires_grad_();
  auto r =
      autograd::gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum_squares(in[0])}; }, {g});
  EXPECT_TRUE(r.ok) << r.message;
  try {
    sum_squares(zeros({2}, {.dtype = DType::i64}));
    ADD_FAILURE() << "expected mp::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum_squares: expected a floating tensor"), std::string::npos) << e.what();
  }
}

TEST(Reduce, ColumnSumsDirectAndBufferedPathsAgreeBitForBit) {
  // Note [column sums]: sums over a leading dim of f32/bf16 rows with one reduced stride read the rows
  // in one vector loop (AVX-512 for plain sums where allowed); other layouts convert row by row into a
  // buffer. Both add the rows in order, so a contiguous copy (direct path) and a non-coalescable view of
  // the same values (buffered path) give the same bits, with the AVX-512 loops allowed or not.
  manual_seed(12);
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor base = randn({7, 100, 1037}).to(dt);
    Tensor view = base.narrow(1, 0, 50);  // reduced dims 7 x 50 do not coalesce: buffered path
    Tensor copy = view.contiguous();      // one reduced dim of 350 rows: direct path
    for (bool avx512 : {true, false}) {
      const bool was = backend::cpu::set_avx512_loops(avx512);
      const auto direct = sum(copy, {0, 1}).to_vector<float>();
      const auto buffered = sum(view, {0, 1}).to_vector<float>();
      backend::cpu::set_avx512_loops(was);
      ASSERT_EQ(direct.size(), size_t{1037});
      EXPECT_EQ(direct, buffered) << dtype_name(dt) << (avx512 ? " avx512" : " baseline");
      // And against a double reference: f32 summation error of 350 terms of |x| <= ~5 (1e-3), plus the
      // rounding of a bf16 result to 8 significant bits (half an ulp: at most 2^-8 relative).
      const auto ref = sum(copy.to(DType::f64), {0, 1}).to_vector<double>();
      const double rel = dt == DType::bf16 ? std::ldexp(1.0, -8) : 0.0;
      for (size_t j = 0; j < ref.size(); ++j) ASSERT_NEAR(direct[j], ref[j], 1e-3 + rel * std::abs(ref[j])) << j;
    }
  }
}

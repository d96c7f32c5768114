#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/matmul_cpu.hpp"
#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using autograd::gradcheck;

namespace {
using mp::test::expect_ok;
using mp::test::leaf;

// Naive reference of a 2-D product in double.
std::vector<double> ref_mm(const std::vector<double>& a, const std::vector<double>& b, int64_t m, int64_t k,
                           int64_t n) {
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

TEST(Linalg, Bf16MatchesReferenceOnEveryPathIncludingTransposedViews) {
  // bf16 operands (the reference multiplies the same rounded values in double), batched, with a transposed
  // view and a bias; f32 accumulation and one rounding to bf16 on every path (oneDNN's bf16 kernels or through
  // f32): each output within half a bf16 unit in the last place (at most 2^-8 relative) of the exact value, plus
  // the f32 sums' error.
  manual_seed(11);
  const Tensor a = randn({2, 37, 53}).to(DType::bf16), b = randn({53, 29}).to(DType::bf16);
  const Tensor bias = randn({29}).to(DType::bf16);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(), biasv = bias.to_vector<double>();
  const Tensor bt = b.t().contiguous().t();
  ASSERT_FALSE(bt.is_contiguous());
  test::for_each_bf16_path([&] {
    const Tensor c = linear(a, bt.t(), bias), ct = matmul(a, bt);
    ASSERT_EQ(c.dtype(), DType::bf16);
    const std::vector<double> cv = c.to_vector<double>(), ctv = ct.to_vector<double>();
    for (int64_t batch = 0; batch < 2; ++batch) {
      const std::vector<double> ai(av.begin() + batch * 37 * 53, av.begin() + (batch + 1) * 37 * 53);
      const std::vector<double> ref = ref_mm(ai, bv, 37, 53, 29);
      for (int64_t i = 0; i < 37 * 29; ++i) {
        const size_t o = static_cast<size_t>(batch * 37 * 29 + i);
        const double r = ref[static_cast<size_t>(i)], rb = r + biasv[static_cast<size_t>(i % 29)];
        ASSERT_LE(std::abs(ctv[o] - r), std::ldexp(std::abs(r), -8) + 1e-4) << "matmul, element " << o;
        ASSERT_LE(std::abs(cv[o] - rb), std::ldexp(std::abs(rb), -8) + 1e-4) << "linear, element " << o;
      }
    }
  });
}

TEST(Linalg, SixteenBitThroughF32KeepsTransposedLayouts) {
  // Note [widening in memory order]: the through-f32 path widens a transposed operand in its own order and makes
  // the f32 result in the output's order. out += a b with a, b and out all transposed views, in f16 and bf16:
  // within one 16-bit rounding (half an ulp: 2^-11 / 2^-8 relative) of the exact value on the same rounded
  // operands (plus the f32 sums' error), and the strides of the caller's output unchanged.
  manual_seed(5);
  for (const DType dt : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor a = randn({1, 29, 37}).to(dt).transpose(1, 2);    // [1, 37, 29], column-major
    const Tensor b = randn({1, 23, 29}).to(dt).transpose(1, 2);    // [1, 29, 23]
    const Tensor out = randn({1, 23, 37}).to(dt).transpose(1, 2);  // [1, 37, 23], accumulated into
    ASSERT_FALSE(a.is_contiguous() || b.is_contiguous() || out.is_contiguous());
    const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(), ov = out.to_vector<double>();
    const Shape strides = out.strides();
    backend::cpu::matmul_on_path(backend::cpu::KernelPath::via_f32, out, a, b, Tensor(), true,
                                 backend::MatmulEpilogue::none);
    EXPECT_EQ(out.strides(), strides);
    const std::vector<double> ref = ref_mm(av, bv, 37, 29, 23), got = out.to_vector<double>();
    const int rel = dt == DType::f16 ? -11 : -8;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double r = ref[i] + ov[i];
      ASSERT_LE(std::abs(got[i] - r), std::ldexp(std::abs(r), rel) + 1e-4) << "element " << i;
    }
  }
}

TEST(Linalg, LinearThroughF32WidensOnceWithTheKernelsValues) {
  // Note [linear through f32]: where the 16-bit GEMMs go through f32, linear widens the weight once for the forward
  // and the data gradient and the output gradient once for both gradients. Bit for bit what the kernel gives when
  // it widens each product's operands itself (KernelPath::via_f32 called directly), for the output (with bias, with
  // and without the ReLU epilogue) and the input and weight gradients, in f16 and bf16.
  using backend::cpu::KernelPath;
  using backend::cpu::matmul_on_path;
  const test::ScopedBf16Path via_f32(backend::cpu::Bf16Path::via_f32);
  manual_seed(23);
  const int64_t rows = 2 * 37, in = 53, outf = 29;
  for (const DType dt : {DType::f16, DType::bf16}) {
    for (const bool relu : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (relu ? " relu" : ""));
      const Tensor x = randn({2, 37, in}).to(dt).requires_grad_(), w = randn({outf, in}).to(dt).requires_grad_();
      const Tensor b = randn({outf}).to(dt), g = randn({2, 37, outf}).to(dt);
      const Tensor y = relu ? linear_relu(x, w, b) : linear(x, w, b);
      autograd::backward({y}, {g});
      const auto epilogue = relu ? backend::MatmulEpilogue::relu : backend::MatmulEpilogue::none;
      const Tensor x3 = x.detach().reshape({1, rows, in}), w2 = w.detach();
      const Tensor y_ref = empty({1, rows, outf}, {.dtype = dt});
      matmul_on_path(KernelPath::via_f32, y_ref, x3, w2.t().unsqueeze(0), b, false, epilogue);
      EXPECT_EQ(y.to_vector<float>(), y_ref.to_vector<float>());
      const Tensor g3 = (relu ? mul(g, gt(y.detach(), zeros({2, 37, outf}, {.dtype = dt})).to(dt)) : g).reshape({1, rows, outf});
      const Tensor gx_ref = empty({1, rows, in}, {.dtype = dt}), gw_ref = empty({1, outf, in}, {.dtype = dt});
      matmul_on_path(KernelPath::via_f32, gx_ref, g3, w2.unsqueeze(0), Tensor(), false, backend::MatmulEpilogue::none);
      matmul_on_path(KernelPath::via_f32, gw_ref, g3.transpose(1, 2), x3, Tensor(), false,
                     backend::MatmulEpilogue::none);
      EXPECT_EQ(x.grad().to_vector<float>(), gx_ref.to_vector<float>());
      EXPECT_EQ(w.grad().to_vector<float>(), gw_ref.to_vector<float>());
    }
  }
}

TEST(Linalg, Bf16UsesF32Accumulation) {
  // k = 4096 products of bf16 ones: a bf16 accumulator would stop at 256; f32 accumulation is exact.
  Tensor a = ones({4, 4096}, {.dtype = DType::bf16}), b = ones({4096, 8}, {.dtype = DType::bf16});
  test::for_each_bf16_path([&] {
    Tensor c = matmul(a, b);
    EXPECT_EQ(c.dtype(), DType::bf16);
    EXPECT_EQ(c.to_vector<float>()[0], 4096.0f);
  });
  Tensor h = matmul(ones({4, 4096}, {.dtype = DType::f16}), ones({4096, 8}, {.dtype = DType::f16}));
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.to_vector<float>()[0], 4096.0f);
}

TEST(Gradcheck, MatmulAndLinear) {
  manual_seed(11);
  expect_ok(
      gradcheck([](auto& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; }, {leaf({3, 4}), leaf({4, 5})}));
  expect_ok(
      gradcheck([](auto& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; }, {leaf({2, 3, 4}), leaf({4, 2})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; },
                      {leaf({2, 1, 3, 4}), leaf({3, 4, 2})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; }, {leaf({4}), leaf({4, 3})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; }, {leaf({4}), leaf({4})}));
  expect_ok(
      gradcheck([](auto& in) { return std::vector<Tensor>{bmm(in[0], in[1])}; }, {leaf({2, 3, 4}), leaf({2, 4, 5})}));
  expect_ok(gradcheck([](auto& in) { return std::vector<Tensor>{linear(in[0], in[1], in[2])}; },
                      {leaf({2, 3, 4}), leaf({5, 4}), leaf({5})}));
  expect_ok(
      gradcheck([](auto& in) { return std::vector<Tensor>{linear(in[0], in[1])}; }, {leaf({3, 4}), leaf({5, 4})}));
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

// ---- linear_relu (Note [Linear + ReLU fusion]) ----

namespace {
// Forward values and the gradients of x, weight and bias of loss = sum(y * r) for a fixed r.
struct LinearRun {
  std::vector<double> y, gx, gw, gb;
};
LinearRun run_linear(const Tensor& x0, const Tensor& w0, const Tensor& b0, bool fused) {
  Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_();
  Tensor b = b0.defined() ? b0.detach().requires_grad_() : Tensor();
  Tensor y = fused ? linear_relu(x, w, b) : relu(linear(x, w, b));
  manual_seed(17);
  Tensor r = randn(y.sizes()).to(y.dtype());
  sum(mul(y, r).to(DType::f64)).backward();
  auto v = [](const Tensor& t) { return t.to(DType::f64).to_vector<double>(); };
  return {v(y), v(x.grad()), v(w.grad()), b.defined() ? v(b.grad()) : std::vector<double>{}};
}
}  // namespace

TEST(LinearRelu, SameValuesAndGradientsAsReluOfLinear) {
  // The ReLU runs on the f32 (f64) GEMM result before rounding; rounding is monotonic and keeps 0, so the
  // fused values equal relu(linear) exactly, and so do the masked gradients. About half the outputs
  // are negative here, so the mask matters.
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (bool with_bias : {true, false})
      test::for_each_bf16_path([&] {
        manual_seed(5);
        Tensor x = randn({3, 7, 45}).to(dt), w = randn({33, 45}, {}, 0.0, 0.2).to(dt);
        Tensor b = with_bias ? randn({33}).to(dt) : Tensor();
        const LinearRun f = run_linear(x, w, b, true), u = run_linear(x, w, b, false);
        const std::string what = std::string(dtype_name(dt)) + (with_bias ? " with bias" : " without bias");
        ASSERT_EQ(f.y.size(), size_t{3 * 7 * 33}) << what;
        int64_t zeros = 0;
        for (double v : f.y) zeros += v == 0.0;
        EXPECT_GT(zeros, 100) << what;  // the ReLU did cut
        EXPECT_EQ(f.y, u.y) << what;
        EXPECT_EQ(f.gx, u.gx) << what;
        EXPECT_EQ(f.gw, u.gw) << what;
        EXPECT_EQ(f.gb, u.gb) << what;
      });
  }
}

TEST(LinearRelu, EmptyInnerDimensionGivesReluOfTheBias) {
  Tensor b = from_vector<float>({-1.5f, 0.0f, 2.0f}, {3});
  Tensor y = linear_relu(zeros({2, 0}), zeros({3, 0}), b);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0.0f, 0.0f, 2.0f, 0.0f, 0.0f, 2.0f}));
  // linear itself: the bias alone (the rows were miscounted as 0 when in_features was 0).
  EXPECT_EQ(linear(zeros({2, 0}), zeros({3, 0}), b).to_vector<float>(),
            (std::vector<float>{-1.5f, 0.0f, 2.0f, -1.5f, 0.0f, 2.0f}));
  EXPECT_THROW(linear_relu(ones({2, 3}), ones({4, 5})), Error);
}

TEST(LinearRelu, AutocastRunsItInBf16) {
  manual_seed(6);
  Tensor x = randn({8, 16}), w = randn({12, 16}), b = randn({12});
  Tensor fused, unfused;
  {
    amp::Autocast guard({.dtype = DType::bf16});
    fused = linear_relu(x, w, b);
    unfused = relu(linear(x, w, b));
  }
  EXPECT_EQ(fused.dtype(), DType::bf16);
  EXPECT_EQ(fused.to_vector<float>(), unfused.to_vector<float>());
}

TEST(LinearRelu, SequentialFusesLinearThenReluUnlessHooked) {
  manual_seed(8);
  auto net = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(20, 30), std::make_shared<nn::ReLU>(),
                                              std::make_shared<nn::Linear>(30, 5));
  Tensor x = randn({6, 20});
  auto l0 = net->at<nn::Linear>(0), l2 = net->at<nn::Linear>(2);
  // The unfused computation by hand.
  Tensor ref = linear(relu(linear(x, l0->weight(), l0->bias())), l2->weight(), l2->bias());
  Tensor y = (*net)(x);
  EXPECT_EQ(y.to_vector<float>(), ref.to_vector<float>());
  // The first layer ran fused: the second Linear's input comes from a LinearReluBackward node.
  ASSERT_TRUE(y.grad_fn() != nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "LinearBackward");
  ASSERT_TRUE(y.grad_fn()->next_edges[0].fn != nullptr);
  EXPECT_EQ(y.grad_fn()->next_edges[0].fn->name(), "LinearReluBackward");
  sum(y).backward();
  EXPECT_TRUE(l0->weight().grad().defined());
  // With a hook on the ReLU, the modules run one by one and the hook sees the ReLU's output.
  int calls = 0;
  Tensor seen;
  (*net)[1]->register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
    ++calls;
    seen = out;
  });
  Tensor y2 = (*net)(x);
  EXPECT_EQ(calls, 1);
  ASSERT_TRUE(seen.defined());
  EXPECT_EQ(seen.sizes(), (Shape{6, 30}));
  EXPECT_EQ(y2.to_vector<float>(), ref.to_vector<float>());
  EXPECT_EQ(y2.grad_fn()->next_edges[0].fn->name(), "ReluBackward");
  // Parameter names are those of the unfused Sequential.
  auto names = net->named_parameters();
  ASSERT_EQ(names.size(), size_t{4});
  EXPECT_EQ(names[0].first, "0.weight");
  EXPECT_EQ(names[3].first, "2.bias");
}

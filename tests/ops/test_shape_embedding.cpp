// cat / stack / split / chunk, embedding and dropout: values, views, gradients (f64 gradcheck and exact
// counts), race-free scatter-add, reproducible dropout masks and error messages.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/loops.hpp"
#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using autograd::gradcheck;

namespace {
using mp::test::expect_ok;
using mp::test::leaf;

Tensor iota_f64(const Shape& s, double start = 0) {
  return add(arange(shape_numel(s), {.dtype = DType::f64}), start).reshape(s);
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

}  // namespace

// -------------------------------------------------------------------------------------------- cat

TEST(Cat, ValuesAlongEveryDim) {
  Tensor a = iota_f64({2, 3}), b = iota_f64({2, 3}, 100);
  EXPECT_EQ(cat({a, b}, 0).to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 4, 5, 100, 101, 102, 103, 104, 105}));
  EXPECT_EQ(cat({a, b}, 1).to_vector<double>(), (std::vector<double>{0, 1, 2, 100, 101, 102, 3, 4, 5, 103, 104, 105}));
  EXPECT_EQ(cat({a, b}, -1).sizes(), (Shape{2, 6}));
  // Middle dim of 3-D tensors with different lengths.
  Tensor x = iota_f64({2, 1, 2}), y = iota_f64({2, 2, 2}, 10);
  Tensor c = cat({x, y}, 1);
  EXPECT_EQ(c.sizes(), (Shape{2, 3, 2}));
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{0, 1, 10, 11, 12, 13, 2, 3, 14, 15, 16, 17}));
  // A strided input.
  Tensor at = a.t();  // [3, 2]
  EXPECT_EQ(cat({at, at}, 0).to_vector<double>(), (std::vector<double>{0, 3, 1, 4, 2, 5, 0, 3, 1, 4, 2, 5}));
  // One tensor: a copy.
  Tensor one = cat({a}, 0);
  EXPECT_FALSE(one.is_alias_of(a));
  EXPECT_EQ(one.to_vector<double>(), a.to_vector<double>());
}

TEST(Cat, PromotesDtypes) {
  Tensor f = ones({2}, {.dtype = DType::f32}), d = full({1}, 2.5, {.dtype = DType::f64});
  Tensor i = full({1}, 7.0, {.dtype = DType::i64}), h = full({1}, 0.5, {.dtype = DType::f16});
  EXPECT_EQ(cat({f, d}).dtype(), DType::f64);
  EXPECT_EQ(cat({i, f}).dtype(), DType::f32);
  EXPECT_EQ(cat({h, full({1}, 1.0, {.dtype = DType::bf16})}).dtype(), DType::f32);
  EXPECT_EQ(cat({i, h}).to_vector<double>(), (std::vector<double>{7, 0.5}));
  EXPECT_EQ(cat({i, h}).dtype(), DType::f16);
  // Gradients flow back in each input's dtype.
  Tensor fg = ones({2}, {.dtype = DType::f32}).requires_grad_();
  Tensor dg = full({1}, 2.0, {.dtype = DType::f64}).requires_grad_();
  sum(mul(cat({fg, dg}), from_vector<double>({1, 2, 3}, {3}))).backward();
  EXPECT_EQ(fg.grad().dtype(), DType::f32);
  EXPECT_EQ(fg.grad().to_vector<double>(), (std::vector<double>{1, 2}));
  EXPECT_EQ(dg.grad().to_vector<double>(), (std::vector<double>{3}));
}

TEST(Cat, LegacyEmptyTensorsAreSkipped) {
  Tensor a = iota_f64({2, 2});
  Tensor e = empty({0}, {.dtype = DType::f64});
  EXPECT_EQ(cat({e, a, e}, 1).sizes(), (Shape{2, 2}));
  EXPECT_EQ(cat({e, e}).sizes(), (Shape{0}));
}

TEST(Cat, Errors) {
  Tensor a = zeros({2, 3}), b = zeros({2, 4}), c = zeros({2, 3, 1});
  // The message names the offending tensor's index and the dim.
  expect_error([&] { cat({a, a, b}, 0); }, {"cat", "tensor 2", "size 4", "dim 1"});
  expect_error([&] { cat({a, c}, 0); }, {"tensor 1", "3 dims"});
  expect_error([&] { cat({}, 0); }, {"non-empty"});
  expect_error([&] { cat({a, a}, 2); }, {"cat"});
  expect_error([&] { cat({scalar_tensor(1.0)}); }, {"0-dim"});
  expect_error([&] { stack({a, b}); }, {"stack", "tensor 1", "[2, 4]", "[2, 3]"});
}

TEST(Cat, Gradcheck) {
  Tensor a = leaf({2, 1, 3}), b = leaf({2, 3, 3}), c = leaf({2, 2, 3});
  expect_ok(gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{cat(in, 1)}; }, {a, b, c}));
  expect_ok(gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{cat({in[0], in[0]}, -1)}; }, {a}));
  // Only some inputs require grad.
  Tensor k = rand({2, 2, 3}, {.dtype = DType::f64});
  expect_ok(gradcheck([k](const std::vector<Tensor>& in) { return std::vector<Tensor>{cat({k, in[0]}, 1)}; }, {a}));
}

TEST(Stack, ValuesAndGradcheck) {
  Tensor a = iota_f64({2, 2}), b = iota_f64({2, 2}, 10);
  Tensor s0 = stack({a, b}, 0), s1 = stack({a, b}, 1), s2 = stack({a, b}, -1);
  EXPECT_EQ(s0.sizes(), (Shape{2, 2, 2}));
  EXPECT_EQ(s0.to_vector<double>(), (std::vector<double>{0, 1, 2, 3, 10, 11, 12, 13}));
  EXPECT_EQ(s1.to_vector<double>(), (std::vector<double>{0, 1, 10, 11, 2, 3, 12, 13}));
  EXPECT_EQ(s2.to_vector<double>(), (std::vector<double>{0, 10, 1, 11, 2, 12, 3, 13}));
  EXPECT_EQ(stack({scalar_tensor(1.0), scalar_tensor(2.0)}).sizes(), (Shape{2}));
  Tensor x = leaf({3, 2}), y = leaf({3, 2});
  expect_ok(gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{stack(in, 1)}; }, {x, y}));
}

// ---------------------------------------------------------------------------------- split / chunk

TEST(Split, ViewsAndSizes) {
  Tensor x = iota_f64({5, 2});
  auto parts = split(x, 2, 0);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].sizes(), (Shape{2, 2}));
  EXPECT_EQ(parts[2].sizes(), (Shape{1, 2}));
  EXPECT_EQ(parts[2].to_vector<double>(), (std::vector<double>{8, 9}));
  for (const Tensor& p : parts) EXPECT_TRUE(p.is_alias_of(x));  // views, no copies
  auto cols = split(x, 1, -1);
  ASSERT_EQ(cols.size(), 2u);
  EXPECT_EQ(cols[1].to_vector<double>(), (std::vector<double>{1, 3, 5, 7, 9}));
  EXPECT_EQ(split(x, 10, 0).size(), 1u);
  expect_error([&] { split(x, 0, 0); }, {"split", "positive"});
}

TEST(Chunk, PyTorchChunkSizes) {
  Tensor x = iota_f64({5});
  auto c = chunk(x, 4);  // ceil(5 / 4) = 2: sizes 2, 2, 1 (fewer chunks than asked, as PyTorch)
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].numel(), 2);
  EXPECT_EQ(c[2].to_vector<double>(), (std::vector<double>{4}));
  auto d = chunk(iota_f64({2, 6}), 3, 1);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[1].to_vector<double>(), (std::vector<double>{2, 3, 8, 9}));
  EXPECT_TRUE(d[1].is_alias_of(d[0]));
  EXPECT_EQ(chunk(empty({0}), 3).size(), 3u);
  expect_error([&] { chunk(x, 0); }, {"chunk", "positive"});
}

TEST(Split, Gradcheck) {
  Tensor x = leaf({4, 5});
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto p = split(in[0], 2, 1);  // sizes 2, 2, 1
        return std::vector<Tensor>{mul(p[0], p[1]), p[2]};
      },
      {x}));
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto p = chunk(in[0], 2, 0);
        return std::vector<Tensor>{sub(p[1], p[0])};
      },
      {x}));
}

TEST(Unbind, ViewsValuesAndErrors) {
  Tensor x = iota_f64({3, 2});
  auto rows = unbind(x, 0);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[1].sizes(), (Shape{2}));
  EXPECT_EQ(rows[2].to_vector<double>(), (std::vector<double>{4, 5}));
  for (const Tensor& r : rows) EXPECT_TRUE(r.is_alias_of(x));
  auto cols = unbind(x, -1);
  ASSERT_EQ(cols.size(), 2u);
  EXPECT_EQ(cols[1].to_vector<double>(), (std::vector<double>{1, 3, 5}));
  EXPECT_TRUE(unbind(empty({0, 4}), 0).empty());
  expect_error([&] { unbind(scalar_tensor(1.0), 0); }, {"unbind", "0-dim"});
  expect_error([&] { unbind(x, 2); }, {"unbind"});
}

TEST(Unbind, Gradcheck) {
  Tensor x = leaf({3, 4});
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto r = unbind(in[0], 1);  // r[2] unused: its gradient is zero
        return std::vector<Tensor>{mul(r[0], r[1]), r[3]};
      },
      {x}));
}

TEST(Unbind, OneNodeForAllSlicesAndUnusedSlicesGetZero) {
  // All slices share one backward node: its gradient is assembled once (not one full-size buffer per
  // slice), and slices that were not used contribute exact zeros.
  Tensor x = iota_f64({4, 3}).requires_grad_();
  auto r = unbind(x, 0);
  for (size_t i = 1; i < r.size(); ++i) EXPECT_EQ(r[i].grad_fn().get(), r[0].grad_fn().get());
  auto p = split(x, 2, 0);
  EXPECT_EQ(p[0].grad_fn().get(), p[1].grad_fn().get());
  sum(add(mul(r[0], 2.0), r[3])).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 2, 2, 0, 0, 0, 0, 0, 0, 1, 1, 1}));
}

// ----------------------------------------------------------------------------------------- embedding

TEST(Embedding, GathersRowsForAnyIndexShape) {
  Tensor w = iota_f64({4, 3});
  Tensor idx = from_vector<int64_t>({3, 0, 3, 1, 2, 2}, {2, 3});
  Tensor out = embedding(w, idx);
  EXPECT_EQ(out.sizes(), (Shape{2, 3, 3}));
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{9, 10, 11, 0, 1, 2, 9, 10, 11, 3, 4, 5, 6, 7, 8, 6, 7, 8}));
  // i32 indices, 0-dim indices, 16-bit weights keep their dtype.
  EXPECT_EQ(embedding(w, idx.to(DType::i32)).to_vector<double>(), out.to_vector<double>());
  EXPECT_EQ(embedding(w, full({}, 2.0, {.dtype = DType::i64})).sizes(), (Shape{3}));
  Tensor wb = w.to(DType::bf16);
  EXPECT_EQ(embedding(wb, idx).dtype(), DType::bf16);
  EXPECT_EQ(embedding(wb, idx).to_vector<double>(), out.to_vector<double>());
}

TEST(Embedding, Errors) {
  Tensor w = zeros({10, 4});
  expect_error([&] { embedding(w, from_vector<int64_t>({1, 12, 3}, {3})); }, {"embedding", "index 12", "V = 10"});
  expect_error([&] { embedding(w, from_vector<int32_t>({-1}, {1})); }, {"index -1", "V = 10"});
  expect_error([&] { embedding(w, zeros({2})); }, {"i64", "f32"});
  expect_error([&] { embedding(zeros({10}), from_vector<int64_t>({1}, {1})); }, {"[V, D]"});
  expect_error([&] { embedding(w, from_vector<int64_t>({1}, {1}), 10); }, {"padding_idx", "10"});
}

TEST(Embedding, RepeatedIndicesAccumulateAndPaddingGetsNone) {
  Tensor w = zeros({5, 2}, {.dtype = DType::f64}).requires_grad_();
  Tensor idx = from_vector<int64_t>({1, 3, 1, 1, 0, 3}, {6});
  Tensor g = iota_f64({6, 2}, 1);  // rows (1,2), (3,4), (5,6), (7,8), (9,10), (11,12)
  embedding(w, idx, /*padding_idx=*/0).backward(g);
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{0, 0,                  // padding row: no gradient
                                                               1 + 5 + 7, 2 + 6 + 8,  // index 1 three times
                                                               0, 0, 3 + 11, 4 + 12, 0, 0}));
}

TEST(Embedding, Gradcheck) {
  Tensor w = leaf({6, 3});
  Tensor idx = from_vector<int64_t>({2, 5, 2, 0, 2, 5, 4, 4}, {2, 4});
  expect_ok(
      gradcheck([idx](const std::vector<Tensor>& in) { return std::vector<Tensor>{embedding(in[0], idx)}; }, {w}));
  // (No gradcheck with padding_idx: by definition, as in PyTorch, the padding row gets no gradient although
  // the forward reads it; RepeatedIndicesAccumulateAndPaddingGetsNone checks that.)
}

TEST(Embedding, ParallelScatterIsExact) {
  // Big enough for the parallel paths: wide rows split columns, narrow rows use per-thread buffers.
  for (const auto& [V, D, M] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{7, 128, 1000}, {9, 4, 20000}}) {
    Tensor w = zeros({V, D}).requires_grad_();
    Tensor idx = randint(0, V, {M});
    // Integer-valued gradients: every partial sum is exact in f32, so any order gives the same result.
    Tensor g = randint(-8, 9, {M, D}).to(DType::f32);
    embedding(w, idx, 2).backward(g);
    std::vector<double> ref(static_cast<size_t>(V * D), 0.0);
    auto iv = idx.to_vector<int64_t>();
    auto gv = g.to_vector<double>();
    for (int64_t m = 0; m < M; ++m)
      if (iv[m] != 2)
        for (int64_t d = 0; d < D; ++d) ref[iv[m] * D + d] += gv[m * D + d];
    EXPECT_EQ(w.grad().to_vector<double>(), ref) << "V=" << V << " D=" << D << " M=" << M;
  }
}

TEST(Embedding, Bf16GradientAccumulatesInF32) {
  // 300 gradients of 1 into one row: summed in bf16 the total stalls at 256 (256 + 1 rounds back to 256);
  // summed in f32 and rounded once it is 300 (exact in bf16: spacing 2 in [256, 512)).
  Tensor w = zeros({3, 2}, {.dtype = DType::bf16}).requires_grad_();
  Tensor idx = full({300}, 1.0, {.dtype = DType::i64});
  sum(embedding(w, idx)).backward();
  EXPECT_EQ(w.grad().dtype(), DType::bf16);
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{0, 0, 300, 300, 0, 0}));
}

// -------------------------------------------------------------------------------------------- dropout

TEST(Dropout, IdentityCasesAndErrors) {
  Tensor x = rand({10});
  EXPECT_TRUE(dropout(x, 0.0, true).is_alias_of(x));
  EXPECT_TRUE(dropout(x, 0.7, false).is_alias_of(x));
  expect_error([&] { dropout(x, -0.1, true); }, {"dropout", "-0.1"});
  expect_error([&] { dropout(x, 1.5, false); }, {"dropout", "1.5"});
  expect_error([&] { dropout(x, std::nan(""), true); }, {"dropout"});
  expect_error([&] { dropout(ones({3}, {.dtype = DType::i64}), 0.5, true); }, {"floating"});
}

TEST(Dropout, POneGivesZerosAndZeroGradient) {
  Tensor x = rand({100}, {.dtype = DType::f32}, 1, 2).requires_grad_();
  Tensor y = dropout(x, 1.0, true);
  for (double v : y.to_vector<double>()) EXPECT_EQ(v, 0.0);
  sum(y).backward();
  for (double v : x.grad().to_vector<double>()) EXPECT_EQ(v, 0.0);
}

TEST(Dropout, MaskFollowsPhiloxStreamAndIsReproducible) {
  const double p = 0.3;
  Tensor x = rand({50000}, {.dtype = DType::f32}, 1, 2);
  manual_seed(1234);
  const uint64_t offset = default_generator().offset();
  Tensor y = dropout(x, p, true);
  manual_seed(1234);
  Tensor y2 = dropout(x, p, true);
  EXPECT_EQ(y.to_vector<float>(), y2.to_vector<float>());
  Tensor y3 = dropout(x, p, true);  // the stream moved on: a different mask
  EXPECT_NE(y.to_vector<float>(), y3.to_vector<float>());
  auto xv = x.to_vector<float>(), yv = y.to_vector<float>();
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  int64_t kept = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    const bool keep = philox_uniform(1234, offset, i) >= static_cast<float>(p);
    ASSERT_EQ(yv[i], keep ? xv[i] * scale : 0.0f) << "element " << i;
    kept += keep;
  }
  // Kept fraction ~ 1 - p: the standard deviation is sqrt(p (1 - p) / n) = 0.002; allow 5 of them.
  EXPECT_NEAR(static_cast<double>(kept) / 50000.0, 1.0 - p, 0.01);
}

TEST(Dropout, BaselineAndAvx512LoopsAgree) {
  // The CPU kernels run an AVX-512 copy of their loops where the CPU has it (16 Philox blocks per
  // pass); with it forbidden they run the baseline loop. Both follow Note [dropout mask] bit for bit,
  // for sizes that end inside a block of draws and inside a 16-lane group, in f32, bf16 and f64.
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    for (int64_t n : {int64_t{7}, int64_t{1029}, int64_t{70001}}) {
      Tensor x = rand({n}, {.dtype = DType::f32}, 1, 2).to(dt);
      std::vector<std::vector<double>> outs, grads;
      uint64_t offset = 0;
      for (bool avx512 : {true, false}) {
        const bool was = backend::cpu::set_avx512_loops(avx512);
        manual_seed(4321);
        offset = default_generator().offset();
        Tensor xl = x.detach().requires_grad_();
        Tensor y = dropout(xl, 0.3, true);
        sum(y * y.detach()).backward();
        outs.push_back(y.to(DType::f64).to_vector<double>());
        grads.push_back(xl.grad().to(DType::f64).to_vector<double>());
        backend::cpu::set_avx512_loops(was);
      }
      ASSERT_EQ(outs[0], outs[1]) << dtype_name(dt) << " n " << n;
      ASSERT_EQ(grads[0], grads[1]) << dtype_name(dt) << " n " << n;
      for (int64_t i = 0; i < n; ++i) {
        const bool keep = philox_uniform(4321, offset, static_cast<uint64_t>(i)) >= 0.3f;
        ASSERT_EQ(outs[0][static_cast<size_t>(i)] != 0.0, keep) << dtype_name(dt) << " element " << i;
      }
    }
  }
}

TEST(Dropout, BackwardUsesTheSameMask) {
  manual_seed(7);
  Tensor x = rand({4000}, {.dtype = DType::f32}, 1, 2).requires_grad_();
  Tensor y = dropout(x, 0.5, true);
  sum(y).backward();
  auto yv = y.to_vector<float>(), gv = x.grad().to_vector<float>();
  for (size_t i = 0; i < yv.size(); ++i) ASSERT_EQ(gv[i], yv[i] != 0.0f ? 2.0f : 0.0f) << "element " << i;
  // 16-bit: output and gradient stay in the input dtype; the same mask applies to both.
  Tensor xb = rand({1000}, {.dtype = DType::f32}, 1, 2).to(DType::bf16).requires_grad_();
  Tensor yb = dropout(xb, 0.25, true);
  EXPECT_EQ(yb.dtype(), DType::bf16);
  sum(yb).backward();
  EXPECT_EQ(xb.grad().dtype(), DType::bf16);
  auto ybv = yb.to_vector<float>(), gbv = xb.grad().to_vector<float>();
  for (size_t i = 0; i < ybv.size(); ++i) ASSERT_EQ(gbv[i] != 0.0f, ybv[i] != 0.0f) << "element " << i;
}

TEST(Dropout, Gradcheck) {
  // Reseeding inside the function fixes the mask across gradcheck's repeated forwards.
  Tensor x = leaf({6, 5});
  expect_ok(gradcheck(
      [](const std::vector<Tensor>& in) {
        manual_seed(99);
        return std::vector<Tensor>{dropout(in[0], 0.4, true)};
      },
      {x}));
}

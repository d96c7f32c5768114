// CUDA against the CPU, part 2: reductions (sum / mean / var / amax / amin / max with indices / argmax /
// sum_squares / sum_to_size over rows, columns, several dims, transposed and broadcast views, > 2^20
// elements exactly on small integers and within the rounding bound on random data, ties and NaN) and
// cat / stack / split / chunk / unbind, forward and backward in f32/f16/bf16/f64.
//
// Every tolerance states its reason (cuda_test_util.hpp). Tests skip without a CUDA device;
// MP_CUDA_TESTS_ON_CPU=1 runs them with the CPU as the device (self-check).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "ops/reduce_shapes.hpp"

using namespace mp;
using namespace mp::cuda_test;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

// =============================================================================== reductions
// sum / mean of floats over every shape of reduce_shapes() are op-table cases
// (tests/ops/op_cases_reduce_index_rnn.cpp).

TEST(CudaReduce, IntegerSumsAreExact) {
  MP_SKIP_WITHOUT_GPU();
  // Integers sum exactly in i64.
  for (DType dt : {DType::i64, DType::i32, DType::u8}) {
    const Tensor x = integers({33, 65}, 0, 3, dt);
    guarded(std::string("integer sum ") + dtype_name(dt), [&] {
      EXPECT_TRUE(identical(std::string("sum ") + dtype_name(dt), sum(on_dev(x)), sum(x)));
      EXPECT_TRUE(identical(std::string("sum dim 0 ") + dtype_name(dt), sum(on_dev(x), {0}), sum(x, {0})));
      EXPECT_TRUE(identical(std::string("sum dim 1 ") + dtype_name(dt), sum(on_dev(x).t(), {0}), sum(x.t(), {0})));
    });
  }
}

TEST(CudaReduce, LargeReductionsOfSmallIntegersAreExact) {
  MP_SKIP_WITHOUT_GPU();
  // Integers in [-4, 4]: every partial sum of fewer than 2^22 terms is an integer below 2^24 in magnitude,
  // so it is exact in f32 in any order: both devices must give identical results (and bf16/f16 the same
  // rounding of the same exact sum). A lost or double-counted block would change the result. (The
  // random-data tests below only bound the rounding, c sqrt(K) u sum|x|, which a small lost block can hide
  // in; this test cannot miss one.)
  const int64_t n = (int64_t{1} << 22) - 3;
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64}) {
    const std::string d = dtype_name(dt);
    guarded("large exact sums " + d, [&] {
      const Tensor x = integers({n}, -4, 5, dt);
      const Tensor xd = on_dev(x);
      EXPECT_TRUE(identical("sum [2^22 - 3] " + d, sum(xd), sum(x)));
      if (is_floating(dt)) { EXPECT_TRUE(identical("mean [2^22 - 3] " + d, mean(xd), mean(x))); }
      // Few outputs with long rows, and many outputs with long columns.
      const int64_t r = (int64_t{1} << 20) + 1;
      const Tensor rows = x.narrow(0, 0, 3 * r).view({3, r});
      EXPECT_TRUE(identical("sum [3, 2^20 + 1] dim 1 " + d, sum(on_dev(rows), {1}), sum(rows, {1})));
      const Tensor cols = x.narrow(0, 0, 65537 * 63).view({65537, 63});
      EXPECT_TRUE(identical("sum [65537, 63] dim 0 " + d, sum(on_dev(cols), {0}), sum(cols, {0})));
      EXPECT_TRUE(identical("sum [65537, 63]^T dim 1 " + d, sum(on_dev(cols).t(), {1}), sum(cols.t(), {1})));
    });
  }
  guarded("large exact sum_squares", [] {
    // |v| <= 2: squares <= 4, partial sums <= 4 (2^21 + 5) < 2^24: exact.
    const Tensor x = integers({(int64_t{1} << 21) + 5}, -2, 3, DType::bf16);
    EXPECT_TRUE(identical("sum_squares bf16 [2^21 + 5]", sum_squares(on_dev(x)), sum_squares(x)));
  });
}

TEST(CudaReduce, LargeRandomSumsWithinTheRoundingBound) {
  MP_SKIP_WITHOUT_GPU();
  const int64_t n = (int64_t{1} << 21) + 3;
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const Tensor x = uniform({n}, 0, 1, dt);
    guarded(std::string("large random sum ") + dtype_name(dt), [&] {
      const Tensor s = sum(abs(x.to(DType::f64)));
      EXPECT_TRUE(
          close(std::string("sum [2^21 + 3] ") + dtype_name(dt), sum(on_dev(x)), sum(x), reduction_tol(dt, n), s));
      EXPECT_TRUE(close(std::string("sum_squares [2^21 + 3] ") + dtype_name(dt), sum_squares(on_dev(x)), sum_squares(x),
                        reduction_tol(dt == DType::f64 ? DType::f64 : DType::f32, n), sum(square(x.to(DType::f64)))));
    });
  }
}

TEST(CudaReduce, VarianceAndSumSquares) {
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : kFloatTypes) {
    for (const ReduceShape& s : reduce_shapes()) {
      if (s.dims.empty()) continue;
      const Tensor x = uniform(s.leaf, -1, 2, dt);
      const int64_t K = reduced_count(s.view(x).sizes(), s.dims);
      if (K < 2) continue;
      OpCheck chk;
      chk.name = std::string("var ") + dtype_name(dt) + " " + s.name;
      chk.inputs = {x};
      chk.fn = [&s](const std::vector<Tensor>& in) { return var(s.view(in[0]), s.dims, 1, s.keepdim); };
      // Two passes (mean, then squared deviations): the mean's difference enters at second order, each term
      // adds one rounding of the square: c = 4; 16-bit: the mean, deviations and squares are rounded to the
      // 16-bit dtype (identically, given the same mean; a mean one ulp apart shifts every deviation): 2 ulps.
      chk.out = reduction_tol(dt, K, 4, "; two passes");
      if (is_low_precision(dt)) chk.out.ulps = 2;
      chk.out_scale = [&s](const std::vector<Tensor>& in) {
        return var(s.view(in[0]).detach().to(DType::f64), s.dims, 1, s.keepdim);
      };
      // Gradient 2 (x - mean) g / (K - 1) - its mean: the devices' means differ by a rounding (16-bit: the mean
      // is rounded to the 16-bit dtype and may be one ulp apart), which shifts every x - mean: absolute
      // 4 ulp(2) / (K - 1) for 16-bit (|mean| < 2, |g| < 1), 8 u_acc otherwise; plus one rounding.
      Tol g;
      g.ulps = 1;
      g.atol = is_low_precision(dt) ? 4 * ulp(dt, 2.0) / static_cast<double>(K - 1) : 8 * acc_roundoff(dt);
      g.why = "gradient of var: x - mean shifts with the mean's rounding";
      chk.grad = g;
      check_op(chk);
    }
    OpCheck sq;
    sq.name = std::string("sum_squares ") + dtype_name(dt) + " [61, 17]^T";
    sq.inputs = {uniform({61, 17}, -2, 2, dt)};
    sq.fn = [](const std::vector<Tensor>& in) { return sum_squares(in[0].t()); };
    sq.out = reduction_tol(dt == DType::f64 ? DType::f64 : DType::f32, 1037);
    sq.out_scale = [](const std::vector<Tensor>& in) { return sum(square(in[0].detach().to(DType::f64))); };
    sq.grad = exact("2 g x: exact products");
    check_op(sq);
  }
}

TEST(CudaReduce, MaxMinArgmaxWithTiesAndNaN) {
  MP_SKIP_WITHOUT_GPU();
  // Values from a small set: ties everywhere, so the "first extreme" index rule and the even split of
  // the amax/amin gradient among ties are exercised. Selections: identical results.
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i64, DType::i32}) {
    const bool fl = is_floating(dt);
    for (const ReduceShape& s : reduce_shapes()) {
      if (s.dims.empty()) continue;
      const Tensor x = fl ? from_set(s.leaf, {-3, -1, 0, 2, 2.5}, dt) : integers(s.leaf, -3, 3, dt);
      for (bool is_max : {true, false}) {
        OpCheck chk;
        chk.name = std::string(is_max ? "amax " : "amin ") + dtype_name(dt) + " " + s.name;
        chk.inputs = {x};
        chk.fn = [&s, is_max](const std::vector<Tensor>& in) {
          return is_max ? amax(s.view(in[0]), s.dims, s.keepdim) : amin(s.view(in[0]), s.dims, s.keepdim);
        };
        chk.out = exact("a selection");
        if (fl) chk.grad = reduce_grad_tol(dt);  // g / count * hit: exact, then the broadcast leaf's sum
        chk.bit_exact_output = true;
        check_op(chk);
      }
    }
    // max(x, dim) with indices, argmax, max(): the first maximum's index.
    for (int64_t dim : {0, 1, -1}) {
      const Tensor x = fl ? from_set({33, 65}, {-3, -1, 0, 2, 2.5}, dt) : integers({33, 65}, -3, 3, dt);
      const std::string what = std::string("max(dim ") + std::to_string(dim) + ") " + dtype_name(dt);
      guarded(what, [&] {
        const Tensor xd = on_dev(x, fl);
        const Tensor xc = cpu_leaf(x, fl);
        auto [dv, di] = max(xd, dim, dim == 1);
        auto [cv, ci] = max(xc, dim, dim == 1);
        EXPECT_TRUE(identical(what + " values", dv, cv));
        EXPECT_TRUE(identical(what + " indices", di, ci));
        EXPECT_TRUE(identical(what + " argmax", argmax(xd, dim), argmax(xc, dim)));
        EXPECT_TRUE(
            identical(what + " of a transposed view", std::get<1>(max(xd.t(), dim)), std::get<1>(max(xc.t(), dim))));
        if (fl) {
          const Tensor g = uniform(cv.sizes(), -1, 1, dt);
          cv.backward(g);
          dv.backward(on_dev(g));
          EXPECT_TRUE(identical(what + " gradient (one-hot at the index)", xd.grad(), xc.grad()));
        }
      });
    }
  }
  // NaN propagates: amax/amin give NaN, max(dim)/argmax point at the first NaN.
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    const std::string d = dtype_name(dt);
    guarded("NaN " + d, [&] {
      Tensor x = from_set({20, 30}, {-1, 0, 1, 2}, dt);
      x.select(0, 3).narrow(0, 7, 1).fill_(kNaN);
      x.select(0, 3).narrow(0, 20, 1).fill_(kNaN);
      x.select(0, 11).narrow(0, 0, 1).fill_(kNaN);
      const Tensor xd = on_dev(x);
      EXPECT_TRUE(identical("amax with NaN " + d, amax(xd, {1}), amax(x, {1})));
      EXPECT_TRUE(identical("amin with NaN " + d, amin(xd, {0}), amin(x, {0})));
      EXPECT_TRUE(identical("max() with NaN " + d, max(xd), max(x)));
      EXPECT_TRUE(identical("argmax with NaN " + d, argmax(xd, 1), argmax(x, 1)));
    });
  }
  // A long row (arg reduction over 300001 elements) and max of everything.
  guarded("long argmax", [] {
    const Tensor x = from_set({2, 300001}, {-1, 0, 1, 5}, DType::f32);
    EXPECT_TRUE(identical("argmax [2, 300001]", argmax(on_dev(x), 1), argmax(x, 1)));
    EXPECT_TRUE(identical("max() [2, 300001]", max(on_dev(x)), max(x)));
  });
}

TEST(CudaReduce, SumToSize) {
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : kFloatTypes) {
    OpCheck chk;
    chk.name = std::string("sum_to_size [4, 5, 6] -> [5, 1] ") + dtype_name(dt);
    chk.inputs = {uniform({4, 5, 6}, -1, 1, dt)};
    chk.fn = [](const std::vector<Tensor>& in) { return sum_to_size(in[0], {5, 1}); };
    chk.out = reduction_tol(dt, 24);
    chk.out_scale = [](const std::vector<Tensor>& in) {
      return sum_to_size(abs(in[0].detach().to(DType::f64)), {5, 1});
    };
    chk.grad = exact("the upstream gradient expanded");
    check_op(chk);
  }
}

// =============================================================================== cat / stack / split

TEST(CudaShape, CatStackSplitChunkUnbind) {
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : kFloatTypes) {
    const DType other = dt == DType::f32 ? DType::f16 : DType::f32;
    OpCheck c0;
    c0.name = std::string("cat dim 0 ") + dtype_name(dt) + " + " + dtype_name(other) + " (promotes)";
    c0.inputs = {uniform({3, 7}, -2, 2, dt), uniform({5, 7}, -2, 2, other), zeros({0}, {.dtype = dt})};
    c0.fn = [](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[2]}, 0); };
    c0.out = exact("copies and exact widening casts");
    c0.grad = exact("slices of the upstream gradient, cast back (exact when the cast narrows the same values) ");
    c0.grad->ulps = 1;  // the f32 gradient of a 16-bit input rounds to it once, identically on both: slack only
    c0.grad_inputs = {0, 1};
    check_op(c0);

    OpCheck c1;
    c1.name = std::string("cat dim 1 of transposed views ") + dtype_name(dt);
    c1.inputs = {uniform({6, 4}, -2, 2, dt), uniform({9, 4}, -2, 2, dt)};
    c1.fn = [](const std::vector<Tensor>& in) { return cat({in[0].t(), in[1].t()}, 1); };
    c1.out = exact("copies");
    c1.grad = exact("slices of the upstream gradient");
    check_op(c1);

    OpCheck st;
    st.name = std::string("stack dim 1 ") + dtype_name(dt);
    st.inputs = {uniform({5, 3}, -2, 2, dt), uniform({5, 3}, -2, 2, dt), uniform({5, 3}, -2, 2, dt)};
    st.fn = [](const std::vector<Tensor>& in) { return stack({in[0], in[1], in[2]}, 1); };
    st.out = exact("copies");
    st.grad = exact("slices of the upstream gradient");
    check_op(st);

    OpCheck sp;
    sp.name = std::string("split/chunk/unbind then recombine ") + dtype_name(dt);
    sp.inputs = {uniform({10, 6}, -2, 2, dt)};
    sp.fn = [](const std::vector<Tensor>& in) {
      const auto parts = split(in[0], 4, 0);    // 4, 4, 2 rows
      const auto cols = chunk(parts[1], 3, 1);  // 3 column pairs
      const auto rows = unbind(parts[2], 0);    // 2 rows of 6
      return cat({parts[0].t().contiguous().view({-1}), cols[2].contiguous().view({-1}) * 2.0,
                  stack({rows[1], rows[0]}, 0).view({-1})},
                 0);
    };
    sp.out = exact("views, copies and an exact product");
    sp.grad = exact("slices of the upstream gradient into one buffer per node");
    check_op(sp);
  }
}

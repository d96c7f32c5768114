// CUDA against the CPU, reductions: the contracts that are not one op's values within a tolerance. Every reduction's
// values (sum / mean / var / sum_squares / amax / amin / argmax / sum_to_size over rows, columns, several dims,
// transposed and broadcast views, large sums exact on small integers, ties) and cat / stack / split are op-table
// cases (tests/ops/op_cases_reduce_index_rnn.cpp). Here: max(x, dim) returns the first maximum's index with its value
// and sends the gradient there, and NaN wins every reduction at the first NaN's index.
//
// Tests skip without a CUDA device; MP_CUDA_TESTS_ON_CPU=1 runs them with the CPU as the device (self-check).
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.hpp"

using namespace mp;
using namespace mp::cuda_test;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

TEST(CudaReduce, MaxWithIndicesAndNaN) {
  MP_SKIP_WITHOUT_GPU();
  // Values from a small set: ties everywhere, so the "first extreme" index rule is exercised. Selections: identical.
  for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i64, DType::i32}) {
    const bool fl = is_floating(dt);
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
}

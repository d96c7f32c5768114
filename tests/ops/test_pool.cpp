// max_pool2d, avg_pool2d, adaptive_avg_pool2d: hand-computed values (PyTorch's window and divisor rules,
// ceil_mode including the "last window starts inside" rule), gradient checks (f64), the parallel path against
// single planes, 16-bit inputs against f32, and error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using autograd::gradcheck;

namespace {
using mp::test::expect_ok;
using mp::test::leaf;

// 0, 1, 2, ... laid out as [1, 1, h, w] (f32, exact).
Tensor iota(int64_t h, int64_t w) {
  return arange(0.0, static_cast<double>(h * w), 1.0, {.dtype = DType::f32}).view({1, 1, h, w});
}

// A leaf whose values are a shuffled ladder with steps of 0.05: no two values are within the central-difference
// step of each other, so max pool has no ties or near-ties for gradcheck to trip on.
Tensor distinct_leaf(const Shape& s, unsigned seed) {
  const int64_t n = shape_numel(s);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = 0.05 * static_cast<double>(i) - 0.025 * static_cast<double>(n);
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return from_vector(v, s).requires_grad_();
}

using PoolFn = std::function<Tensor(const Tensor&)>;

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) { return e.what(); }
  return "<no error>";
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  const std::string msg = what_of(f);
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
}

}  // namespace

TEST(MaxPool2d, KnownValues) {
  // 4x4 of 0..15, 2x2 windows: the bottom-right of each window.
  EXPECT_EQ(max_pool2d(iota(4, 4), {.kernel = {2, 2}}).to_vector<float>(), (std::vector<float>{5, 7, 13, 15}));
  // 3x3 windows, stride 2, padding 1 (padding is -inf, never selected): windows rows/cols [-1, 2) and [1, 4).
  EXPECT_EQ(max_pool2d(iota(4, 4), {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}).to_vector<float>(),
            (std::vector<float>{5, 7, 13, 15}));
  // All-negative input with padding: the padded -inf never wins over a real value.
  EXPECT_EQ(
      max_pool2d(full({1, 1, 2, 2}, -3.0), {.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1}}).to_vector<float>(),
      (std::vector<float>(4, -3.0f)));
  // Rectangular kernel and stride: 4x6 of 0..23, kernel (2, 3), stride (2, 3).
  EXPECT_EQ(max_pool2d(iota(4, 6), {.kernel = {2, 3}}).to_vector<float>(), (std::vector<float>{8, 11, 20, 23}));
}

TEST(MaxPool2d, CeilMode) {
  // 5x5, 2x2 stride 2: floor gives 2x2; ceil adds a partial last window [4, 5) in each dim.
  EXPECT_EQ(max_pool2d(iota(5, 5), {.kernel = {2, 2}}).sizes(), (Shape{1, 1, 2, 2}));
  Tensor c = max_pool2d(iota(5, 5), {.kernel = {2, 2}, .ceil_mode = true});
  ASSERT_EQ(c.sizes(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{6, 8, 9, 16, 18, 19, 21, 23, 24}));
  // 6, kernel 3, stride 2: floor 2, ceil 3.
  EXPECT_EQ(max_pool2d(iota(6, 6), {.kernel = {3, 3}, .stride = {2, 2}, .ceil_mode = true}).sizes(),
            (Shape{1, 1, 3, 3}));
  // 5, kernel 2, stride 2, padding 1: ceil((5 + 2 - 2) / 2) + 1 = 4, but window 4 would start at 6 - 1 = 5,
  // past the input (5 + left padding 1 <= 6): PyTorch drops it, giving 3.
  EXPECT_EQ(max_pool2d(iota(5, 5), {.kernel = {2, 2}, .padding = {1, 1}, .ceil_mode = true}).sizes(),
            (Shape{1, 1, 3, 3}));
  // 6, kernel 3, stride 2, padding 1: floor 3, ceil 4 (window 4 starts at 5, inside the input: kept).
  EXPECT_EQ(max_pool2d(iota(6, 6), {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true}).sizes(),
            (Shape{1, 1, 4, 4}));
}

TEST(MaxPool2d, TiesGoToTheFirstAndOverlapsAccumulate) {
  // Equal values: the first in the window (row-major) gets the gradient, as in PyTorch.
  Tensor x = ones({1, 1, 2, 2}, {.dtype = DType::f64}).requires_grad_();
  sum(max_pool2d(x, {.kernel = {2, 2}})).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 0, 0, 0}));
  // Overlapping 2x2 windows (stride 1) over a 3x3 whose centre is the largest: all four windows pick it.
  Tensor y = from_vector<double>({0, 1, 2, 3, 9, 4, 5, 6, 7}, {1, 1, 3, 3}).requires_grad_();
  sum(max_pool2d(y, {.kernel = {2, 2}, .stride = {1, 1}})).backward();
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 0, 4, 0, 0, 0, 0}));
}

TEST(MaxPool2d, NanPropagates) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = from_vector<float>({1, nan, 3, 4, 5, 6, 7, 8}, {1, 1, 2, 4});
  auto v = max_pool2d(x, {.kernel = {2, 2}}).to_vector<float>();
  EXPECT_TRUE(std::isnan(v[0]));
  EXPECT_EQ(v[1], 8.0f);
}

TEST(AvgPool2d, CountIncludePadAndCeilMode) {
  // Ones 4x4, 3x3 windows, stride 2, padding 1 -> 2x2. Window (0,0) covers 4 inputs of 9 padded positions,
  // (0,1) and (1,0) cover 6, (1,1) covers 9.
  const Pool2dOptions o{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  auto inc = avg_pool2d(ones({1, 1, 4, 4}), o).to_vector<float>();
  const std::vector<float> inc_want{4.0f / 9, 6.0f / 9, 6.0f / 9, 1.0f};
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(inc[i], inc_want[i]) << i;
  Pool2dOptions ex = o;
  ex.count_include_pad = false;
  EXPECT_EQ(avg_pool2d(ones({1, 1, 4, 4}), ex).to_vector<float>(), (std::vector<float>(4, 1.0f)));
  // ceil_mode without padding: a window hanging past the input divides by its in-bounds part only (the window is
  // clipped to the padded input, which here is the input). 5x5 of 0..24, 2x2 stride 2 -> 3x3.
  Tensor c = avg_pool2d(iota(5, 5), {.kernel = {2, 2}, .ceil_mode = true});
  ASSERT_EQ(c.sizes(), (Shape{1, 1, 3, 3}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{3, 5, 6.5f, 13, 15, 16.5f, 20.5f, 22.5f, 24}));
  // ceil_mode with padding: 6x6 ones, 3x3 stride 2 padding 1 -> 4x4. The last window [5, 8) is clipped to the
  // padded input [5, 7) (2 positions, 1 inside), so with count_include_pad the corner is 1 / (2 * 2).
  const Pool2dOptions cp{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true};
  auto v = avg_pool2d(ones({1, 1, 6, 6}), cp).to_vector<float>();
  ASSERT_EQ(v.size(), 16u);
  EXPECT_FLOAT_EQ(v[0], 4.0f / 9);
  EXPECT_FLOAT_EQ(v[3], 2.0f / 6);
  EXPECT_FLOAT_EQ(v[15], 1.0f / 4);
  EXPECT_FLOAT_EQ(v[5], 1.0f);
  Pool2dOptions cpx = cp;
  cpx.count_include_pad = false;
  EXPECT_EQ(avg_pool2d(ones({1, 1, 6, 6}), cpx).to_vector<float>(), (std::vector<float>(16, 1.0f)));
}

TEST(AdaptiveAvgPool2d, PyTorchBins) {
  // 5x7 of 7r + c -> 3x2. Row bins [0,2), [1,4), [3,5) (means 0.5, 2, 3.5); column bins [0,4), [3,7)
  // (means 1.5, 4.5). Each output is 7 * row mean + column mean.
  Tensor y = adaptive_avg_pool2d(iota(5, 7), {3, 2});
  ASSERT_EQ(y.sizes(), (Shape{1, 1, 3, 2}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{5, 8, 15.5f, 18.5f, 26, 29}));
  EXPECT_EQ(adaptive_avg_pool2d(iota(5, 7), {1, 1}).to_vector<float>(), (std::vector<float>{17}));
  // Identity size and upsampling (bins overlap: 2 -> 3 gives [0,1), [0,2), [1,2)).
  EXPECT_EQ(adaptive_avg_pool2d(iota(3, 4), {3, 4}).to_vector<float>(), iota(3, 4).to_vector<float>());
  EXPECT_EQ(adaptive_avg_pool2d(iota(2, 1), {3, 1}).to_vector<float>(), (std::vector<float>{0, 0.5f, 1}));
}

TEST(Gradcheck, MaxPool2d) {
  const Pool2dOptions cases[] = {
      {.kernel = {2, 2}},
      {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}},
      {.kernel = {3, 2}, .stride = {1, 2}, .padding = {1, 0}},
      {.kernel = {2, 2}, .stride = {2, 2}, .ceil_mode = true},
      {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true},
  };
  unsigned seed = 1;
  for (const Pool2dOptions& o : cases) {
    SCOPED_TRACE(seed);
    expect_ok(gradcheck([o](auto& in) { return std::vector<Tensor>{max_pool2d(in[0], o)}; },
                        {distinct_leaf({2, 3, 5, 6}, seed++)}));
  }
}

TEST(Gradcheck, AvgPool2d) {
  manual_seed(31);
  const Pool2dOptions cases[] = {
      {.kernel = {2, 2}},
      {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}},
      {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .count_include_pad = false},
      {.kernel = {3, 2}, .stride = {1, 2}, .padding = {1, 1}},
      {.kernel = {2, 2}, .stride = {2, 2}, .ceil_mode = true},
      {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true},
      {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true, .count_include_pad = false},
  };
  int i = 0;
  for (const Pool2dOptions& o : cases) {
    SCOPED_TRACE(i++);
    expect_ok(gradcheck([o](auto& in) { return std::vector<Tensor>{avg_pool2d(in[0], o)}; }, {leaf({2, 3, 5, 6})}));
  }
}

TEST(Gradcheck, AdaptiveAvgPool2d) {
  manual_seed(32);
  const std::array<int64_t, 2> sizes[] = {{3, 2}, {1, 1}, {5, 7}, {4, 9}, {2, 3}};
  for (const auto& s : sizes) {
    SCOPED_TRACE(s[0] * 100 + s[1]);
    expect_ok(
        gradcheck([s](auto& in) { return std::vector<Tensor>{adaptive_avg_pool2d(in[0], s)}; }, {leaf({2, 2, 5, 7})}));
  }
}

TEST(Pool2d, ParallelPathMatchesSinglePlanes) {
  // 4 x 16 planes of 32x32 = 65536 elements takes the OpenMP path; every plane must equal the same op run on
  // that plane alone (the single-threaded path), forward and backward, bit for bit.
  manual_seed(33);
  Tensor x = randn({4, 16, 32, 32});
  const std::vector<std::pair<const char*, PoolFn>> fns{
      {"max",
       [](const Tensor& t) {
         return max_pool2d(t, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
       }},
      {"avg",
       [](const Tensor& t) {
         return avg_pool2d(t, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
       }},
      {"adaptive",
       [](const Tensor& t) {
         return adaptive_avg_pool2d(t, {5, 7});
       }},
  };
  for (const auto& [name, fn] : fns) {
    SCOPED_TRACE(name);
    Tensor xa = x.clone().requires_grad_();
    Tensor y = fn(xa);
    Tensor gy = randn(y.sizes());
    y.backward(gy);
    for (int64_t p : {0L, 17L, 63L}) {
      const int64_t n = p / 16, c = p % 16;
      Tensor xp = x.narrow(0, n, 1).narrow(1, c, 1).contiguous().requires_grad_();
      Tensor yp = fn(xp);
      yp.backward(gy.narrow(0, n, 1).narrow(1, c, 1).contiguous());
      EXPECT_EQ(yp.to_vector<float>(), y.narrow(0, n, 1).narrow(1, c, 1).to_vector<float>()) << "plane " << p;
      EXPECT_EQ(xp.grad().to_vector<float>(), xa.grad().narrow(0, n, 1).narrow(1, c, 1).to_vector<float>())
          << "plane " << p;
    }
  }
}

TEST(Pool2d, NonContiguousInput) {
  manual_seed(34);
  Tensor x = randn({2, 3, 6, 5});
  Tensor xt = x.permute({0, 1, 3, 2}).contiguous().permute({0, 1, 3, 2});
  ASSERT_FALSE(xt.is_contiguous());
  const Pool2dOptions o{.kernel = {2, 2}, .ceil_mode = true};
  EXPECT_EQ(max_pool2d(xt, o).to_vector<float>(), max_pool2d(x, o).to_vector<float>());
  EXPECT_EQ(avg_pool2d(xt, o).to_vector<float>(), avg_pool2d(x, o).to_vector<float>());
  EXPECT_EQ(adaptive_avg_pool2d(xt, {2, 3}).to_vector<float>(), adaptive_avg_pool2d(x, {2, 3}).to_vector<float>());
}

// 16-bit inputs against f32 on the same rounded inputs. Tolerances (u = unit roundoff of the format: bf16 2^-8,
// f16 2^-11):
//   max pool, forward and backward with stride = kernel: exact (selects an input; each dx element receives at
//   most one dy value);
//   avg pool / adaptive avg pool: f32 sums of at most 9 / 12 values in both paths (9 * 2^-24 of the sum of |x|,
//   negligible but included), then one rounding of the output (u |r|);
//   their backward: each dx element sums at most 4 / 4 rounded-on-store contributions computed in f32, then one
//   rounding: same bound.
class Pool2dLowPrecision : public ::testing::TestWithParam<DType> {};

TEST_P(Pool2dLowPrecision, MatchesF32OnRoundedInputs) {
  const DType dt = GetParam();
  const double u = dt == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  manual_seed(35);
  Tensor x = randn({2, 3, 8, 9}).to(dt);
  struct Case {
    const char* name;
    PoolFn fn;
    bool exact;
  };
  const Case cases[] = {
      {"max 2x2",
       [](const Tensor& t) {
         return max_pool2d(t, {.kernel = {2, 2}});
       },
       true},
      {"avg 3x3 s2 p1",
       [](const Tensor& t) {
         return avg_pool2d(t, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
       },
       false},
      {"adaptive 3x4",
       [](const Tensor& t) {
         return adaptive_avg_pool2d(t, {3, 4});
       },
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Tensor xl = x.detach().requires_grad_(), xr = x.to(DType::f32).detach().requires_grad_();
    Tensor yl = c.fn(xl), yr = c.fn(xr);
    ASSERT_EQ(yl.dtype(), dt);
    Tensor gy = randn(yl.sizes()).to(dt);
    yl.backward(gy);
    yr.backward(gy.to(DType::f32));
    // Scale for the accumulation term: the same op on |x| (and |dy|).
    Tensor xs = abs(x.to(DType::f32)).detach().requires_grad_();
    Tensor ys = c.fn(xs);
    ys.backward(abs(gy.to(DType::f32)));
    const std::vector<float> pairs[2][3] = {
        {yl.to_vector<float>(), yr.to_vector<float>(), ys.to_vector<float>()},
        {xl.grad().to_vector<float>(), xr.grad().to_vector<float>(), xs.grad().to_vector<float>()},
    };
    for (int k = 0; k < 2; ++k) {
      const auto &a = pairs[k][0], &r = pairs[k][1], &s = pairs[k][2];
      ASSERT_EQ(a.size(), r.size());
      for (size_t i = 0; i < a.size(); ++i) {
        if (c.exact) {
          ASSERT_EQ(a[i], r[i]) << (k ? "dx" : "y") << " element " << i;
        } else {
          const double tol = u * std::abs(r[i]) + 2 * 9 * std::ldexp(s[i], -24);
          ASSERT_LE(std::abs(a[i] - r[i]), tol)
              << (k ? "dx" : "y") << " element " << i << ": got " << a[i] << ", f32 gives " << r[i];
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(LowPrecision, Pool2dLowPrecision, ::testing::Values(DType::bf16, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Pool2d, ErrorMessages) {
  const Tensor x = ones({1, 2, 5, 5});
  expect_error([&] { max_pool2d(ones({2, 5, 5}), {}); }, {"max_pool2d", "expected input [N, C, H, W]", "unsqueeze(0)"});
  expect_error([&] { avg_pool2d(ones({5, 5}), {}); }, {"avg_pool2d", "expected input [N, C, H, W]", "[5, 5]"});
  expect_error([&] { adaptive_avg_pool2d(ones({5}), {1, 1}); }, {"adaptive_avg_pool2d", "expected input"});
  expect_error([&] { max_pool2d(x, {.kernel = {0, 2}}); }, {"max_pool2d", "positive kernel", "kernel=(0, 2)"});
  expect_error([&] { avg_pool2d(x, {.kernel = {2, 2}, .stride = {-1, 1}}); }, {"avg_pool2d", "stride=(-1, 1)"});
  expect_error(
      [&] {
        max_pool2d(x, {.kernel = {3, 3}, .padding = {2, 1}});
      },
      {"max_pool2d", "padding between 0 and half the kernel size", "padding=(2, 1)", "kernel=(3, 3)"});
  expect_error([&] { avg_pool2d(x, {.kernel = {6, 2}}); }, {"avg_pool2d", "output size is too small", "gives 0x2"});
  expect_error([&] { adaptive_avg_pool2d(x, {0, 3}); }, {"adaptive_avg_pool2d", "positive output size", "(0, 3)"});
  expect_error([&] { max_pool2d(ones({1, 2, 0, 5}), {}); }, {"max_pool2d", "non-empty", "[1, 2, 0, 5]"});
  expect_error([&] { max_pool2d(ones({1, 2, 4, 4}, {.dtype = DType::i32}), {}); }, {"max_pool2d", "floating", "i32"});
}

TEST(MaxPool2d, FastPathSpecialValuesMatchTheScanRule) {
  // The 2x2 stride-2 fast paths (Note [pooling fast paths], src/backend/cpu/pool.cpp: wide rows, rows of
  // 7 outputs, and 7x7 planes with rows of 3) against the general loop's rule written out here: scan the
  // cell a b / c d from m = -inf at the top-left offset, take v when v > m or v is NaN. So ties (including
  // -0 vs +0) keep the first, the last NaN wins, an all -inf cell selects the top-left. Values are compared
  // bit for bit (NaN as NaN) and the selected inputs through the gradient.
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  const double pool[] = {nan, inf, -inf, -0.0, 0.0, 1.0, -1.0, 2.0, 2.0, 0.5, -inf, -0.0};
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return pool[(state >> 33) % std::size(pool)];
  };
  for (const Shape& s : {Shape{2, 3, 16, 16}, Shape{1, 2, 14, 14}, Shape{2, 3, 7, 7}})
    for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
      SCOPED_TRACE(shape_str(s) + " " + dtype_name(dt));
      const int64_t P = s[0] * s[1], H = s[2], W = s[3], OH = H / 2, OW = W / 2;
      std::vector<double> xs(static_cast<size_t>(P * H * W));
      for (double& v : xs) v = next();
      Tensor x = from_vector<double>(xs, s).to(dt).requires_grad_();
      Tensor y = max_pool2d(x, {.kernel = {2, 2}, .stride = {2, 2}});
      y.backward(ones_like(y));
      const auto yv = y.to_vector<double>(), gv = x.grad().to_vector<double>();
      std::vector<double> want_g(xs.size(), 0.0);
      for (int64_t p = 0; p < P; ++p)
        for (int64_t oy = 0; oy < OH; ++oy)
          for (int64_t ox = 0; ox < OW; ++ox) {
            const int64_t base = p * H * W;
            int64_t best = base + 2 * oy * W + 2 * ox;
            double m = -inf;
            for (int64_t dy = 0; dy < 2; ++dy)
              for (int64_t dx = 0; dx < 2; ++dx) {
                const int64_t i = base + (2 * oy + dy) * W + 2 * ox + dx;
                if (xs[i] > m || std::isnan(xs[i])) m = xs[i], best = i;
              }
            const double got = yv[(p * OH + oy) * OW + ox];
            ASSERT_EQ(std::isnan(got), std::isnan(m)) << "window " << p << "," << oy << "," << ox;
            if (!std::isnan(m)) {
              ASSERT_EQ(got, m);
              ASSERT_EQ(std::signbit(got), std::signbit(m)) << "-0 vs +0 tie must keep the first";
            }
            want_g[best] += 1.0;
          }
      ASSERT_EQ(gv, want_g);
    }
}

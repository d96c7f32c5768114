// Channels-last (NHWC) activations: the memory-format API of Tensor, element-wise ops keeping the layout,
// conv2d and batch_norm on channels-last inputs against the same data in NCHW (values, gradients, output
// layouts), and a ResNet built channels-last against the same ResNet in NCHW.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;

namespace {

constexpr MemoryFormat kCL = MemoryFormat::channels_last;

std::vector<double> values(const Tensor& t) { return t.detach().to(DType::f64).to_vector<double>(); }

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// |a - b| <= tol * max|b| element by element (tol 0: bit-equal values).
void expect_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  const std::vector<double> va = values(a), vb = values(b);
  const double bound = tol * max_abs(vb);
  size_t bad = 0;
  for (size_t i = 0; i < va.size(); ++i)
    if (!(std::abs(va[i] - vb[i]) <= bound) && bad++ < 3)
      ADD_FAILURE() << what << ": element " << i << " is " << va[i] << ", expected " << vb[i] << " (bound " << bound
                    << ")";
  EXPECT_EQ(bad, 0u) << what;
}

// Tolerance of a channels-last result against the NCHW one, per dtype. f64 runs the same double loops on
// copies: bit-equal. f32: the two layouts may run different oneDNN kernels (1x1 convolutions: gemm on NCHW vs
// NHWC), i.e. the same f32 products summed in another order: ~1e-6 relative over a few hundred terms, 1e-5 of
// the largest value leaves a margin. f16/bf16 results are rounded once to 11/8 significant bits; a different
// f32 sum order can move that rounding by one unit: 2^-10 / 2^-7 of the largest value covers one unit of any
// element plus the order effect.
double layout_tol(DType dt) {
  switch (dt) {
    case DType::f64: return 0.0;
    case DType::f32: return 1e-5;
    case DType::f16: return std::ldexp(1.0, -10);
    default: return std::ldexp(1.0, -7);
  }
}

TEST(MemoryFormat, StridesAndPredicates) {
  const Tensor t = empty({2, 3, 4, 5}, {.memory_format = kCL});
  EXPECT_EQ(t.strides(), (Shape{60, 1, 15, 3}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.is_contiguous(kCL));
  EXPECT_EQ(t.suggest_memory_format(), kCL);
  const Tensor c = empty({2, 3, 4, 5});
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.is_contiguous(kCL));
  EXPECT_EQ(c.suggest_memory_format(), MemoryFormat::contiguous);
  // A permuted NHWC buffer is channels-last; a transposed H/W is neither.
  EXPECT_EQ(empty({2, 4, 5, 3}).permute({0, 3, 1, 2}).suggest_memory_format(), kCL);
  EXPECT_EQ(c.transpose(2, 3).suggest_memory_format(), MemoryFormat::contiguous);
  EXPECT_FALSE(c.transpose(2, 3).is_contiguous(kCL));
  EXPECT_FALSE(empty({2, 3, 4}).is_contiguous(kCL));
  test::expect_error([] { (void)empty({2, 3, 4}, {.memory_format = kCL}); }, {"4-D", "[2, 3, 4]"});
}

TEST(MemoryFormat, ContiguousInFormatCopiesValuesAndKeepsAutograd) {
  const Tensor x = rand({2, 3, 4, 5}, {.dtype = DType::f64}, -1.0, 1.0).requires_grad_();
  const Tensor y = x.contiguous(kCL);
  EXPECT_EQ(y.suggest_memory_format(), kCL);
  EXPECT_FALSE(y.is_alias_of(x));
  EXPECT_EQ(values(y), values(x));
  EXPECT_TRUE(y.contiguous(kCL).is_alias_of(y));  // already in the format: no copy
  EXPECT_EQ(values(y.contiguous()), values(x));   // and back
  const Tensor w = rand({2, 3, 4, 5}, {.dtype = DType::f64});
  sum(mul(y, w)).backward();
  EXPECT_EQ(values(x.grad()), values(w));
  // A cast keeps the layout.
  EXPECT_EQ(y.to(DType::bf16).suggest_memory_format(), kCL);
  EXPECT_EQ(values(y.to(DType::f32)), values(x.to(DType::f32)));
}

TEST(MemoryFormat, AmbiguousShapesAreRestridedNotCopied) {
  // C == 1: NCHW and NHWC are the same bytes. contiguous(channels_last) restrides (a view) so that ops
  // downstream see the requested layout; a plain tensor of that shape stays contiguous.
  const Tensor x = rand({2, 1, 4, 4});
  EXPECT_EQ(x.suggest_memory_format(), MemoryFormat::contiguous);
  const Tensor y = x.contiguous(kCL);
  EXPECT_TRUE(y.is_alias_of(x));
  EXPECT_EQ(y.strides(), (Shape{16, 1, 4, 1}));
  EXPECT_EQ(y.suggest_memory_format(), kCL);
  EXPECT_TRUE(y.is_contiguous());  // still dense row-major: raw pointers read the same values
  // 1x1 spatial, likewise.
  const Tensor p = rand({3, 8, 1, 1});
  EXPECT_EQ(p.suggest_memory_format(), MemoryFormat::contiguous);
  EXPECT_EQ(p.contiguous(kCL).suggest_memory_format(), kCL);
}

TEST(MemoryFormat, ElementwiseOpsKeepChannelsLast) {
  const Tensor a = rand({2, 5, 3, 4}, {}, -1.0, 1.0), b = rand({2, 5, 3, 4}, {}, -1.0, 1.0);
  const Tensor al = a.contiguous(kCL), bl = b.contiguous(kCL);
  const Tensor r = relu(al);
  EXPECT_EQ(r.suggest_memory_format(), kCL);
  EXPECT_EQ(values(r), values(relu(a)));
  const Tensor s = add(al, bl);
  EXPECT_EQ(s.suggest_memory_format(), kCL);
  EXPECT_EQ(values(s), values(add(a, b)));
  // Mixed layouts: the result follows the first full-shape operand; the values do not care.
  EXPECT_EQ(add(al, b).suggest_memory_format(), kCL);
  EXPECT_EQ(add(a, bl).suggest_memory_format(), MemoryFormat::contiguous);
  EXPECT_EQ(values(add(a, bl)), values(add(a, b)));
  // A broadcast per-channel operand.
  const Tensor bias = rand({1, 5, 1, 1});
  const Tensor sb = add(al, bias);
  EXPECT_EQ(sb.suggest_memory_format(), kCL);
  EXPECT_EQ(values(sb), values(add(a, bias)));
  // bf16 storage through the float loop, and in place.
  EXPECT_EQ(values(mul(al.to(DType::bf16), bl.to(DType::bf16))), values(mul(a.to(DType::bf16), b.to(DType::bf16))));
  Tensor acc = al.clone().contiguous(kCL);
  add_(acc, b);
  EXPECT_EQ(values(acc), values(add(a, b)));
  // ReLU's gradient keeps the layout too.
  const Tensor xl = a.contiguous(kCL).detach().requires_grad_();
  Tensor g = relu(xl);
  sum(mul(g, b)).backward();
  EXPECT_EQ(values(xl.grad()), values(mul(b, gt(a, zeros({})).to(DType::f32))));
}

TEST(MemoryFormat, FlagValues) {
  EXPECT_EQ(models::memory_format_from_flag("auto"), kCL);
  EXPECT_EQ(models::memory_format_from_flag("nhwc"), kCL);
  EXPECT_EQ(models::memory_format_from_flag("channels_last"), kCL);
  EXPECT_EQ(models::memory_format_from_flag("nchw"), MemoryFormat::contiguous);
  EXPECT_EQ(models::memory_format_from_flag("contiguous"), MemoryFormat::contiguous);
  test::expect_error([] { (void)models::memory_format_from_flag("NHWC4"); },
                     {"--memory_format", "'NHWC4'", "channels_last", "contiguous", "auto"});
}

struct ConvCase {
  Shape x, w;
  Conv2dOptions opt;
  const char* name;
};

std::vector<ConvCase> conv_cases() {
  return {
      {{2, 8, 6, 6}, {12, 8, 3, 3}, {.padding = {1, 1}}, "3x3 pad 1"},
      {{2, 8, 7, 7}, {12, 8, 3, 3}, {.stride = {2, 2}, .padding = {1, 1}}, "3x3 stride 2"},
      {{2, 8, 5, 5}, {12, 8, 1, 1}, {}, "1x1"},
      {{2, 8, 6, 6}, {12, 8, 1, 1}, {.stride = {2, 2}}, "1x1 stride 2"},
      {{2, 8, 4, 4}, {12, 8, 3, 3}, {.padding = {1, 1}}, "4x4 (bf16: GEMM path, padded im2col)"},
      {{2, 8, 7, 7}, {12, 8, 3, 3}, {.stride = {2, 2}}, "7x7 stride 2 no pad (bf16: GEMM path, gathered im2col)"},
      {{2, 8, 8, 8}, {12, 8, 3, 3}, {.padding = {2, 2}, .dilation = {2, 2}}, "dilated"},
      {{2, 8, 6, 6}, {12, 4, 3, 3}, {.padding = {1, 1}, .groups = 2}, "groups 2"},
      {{2, 1, 6, 6}, {12, 1, 3, 3}, {.padding = {1, 1}}, "one input channel (restrided input)"},
  };
}

class ChannelsLastConv : public ::testing::TestWithParam<DType> {};

TEST_P(ChannelsLastConv, MatchesNchwForwardAndBackward) {
  const DType dt = GetParam();
  // bf16 convolutions every way on every CPU: oneDNN's bf16 primitives, im2col + one GEMM, through f32.
  test::for_each_bf16_path([&] {
    manual_seed(6);  // the same data whichever tests ran before in this process
    for (const ConvCase& c : conv_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      const Tensor x0 = rand(c.x, {.dtype = dt}, -1.0, 1.0), w0 = rand(c.w, {.dtype = dt}, -0.5, 0.5);
      const Tensor b0 = rand({c.w[0]}, {}, -0.5, 0.5);
      Tensor gy;  // drawn once, on the first run
      auto run = [&](MemoryFormat f) {
        const Tensor x = x0.contiguous(f).detach().requires_grad_(), w = w0.clone().requires_grad_();
        const Tensor b = b0.clone().requires_grad_();
        const Tensor y = conv2d(x, w, b, c.opt);
        if (!gy.defined()) gy = rand(y.sizes(), {.dtype = dt}, -1.0, 1.0);
        sum(mul(y.to(DType::f32), gy.to(DType::f32))).backward();
        return std::vector<Tensor>{y, x.grad(), w.grad(), b.grad()};
      };
      const std::vector<Tensor> ref = run(MemoryFormat::contiguous), cl = run(kCL);
      EXPECT_EQ(cl[0].suggest_memory_format(), kCL);
      EXPECT_EQ(cl[1].suggest_memory_format(), kCL);
      EXPECT_EQ(ref[0].suggest_memory_format(), MemoryFormat::contiguous);
      const double tol = layout_tol(dt);
      expect_close(cl[0], ref[0], tol, "y");
      expect_close(cl[1], ref[1], tol, "dx");
      // The weight gradient is computed in f32 (f32 sums in another order, and bf16 8x8-or-smaller outputs take
      // the GEMM path channels-last) and stored in the weight's dtype: one unit of 16-bit rounding, as y. The
      // bias is f32: its gradient only sums in another order.
      expect_close(cl[2], ref[2], tol, "dweight");
      expect_close(cl[3], ref[3], dt == DType::f64 ? 0.0 : 1e-5, "dbias");
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ChannelsLastConv, ::testing::Values(DType::f32, DType::bf16, DType::f64, DType::f16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(ChannelsLast, BatchNormMatchesNchwAndKeepsLayout) {
  manual_seed(5);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x0 = add(mul(rand({4, 6, 5, 3}, {.dtype = dt}, -1.0, 1.0), 3.0), 0.5).to(dt);
    const Tensor gy = rand(x0.sizes(), {.dtype = dt}, -1.0, 1.0);
    const Tensor w0 = rand({6}, {.dtype = DType::f32}, 0.5, 1.5), b0 = rand({6}, {.dtype = DType::f32}, -0.5, 0.5);
    auto run = [&](MemoryFormat f, bool training) {
      const Tensor x = x0.contiguous(f).detach().requires_grad_();
      const Tensor w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
      const Tensor rm = zeros({6}), rv = ones({6});
      const Tensor y = batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5);
      sum(mul(y.to(DType::f64), gy.to(DType::f64))).backward();
      return std::vector<Tensor>{y, x.grad(), w.grad(), b.grad(), rm, rv};
    };
    for (bool training : {true, false}) {
      SCOPED_TRACE(training ? "training" : "eval");
      const std::vector<Tensor> ref = run(MemoryFormat::contiguous, training), cl = run(kCL, training);
      EXPECT_EQ(cl[0].suggest_memory_format(), kCL);
      EXPECT_EQ(cl[1].suggest_memory_format(), kCL);
      // The channels-last kernel sums the statistics in another order (rows of channels, not planes):
      // f32 sums of 60 values per channel, a few ulp; 16-bit outputs may round one unit apart.
      const double tol = dt == DType::f64 ? 1e-12 : dt == DType::f32 ? 1e-5 : std::ldexp(1.0, -7);
      const char* names[] = {"y", "dx", "dweight", "dbias", "running_mean", "running_var"};
      for (size_t i = 0; i < ref.size(); ++i) expect_close(cl[i], ref[i], i < 2 ? tol : std::max(tol, 1e-5), names[i]);
    }
  }
}

TEST(ChannelsLast, ResNetMatchesNchw) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "f32");
    auto run = [&](MemoryFormat f) {
      manual_seed(7);
      auto net = models::create_image_model("resnet8", {.in_channels = 3, .image_size = 8, .memory_format = f});
      net->train();
      manual_seed(8);
      const Tensor x = rand({4, 3, 8, 8}, {}, -1.0, 1.0);
      Tensor loss;
      {
        amp::Autocast ac({.dtype = DType::bf16, .enabled = bf16});
        loss = cross_entropy(net->forward(x), from_vector<int64_t>({1, 2, 3, 4}, {4}));
      }
      loss.backward();
      std::vector<Tensor> out{loss};
      for (const auto& [name, p] : net->named_parameters()) out.push_back(p.grad());
      return out;
    };
    const std::vector<Tensor> ref = run(MemoryFormat::contiguous), cl = run(kCL);
    ASSERT_EQ(ref.size(), cl.size());
    // f32: sums in another order in the 1x1 convolutions and batch norm; bf16: activations rounded to 8
    // bits after each layer, where one unit of difference anywhere propagates: 2% of the largest gradient.
    const double tol = bf16 ? 2e-2 : 1e-4;
    for (size_t i = 0; i < ref.size(); ++i) expect_close(cl[i], ref[i], tol, "tensor " + std::to_string(i));
  }
}

}  // namespace

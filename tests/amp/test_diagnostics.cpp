// Diagnostics of mixed-precision training (mp/amp/diagnostics.hpp): underflow statistics of gradients
// against f16's range, and OverflowFinder naming the module whose output (forward) or output gradient
// (backward) first became inf/NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "mp/mp.hpp"

using namespace mp;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// y = x * factor in x's dtype (1e30 overflows f16 and bf16 never does: bf16 has f32's range).
class ScaleBy : public nn::UnaryModule {
 public:
  explicit ScaleBy(double factor) : UnaryModule("ScaleBy"), factor_(factor) {}
  Tensor forward(const Tensor& x) override { return x * factor_; }

 private:
  double factor_;
};

}  // namespace

// ============================================================================ underflow statistics

TEST(UnderflowStats, ClassifiesAgainstF16Range) {
  // 7 nonzero finite values: three below 2^-24 (lost in f16), two f16 subnormals, two normals; plus
  // a zero (not counted) and two non-finite values (counted apart), over f32 and f64 tensors.
  const Tensor a = from_vector<float>({0.f, 1e-9f, -1e-9f, 1e-6f, -3e-5f, 1e-3f, 1.f, static_cast<float>(kInf)}, {8});
  const Tensor b = from_vector<double>({std::nan(""), 1e-8}, {2});
  const amp::UnderflowStats s = amp::underflow_stats({a, b}, 1024.0);
  EXPECT_EQ(s.nonzero, 7);
  EXPECT_EQ(s.nonfinite, 2);
  EXPECT_EQ(s.values, 10);
  EXPECT_EQ(s.zeros, 1);
  EXPECT_DOUBLE_EQ(s.underflow_unscaled, 3.0 / 7);
  EXPECT_DOUBLE_EQ(s.subnormal_unscaled, 2.0 / 7);
  // x1024: 1e-9 -> 1.0e-6 and 1e-8 -> 1.0e-5 are subnormal; 1e-6 and 3e-5 become normal.
  EXPECT_DOUBLE_EQ(s.underflow_scaled, 0.0);
  EXPECT_DOUBLE_EQ(s.subnormal_scaled, 3.0 / 7);
  EXPECT_EQ(s.scale, 1024.0);
  // x65536: 1e-9 -> 6.6e-5 >= 2^-14: everything is an f16 normal.
  const amp::UnderflowStats big = amp::underflow_stats({a, b}, 65536.0);
  EXPECT_DOUBLE_EQ(big.underflow_scaled, 0.0);
  EXPECT_DOUBLE_EQ(big.subnormal_scaled, 0.0);
  EXPECT_DOUBLE_EQ(big.underflow_unscaled, 3.0 / 7);  // the unscaled shares do not depend on S
}

TEST(UnderflowStats, BoundariesAndSixteenBitInputs) {
  // 2^-24 itself is representable (a subnormal), 2^-14 is the first normal; the f32 value just below
  // each is in the class below. (f32 inputs are classified exactly; the kernel works in f32.)
  const float m24 = std::ldexp(1.0f, -24), m14 = std::ldexp(1.0f, -14);
  const Tensor edges = from_vector<float>({m24, std::nextafter(m24, 0.0f), m14, std::nextafter(m14, 0.0f)}, {4});
  const amp::UnderflowStats s = amp::underflow_stats({edges}, 1.0);
  EXPECT_EQ(s.nonzero, 4);
  EXPECT_DOUBLE_EQ(s.underflow_unscaled, 0.25);  // nextafter(2^-24, 0)
  EXPECT_DOUBLE_EQ(s.subnormal_unscaled, 0.5);   // 2^-24 and nextafter(2^-14, 0)
  // The same edges reached through the scale: 2^-30 * 2^6 = 2^-24.
  const Tensor shifted = from_vector<float>({std::ldexp(1.0f, -30), std::nextafter(std::ldexp(1.0f, -30), 0.0f)}, {2});
  const amp::UnderflowStats ss = amp::underflow_stats({shifted}, 64.0);
  EXPECT_DOUBLE_EQ(ss.underflow_scaled, 0.5);
  EXPECT_DOUBLE_EQ(ss.subnormal_scaled, 0.5);
  const Tensor h = from_vector<float>({std::ldexp(1.0f, -20), 0.5f}, {2}).to(DType::f16);
  const amp::UnderflowStats sh = amp::underflow_stats({h}, 1.0);
  EXPECT_DOUBLE_EQ(sh.subnormal_unscaled, 0.5);
  const Tensor bf = from_vector<float>({1e-30f, 1e-3f, 0.f, 0.f}, {4}).to(DType::bf16);
  const amp::UnderflowStats sb = amp::underflow_stats({bf}, 1.0);
  EXPECT_EQ(sb.nonzero, 2);
  EXPECT_DOUBLE_EQ(sb.underflow_unscaled, 0.5);  // representable in bf16, lost in f16
  // Nothing to count: all shares 0.
  const amp::UnderflowStats none = amp::underflow_stats({zeros({5}), Tensor()}, 8.0);
  EXPECT_EQ(none.nonzero, 0);
  EXPECT_EQ(none.underflow_unscaled, 0.0);
  EXPECT_EQ(amp::underflow_stats({}, 8.0).nonzero, 0);
}

TEST(UnderflowStats, OfScaledGradientsDividesTheScaleOut) {
  // .grad holds S * g after scaler.scale(loss).backward(); the statistics are those of g at scale S.
  const Tensor g = from_vector<float>({1e-9f, 2e-7f, 1e-4f, 0.5f, 1e-10f, 0.f}, {6});
  const double S = 4096.0;
  Tensor p = zeros({6});
  p.requires_grad_(true);
  p.set_grad(g * S);
  const amp::UnderflowStats from_params = amp::underflow_stats_of_scaled_grads({p}, S);
  const amp::UnderflowStats direct = amp::underflow_stats({g}, S);
  EXPECT_EQ(from_params.nonzero, 5);
  EXPECT_EQ(from_params.nonzero, direct.nonzero);
  EXPECT_DOUBLE_EQ(from_params.underflow_unscaled, direct.underflow_unscaled);
  EXPECT_DOUBLE_EQ(from_params.subnormal_unscaled, direct.subnormal_unscaled);
  EXPECT_DOUBLE_EQ(from_params.underflow_scaled, direct.underflow_scaled);
  EXPECT_DOUBLE_EQ(from_params.subnormal_scaled, direct.subnormal_scaled);
  EXPECT_DOUBLE_EQ(from_params.underflow_unscaled, 2.0 / 5);  // 1e-9 and 1e-10
  EXPECT_DOUBLE_EQ(from_params.underflow_scaled, 0.0);        // x4096: 1e-9 -> 4.1e-6, 1e-10 -> 4.1e-7
  EXPECT_DOUBLE_EQ(from_params.subnormal_scaled, 2.0 / 5);    // ... both f16 subnormals
}

// ============================================================================== OverflowFinder

TEST(OverflowFinder, NamesTheModuleWhoseForwardOutputOverflowed) {
  manual_seed(1);
  auto model = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(4, 8), std::make_shared<ScaleBy>(1e30),
                                                std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(8, 2));
  Tensor x = randn({3, 4});
  amp::OverflowFinder finder(*model);
  EXPECT_EQ(finder.report(), "no non-finite values seen");
  // In f32, 1e30 times activations of order 1 is finite (f32 max 3.4e38): nothing found.
  (void)(*model)(x);
  EXPECT_FALSE(finder.first_forward().has_value());
  // In f16 (max 65504) the same layer overflows; later modules see inf too, the first one is named.
  model->to(DType::f16);
  Tensor y = (*model)(x.to(DType::f16));
  ASSERT_TRUE(finder.first_forward().has_value());
  EXPECT_EQ(*finder.first_forward(), "1 (ScaleBy)");
  EXPECT_NE(finder.report().find("forward: first non-finite output from 1 (ScaleBy)"), std::string::npos)
      << finder.report();
  finder.reset();
  EXPECT_FALSE(finder.first_forward().has_value());
  EXPECT_EQ(finder.report(), "no non-finite values seen");
  // bf16 has f32's range: no overflow.
  model->to(DType::bf16);
  (void)(*model)(x.to(DType::bf16));
  EXPECT_FALSE(finder.first_forward().has_value());
}

TEST(OverflowFinder, NamesALayerWithAnInfWeight) {
  manual_seed(2);
  auto model = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>(),
                                                std::make_shared<nn::Linear>(8, 2));
  amp::OverflowFinder finder(*model);
  {
    autograd::NoGradGuard ng;
    Tensor w = model->at<nn::Linear>(2)->weight();
    w.fill_(kInf);
  }
  (void)(*model)(randn({2, 4}));
  ASSERT_TRUE(finder.first_forward().has_value());
  EXPECT_EQ(*finder.first_forward(), "2 (Linear)");
}

// any_nonfinite: one pass over tensors of any floating dtype; integer, empty and undefined ones are skipped.
TEST(AnyNonfinite, FindsInfAndNanInAnyFloatingTensor) {
  const Tensor ok = from_vector<float>({1.f, -2.f}, {2});
  EXPECT_FALSE(amp::any_nonfinite({ok, ok.to(DType::bf16), ok.to(DType::f16), Tensor(), zeros({0})}));
  EXPECT_FALSE(amp::any_nonfinite({}));
  EXPECT_TRUE(amp::any_nonfinite({ok, from_vector<float>({0.f, static_cast<float>(kInf)}, {2}).to(DType::bf16)}));
  EXPECT_TRUE(amp::any_nonfinite({from_vector<double>({std::nan("")}, {1}), ok}));
  EXPECT_TRUE(amp::any_nonfinite({full({3}, 1e5).to(DType::f16)}));  // 1e5 overflows f16: inf
  EXPECT_FALSE(amp::any_nonfinite({from_vector<int64_t>({1, 2}, {2})}));
}

TEST(OverflowFinder, NamesTheModuleWhoseOutputGradientOverflowed) {
  // Forward finite, backward not: an f16 network whose second layer has large weights (100) and
  // tiny inputs. With the loss scaled by 1024 the gradient at the output of layer 1 is 1024 (finite in
  // f16), and at the output of layer 0 it is W1^T (1024 ...) = 8 * 100 * 1024 = 819200 > 65504: inf.
  auto l0 = std::make_shared<nn::Linear>(16, 8, false);
  auto l1 = std::make_shared<nn::Linear>(8, 8, false);
  {
    autograd::NoGradGuard ng;
    Tensor w0 = l0->weight(), w1 = l1->weight();
    w0.fill_(0.01);
    w1.fill_(100.0);
  }
  auto model = std::make_shared<nn::Sequential>(l0, l1);
  model->to(DType::f16);
  amp::OverflowFinder finder(*model);
  Tensor x = full({2, 16}, 0.01, {.dtype = DType::f16});
  Tensor out = (*model)(x);
  EXPECT_FALSE(finder.first_forward().has_value());  // 16 * 1e-4 * 8 * 100 = 1.28: finite
  amp::GradScaler scaler({.init_scale = 1024.0});
  scaler.scale(sum(out.to(DType::f32))).backward();
  ASSERT_TRUE(finder.first_backward().has_value());
  EXPECT_EQ(*finder.first_backward(), "0 (Linear)");
  EXPECT_NE(finder.report().find("backward: first non-finite gradient at the output of 0 (Linear)"), std::string::npos)
      << finder.report();
  // And the scaler refuses the step the finder explains.
  optim::SGD opt(model->parameters(), {.lr = 0.1});
  EXPECT_FALSE(scaler.step(opt));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 512.0);
  // At a small enough scale the same backward is finite.
  finder.reset();
  opt.zero_grad();
  Tensor out2 = (*model)(x);
  sum(out2.to(DType::f32)).backward();  // scale 1: 8 * 100 = 800
  EXPECT_FALSE(finder.first_backward().has_value()) << finder.report();
}

TEST(OverflowFinder, HooksAreRemovedWithTheFinder) {
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(4, 4), std::make_shared<ScaleBy>(1e30));
  model->to(DType::f16);
  Tensor x = randn({2, 4}).to(DType::f16);
  x.requires_grad_(true);
  Tensor pending;
  {
    amp::OverflowFinder finder(*model);
    pending = (*model)(x);  // gradient hooks registered on this graph outlive the finder
    EXPECT_TRUE(finder.first_forward().has_value());
  }
  // Backward after the finder is gone: the hooks share their record, so this is safe.
  EXPECT_NO_THROW(sum(pending.to(DType::f32)).backward());
  // A new finder starts clean and only its own hooks report.
  amp::OverflowFinder again(*model);
  EXPECT_FALSE(again.first_forward().has_value());
  (void)(*model)(x);
  ASSERT_TRUE(again.first_forward().has_value());
  EXPECT_EQ(*again.first_forward(), "1 (ScaleBy)");
}

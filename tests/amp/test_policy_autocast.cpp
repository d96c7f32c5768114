// The per-op policy table and the Autocast guard (docs/DESIGN.md 1.4, mp/autocast/policy.hpp,
// mp/autocast/autocast.hpp): the output dtype of one op of each class, nesting, the cast cache of f32 leaf parameters,
// and the gradient path (f32 gradients for f32 leaves; backward with autocast suspended).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using amp::Autocast;
using amp::CastPolicy;
using amp::Op;

namespace {

// A leaf parameter of `shape` in f32 with requires_grad (what nn layers hold).
Tensor param(const Shape& shape, double scale = 0.5) {
  Tensor t = randn(shape, {}, 0.0, scale);
  t.requires_grad_(true);
  return t;
}

// Largest |a - b| over all elements, in f64.
double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  EXPECT_EQ(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

double max_abs(const Tensor& a) {
  double m = 0;
  for (double v : a.to_vector<double>()) m = std::max(m, std::abs(v));
  return m;
}

using mp::test::bitwise_equal;

}  // namespace

// ------------------------------------------------------------------------------------- the table

// The table itself is MP_AUTOCAST_POLICY (Note [the autocast policy table]); the tests below check that each class
// does what it says on the ops. Here: every op has its own name and a class.
TEST(AmpPolicy, EveryOpHasADistinctNameAndAClass) {
  std::set<std::string> names;
  for (size_t i = 0; i < static_cast<size_t>(Op::kCount); ++i) {
    const Op op = static_cast<Op>(i);
    EXPECT_TRUE(names.insert(amp::op_name(op)).second) << "twice: " << amp::op_name(op);
    for (DeviceType dev : {DeviceType::cpu, DeviceType::cuda})
      EXPECT_NE(amp::cast_policy(op, dev), CastPolicy::none) << amp::op_name(op) << " is listed without a class";
  }
  EXPECT_STREQ(amp::op_name(Op::cross_entropy), "cross_entropy");
  EXPECT_STREQ(amp::op_name(Op::kCount), "?");
  EXPECT_STREQ(amp::policy_name(CastPolicy::lower), "lower");
  EXPECT_STREQ(amp::policy_name(CastPolicy::none), "none");
}

// ------------------------------------------------------------------ output dtypes under autocast

TEST(AmpAutocast, LowerOpsRunInTheAutocastDtype) {
  manual_seed(1);
  Tensor x = randn({4, 8}), w = param({3, 8}), b = param({3});
  Tensor img = randn({2, 3, 6, 6}), k = param({4, 3, 3, 3});
  for (DType low : {DType::bf16, DType::f16}) {
    Autocast guard({.dtype = low});
    EXPECT_EQ(linear(x, w, b).dtype(), low) << dtype_name(low);
    EXPECT_EQ(matmul(x, w.t()).dtype(), low) << dtype_name(low);
    EXPECT_EQ(conv2d(img, k).dtype(), low) << dtype_name(low);
  }
  // Outside any region the same calls stay f32.
  EXPECT_EQ(linear(x, w, b).dtype(), DType::f32);
  EXPECT_EQ(conv2d(img, k).dtype(), DType::f32);
}

TEST(AmpAutocast, LowerCastsInputsThenComputes) {
  // Under autocast, linear(x, w, b) is exactly linear(x.to(bf16), w.to(bf16), b.to(bf16)): the policy
  // casts the inputs and the op runs as written (bit for bit, same kernel on the same operands).
  manual_seed(2);
  Tensor x = randn({5, 16}), w = param({7, 16}), b = param({7});
  Tensor expect;
  {
    autograd::NoGradGuard ng;
    expect = linear(x.to(DType::bf16), w.to(DType::bf16), b.to(DType::bf16));
  }
  Tensor got;
  {
    Autocast guard({.dtype = DType::bf16});
    got = linear(x, w, b);
  }
  EXPECT_TRUE(bitwise_equal(got.detach(), expect));
}

TEST(AmpAutocast, Fp32OpsRunInF32FromBf16Inputs) {
  manual_seed(3);
  Tensor x = randn({4, 5}).to(DType::bf16);
  Tensor target = from_vector<int64_t>({0, 4, 2, 1}, {4});
  Autocast guard({.dtype = DType::bf16});
  EXPECT_EQ(softmax(x, 1).dtype(), DType::f32);
  EXPECT_EQ(log_softmax(x, 1).dtype(), DType::f32);
  EXPECT_EQ(cross_entropy(x, target).dtype(), DType::f32);
  EXPECT_EQ(sum(x).dtype(), DType::f32);
  EXPECT_EQ(mean(x, {1}).dtype(), DType::f32);
  EXPECT_EQ(exp(x).dtype(), DType::f32);
  EXPECT_EQ(log(abs(x) + 1.0).dtype(), DType::f32);
  // f64 is the widest type and stays f64 (fp32 means "at least f32").
  EXPECT_EQ(softmax(randn({2, 3}, {.dtype = DType::f64}), 1).dtype(), DType::f64);
}

TEST(AmpAutocast, PromoteOpsRunInTheWidestInputType) {
  manual_seed(4);
  Tensor a = randn({3, 4}), b16 = randn({3, 4}).to(DType::bf16);
  Autocast guard({.dtype = DType::bf16});
  EXPECT_EQ(add(a, b16).dtype(), DType::f32);
  EXPECT_EQ(mul(b16, a).dtype(), DType::f32);
  EXPECT_EQ(cat({a, b16}, 0).dtype(), DType::f32);
  EXPECT_EQ(cat({a, b16}, 0).size(0), 6);
  EXPECT_EQ(stack({b16, a}, 0).dtype(), DType::f32);
  // Two bf16 inputs stay bf16 (promote does not raise the widest type).
  EXPECT_EQ(add(b16, b16).dtype(), DType::bf16);
  // The f32 value of the promoted add equals the f32 add of the widened bf16 operand.
  Tensor expect;
  {
    Autocast off({.enabled = false});
    expect = add(a, b16.to(DType::f32));
  }
  EXPECT_TRUE(bitwise_equal(add(a, b16), expect));
}

TEST(AmpAutocast, OpsOutsideTheTableRunInTheirInputDtype) {
  Tensor x16 = randn({2, 8}).to(DType::bf16), x32 = randn({2, 8});
  Autocast guard({.dtype = DType::bf16});
  EXPECT_EQ(relu(x16).dtype(), DType::bf16);
  EXPECT_EQ(relu(x32).dtype(), DType::f32);  // "none" never lowers
  EXPECT_EQ(max_pool2d(randn({1, 1, 4, 4}).to(DType::bf16), {}).dtype(), DType::bf16);
}

TEST(AmpAutocast, LowerLeavesF64Alone) {
  Tensor x = randn({2, 3}, {.dtype = DType::f64}), w = randn({4, 3}, {.dtype = DType::f64});
  Autocast guard({.dtype = DType::bf16});
  EXPECT_EQ(linear(x, w).dtype(), DType::f64);
}

// ------------------------------------------------------------------------------- the guard itself

TEST(AmpAutocast, NestedGuards) {
  manual_seed(5);
  Tensor x = randn({2, 8}), w = param({4, 8});
  EXPECT_FALSE(amp::autocast_active(DeviceType::cpu));
  {
    Autocast outer({.dtype = DType::bf16});
    EXPECT_TRUE(amp::autocast_active(DeviceType::cpu));
    EXPECT_EQ(amp::autocast_dtype(), DType::bf16);
    EXPECT_EQ(linear(x, w).dtype(), DType::bf16);
    {
      Autocast off({.enabled = false});  // an f32 island inside a bf16 region
      EXPECT_FALSE(amp::autocast_active(DeviceType::cpu));
      EXPECT_EQ(linear(x, w).dtype(), DType::f32);
      {
        Autocast back_on({.dtype = DType::f16});  // and autocast again inside the island
        EXPECT_EQ(linear(x, w).dtype(), DType::f16);
      }
      EXPECT_EQ(linear(x, w).dtype(), DType::f32);
    }
    EXPECT_EQ(linear(x, w).dtype(), DType::bf16);
    {
      Autocast inner({.dtype = DType::f16});  // an inner region may change the dtype
      EXPECT_EQ(amp::autocast_dtype(), DType::f16);
      EXPECT_EQ(linear(x, w).dtype(), DType::f16);
    }
    EXPECT_EQ(amp::autocast_dtype(), DType::bf16);
    EXPECT_EQ(linear(x, w).dtype(), DType::bf16);
  }
  EXPECT_FALSE(amp::autocast_active(DeviceType::cpu));
  EXPECT_FALSE(amp::autocast_active_any());
  EXPECT_EQ(linear(x, w).dtype(), DType::f32);
}

TEST(AmpAutocast, OnlyTheRegionsDeviceIsAutocast) {
  Tensor x = randn({2, 8}), w = param({4, 8});
  Autocast guard({.dtype = DType::bf16, .device = DeviceType::cuda});
  EXPECT_TRUE(amp::autocast_active_any());
  EXPECT_FALSE(amp::autocast_active(DeviceType::cpu));
  EXPECT_EQ(linear(x, w).dtype(), DType::f32);  // CPU tensors are untouched by a CUDA region
}

TEST(AmpAutocast, RejectsANonLowPrecisionDtype) {
  EXPECT_THROW(Autocast({.dtype = DType::f32}), Error);
  EXPECT_THROW(Autocast({.dtype = DType::f64}), Error);
  EXPECT_NO_THROW(Autocast({.dtype = DType::f32, .enabled = false}));  // a disabled region needs no dtype
  EXPECT_FALSE(amp::autocast_active_any());                            // a failed guard leaves no state
}

// ------------------------------------------------------------------------------------ cast cache

TEST(AmpAutocast, ParameterUsedTwiceIsCastOnce) {
  manual_seed(6);
  auto layer = std::make_shared<nn::Linear>(8, 8);
  Tensor x = randn({3, 8});
  EXPECT_EQ(amp::autocast_cache_size(), 0u);
  {
    Autocast guard({.dtype = DType::bf16});
    Tensor h = (*layer)(x);
    EXPECT_EQ(amp::autocast_cache_size(), 2u);  // weight and bias; x is not a leaf parameter
    Tensor y = (*layer)(relu(h));               // the same parameters again: no new casts
    EXPECT_EQ(amp::autocast_cache_size(), 2u);
    // The cache hands back the very same cast tensor.
    const Tensor c1 = amp::autocast_cast(layer->weight(), DType::bf16);
    const Tensor c2 = amp::autocast_cast(layer->weight(), DType::bf16);
    EXPECT_EQ(c1.impl_ptr(), c2.impl_ptr());
    EXPECT_EQ(c1.dtype(), DType::bf16);
    // Another dtype is another entry.
    {
      Autocast inner({.dtype = DType::f16});
      (void)(*layer)(x);
      EXPECT_EQ(amp::autocast_cache_size(), 4u);
    }
    EXPECT_EQ(amp::autocast_cache_size(), 4u);  // an inner guard's end does not clear the outer cache
    // Both uses contribute gradients through the shared cast (backward inside the region works).
    sum(y).backward();
    EXPECT_TRUE(layer->weight().grad().defined());
  }
  EXPECT_EQ(amp::autocast_cache_size(), 0u);  // cleared when the outermost guard ends
}

TEST(AmpAutocast, CacheOnlyHoldsGradLeavesInGradMode) {
  Tensor w = param({4, 4}), plain = randn({4, 4});
  Autocast guard({.dtype = DType::bf16});
  (void)amp::autocast_cast(plain, DType::bf16);  // not a parameter: cast directly
  EXPECT_EQ(amp::autocast_cache_size(), 0u);
  {
    autograd::NoGradGuard ng;  // evaluation: casts are not kept
    (void)amp::autocast_cast(w, DType::bf16);
    EXPECT_EQ(amp::autocast_cache_size(), 0u);
  }
  {
    Autocast no_cache({.dtype = DType::bf16, .cache_enabled = false});
    (void)amp::autocast_cast(w, DType::bf16);
    EXPECT_EQ(amp::autocast_cache_size(), 0u);
  }
  (void)amp::autocast_cast(w, DType::bf16);
  EXPECT_EQ(amp::autocast_cache_size(), 1u);
  // Tensors already of the target dtype and integer tensors are returned as they are.
  Tensor i = arange(4);
  EXPECT_EQ(amp::autocast_cast(i, DType::bf16).impl_ptr(), i.impl_ptr());
  EXPECT_EQ(amp::autocast_cast(w, DType::f32).impl_ptr(), w.impl_ptr());
}

TEST(AmpAutocast, InPlaceUpdateGivesAFreshCast) {
  Tensor w = param({4, 4});
  Autocast guard({.dtype = DType::bf16});
  const Tensor before = amp::autocast_cast(w, DType::bf16);
  const uint64_t v0 = w.version();
  {
    autograd::NoGradGuard ng;
    w.fill_(0.25);  // what an optimizer step does to a parameter inside a long region
  }
  EXPECT_GT(w.version(), v0);
  const Tensor after = amp::autocast_cast(w, DType::bf16);
  EXPECT_NE(before.impl_ptr(), after.impl_ptr());
  EXPECT_EQ(amp::autocast_cache_size(), 2u);
  for (double v : after.to_vector<double>()) EXPECT_EQ(v, 0.25);  // the new values, not the stale cast
}

// ------------------------------------------------------------------------------------- gradients

TEST(AmpAutocast, GradientsReachF32LeavesInF32) {
  // A two-layer classifier under bf16 autocast: the f32 parameters get f32 gradients (through the
  // cast nodes) close to the pure-f32 gradients.
  manual_seed(7);
  Tensor x = randn({16, 12}), w1 = param({10, 12}), b1 = param({10}), w2 = param({5, 10}), b2 = param({5});
  Tensor y = randint(0, 5, {16});
  auto loss_of = [&] { return cross_entropy(linear(relu(linear(x, w1, b1)), w2, b2), y); };
  std::vector<Tensor> params{w1, b1, w2, b2}, ref;
  loss_of().backward();
  for (Tensor& p : params) {
    ref.push_back(p.grad().clone());
    p.set_grad(Tensor());
  }
  Tensor loss;
  {
    Autocast guard({.dtype = DType::bf16});
    loss = loss_of();
    EXPECT_EQ(loss.dtype(), DType::f32);
  }
  loss.backward();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << i;
    EXPECT_EQ(params[i].grad().dtype(), DType::f32) << i;
    // Tolerance: inputs, weights, the hidden activation and the backward matmul outputs are each rounded
    // to bf16 (relative error 2^-9 each, ~5 roundings on a path): 5% of the largest gradient entry
    // covers that with margin, while a wrong gradient (missing cast node, wrong transpose) is O(100%).
    EXPECT_LT(max_abs_diff(params[i].grad(), ref[i]), 0.05 * max_abs(ref[i])) << i;
  }
}

TEST(AmpAutocast, BackwardRunsWithAutocastSuspended) {
  manual_seed(8);
  Tensor x = randn({4, 8}), w = param({6, 8}), probe_w = randn({6, 6});
  bool active_in_backward = true;
  DType dtype_in_backward = DType::bf16;
  DType grad_dtype = DType::f64;
  Autocast guard({.dtype = DType::bf16});
  Tensor h = linear(x, w);
  autograd::register_hook(h, [&](const Tensor& g) {
    active_in_backward = amp::autocast_active_any();
    grad_dtype = g.dtype();
    // An op that autocast would lower: inside backward it runs in its inputs' dtype.
    dtype_in_backward = matmul(g.to(DType::f32), probe_w).dtype();
    return Tensor();
  });
  sum(h).backward();  // backward called inside the region, as training loops often do
  EXPECT_FALSE(active_in_backward);
  EXPECT_EQ(dtype_in_backward, DType::f32);
  EXPECT_EQ(grad_dtype, DType::bf16);                  // the gradient of a bf16 output is bf16
  EXPECT_TRUE(amp::autocast_active(DeviceType::cpu));  // and the region is active again afterwards
  EXPECT_EQ(w.grad().dtype(), DType::f32);
}

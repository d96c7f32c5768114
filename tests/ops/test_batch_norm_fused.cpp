// batch_norm_relu and batch_norm_add_relu (Note [batch norm + add + ReLU]):
// outputs, running statistics and every gradient bit-identical to the unfused
// ops, in every dtype and layout, training and eval; the fallbacks (residual of
// another dtype or shape, modules with forward hooks); the ResNet blocks that
// use them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;

namespace {

// The bytes of t (contiguous, in its dtype): equal bytes = bit-identical
// values, NaN payloads included.
std::vector<unsigned char> bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  std::vector<unsigned char> b(static_cast<size_t>(c.numel() * static_cast<int64_t>(c.element_size())));
  if (!b.empty()) std::memcpy(b.data(), c.raw_data(), b.size());
  return b;
}

struct Case {
  Shape shape;
  DType dt;
  bool channels_last;
  bool training;
  bool residual;
  DType param_dt;  // f32 parameters with 16-bit data: the amp O2 "batch norm in
                   // fp32" case
  bool nan_residual = false;
};

std::string label(const Case& c) {
  return shape_str(c.shape) + " " + dtype_name(c.dt) + (c.channels_last ? " channels_last" : "") +
         (c.training ? " train" : " eval") + (c.residual ? " add_relu" : " relu") + " params " +
         dtype_name(c.param_dt) + (c.nan_residual ? " nan" : "");
}

struct Run {
  Tensor out, dx, dw, db, dr, rm, rv;
};

// One forward + backward, fused or not, from identical inputs (seeded).
Run run(const Case& c, bool fused) {
  manual_seed(11);
  const int64_t C = c.shape[1];
  Tensor x = add(mul(randn(c.shape), 2.0), 0.3).to(c.dt);
  if (c.channels_last) x = x.contiguous(MemoryFormat::channels_last);
  x.requires_grad_();
  Tensor res;
  if (c.residual) {
    res = randn(c.shape).to(c.dt);
    if (c.nan_residual) {
      Tensor r32 = res.to(DType::f32);
      std::vector<float> v = r32.to_vector<float>();
      v[1] = std::numeric_limits<float>::quiet_NaN();
      res = from_vector(v, c.shape).to(c.dt);
    }
    if (c.channels_last) res = res.contiguous(MemoryFormat::channels_last);
    res.requires_grad_();
  }
  Tensor w = rand({C}, {.dtype = c.param_dt}, 0.5, 1.5).requires_grad_();
  Tensor b = rand({C}, {.dtype = c.param_dt}, -0.5, 0.5).requires_grad_();
  Tensor rm = mul(randn({C}), 0.1).to(c.param_dt), rv = rand({C}, {.dtype = c.param_dt}, 0.5, 2.0);
  const Tensor g = randn(c.shape).to(c.dt);
  Tensor out;
  if (fused) {
    out = c.residual ? batch_norm_add_relu(x, res, rm, rv, w, b, c.training)
                     : batch_norm_relu(x, rm, rv, w, b, c.training);
  } else {
    Tensor y = batch_norm(x, rm, rv, w, b, c.training);
    out = relu(c.residual ? add(y, res) : y);
  }
  out.backward(g);
  return {out, x.grad(), w.grad(), b.grad(), c.residual ? res.grad() : Tensor(), rm, rv};
}

void expect_identical(const Case& c) {
  SCOPED_TRACE(label(c));
  const Run f = run(c, true), u = run(c, false);
  ASSERT_EQ(f.out.dtype(), u.out.dtype());
  ASSERT_EQ(f.out.sizes(), u.out.sizes());
  EXPECT_EQ(f.out.suggest_memory_format(), u.out.suggest_memory_format());
  EXPECT_EQ(bytes(f.out), bytes(u.out)) << "output";
  EXPECT_EQ(bytes(f.dx), bytes(u.dx)) << "dx";
  EXPECT_EQ(bytes(f.dw), bytes(u.dw)) << "dweight";
  EXPECT_EQ(bytes(f.db), bytes(u.db)) << "dbias";
  EXPECT_EQ(bytes(f.rm), bytes(u.rm)) << "running_mean";
  EXPECT_EQ(bytes(f.rv), bytes(u.rv)) << "running_var";
  if (c.residual) { EXPECT_EQ(bytes(f.dr), bytes(u.dr)) << "dresidual"; }
  // The ReLU really cut something (the comparison covers the mask), and
  // something passed.
  const std::vector<double> o = f.out.to(DType::f64).to_vector<double>();
  int64_t zeros = 0, positive = 0;
  for (double v : o) {
    if (v == 0.0) ++zeros;
    if (v > 0.0) ++positive;
  }
  EXPECT_GT(zeros, 0);
  EXPECT_GT(positive, 0);
}

}  // namespace

TEST(BatchNormFused, MatchesUnfusedBitForBit) {
  // NCHW with S > 1 (the channel-group kernels), channels-last and [N, C] (the
  // rows kernels); f16 runs the kernels' converted-block path; 16-bit data with
  // f32 parameters as amp O2 has it.
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (bool training : {true, false})
      for (bool residual : {false, true}) {
        const DType pdt = dt == DType::f64 ? DType::f64 : DType::f32;
        expect_identical({{4, 6, 5, 7}, dt, false, training, residual, pdt});
        expect_identical({{4, 6, 5, 7}, dt, true, training, residual, pdt});
        expect_identical({{64, 24}, dt, false, training, residual, pdt});
        if (dt == DType::bf16) expect_identical({{4, 6, 5, 7}, dt, true, training, residual, DType::bf16});
      }
  // Larger than one chunk / group of the kernels, odd channel counts.
  expect_identical({{8, 67, 9, 11}, DType::bf16, true, true, true, DType::f32});
  expect_identical({{8, 67, 9, 11}, DType::f32, false, true, true, DType::f32});
  expect_identical({{8, 130, 16, 16}, DType::bf16, false, true, true, DType::f32});
  // A NaN in the residual: relu keeps it (NaN out), the mask drops its
  // gradient, as the unfused ops do.
  expect_identical({{4, 6, 5, 7}, DType::f32, true, true, true, DType::f32, true});
  expect_identical({{4, 6, 5, 7}, DType::bf16, false, true, true, DType::f32, true});
}

TEST(BatchNormFused, ResidualOfAnotherDtypeOrShapeUsesTheUnfusedOps) {
  manual_seed(2);
  const Tensor x = randn({4, 3, 5, 5}).to(DType::bf16);
  const Tensor w = rand({3}, {}, 0.5, 1.5), b = zeros({3});
  const Tensor r32 = randn({4, 3, 5, 5});  // f32: promoted, as add(bf16, f32) is
  Tensor fused = batch_norm_add_relu(x, r32, Tensor(), Tensor(), w, b, true);
  Tensor ref = relu(add(batch_norm(x, Tensor(), Tensor(), w, b, true), r32));
  EXPECT_EQ(fused.dtype(), DType::f32);
  EXPECT_EQ(bytes(fused), bytes(ref));
  const Tensor rb = randn({1, 3, 1, 1}).to(DType::bf16);  // broadcast over N, H, W
  fused = batch_norm_add_relu(x, rb, Tensor(), Tensor(), w, b, true);
  ref = relu(add(batch_norm(x, Tensor(), Tensor(), w, b, true), rb));
  EXPECT_EQ(fused.sizes(), x.sizes());
  EXPECT_EQ(bytes(fused), bytes(ref));
  // Residual in the other layout: copied into x's, same values.
  const Tensor xl = x.contiguous(MemoryFormat::channels_last), rn = randn({4, 3, 5, 5}).to(DType::bf16);
  fused = batch_norm_add_relu(xl, rn, Tensor(), Tensor(), w, b, true);
  ref = relu(add(batch_norm(xl, Tensor(), Tensor(), w, b, true), rn));
  EXPECT_EQ(bytes(fused), bytes(ref));
  mp::test::expect_error([&] { (void)batch_norm_add_relu(x, Tensor(), Tensor(), Tensor(), w, b, true); },
                         {"batch_norm_add_relu", "undefined residual"});
}

TEST(BatchNormFused, ModuleForwardReluAndHooks) {
  manual_seed(5);
  nn::BatchNorm2d a(6), u(6);
  const Tensor x = randn({4, 6, 3, 3}).contiguous(MemoryFormat::channels_last);
  const Tensor r = randn({4, 6, 3, 3}).contiguous(MemoryFormat::channels_last);
  EXPECT_EQ(bytes(a.forward_add_relu(x, r)), bytes(relu(add(u.forward(x), r))));
  EXPECT_EQ(bytes(a.running_mean()), bytes(u.running_mean()));
  EXPECT_EQ(a.num_batches_tracked().item<int64_t>(), 1);
  EXPECT_EQ(bytes(a.forward_relu(x)), bytes(relu(u.forward(x))));
  EXPECT_EQ(a.num_batches_tracked().item<int64_t>(), 2);
  // A forward hook sees the module's own output (batch norm, before the ReLU):
  // not fused then.
  double min_seen = 1.0;
  a.register_forward_hook([&](nn::Module&, const Tensor&, const Tensor& out) {
    min_seen = std::min(min_seen, -max(neg(out.to(DType::f64))).item<double>());
  });
  const Tensor y = a.forward_relu(x);
  EXPECT_LT(min_seen, 0.0);
  EXPECT_EQ(bytes(y), bytes(relu(u.forward(x))));
  // Without momentum: the cumulative average still counts batches.
  nn::BatchNorm2d cma(nn::BatchNormOptions{.num_features = 6, .momentum = std::nullopt});
  (void)cma.forward_relu(x);
  (void)cma.forward_relu(x);
  EXPECT_EQ(cma.num_batches_tracked().item<int64_t>(), 2);
}

// CUDA against the CPU, normalisation, softmax and the losses: the contracts that are not one op's values within a
// tolerance. Every value and gradient (batch norm in every layout and mode, layer norm, softmax / log_softmax,
// cross entropy / nll / mse) is an op-table case (tests/ops/op_cases_norm_softmax_loss.cpp). Here: the fused batch
// norm + (add +) ReLU gives the unfused ops' bits on the device; an empty batch; bad class targets raise the CPU's
// message and leave the device usable. Tests skip without a CUDA device; MP_CUDA_TESTS_ON_CPU=1 runs them with the
// CPU as the device (self-check).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.hpp"

using namespace mp;
using namespace mp::cuda_test;

TEST(CudaNorm, BatchNormReluAndAddReluMatchTheUnfusedOps) {
  // Note [batch norm + add + ReLU]: on the device the fused ops give the unfused ops' bits (values and every
  // gradient), in both layouts and every dtype; the CPU side of the same contract is test_batch_norm_fused.
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : kFloatTypes)
    for (bool cl : {false, true})
      for (bool training : {true, false})
        for (bool residual : {false, true}) {
          const std::string what = std::string("batch_norm") + (residual ? "_add_relu " : "_relu ") + dtype_name(dt) +
                                   (cl ? " channels-last" : " NCHW") + (training ? " train" : " eval");
          guarded(what, [&] {
            const MemoryFormat fmt = cl ? MemoryFormat::channels_last : MemoryFormat::contiguous;
            const DType pdt = dt == DType::f64 ? DType::f64 : DType::f32;
            const Shape shape{4, 24, 6, 5};
            const Tensor x = normal(shape, 0.3, 2.0, dt).contiguous(fmt),
                         r = normal(shape, 0.0, 1.0, dt).contiguous(fmt);
            const Tensor w = uniform({24}, 0.5, 1.5, pdt), b = uniform({24}, -0.5, 0.5, pdt);
            const Tensor rm = uniform({24}, -0.3, 0.3, pdt), rv = uniform({24}, 0.5, 2.0, pdt);
            const Tensor go = uniform(shape, -1, 1, dt).contiguous(fmt);
            struct Out {
              Tensor y, dx, dw, db, dr, rm;
            };
            auto run = [&](bool fused) {
              const Tensor dx = on_dev(x, true), dw = on_dev(w, true), db = on_dev(b, true);
              const Tensor dr = residual ? on_dev(r, true) : Tensor(), drm = on_dev(rm), drv = on_dev(rv);
              Tensor y;
              if (fused) {
                y = residual ? batch_norm_add_relu(dx, dr, drm, drv, dw, db, training)
                             : batch_norm_relu(dx, drm, drv, dw, db, training);
              } else {
                const Tensor n = batch_norm(dx, drm, drv, dw, db, training);
                y = relu(residual ? add(n, dr) : n);
              }
              y.backward(on_dev(go));
              return Out{y, dx.grad(), dw.grad(), db.grad(), residual ? dr.grad() : Tensor(), drm};
            };
            const Out f = run(true), u = run(false);
            EXPECT_TRUE(identical(what + " y", f.y, u.y.to(kCPU)));
            EXPECT_TRUE(identical(what + " dx", f.dx, u.dx.to(kCPU)));
            EXPECT_TRUE(identical(what + " dweight", f.dw, u.dw.to(kCPU)));
            EXPECT_TRUE(identical(what + " dbias", f.db, u.db.to(kCPU)));
            EXPECT_TRUE(identical(what + " running_mean", f.rm, u.rm.to(kCPU)));
            if (residual) { EXPECT_TRUE(identical(what + " dresidual", f.dr, u.dr.to(kCPU))); }
            EXPECT_EQ(f.y.suggest_memory_format(), fmt) << f.y.describe();
          });
        }
}

TEST(CudaSoftmax, EmptyBatch) {
  MP_SKIP_WITHOUT_GPU();
  guarded("softmax of an empty batch", [] {
    const Tensor x = zeros({0, 7});
    EXPECT_TRUE(identical("softmax [0, 7]", softmax(on_dev(x), 1), softmax(x, 1)));
  });
}

TEST(CudaLoss, BadTargetsThrowTheCpuMessage) {
  MP_SKIP_WITHOUT_GPU();
  // One out-of-range target at flat position 3 and another at 7: both devices name the first (3), C and
  // ignore_index, in the same words. A target equal to ignore_index is not an error.
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const Tensor logits = uniform({10, 5}, -1, 1, dt);
    Tensor t = integers({10}, 0, 5);
    t.narrow(0, 3, 1).fill_(7);
    t.narrow(0, 7, 1).fill_(-2);
    t.narrow(0, 5, 1).fill_(-100);
    for (bool nll : {false, true}) {
      const std::string what = std::string(nll ? "nll_loss" : "cross_entropy") + " " + dtype_name(dt);
      auto run = [nll](const Tensor& x, const Tensor& y) { return nll ? nll_loss(x, y) : cross_entropy(x, y); };
      const std::string cpu_msg = test::error_of([&] { (void)run(logits, t); });
      const std::string dev_msg = test::error_of([&] { (void)run(on_dev(logits), on_dev(t)).item<double>(); });
      EXPECT_NE(cpu_msg, "(no error)") << what;
      EXPECT_EQ(dev_msg, cpu_msg) << what;
      // The device is usable afterwards.
      guarded(what + " after the error", [&] {
        Tensor ok = t.clone();
        ok.narrow(0, 3, 1).fill_(1);
        ok.narrow(0, 7, 1).fill_(2);
        EXPECT_TRUE(close(what + " after the error", run(on_dev(logits), on_dev(ok)), run(logits, ok),
                          Tol{.ulps = 2, .rtol = 1e-6, .why = "a 10-row class loss"}));
      });
    }
  }
}

// CUDA against the CPU, normalisation, softmax and the losses. Batch norm (train / eval, running
// statistics, f32 parameters on 16-bit data, a far pivot, channels-last, the fused ReLU / add + ReLU),
// layer norm, softmax / log_softmax (short rows, rows longer than a block, inner > 1, -inf, large logits)
// and cross entropy / nll / mse (ignore_index, label smoothing, reductions, bad targets). Forward and
// backward in f32, f16, bf16 and f64. Tests skip without a CUDA device; MP_CUDA_TESTS_ON_CPU=1 runs them
// with the CPU as the device (self-check).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"

using namespace mp;
using namespace mp::cuda_test;

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

// =============================================================================== batch norm / layer norm

namespace {

// Tolerances of normalisation over groups of M values (batch norm: M = N S per channel; layer norm:
// M = the row length). Each device's mean differs from the exact one by <= ~2 sqrt(M) u_acc mean|x| and
// its invstd by ~4 sqrt(M) u_acc relative (a sum of squares), so y = (x - mean) invstd w + b differs by
// <= |w| invstd (2 sqrt(M) u mean|x| + 4 sqrt(M) u |xhat|): with the test data (x ~ N(0.5, 1), |w| <=
// 1.5, |xhat| <= 5) that is <= 32 sqrt(M) u_acc; the element-wise pass adds a rounding or an FMA (2 ulps).
Tol norm_out_tol(DType dt, int64_t M, double pivot = 1.0) {
  Tol t;
  t.ulps = 2;
  t.atol = 32 * std::sqrt(static_cast<double>(M)) * acc_roundoff(dt) * pivot;
  t.why = "normalisation statistics over M = " + std::to_string(M) + " values in another order: 32 sqrt(M) u_acc" +
          (pivot > 1 ? " times (1 + |mean| / std)" : "");
  return t;
}

// dx = w invstd (dy - mean(dy) - xhat mean(dy xhat)): the two means (sums over M) and the statistics
// differ: 4x the forward's bound (|dy| < 1).
Tol norm_dx_tol(DType dt, int64_t M) {
  Tol t;
  t.ulps = 2;
  t.atol = 128 * std::sqrt(static_cast<double>(M)) * acc_roundoff(dt);
  t.why = "dx: two sums over M values and the statistics in another order: 128 sqrt(M) u_acc";
  return t;
}

// dweight = sum(dy xhat), dbias = sum(dy) over R values each: the sums' order (2 sqrt(R) u_acc R) and the
// statistics' differences shifting xhat (<= 32 sqrt(M) u_acc, times sum|dy| <= R): 40 R sqrt(max(R, M)) u.
Tol norm_dw_tol(DType dt, int64_t R, int64_t M) {
  Tol t;
  t.ulps = 2;
  t.atol = 40 * static_cast<double>(R) * std::sqrt(static_cast<double>(std::max(R, M))) * acc_roundoff(dt);
  t.why = "dweight / dbias: sums over R = " + std::to_string(R) + " values, xhat shifted by the statistics";
  return t;
}

}  // namespace

// Channels-last cases (strides {S C, 1, C}) run the own kernels' column reductions (Note [column reductions])
// and the element-wise passes vectorised along C, against the CPU's channels-last path: C a multiple of the
// vector width and not, more than one 32-column tile (a partial one), several row parts per tile; the
// output stays channels-last.
TEST(CudaNorm, BatchNormTrainEvalRunningStatsAndGradients) {
  MP_SKIP_WITHOUT_GPU();
  struct Case {
    const char* name;
    Shape x;
    bool affine, running;
    bool channels_last = false;
  };
  const std::vector<Case> cases = {
      {"[8, 6] affine", {8, 6}, true, true},
      {"[4, 5, 7, 7] affine", {4, 5, 7, 7}, true, true},
      {"[3, 4, 9] affine, no running stats", {3, 4, 9}, true, false},
      {"[4, 3, 5, 6] no affine", {4, 3, 5, 6}, false, true},
      {"[16, 8, 32, 32] affine (long channels)", {16, 8, 32, 32}, true, true},
      {"channels-last [4, 16, 7, 7] affine (C a vector multiple)", {4, 16, 7, 7}, true, true, true},
      {"channels-last [3, 5, 6, 6] no affine (odd C)", {3, 5, 6, 6}, false, true, true},
      {"channels-last [2, 40, 9, 9] affine (two column tiles)", {2, 40, 9, 9}, true, true, true},
      {"channels-last [64, 8, 16, 16] affine (row parts)", {64, 8, 16, 16}, true, true, true},
  };
  for (DType dt : kFloatTypes) {
    const DType sdt = dt == DType::f64 ? DType::f64 : DType::f32;
    // 16-bit data with f32 weight and bias: amp O2's keep_batchnorm_fp32.
    std::vector<DType> wdts = {dt};
    if (is_low_precision(dt)) wdts.push_back(DType::f32);
    for (DType wdt : wdts) {
      for (const Case& k : cases) {
        for (bool training : {true, false}) {
          if (!training && !k.running) continue;
          const int64_t C = k.x[1], M = shape_numel(k.x) / C;
          const std::string what = std::string("batch_norm ") + dtype_name(dt) + " (weights " + dtype_name(wdt) + ") " +
                                   k.name + (training ? " train" : " eval");
          guarded(what, [&] {
            const MemoryFormat fmt = k.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
            const Tensor x = normal(k.x, 0.5, 1.0, dt).contiguous(fmt);
            const Tensor w = k.affine ? uniform({C}, 0.5, 1.5, wdt) : Tensor();
            const Tensor b = k.affine ? uniform({C}, -0.5, 0.5, wdt) : Tensor();
            const Tensor rm = k.running ? uniform({C}, -0.3, 0.3, sdt) : Tensor();
            const Tensor rv = k.running ? uniform({C}, 0.5, 2.0, sdt) : Tensor();
            const Tensor cx = cpu_leaf(x, true), cw = cpu_leaf(w, true), cb = cpu_leaf(b, true);
            const Tensor dx = on_dev(x, true), dw = on_dev(w, true), db = on_dev(b, true);
            const Tensor crm = cpu_leaf(rm), crv = cpu_leaf(rv), drm = on_dev(rm), drv = on_dev(rv);
            const Tensor want = batch_norm(cx, crm, crv, cw, cb, training, 0.1, 1e-5);
            const Tensor got = batch_norm(dx, drm, drv, dw, db, training, 0.1, 1e-5);
            if (k.channels_last) {
              ASSERT_EQ(dx.suggest_memory_format(), fmt) << "on_dev must keep the layout: " << dx.describe();
              EXPECT_EQ(got.suggest_memory_format(), fmt) << got.describe();
            }
            EXPECT_TRUE(close(what + " y", got, want,
                              training ? norm_out_tol(dt, M)
                                       : Tol{.ulps = 2,
                                             .atol = 32 * acc_roundoff(dt),
                                             .why = "eval: fixed statistics, one element-wise pass (rounding / FMA)"}));
            if (training && k.running) {
              // new = 0.9 old + 0.1 batch: the batch statistics' differences scaled by 0.1 (plus M / (M - 1)).
              const Tol rt{.ulps = 2,
                           .atol = 4 * std::sqrt(static_cast<double>(M)) * acc_roundoff(dt),
                           .why = "running statistics: 0.1 x the batch statistics' differences"};
              EXPECT_TRUE(close(what + " running_mean", drm, crm, rt));
              EXPECT_TRUE(close(what + " running_var", drv, crv, rt));
            }
            const Tensor go = uniform(k.x, -1, 1, dt).contiguous(fmt);
            want.backward(go);
            got.backward(on_dev(go));
            EXPECT_TRUE(close(what + " dx", dx.grad(), cx.grad(),
                              training
                                  ? norm_dx_tol(dt, M)
                                  : Tol{.ulps = 2, .atol = 8 * acc_roundoff(dt), .why = "eval: dx = w invstd dy"}));
            if (k.affine) {
              EXPECT_TRUE(close(what + " dweight", dw.grad(), cw.grad(), norm_dw_tol(wdt, M, M)));
              EXPECT_TRUE(close(what + " dbias", db.grad(), cb.grad(), norm_dw_tol(wdt, M, M)));
            }
          });
        }
      }
    }
  }
}

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

TEST(CudaNorm, BatchNormFarFromZeroMean) {
  MP_SKIP_WITHOUT_GPU();
  // Activations with |mean| = 100 std: a one-pass E[x^2] - E[x]^2 variance cancels catastrophically
  // (relative error ~ u (mean / std)^2 sqrt(M)); shifted / Welford statistics (as the CPU's) keep the
  // error at ~ u (mean / std) sqrt(M). The tolerance is the latter, scaled by 1 + |mean| / std.
  for (DType dt : {DType::f32, DType::f16}) {
    const std::string what = std::string("batch_norm far pivot ") + dtype_name(dt);
    guarded(what, [&] {
      const Shape s{8, 4, 12, 12};
      const int64_t M = 8 * 144;
      const Tensor x = normal(s, 100.0, 1.0, dt);
      const Tensor w = uniform({4}, 0.5, 1.5), b = uniform({4}, -0.5, 0.5);
      const Tensor want = batch_norm(x, Tensor(), Tensor(), w, b, true);
      const Tensor got = batch_norm(on_dev(x), Tensor(), Tensor(), on_dev(w), on_dev(b), true);
      EXPECT_TRUE(close(what, got, want, norm_out_tol(dt, M, 101.0)));
    });
  }
}

TEST(CudaNorm, LayerNorm) {
  MP_SKIP_WITHOUT_GPU();
  struct Case {
    const char* name;
    Shape x, normalized;
    bool affine;
  };
  const std::vector<Case> cases = {
      {"[16, 1000] over [1000]", {16, 1000}, {1000}, true},
      {"[4, 3, 5000] over [5000] (row longer than a block)", {4, 3, 5000}, {5000}, true},
      {"[6, 7, 8] over [7, 8]", {6, 7, 8}, {7, 8}, true},
      {"[37, 33] over [33], no affine", {37, 33}, {33}, false},
  };
  for (DType dt : kFloatTypes) {
    for (const Case& k : cases) {
      const int64_t N = shape_numel(k.normalized), R = shape_numel(k.x) / N;
      const std::string what = std::string("layer_norm ") + dtype_name(dt) + " " + k.name;
      guarded(what, [&] {
        const Tensor x = normal(k.x, 0.5, 1.0, dt);
        const Tensor w = k.affine ? uniform(k.normalized, 0.5, 1.5, dt) : Tensor();
        const Tensor b = k.affine ? uniform(k.normalized, -0.5, 0.5, dt) : Tensor();
        const Tensor cx = cpu_leaf(x, true), cw = cpu_leaf(w, true), cb = cpu_leaf(b, true);
        const Tensor dx = on_dev(x, true), dw = on_dev(w, true), db = on_dev(b, true);
        const Tensor want = layer_norm(cx, k.normalized, cw, cb);
        const Tensor got = layer_norm(dx, k.normalized, dw, db);
        EXPECT_TRUE(close(what + " y", got, want, norm_out_tol(dt, N)));
        const Tensor go = uniform(k.x, -1, 1, dt);
        want.backward(go);
        got.backward(on_dev(go));
        EXPECT_TRUE(close(what + " dx", dx.grad(), cx.grad(), norm_dx_tol(dt, N)));
        if (k.affine) {
          EXPECT_TRUE(close(what + " dweight", dw.grad(), cw.grad(), norm_dw_tol(dt, R, N)));
          EXPECT_TRUE(close(what + " dbias", db.grad(), cb.grad(), norm_dw_tol(dt, R, N)));
        }
      });
    }
  }
}

// =============================================================================== softmax

namespace {

// Relative difference bound of softmax outputs of rows of n: exp on each device (CUDA expf 2 ulp,
// fast_exp 1.03 ulp), the row sums in another order (2 sqrt(n) u), the division (or reciprocal and
// product), and the GPU's online softmax (Note [CUDA online softmax]), which rescales partial sums by
// exp(m_old - m_new) each time a running max grows and at each of the ~log2(n) combining levels (an
// expf and a product each, <= 3 u): (24 + 3 log2(n) + 2 sqrt(n)) u_acc; a 16-bit output adds one ulp.
double softmax_rel(DType dt, int64_t n) {
  const double nn = static_cast<double>(std::max<int64_t>(n, 2));
  return (24 + 3 * std::log2(nn) + 2 * std::sqrt(nn)) * acc_roundoff(dt);
}
// Absolute difference bound of log_softmax outputs: (x - m) - log(sum): the sum's relative difference
// (as softmax_rel) and log's ulps, times (1 + ln n) for the size of log(sum).
double log_softmax_abs(DType dt, int64_t n) {
  return softmax_rel(dt, n) * (1 + std::log(static_cast<double>(std::max<int64_t>(n, 2))));
}

}  // namespace

TEST(CudaSoftmax, SoftmaxAndLogSoftmaxForwardBackward) {
  MP_SKIP_WITHOUT_GPU();
  struct Case {
    const char* name;
    Shape x;
    int64_t dim;
    double offset;  // added to every logit (shift invariance)
    bool masked;    // some logits are -inf
  };
  const std::vector<Case> cases = {
      {"[8, 10] dim 1", {8, 10}, 1, 0, false},
      {"[4, 1000] dim -1", {4, 1000}, -1, 0, false},
      {"[3, 5000] dim 1 (row longer than a block)", {3, 5000}, 1, 0, false},
      {"[6, 33, 7] dim 1 (inner 7)", {6, 33, 7}, 1, 0, false},
      {"[37, 5] dim 0 (columns)", {37, 5}, 0, 0, false},
      {"[4, 100] + 1e4 (large logits)", {4, 100}, 1, 1e4, false},
      {"[8, 10] with -inf entries", {8, 10}, 1, 0, true},
  };
  for (DType dt : kFloatTypes) {
    for (const Case& k : cases) {
      for (bool log : {false, true}) {
        const int64_t n = k.x[static_cast<size_t>(k.dim < 0 ? k.dim + static_cast<int64_t>(k.x.size()) : k.dim)];
        const std::string what = std::string(log ? "log_softmax " : "softmax ") + dtype_name(dt) + " " + k.name;
        guarded(what, [&] {
          Tensor x = add(uniform(k.x, -4, 4, DType::f64), k.offset).to(dt);
          if (k.masked) {
            x.select(1, 3).fill_(-kInf);
            x.select(0, 2).narrow(0, 5, 4).fill_(-kInf);
          }
          const Tensor cx = cpu_leaf(x, true), dx = on_dev(x, true);
          const Tensor want = log ? log_softmax(cx, k.dim) : softmax(cx, k.dim);
          const Tensor got = log ? log_softmax(dx, k.dim) : softmax(dx, k.dim);
          const double r = softmax_rel(dt, n), a = log_softmax_abs(dt, n);
          const Tol fwd = log ? Tol{.ulps = 1,
                                    .rtol = 2 * acc_roundoff(dt),
                                    .atol = a,
                                    .why = "log_softmax: log of the row sum (its order differs) and logf / fast_log"}
                              : Tol{.ulps = 1, .rtol = r, .why = "softmax: expf vs fast_exp and the row sum's order"};
          EXPECT_TRUE(close(what + " forward", got, want, fwd));
          const Tensor go = uniform(k.x, -1, 1, dt);
          want.backward(go);
          got.backward(on_dev(go));
          // Backward bounds (x2), as tensors from the CPU's values:
          //   softmax: g_in = y (g - sum(g y)): |y| (3 r_y + 2 sqrt(n) u) with r_y the forward's relative bound
          //     (16-bit: the saved y may differ by one 16-bit ulp, 2 u16 relative);
          //   log_softmax: g_in = g - exp(y) sum(g): p (|sum g| (a_y + 5 u) + 2 sqrt(n) u sum|g|).
          const double u = acc_roundoff(dt), sq = 2 * std::sqrt(static_cast<double>(n)) * u;
          const Tensor y64 = want.detach().to(DType::f64), g64 = go.to(DType::f64);
          Tensor bound;
          if (!log) {
            const double ry = r + (is_low_precision(dt) ? 2 * unit_roundoff(dt) : 0.0);
            bound = mul(abs(y64), 3 * ry + sq);
          } else {
            const double ay = a + (is_low_precision(dt) ? ulp(dt, 16.0) : 0.0);
            const Tensor p = exp(y64);
            bound = mul(p, add(mul(abs(sum(g64, {k.dim}, true)), ay + 5 * u), mul(sum(abs(g64), {k.dim}, true), sq)));
          }
          EXPECT_TRUE(close(
              what + " backward", dx.grad(), cx.grad(),
              Tol{.ulps = 1, .scaled = 2, .why = "backward: the forward's differences propagated (bound x2)"}, bound));
        });
      }
    }
  }
  guarded("softmax of an empty batch", [] {
    const Tensor x = zeros({0, 7});
    EXPECT_TRUE(identical("softmax [0, 7]", softmax(on_dev(x), 1), softmax(x, 1)));
  });
}

// =============================================================================== losses

TEST(CudaLoss, CrossEntropyNllAndMse) {
  MP_SKIP_WITHOUT_GPU();
  struct Case {
    const char* name;
    Shape logits;  // [N, C] or [N, C, d]
    CrossEntropyOptions opt;
  };
  const std::vector<Case> cases = {
      {"[32, 10] mean", {32, 10}, {}},
      {"[32, 10] sum, ignore_index 3", {32, 10}, {.ignore_index = 3, .reduction = Reduction::sum}},
      {"[32, 10] none, label_smoothing 0.1", {32, 10}, {.label_smoothing = 0.1, .reduction = Reduction::none}},
      {"[8, 1000] mean, label_smoothing 0.2", {8, 1000}, {.label_smoothing = 0.2}},
      {"[4, 5, 6] (inner 6) mean, ignore_index 1", {4, 5, 6}, {.ignore_index = 1}},
      {"[3, 5000] mean (row longer than a block)", {3, 5000}, {}},
  };
  for (DType dt : kFloatTypes) {
    for (const Case& k : cases) {
      Shape ts = k.logits;
      ts.erase(ts.begin() + 1);
      const int64_t C = k.logits[1], N = shape_numel(ts);
      const double u = acc_roundoff(dt);
      // Per row: lse - x_t (+ eps (lse - mean x)): the row's log-sum-exp differs like log_softmax's output,
      // the smoothing's mean over C by 2 sqrt(C) u mean|x|; a mean / sum over N rows adds 2 sqrt(N) u
      // relative. The loss is f32 (f64 for f64 logits) in every case.
      const double row = log_softmax_abs(dt, C) + 2 * std::sqrt(static_cast<double>(C)) * u * 4;
      const Tol lt{.ulps = 2,
                   .rtol = 2 * std::sqrt(static_cast<double>(N)) * u,
                   .atol = 2 * row,
                   .why = "class loss: each row's log-sum-exp (order, expf vs fast_exp, logf vs fast_log)"};
      const std::vector<bool> logp = {false, true};
      for (bool nll : logp) {
        OpCheck chk;
        chk.name = std::string(nll ? "nll_loss " : "cross_entropy ") + dtype_name(dt) + " " + k.name;
        const Tensor logits = uniform(k.logits, -4, 4, dt);
        chk.inputs = {nll ? log_softmax(logits.to(DType::f64), 1).to(dt) : logits, integers(ts, 0, C)};
        const CrossEntropyOptions opt = k.opt;
        chk.fn = [opt, nll](const std::vector<Tensor>& in) {
          return nll ? nll_loss(in[0], in[1], opt) : cross_entropy(in[0], in[1], opt);
        };
        chk.out = lt;
        // grad = w (p_c - [c == t](1 - eps) - eps / C): p differs by its exponent's difference (row + 6 u)
        // relative; nll has p = 0 (exact up to an FMA). Normwise: |w| p <= max |grad| + |w|.
        chk.grad = Tol{.ulps = 2,
                       .normwise = 2 * (row + 6 * u),
                       .why = "class-loss gradient: the softmax probabilities' differences"};
        chk.grad_inputs = {0};
        check_op(chk);
      }
    }
    OpCheck mse;
    mse.name = std::string("mse_loss ") + dtype_name(dt) + " [37, 29] mean";
    mse.inputs = {uniform({37, 29}, -2, 2, dt), uniform({37, 29}, -2, 2, dt)};
    mse.fn = [](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1]); };
    mse.out = reduction_tol(dt == DType::f64 ? DType::f64 : DType::f32, 37 * 29);
    mse.out_scale = [](const std::vector<Tensor>& in) {
      return mean(square(in[0].detach().to(DType::f64) - in[1].detach().to(DType::f64)));
    };
    mse.grad = exact("2 (x - y) g / n through IEEE operations on identical values");
    check_op(mse);
    OpCheck msen = mse;
    msen.name = std::string("mse_loss ") + dtype_name(dt) + " [1037] none";
    msen.inputs = {uniform({1037}, -2, 2, dt), uniform({1037}, -2, 2, dt)};
    msen.fn = [](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1], Reduction::none); };
    msen.out = exact("(x - y)^2 in f32: IEEE operations");
    msen.out_scale = nullptr;
    check_op(msen);
  }
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

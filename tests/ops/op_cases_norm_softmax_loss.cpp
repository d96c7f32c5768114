// The op table, normalisation, softmax and the class losses (tests/ops/op_cases.hpp): batch norm (train and eval,
// affine or not, with and without running statistics, channels-last with C a vector multiple or odd, two column
// tiles and row parts, 16-bit data with f32 weights, a mean far from zero), layer norm (rows longer than a block),
// softmax / log_softmax (rows longer than a block, inner > 1, columns, large logits, -inf entries), cross entropy and
// nll (label smoothing, ignore_index, every reduction, inner > 1, long rows) and mse. Folded from the hand-written
// CUDA tests with their tolerances and reasons; tests/cuda/test_cuda_ops_norm_loss.cpp keeps the contracts that are
// not one op's values (the fused batch norm + ReLU gives the unfused ops' bits; bad targets give the CPU's message).
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "op_cases.hpp"

namespace mp::op_table {

using namespace cuda_test;

namespace {

// Normalisation over groups of M values (batch norm: M = N S per channel; layer norm: the row length). Each device's
// mean differs from the exact one by <= ~2 sqrt(M) u_acc mean|x| and its invstd by ~4 sqrt(M) u_acc relative (a sum
// of squares), so y = (x - mean) invstd w + b differs by <= |w| invstd (2 sqrt(M) u mean|x| + 4 sqrt(M) u |xhat|):
// with the test data (x ~ N(0.5, 1), |w| <= 1.5, |xhat| <= 5) <= 32 sqrt(M) u_acc, times 1 + |mean| / std for a far
// pivot; the element-wise pass adds a rounding or an FMA (2 ulps). A 16-bit y is rounded after that: statistics
// differing in their last f32 bits put a y on either side of a 16-bit rounding boundary, one 16-bit ulp (at most
// 2^-7 / 2^-10 of |y| in bf16 / f16). `ulps` cannot say it where y is packed with the f32 running statistics
// (cat promotes to f32, so ulps count f32 ulps; seen on the H200: 1-6 of 131088 elements one f16 / bf16 ulp apart).
Tol norm_out(DType dt, int64_t M, double pivot = 1.0) {
  return Tol{.ulps = 2,
             .rtol = dt == DType::bf16 ? std::ldexp(1.0, -7) : dt == DType::f16 ? std::ldexp(1.0, -10) : 0.0,
             .atol = 32 * std::sqrt(static_cast<double>(M)) * acc_roundoff(dt) * pivot,
             .why = "normalisation statistics over M = " + std::to_string(M) + " values in another order" +
                    (pivot > 1 ? " times (1 + |mean| / std)" : "") +
                    (is_low_precision(dt) ? ", then one 16-bit rounding" : "")};
}
// Gradients of x, weight and bias in one tolerance: dx = w invstd (dy - mean(dy) - xhat mean(dy xhat)), two sums
// over M values and the statistics (128 sqrt(M) u_acc); dweight = sum(dy xhat), dbias = sum(dy) over R values each,
// the sums' order and xhat shifted by the statistics (40 R sqrt(max(R, M)) u_acc); 16-bit gradients are rounded to
// the input's dtype (2 ulps).
Tol norm_grad(DType dt, int64_t M, int64_t R) {
  const double u = acc_roundoff(dt), m = static_cast<double>(M), r = static_cast<double>(R);
  return Tol{.ulps = 2,
             .atol = std::max(128 * std::sqrt(m), 40 * r * std::sqrt(std::max(r, m))) * u,
             .why = "dx: two sums over M = " + std::to_string(M) + " values; dweight, dbias: sums over R = " +
                    std::to_string(R) + " values, xhat shifted by the statistics"};
}

// Relative difference bound of softmax outputs of rows of n: exp on each device (CUDA expf 2 ulp, fast_exp 1.03 ulp),
// the row sums in another order (2 sqrt(n) u), the division, and the GPU's online softmax (Note [CUDA online
// softmax]), which rescales partial sums by exp(m_old - m_new) each time a running max grows and at each of the
// ~log2(n) combining levels (an expf and a product each, <= 3 u): (24 + 3 log2(n) + 2 sqrt(n)) u_acc.
double softmax_rel(DType dt, int64_t n) {
  const double nn = static_cast<double>(std::max<int64_t>(n, 2));
  return (24 + 3 * std::log2(nn) + 2 * std::sqrt(nn)) * acc_roundoff(dt);
}
// Absolute difference bound of log_softmax outputs: (x - m) - log(sum): the sum's relative difference (softmax_rel)
// and log's ulps, times (1 + ln n) for the size of log(sum).
double log_softmax_abs(DType dt, int64_t n) {
  return softmax_rel(dt, n) * (1 + std::log(static_cast<double>(std::max<int64_t>(n, 2))));
}

}  // namespace

std::vector<OpCase> norm_softmax_loss_cases() {
  std::vector<OpCase> cases;
  struct Bn {
    const char* name;
    Shape x;
    bool affine, running;
    bool channels_last = false;
  };
  const std::vector<Bn> bns = {
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
  for (const Bn& k : bns) {
    for (const bool training : {true, false}) {
      if (!training && !k.running) continue;
      // 16-bit data with f32 weight and bias: amp O2's keep_batchnorm_fp32.
      for (const bool f32_weights : {false, true}) {
        if (f32_weights && !k.affine) continue;
        const std::string name = std::string("batch_norm ") + k.name + (training ? " train" : " eval") +
                                 (f32_weights ? ", f32 weights" : "");
        const std::vector<DType> dts = f32_weights ? std::vector<DType>{DType::f16, DType::bf16} : all_floats();
        cases.push_back({name, dts, [k, training, f32_weights](DType dt) {
                           const int64_t C = k.x[1], M = shape_numel(k.x) / C;
                           const DType sdt = dt == DType::f64 ? DType::f64 : DType::f32;
                           const DType wdt = f32_weights ? DType::f32 : dt;
                           const MemoryFormat fmt =
                               k.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
                           OpCheck chk;
                           chk.inputs = {normal(k.x, 0.5, 1.0, dt).contiguous(fmt),
                                         k.affine ? uniform({C}, 0.5, 1.5, wdt) : Tensor(),
                                         k.affine ? uniform({C}, -0.5, 0.5, wdt) : Tensor(),
                                         k.running ? uniform({C}, -0.3, 0.3, sdt) : Tensor(),
                                         k.running ? uniform({C}, 0.5, 2.0, sdt) : Tensor()};
                           chk.grad_inputs = k.affine ? std::vector<size_t>{0, 1, 2} : std::vector<size_t>{0};
                           const bool cl = k.channels_last, running = k.running;
                           // The running statistics are updated in place: each run on its own copy, returned with
                           // y (new = 0.9 old + 0.1 batch: within y's tolerance). The layout must be kept.
                           chk.fn = [training, running, cl](const std::vector<Tensor>& in) {
                             Tensor rm = running ? in[3].clone() : Tensor(), rv = running ? in[4].clone() : Tensor();
                             const Tensor y = batch_norm(in[0], rm, rv, in[1], in[2], training, 0.1, 1e-5);
                             if (cl && y.suggest_memory_format() != MemoryFormat::channels_last)
                               throw std::runtime_error("batch_norm lost the channels-last layout: " + y.describe());
                             return training && running ? cat({y.reshape({-1}), rm, rv}, 0) : y;
                           };
                           chk.out = training ? norm_out(dt, M)
                                              : Tol{.ulps = 2,
                                                    .atol = 32 * acc_roundoff(dt),
                                                    .why = "eval: fixed statistics, one element-wise pass"};
                           chk.grad = norm_grad(dt, M, M);
                           return chk;
                         }});
      }
    }
  }
  // Activations with |mean| = 100 std: a one-pass E[x^2] - E[x]^2 variance cancels catastrophically (relative error
  // ~ u (mean / std)^2 sqrt(M)); shifted / Welford statistics keep it at ~ u (mean / std) sqrt(M): the tolerance is
  // the latter, scaled by 1 + |mean| / std. Forward only.
  cases.push_back({"batch_norm [8, 4, 12, 12] far from zero mean", {DType::f32, DType::f16, DType::f64}, [](DType dt) {
                     OpCheck chk;
                     chk.inputs = {normal({8, 4, 12, 12}, 100.0, 1.0, dt), uniform({4}, 0.5, 1.5, DType::f32),
                                   uniform({4}, -0.5, 0.5, DType::f32)};
                     if (dt == DType::f64)
                       for (size_t i : {1, 2}) chk.inputs[i] = chk.inputs[i].to(DType::f64);
                     chk.fn = [](const std::vector<Tensor>& in) {
                       return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], true);
                     };
                     chk.out = norm_out(dt, 8 * 144, 101.0);
                     return chk;
                   }});
  // batch_norm_add_relu: the fused pass (its bits equal the unfused ops': tests/cuda/test_cuda_ops_norm_loss.cpp).
  cases.push_back({"batch_norm_add_relu [4, 5, 7, 7] train", all_floats(), [](DType dt) {
                     const DType sdt = dt == DType::f64 ? DType::f64 : DType::f32;
                     OpCheck chk;
                     const Tensor x = normal({4, 5, 7, 7}, 0.5, 1.0, dt), w = uniform({5}, 0.5, 1.5, dt),
                                  bias = uniform({5}, -0.5, 0.5, dt);
                     // The residual keeps every pre-ReLU value at least 0.05 from 0 (computed in f64): a value
                     // within the dtype's rounding of 0 could fall on either side of the mask on one device and
                     // in the f64 reference, and the gradients would differ by the whole value there.
                     Tensor r = normal({4, 5, 7, 7}, 0.0, 1.0, DType::f64);
                     {
                       const Tensor y = batch_norm(x.to(DType::f64), zeros({5}, {.dtype = DType::f64}),
                                                   ones({5}, {.dtype = DType::f64}), w.to(DType::f64),
                                                   bias.to(DType::f64), true, 0.1, 1e-5)
                                            .contiguous();
                       const double* yp = y.data_ptr<double>();
                       double* rp = r.data_ptr<double>();
                       for (int64_t i = 0; i < r.numel(); ++i)
                         if (std::abs(yp[i] + rp[i]) < 0.05) rp[i] += yp[i] + rp[i] >= 0 ? 0.1 : -0.1;
                     }
                     chk.inputs = {x, r.to(dt), w, bias};
                     chk.fn = [sdt](const std::vector<Tensor>& in) {
                       Tensor rm = zeros({5}, {.dtype = sdt, .device = in[0].device()}),
                              rv = ones({5}, {.dtype = sdt, .device = in[0].device()});
                       return batch_norm_add_relu(in[0], in[1], rm, rv, in[2], in[3], true, 0.1, 1e-5);
                     };
                     chk.out = norm_out(dt, 196);
                     chk.grad = norm_grad(dt, 196, 196);
                     return chk;
                   }});
  struct Ln {
    const char* name;
    Shape x, normalized;
    bool affine;
  };
  const std::vector<Ln> lns = {{"[6, 37] affine", {6, 37}, {37}, true},
                               {"[2, 3, 8, 16] over [8, 16] affine", {2, 3, 8, 16}, {8, 16}, true},
                               {"[5, 1029] no affine (long rows)", {5, 1029}, {1029}, false},
                               {"[16, 1000] affine", {16, 1000}, {1000}, true},
                               {"[4, 3, 5000] affine (rows longer than a block)", {4, 3, 5000}, {5000}, true},
                               {"[6, 7, 8] over [7, 8] affine", {6, 7, 8}, {7, 8}, true},
                               {"[37, 33] no affine", {37, 33}, {33}, false}};
  for (const Ln& k : lns) {
    cases.push_back({std::string("layer_norm ") + k.name, all_floats(), [k](DType dt) {
                       const int64_t M = shape_numel(k.normalized), R = shape_numel(k.x) / M;
                       OpCheck chk;
                       chk.inputs = {normal(k.x, 0.5, 1.0, dt),
                                     k.affine ? uniform(k.normalized, 0.5, 1.5, dt) : Tensor(),
                                     k.affine ? uniform(k.normalized, -0.5, 0.5, dt) : Tensor()};
                       const Shape ns = k.normalized;
                       chk.fn = [ns](const std::vector<Tensor>& in) { return layer_norm(in[0], ns, in[1], in[2]); };
                       chk.out = norm_out(dt, M);
                       chk.grad = norm_grad(dt, M, R);
                       return chk;
                     }});
  }
  struct Sm {
    const char* name;
    Shape x;
    int64_t dim;
    double offset;  // added to every logit (shift invariance)
    bool masked;    // some logits are -inf
  };
  const std::vector<Sm> sms = {
      {"[8, 10] dim 1", {8, 10}, 1, 0, false},
      {"[7, 129] dim -1", {7, 129}, -1, 0, false},
      {"[4, 1000] dim -1", {4, 1000}, -1, 0, false},
      {"[3, 5000] dim 1 (rows longer than a block)", {3, 5000}, 1, 0, false},
      {"[6, 33, 7] dim 1 (inner 7)", {6, 33, 7}, 1, 0, false},
      {"[37, 5] dim 0 (columns)", {37, 5}, 0, 0, false},
      {"[4, 100] + 1e4 (large logits)", {4, 100}, 1, 1e4, false},
      {"[8, 10] with -inf entries", {8, 10}, 1, 0, true},
  };
  for (const Sm& k : sms) {
    for (const bool log : {false, true}) {
      cases.push_back(
          {std::string(log ? "log_softmax " : "softmax ") + k.name, all_floats(), [k, log](DType dt) {
             const int64_t n = k.x[static_cast<size_t>(k.dim < 0 ? k.dim + static_cast<int64_t>(k.x.size()) : k.dim)];
             Tensor x = add(uniform(k.x, -4, 4, DType::f64), k.offset).to(dt);
             if (k.masked) {
               x.select(1, 3).fill_(-std::numeric_limits<double>::infinity());
               x.select(0, 2).narrow(0, 5, 4).fill_(-std::numeric_limits<double>::infinity());
             }
             OpCheck chk;
             chk.inputs = {x};
             const int64_t dim = k.dim;
             chk.fn = [log, dim](const std::vector<Tensor>& in) {
               return log ? log_softmax(in[0], dim) : softmax(in[0], dim);
             };
             const double r = softmax_rel(dt, n), a = log_softmax_abs(dt, n);
             chk.out = log ? Tol{.ulps = 1,
                                 .rtol = 2 * acc_roundoff(dt),
                                 .atol = a,
                                 .why = "log_softmax: log of the row sum (its order differs) and logf / fast_log"}
                           : Tol{.ulps = 1, .rtol = r, .why = "softmax: expf vs fast_exp and the row sum's order"};
             // Backward bounds (x2), per element from the values:
             //   softmax: g_in = y (g - sum(g y)): |y| (3 r_y + 2 sqrt(n) u) with r_y the forward's relative bound
             //     (16-bit: the saved y may differ by one 16-bit ulp, 2 u16 relative);
             //   log_softmax: g_in = g - exp(y) sum(g): p (|sum g| (a_y + 5 u) + 2 sqrt(n) u sum|g|).
             chk.grad = Tol{.ulps = 1, .scaled = 2, .why = "backward: the forward's differences propagated (bound x2)"};
             chk.grad_scale = [log, dim, dt, r, a, n](const std::vector<Tensor>& in, const Tensor& go, size_t) {
               const double u = acc_roundoff(dt), sq = 2 * std::sqrt(static_cast<double>(n)) * u;
               const Tensor x64 = in[0].detach().to(DType::f64), g64 = go.to(DType::f64);
               const Tensor y64 = softmax(x64, dim);
               if (!log) return mul(y64, 3 * (r + (is_low_precision(dt) ? 2 * unit_roundoff(dt) : 0.0)) + sq);
               const double ay = a + (is_low_precision(dt) ? ulp(dt, 16.0) : 0.0);
               return mul(y64, add(mul(abs(sum(g64, {dim}, true)), ay + 5 * u), mul(sum(abs(g64), {dim}, true), sq)));
             };
             return chk;
           }});
    }
  }
  struct Ce {
    const char* name;
    Shape logits;  // [N, C] or [N, C, d]
    CrossEntropyOptions opt;
  };
  const std::vector<Ce> ces = {
      {"[37, 11] mean", {37, 11}, {}},
      {"[37, 11] label smoothing 0.1, sum", {37, 11}, {.label_smoothing = 0.1, .reduction = Reduction::sum}},
      {"[37, 11] ignore_index 2, none", {37, 11}, {.ignore_index = 2, .reduction = Reduction::none}},
      {"[32, 10] none, label_smoothing 0.1", {32, 10}, {.label_smoothing = 0.1, .reduction = Reduction::none}},
      {"[8, 1000] mean, label_smoothing 0.2", {8, 1000}, {.label_smoothing = 0.2}},
      {"[4, 5, 6] (inner 6) mean, ignore_index 1", {4, 5, 6}, {.ignore_index = 1}},
      {"[3, 5000] mean (rows longer than a block)", {3, 5000}, {}},
  };
  for (const Ce& k : ces) {
    for (const bool nll : {false, true}) {
      cases.push_back({std::string(nll ? "nll_loss " : "cross_entropy ") + k.name, all_floats(), [k, nll](DType dt) {
                         Shape ts = k.logits;
                         ts.erase(ts.begin() + 1);
                         const int64_t C = k.logits[1], N = shape_numel(ts);
                         const double u = acc_roundoff(dt);
                         OpCheck chk;
                         const Tensor logits = uniform(k.logits, -4, 4, dt);
                         chk.inputs = {nll ? log_softmax(logits.to(DType::f64), 1).to(dt) : logits, integers(ts, 0, C)};
                         const CrossEntropyOptions opt = k.opt;
                         chk.fn = [opt, nll](const std::vector<Tensor>& in) {
                           return nll ? nll_loss(in[0], in[1], opt) : cross_entropy(in[0], in[1], opt);
                         };
                         // Per row: lse - x_t (+ eps (lse - mean x)): the row's log-sum-exp differs like log_softmax's
                         // output, the smoothing's mean over C by 2 sqrt(C) u mean|x|; a mean / sum over N rows adds
                         // 2 sqrt(N) u relative. The loss is f32 (f64 for f64 logits) in every case.
                         const double row = log_softmax_abs(dt, C) + 2 * std::sqrt(static_cast<double>(C)) * u * 4;
                         chk.out = Tol{.ulps = 2,
                                       .rtol = 2 * std::sqrt(static_cast<double>(N)) * u,
                                       .atol = 2 * row,
                                       .why =
                                           "class loss: each row's log-sum-exp (order, expf vs fast_exp, logf vs "
                                           "fast_log)"};
                         // grad = w (p_c - [c == t](1 - eps) - eps / C): p differs by its exponent's difference
                         // (row + 6 u) relative; nll has p = 0 (exact up to an FMA). Normwise: |w| p <= max |grad|
                         // + |w|.
                         chk.grad = Tol{.ulps = 2,
                                        .normwise = 2 * (row + 6 * u),
                                        .why = "class-loss gradient: the softmax probabilities' differences"};
                         chk.grad_inputs = {0};
                         return chk;
                       }});
    }
  }
  for (const auto& [name, shape, r] : std::vector<std::tuple<std::string, Shape, Reduction>>{
           {"[37, 29] mean", {37, 29}, Reduction::mean}, {"[1037] none", {1037}, Reduction::none}}) {
    cases.push_back({"mse_loss " + name, all_floats(), [shape, r](DType dt) {
                       OpCheck chk;
                       chk.inputs = {uniform(shape, -2, 2, dt), uniform(shape, -2, 2, dt)};
                       chk.fn = [r](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1], r); };
                       if (r == Reduction::mean) {
                         chk.out = reduction_tol(dt == DType::f64 ? DType::f64 : DType::f32, shape_numel(shape));
                         chk.out_scale = [](const std::vector<Tensor>& in) {
                           return mean(square(in[0].detach().to(DType::f64) - in[1].detach().to(DType::f64)));
                         };
                       } else {
                         chk.out = exact("(x - y)^2 in f32: IEEE operations");
                       }
                       chk.grad = exact("2 (x - y) g / n through IEEE operations on identical values");
                       return chk;
                     }});
  }
  return cases;
}

}  // namespace mp::op_table

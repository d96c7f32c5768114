// The op table, normalisation, softmax and the class losses (tests/ops/op_cases.hpp): batch norm (train and eval,
// affine or not, channels-last, 16-bit data with f32 weights), layer norm, softmax / log_softmax along the last
// and a strided dim, cross entropy (label smoothing, ignore_index), nll and mse losses. New cases: the hand-written
// tests/cuda/test_cuda_ops_norm_loss.cpp stays (its per-output tolerances: y, running statistics, dx, dweight are
// not one OpCheck); the tolerances here take its bounds, the gradient one the largest of its gradient bounds.
#include <cmath>
#include <string>
#include <vector>

#include "op_cases.hpp"

namespace mp::op_table {

using namespace cuda_test;

namespace {

// Normalisation over groups of M values with data ~ N(0.5, 1), |w| <= 1.5 (tests/cuda/test_cuda_ops_norm_loss.cpp's
// norm_out_tol): each device's mean is within ~2 sqrt(M) u_acc mean|x| and its invstd ~4 sqrt(M) u_acc relative,
// so y within 32 sqrt(M) u_acc; the element-wise pass adds a rounding or an FMA (2 ulps).
Tol norm_out(DType dt, int64_t M) {
  return Tol{.ulps = 2,
             .atol = 32 * std::sqrt(static_cast<double>(M)) * acc_roundoff(dt),
             .why = "normalisation statistics over M = " + std::to_string(M) + " values in another order"};
}
// Gradients of x, weight and bias: dweight / dbias are sums over R = M values with xhat shifted by the statistics
// (40 R sqrt(M) u_acc, test_cuda_ops_norm_loss.cpp's norm_dw_tol), the largest of the bounds there (dx: 128
// sqrt(M) u_acc); 16-bit: the gradients are rounded to the input's dtype (2 ulps).
Tol norm_grad(DType dt, int64_t M) {
  return Tol{.ulps = 2,
             .atol = 40 * static_cast<double>(M) * std::sqrt(static_cast<double>(M)) * acc_roundoff(dt),
             .why = "dx, dweight, dbias: sums over M = " + std::to_string(M) + " values, statistics in another order"};
}

// Softmax over n values: exp (CUDA 2 ulp + fast_exp 1.03 ulp), the row sums in another order (2 sqrt(n) u), the
// division: relative to each output, plus one 16-bit ulp for the rounding of the result.
Tol softmax_tol(DType dt, int64_t n, double extra_ulps) {
  Tol t;
  t.rtol = (4 + 2 * std::sqrt(static_cast<double>(n))) * acc_roundoff(dt);
  t.ulps = extra_ulps;
  t.atol = 4 * acc_roundoff(dt);
  t.why = "exp of each device's libm and the row sum of n = " + std::to_string(n) + " terms in another order";
  return t;
}

}  // namespace

std::vector<OpCase> norm_softmax_loss_cases() {
  std::vector<OpCase> cases;
  struct Bn {
    const char* name;
    Shape x;
    bool affine, channels_last, training, f32_weights;
  };
  const std::vector<Bn> bns = {
      {"[8, 6] affine train", {8, 6}, true, false, true, false},
      {"[4, 5, 7, 7] affine train", {4, 5, 7, 7}, true, false, true, false},
      {"[4, 3, 5, 6] no affine train", {4, 3, 5, 6}, false, false, true, false},
      {"[4, 5, 7, 7] affine eval", {4, 5, 7, 7}, true, false, false, false},
      {"[4, 5, 7, 7] affine train f32 weights", {4, 5, 7, 7}, true, false, true, true},
      {"channels-last [4, 16, 7, 7] affine train", {4, 16, 7, 7}, true, true, true, false},
      {"channels-last [3, 5, 6, 6] no affine train (odd C)", {3, 5, 6, 6}, false, true, true, false},
      {"channels-last [2, 40, 9, 9] affine eval", {2, 40, 9, 9}, true, true, false, false},
  };
  for (const Bn& k : bns) {
    cases.push_back(
        {std::string("batch_norm ") + k.name, all_floats(), [k](DType dt) {
           const int64_t C = k.x[1], M = shape_numel(k.x) / C;
           const DType sdt = dt == DType::f64 ? DType::f64 : DType::f32;
           const DType wdt = k.f32_weights && dt != DType::f64 ? DType::f32 : dt;
           const MemoryFormat fmt = k.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
           OpCheck chk;
           chk.inputs = {normal(k.x, 0.5, 1.0, dt).contiguous(fmt), k.affine ? uniform({C}, 0.5, 1.5, wdt) : Tensor(),
                         k.affine ? uniform({C}, -0.5, 0.5, wdt) : Tensor(), uniform({C}, -0.3, 0.3, sdt),
                         uniform({C}, 0.5, 2.0, sdt)};
           chk.grad_inputs = k.affine ? std::vector<size_t>{0, 1, 2} : std::vector<size_t>{0};
           const bool training = k.training;
           // The running statistics are updated in place: each run on its own copy, returned with y.
           chk.fn = [training](const std::vector<Tensor>& in) {
             Tensor rm = in[3].clone(), rv = in[4].clone();
             const Tensor y = batch_norm(in[0], rm, rv, in[1], in[2], training, 0.1, 1e-5);
             return training ? cat({y.reshape({-1}), rm, rv}, 0) : y;
           };
           chk.out = training ? norm_out(dt, M)
                              : Tol{.ulps = 2,
                                    .atol = 32 * acc_roundoff(dt),
                                    .why = "eval: fixed statistics, one element-wise pass (rounding / FMA)"};
           chk.grad = training ? norm_grad(dt, M)
                               : Tol{.ulps = 2,
                                     .atol = 40 * static_cast<double>(M) * acc_roundoff(dt),
                                     .why = "eval: dx = w invstd dy; dweight, dbias sums over M values"};
           return chk;
         }});
  }
  // batch_norm_relu / batch_norm_add_relu: the fused passes.
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
                       Tensor rm = zeros({5}, {.dtype = sdt}), rv = ones({5}, {.dtype = sdt});
                       return batch_norm_add_relu(in[0], in[1], rm, rv, in[2], in[3], true, 0.1, 1e-5);
                     };
                     chk.out = norm_out(dt, 196);
                     chk.grad = norm_grad(dt, 196);
                     return chk;
                   }});
  struct Ln {
    const char* name;
    Shape x, normalized;
    bool affine;
  };
  const std::vector<Ln> lns = {{"[6, 37] affine", {6, 37}, {37}, true},
                               {"[2, 3, 8, 16] over [8, 16] affine", {2, 3, 8, 16}, {8, 16}, true},
                               {"[5, 1029] no affine (long rows)", {5, 1029}, {1029}, false}};
  for (const Ln& k : lns) {
    cases.push_back({std::string("layer_norm ") + k.name, all_floats(), [k](DType dt) {
                       const int64_t M = shape_numel(k.normalized);
                       OpCheck chk;
                       chk.inputs = {normal(k.x, 0.5, 1.0, dt),
                                     k.affine ? uniform(k.normalized, 0.5, 1.5, dt) : Tensor(),
                                     k.affine ? uniform(k.normalized, -0.5, 0.5, dt) : Tensor()};
                       const Shape ns = k.normalized;
                       chk.fn = [ns](const std::vector<Tensor>& in) { return layer_norm(in[0], ns, in[1], in[2]); };
                       chk.out = norm_out(dt, M);
                       const int64_t R = shape_numel(k.x) / M;
                       chk.grad = norm_grad(dt, std::max(M, R));
                       return chk;
                     }});
  }
  for (const bool log : {false, true}) {
    for (const int64_t dim : {int64_t{-1}, int64_t{0}}) {
      cases.push_back({std::string(log ? "log_softmax" : "softmax") + " [7, 129] dim " + std::to_string(dim),
                       all_floats(), [log, dim](DType dt) {
                         OpCheck chk;
                         chk.inputs = {uniform({7, 129}, -8, 8, dt)};
                         chk.fn = [log, dim](const std::vector<Tensor>& in) {
                           return log ? log_softmax(in[0], dim) : softmax(in[0], dim);
                         };
                         const int64_t n = dim == 0 ? 7 : 129;
                         chk.out = softmax_tol(dt, n, log ? 2 : 1);
                         if (log) chk.out.atol = 16 * std::sqrt(static_cast<double>(n)) * acc_roundoff(dt) * 8;
                         // Gradients: g - sum(g p) (log) or p (g - sum(g p)): the row sums cancel; absolute,
                         // relative to the largest gradient.
                         chk.grad = Tol{.ulps = 2,
                                        .normwise = (8 + 4 * std::sqrt(static_cast<double>(n))) * acc_roundoff(dt) +
                                                    (is_low_precision(dt) ? 2 * unit_roundoff(dt) : 0.0),
                                        .why = "backward: a row sum of n terms in another order, cancelling: normwise"};
                         return chk;
                       }});
    }
  }
  struct Ce {
    const char* name;
    CrossEntropyOptions opt;
  };
  const std::vector<Ce> ces = {{"mean", {}},
                               {"label smoothing 0.1, sum", {.label_smoothing = 0.1, .reduction = Reduction::sum}},
                               {"ignore_index 2, none", {.ignore_index = 2, .reduction = Reduction::none}}};
  for (const Ce& k : ces) {
    for (const bool nll : {false, true}) {
      cases.push_back(
          {std::string(nll ? "nll_loss " : "cross_entropy ") + k.name + " [37, 11]", all_floats(), [k, nll](DType dt) {
             OpCheck chk;
             chk.inputs = {uniform({37, 11}, -4, 4, dt), integers({37}, 0, 11)};
             const CrossEntropyOptions opt = k.opt;
             chk.fn = [opt, nll](const std::vector<Tensor>& in) {
               return nll ? nll_loss(log_softmax(in[0], -1), in[1], opt) : cross_entropy(in[0], in[1], opt);
             };
             // A sum over 37 rows of log-sum-exps of 11 terms (|each| <= 4 + log 11): each device's
             // logsumexp within a few ulps (exp / log: 3 + 2 ulp), the row sum in another order.
             chk.out = Tol{.ulps = 2,
                           .rtol = 64 * acc_roundoff(dt),
                           .atol = 64 * 37 * 8 * acc_roundoff(dt),
                           .why = "log-sum-exp of each device's exp / log over 11 classes, summed over 37 rows"};
             chk.grad = Tol{.ulps = 2,
                            .atol = 16 * acc_roundoff(dt) + (is_low_precision(dt) ? unit_roundoff(dt) / 37 : 0.0),
                            .why = "softmax - one_hot (scaled by 1/rows): exp and the row sums in another order"};
             chk.grad_inputs = {0};
             return chk;
           }});
    }
  }
  for (const Reduction r : {Reduction::mean, Reduction::none}) {
    cases.push_back(
        {std::string("mse_loss [13, 29] ") + (r == Reduction::mean ? "mean" : "none"), all_floats(), [r](DType dt) {
           OpCheck chk;
           chk.inputs = {uniform({13, 29}, -2, 2, dt), uniform({13, 29}, -2, 2, dt)};
           chk.fn = [r](const std::vector<Tensor>& in) { return mse_loss(in[0], in[1], r); };
           // mean: a sum of 377 non-negative squares (no cancellation), in another order:
           // relative 2 sqrt(K) u_acc; none: one square of a difference each (2 roundings, or an FMA).
           chk.out = r == Reduction::mean ? Tol{.ulps = 2,
                                                .rtol = 2 * std::sqrt(377.0) * acc_roundoff(dt),
                                                .why = "a mean of 377 squares in another order (no cancellation)"}
                                          : Tol{.ulps = 2, .why = "(x - y)^2: two roundings or one FMA"};
           chk.grad = Tol{.ulps = 2, .why = "2 (x - y) / n: exact differences, a product and a division"};
           return chk;
         }});
  }
  return cases;
}

}  // namespace mp::op_table

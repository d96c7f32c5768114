// The CPU batch-norm kernels on channels-last x [N, C, S] (strides {S C, 1, C}; memory a row-major [N S, C]
// matrix) and on [N, C], called directly: every output (y, mean, var, invstd; dx, dweight, dbias) against the
// NCHW kernels on the same values, in f32, bf16, f16 and f64, training and eval, weight/bias present or
// absent, dx/dweight/dbias each absent; against double references for [N, C], a large common offset and a
// channel whose pivot rows sit far out in the tails; bit-identical results with 1 and 2 OpenMP threads and
// with the AVX-512 loops on and off.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/norm_kernels.hpp"
#include "mp/mp.hpp"

using namespace mp;

namespace {

constexpr double kEps = 1e-5;

DType stats_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

// Unit roundoff of the statistics type: the arithmetic of every kernel is in it.
double unit_roundoff(DType dt) { return dt == DType::f64 ? std::ldexp(1.0, -53) : std::ldexp(1.0, -24); }

// Bound on one rounding of a result stored as dt, relative (ulp <= 2^(1 - p) |v|), and absolute for the
// subnormal range of f16 (spacing 2^-24; the others' subnormals are far below every tolerance here).
double out_rel(DType dt) {
  switch (dt) {
    case DType::bf16: return std::ldexp(1.0, -7);
    case DType::f16: return std::ldexp(1.0, -10);
    case DType::f32: return std::ldexp(1.0, -23);
    default: return std::ldexp(1.0, -52);
  }
}
double out_abs(DType dt) { return dt == DType::f16 ? std::ldexp(1.0, -24) : 0.0; }

// An uninitialised [N, C, S] tensor: NCHW, or channels-last built as empty({N, S, C}).permute({0, 2, 1}).
Tensor make(int64_t N, int64_t C, int64_t S, DType dt, bool cl) {
  return cl ? empty({N, S, C}, {.dtype = dt}).permute({0, 2, 1}) : empty({N, C, S}, {.dtype = dt});
}

// A copy of x [N, C, S] in layout cl.
Tensor relayout(const Tensor& x, bool cl) {
  Tensor t = make(x.size(0), x.size(1), x.size(2), x.dtype(), cl);
  t.copy_(x);
  return t;
}

bool is_cl(const Tensor& t) { return t.stride(1) == 1 && t.size(2) > 1 && t.size(1) > 1; }

std::vector<double> vals(const Tensor& t) { return t.defined() ? t.to_vector<double>() : std::vector<double>(); }

// The bytes of t in logical order (for bit-identity checks).
std::vector<uint8_t> bytes(const Tensor& t) {
  if (!t.defined()) return {};
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return std::vector<uint8_t>(p, p + c.numel() * static_cast<int64_t>(c.element_size()));
}

// Inputs of one case: x and dy [N, C, S] (NCHW, values already in dtype dt), w and b in the statistics dtype
// (undefined when absent), running statistics for eval.
struct Data {
  int64_t N, C, S;
  DType dt;
  Tensor x, dy, w, b, rm, rv;
  int64_t M() const { return N * S; }
};

// x: per-channel offsets in [-2, 2] plus N(0.3, 1.5^2); dy: N(0, 1); w in [0.5, 1.5], b in [-0.5, 0.5].
Data make_data(int64_t N, int64_t C, int64_t S, DType dt, bool has_w, bool has_b) {
  Data d{N, C, S, dt, {}, {}, {}, {}, {}, {}};
  const DType sdt = stats_dtype(dt);
  d.x = (randn({N, C, S}, {.dtype = DType::f64}, 0.3, 1.5) + rand({1, C, 1}, {.dtype = DType::f64}, -2.0, 2.0))
            .to(dt)
            .contiguous();
  d.dy = randn({N, C, S}).to(dt).contiguous();
  if (has_w) d.w = rand({C}, {.dtype = sdt}, 0.5, 1.5);
  if (has_b) d.b = rand({C}, {.dtype = sdt}, -0.5, 0.5);
  d.rm = rand({C}, {.dtype = sdt}, -1.0, 1.0);
  d.rv = rand({C}, {.dtype = sdt}, 0.5, 2.0);
  return d;
}

struct Fwd {
  Tensor y, mean, var, invstd;
};

// The forward kernel on x (layout cl): batch statistics when training, else d's running statistics.
Fwd forward(const Data& d, const Tensor& x, bool cl, bool training) {
  const DType sdt = stats_dtype(d.dt);
  Fwd f;
  f.y = make(d.N, d.C, d.S, d.dt, cl);
  f.mean = training ? empty({d.C}, {.dtype = sdt}) : d.rm.clone();
  f.var = training ? empty({d.C}, {.dtype = sdt}) : d.rv.clone();
  f.invstd = empty({d.C}, {.dtype = sdt});
  backend::batch_norm_forward_kernel.get(kCPU)(f.y, f.mean, f.var, f.invstd, x, d.w, d.b, training, kEps, Tensor(),
                                               false);
  return f;
}

struct Bwd {
  Tensor dx, dw, db;
};

// Which backward outputs to ask for.
struct Need {
  bool dx, dw, db;
};

// The backward kernel on dy, x (layout cl) with the statistics mean, invstd.
Bwd backward(const Data& d, const Tensor& dy, const Tensor& x, bool cl, const Tensor& mean, const Tensor& invstd,
             bool training, Need need) {
  const DType sdt = stats_dtype(d.dt);
  Bwd g;
  if (need.dx) g.dx = make(d.N, d.C, d.S, d.dt, cl);
  if (need.dw) g.dw = empty({d.C}, {.dtype = sdt});
  if (need.db) g.db = empty({d.C}, {.dtype = sdt});
  backend::batch_norm_backward_kernel.get(kCPU)(g.dx, g.dw, g.db, dy, x, mean, invstd, d.w, training, Tensor(),
                                                Tensor());
  return g;
}

// Per-element check: |got - ref| <= tol[i] for every i, reporting the worst element.
void expect_within(const std::vector<double>& got, const std::vector<double>& ref, const std::vector<double>& tol,
                   const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = -1e300;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::abs(got[i] - ref[i]);
    const double excess = std::isnan(diff) ? 1e300 : diff - tol[i];  // a NaN on either side fails
    if (excess > worst) {
      worst = excess;
      at = i;
    }
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " got " << got[at] << " want " << ref[at] << " +- " << tol[at];
}

// Note [tolerances of the channels-last batch-norm tests]
// The kernels under test and the references compute the same formulas; what differs is the order of the
// sums over the M = N S values of a channel (chunks of rows here, runs of a channel there) and, against a
// long-double reference, the precision. Each kernel accumulates shifted values x - k (k a per-channel pivot)
// in partial sums of ~32 values in the statistics type (unit roundoff u: 2^-24 f32, 2^-53 f64), added into
// double (Note [normalisation statistics on the CPU]); a pivot beyond 4 std is redone, so the rms of x - k is
// at most t1 = sqrt(17 var) and the mean of (x - k)^2 at most t2 = 17 var. Three errors, per kernel:
// - The sums' rounding: a partial sum of 32 terms of rms t errs by ~sqrt(32^2 / 2) u t ~ 23 u t (a random
//   walk), and the M / 32 partial sums' errors add as a random walk: ~4 u sqrt(M) t on a sum of M terms.
//   We allow kSumTol u sqrt(M) t with kSumTol = 16 per kernel ("a few ulp scaled by sqrt(M)", tails
//   included); t = t1 for sum(x - k), 3 t2 for sum((x - k)^2) (kurtosis of our data 3).
// - x - k itself is rounded unless x is within a factor 2 of k (Sterbenz), and for 16-bit x the rounding
//   drops the same low bits of k for a whole binade of x: the errors need not average out. Up to u |x - k|
//   each, so u t1 on the mean and 2 u t2 on the mean square, which with var = E[(x - k)^2] - d^2 (d = mean -
//   k, |d| <= 4 sqrt(var)) gives <= 2 u t2 + 2 |d| u t1 ~ 67 u var on the variance (the Note's ~1e-5).
// - Each statistic stored in the statistics type is rounded once: u relative.
// Two kernels: twice that (also allowed against the reference). Outputs stored as dtype dt round once more
// (out_rel, out_abs: 16-bit outputs may round to a neighbour when the f32 values differ in the last bits); the
// element-wise formulas add <= 4 roundings of the size of their terms.
constexpr double kSumTol = 16.0;

// Per channel of a [N, C, S] value vector: the mean and the biased variance (long-double sums: the kernels' f64
// sums would be as accurate as a plain double reference).
struct ChannelScan {
  std::vector<double> mean, var;
};
ChannelScan scan(const Data& d, const std::vector<double>& x) {
  std::vector<long double> m(d.C, 0.0L), q(d.C, 0.0L);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c)
      for (int64_t j = 0; j < d.S; ++j) m[c] += x[(n * d.C + c) * d.S + j];
  for (int64_t c = 0; c < d.C; ++c) m[c] /= static_cast<long double>(d.M());
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c)
      for (int64_t j = 0; j < d.S; ++j) {
        const long double e = x[(n * d.C + c) * d.S + j] - m[c];
        q[c] += e * e;
      }
  ChannelScan s{std::vector<double>(d.C), std::vector<double>(d.C)};
  for (int64_t c = 0; c < d.C; ++c) {
    s.mean[c] = static_cast<double>(m[c]);
    s.var[c] = static_cast<double>(q[c] / static_cast<long double>(d.M()));
  }
  return s;
}

// Forward outputs `got` against `ref` (a kernel in the other layout, or a double reference) on d.
void check_forward(const Data& d, const Fwd& got, const Fwd& ref, bool training, const std::string& what) {
  const double u = unit_roundoff(d.dt), sqM = std::sqrt(static_cast<double>(d.M()));
  const std::vector<double> x = vals(d.x), w = vals(d.w), b = vals(d.b);
  const std::vector<double> rmean = vals(ref.mean), rvar = vals(ref.var), rinv = vals(ref.invstd);
  std::vector<double> tmean(d.C), tvar(d.C), tinv(d.C), rel_r(d.C);
  for (int64_t c = 0; c < d.C; ++c) {
    const double v = rvar[c], sd = std::sqrt(v);
    const double M = static_cast<double>(d.M());
    // Note [tolerances of the channels-last batch-norm tests], for two kernels.
    const double t1 = std::sqrt(17.0) * sd, t2 = 17.0 * v;
    tmean[c] = training ? 2 * (kSumTol * u * sqM * t1 / M + u * t1 + u * std::abs(rmean[c])) : 0.0;
    tvar[c] = training ? 2 * (kSumTol * u * sqM * 3 * t2 / M + 2 * u * t2 + 2 * 4 * sd * u * t1 + u * v) : 0.0;
    rel_r[c] = 0.5 * tvar[c] / (v + kEps) + 2 * u;
    tinv[c] = rel_r[c] * rinv[c];
  }
  expect_within(vals(got.mean), rmean, tmean, what + " mean");
  expect_within(vals(got.var), rvar, tvar, what + " var");
  expect_within(vals(got.invstd), rinv, tinv, what + " invstd");
  const std::vector<double> ry = vals(ref.y);
  std::vector<double> ty(ry.size());
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c)
      for (int64_t j = 0; j < d.S; ++j) {
        const size_t i = static_cast<size_t>((n * d.C + c) * d.S + j);
        const double wc = w.empty() ? 1.0 : w[c], bc = b.empty() ? 0.0 : b[c];
        const double xm = std::abs(x[i] - rmean[c]), wr = std::abs(wc) * rinv[c];
        ty[i] = wr * (tmean[c] + xm * rel_r[c]) + 4 * u * (wr * xm + std::abs(bc)) + out_rel(d.dt) * std::abs(ry[i]) +
                out_abs(d.dt);
      }
  expect_within(vals(got.y), ry, ty, what + " y");
}

// Backward outputs `got` against `ref` on d, with the statistics mean, invstd both used.
void check_backward(const Data& d, const Bwd& got, const Bwd& ref, const Tensor& mean, const Tensor& invstd,
                    bool training, const std::string& what) {
  const double u = unit_roundoff(d.dt), sqM = std::sqrt(static_cast<double>(d.M()));
  const double M = static_cast<double>(d.M());
  const std::vector<double> x = vals(d.x), dy = vals(d.dy), w = vals(d.w), mu = vals(mean), r = vals(invstd);
  // Per channel: rms of dy and of dy (x - mean), the sums' tolerances.
  std::vector<double> rms_g(d.C, 0.0), rms_gx(d.C, 0.0), sdy(d.C, 0.0), sdyx(d.C, 0.0);
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c)
      for (int64_t j = 0; j < d.S; ++j) {
        const size_t i = static_cast<size_t>((n * d.C + c) * d.S + j);
        rms_g[c] += dy[i] * dy[i];
        rms_gx[c] += dy[i] * dy[i] * (x[i] - mu[c]) * (x[i] - mu[c]);
        sdy[c] += dy[i];
        sdyx[c] += dy[i] * (x[i] - mu[c]);
      }
  std::vector<double> tsdy(d.C), tsdyx(d.C);
  for (int64_t c = 0; c < d.C; ++c) {
    tsdy[c] = 2 * kSumTol * u * sqM * std::sqrt(rms_g[c] / M);
    tsdyx[c] = 2 * kSumTol * u * sqM * std::sqrt(rms_gx[c] / M);
  }
  if (ref.db.defined()) {
    std::vector<double> t(d.C);
    for (int64_t c = 0; c < d.C; ++c) t[c] = tsdy[c] + 2 * u * std::abs(sdy[c]);
    expect_within(vals(got.db), vals(ref.db), t, what + " dbias");
  }
  if (ref.dw.defined()) {
    std::vector<double> t(d.C);
    for (int64_t c = 0; c < d.C; ++c) t[c] = tsdyx[c] * r[c] + 4 * u * std::abs(sdyx[c] * r[c]);
    expect_within(vals(got.dw), vals(ref.dw), t, what + " dweight");
  }
  if (ref.dx.defined()) {
    const std::vector<double> rdx = vals(ref.dx);
    std::vector<double> t(rdx.size());
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t c = 0; c < d.C; ++c)
        for (int64_t j = 0; j < d.S; ++j) {
          const size_t i = static_cast<size_t>((n * d.C + c) * d.S + j);
          const double wc = w.empty() ? 1.0 : std::abs(w[c]), rc = r[c], xm = std::abs(x[i] - mu[c]);
          const double ta = wc * rc * std::abs(dy[i]);
          const double tb = training ? wc * rc * rc * rc * std::abs(sdyx[c]) / M * xm : 0.0;
          const double tc = training ? wc * rc * std::abs(sdy[c]) / M : 0.0;
          const double sums = training ? wc * rc * rc * rc * tsdyx[c] / M * xm + wc * rc * tsdy[c] / M : 0.0;
          t[i] = sums + 4 * u * (ta + tb + tc) + out_rel(d.dt) * std::abs(rdx[i]) + out_abs(d.dt);
        }
    expect_within(vals(got.dx), rdx, t, what + " dx");
  }
}

std::string label(const Data& d, bool training) {
  return std::string(dtype_name(d.dt)) + " [" + std::to_string(d.N) + ", " + std::to_string(d.C) + ", " +
         std::to_string(d.S) + "] " + (training ? "training" : "eval") + (d.w.defined() ? " w" : "") +
         (d.b.defined() ? " b" : "");
}

// Every output of the channels-last kernels against the NCHW kernels on d. `all_needs`: also ask the backward
// for each output alone (each must equal the same output of the full call, bit for bit).
void compare_layouts(const Data& d, bool training, bool all_needs) {
  const std::string what = label(d, training);
  SCOPED_TRACE(what);
  const Tensor xl = relayout(d.x, true), dyl = relayout(d.dy, true);
  const bool cl = is_cl(xl);
  const Fwd fr = forward(d, d.x, false, training);
  const Fwd fl = forward(d, xl, true, training);
  if (cl) {  // the outputs really are channels-last (C == 1 coincides with NCHW)
    EXPECT_EQ(fl.y.stride(1), 1);
    EXPECT_EQ(fl.y.stride(2), d.C);
  }
  check_forward(d, fl, fr, training, what);
  if (!training) {  // the same constants and the same per-element formula: identical
    EXPECT_EQ(bytes(fl.y), bytes(fr.y));
    EXPECT_EQ(bytes(fl.invstd), bytes(fr.invstd));
  }
  // Backward with the NCHW forward's statistics in both layouts.
  const Need full{true, true, true};
  const Bwd br = backward(d, d.dy, d.x, false, fr.mean, fr.invstd, training, full);
  const Bwd bl = backward(d, dyl, xl, true, fr.mean, fr.invstd, training, full);
  check_backward(d, bl, br, fr.mean, fr.invstd, training, what);
  if (!training) {
    EXPECT_EQ(bytes(bl.dx), bytes(br.dx));  // dx = w r dy: identical
  }
  if (!all_needs) return;
  for (const Need need :
       {Need{true, false, false}, Need{false, true, false}, Need{false, false, true}, Need{false, true, true}}) {
    const Bwd part = backward(d, dyl, xl, true, fr.mean, fr.invstd, training, need);
    EXPECT_EQ(bytes(part.dx), need.dx ? bytes(bl.dx) : std::vector<uint8_t>());
    EXPECT_EQ(bytes(part.dw), need.dw ? bytes(bl.dw) : std::vector<uint8_t>());
    EXPECT_EQ(bytes(part.db), need.db ? bytes(bl.db) : std::vector<uint8_t>());
  }
}

// Double-precision forward and backward on d with batch statistics: the formulas of NormAffineFn and
// NormBackwardFn with exact sums. The backward uses `mean`, `invstd` when given (a kernel's statistics, as an
// op saves them), else the exact ones.
struct Reference {
  Fwd f;
  Bwd g;
};
Reference reference(const Data& d, const Tensor& mean = Tensor(), const Tensor& invstd = Tensor()) {
  const std::vector<double> x = vals(d.x), dy = vals(d.dy), w = vals(d.w), b = vals(d.b);
  const ChannelScan s = scan(d, x);
  std::vector<double> r(d.C), y(x.size()), dx(x.size()), sdy(d.C), dw(d.C);
  std::vector<long double> ldy(d.C, 0.0L), ldyx(d.C, 0.0L);
  for (int64_t c = 0; c < d.C; ++c) r[c] = 1.0 / std::sqrt(s.var[c] + kEps);
  const std::vector<double> mu = mean.defined() ? vals(mean) : s.mean, rb = invstd.defined() ? vals(invstd) : r;
  auto index = [&d](int64_t n, int64_t c, int64_t j) { return static_cast<size_t>((n * d.C + c) * d.S + j); };
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c)
      for (int64_t j = 0; j < d.S; ++j) {
        const size_t i = index(n, c, j);
        const double wc = w.empty() ? 1.0 : w[c], bc = b.empty() ? 0.0 : b[c];
        y[i] = (x[i] - s.mean[c]) * r[c] * wc + bc;
        ldy[c] += dy[i];
        ldyx[c] += static_cast<long double>(dy[i]) * (static_cast<long double>(x[i]) - mu[c]);
      }
  const double M = static_cast<double>(d.M());
  std::vector<double> sdyx(d.C);
  for (int64_t c = 0; c < d.C; ++c) {
    sdy[c] = static_cast<double>(ldy[c]);
    sdyx[c] = static_cast<double>(ldyx[c]);
  }
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t c = 0; c < d.C; ++c)
      for (int64_t j = 0; j < d.S; ++j) {
        const size_t i = index(n, c, j);
        const double wr = (w.empty() ? 1.0 : w[c]) * rb[c];
        dx[i] = wr * dy[i] - wr * rb[c] * rb[c] * sdyx[c] / M * (x[i] - mu[c]) - wr * sdy[c] / M;
      }
  for (int64_t c = 0; c < d.C; ++c) dw[c] = sdyx[c] * rb[c];
  const Shape shp{d.N, d.C, d.S}, cs{d.C};
  return {{from_vector<double>(y, shp), from_vector<double>(s.mean, cs), from_vector<double>(s.var, cs),
           from_vector<double>(r, cs)},
          {from_vector<double>(dx, shp), from_vector<double>(dw, cs), from_vector<double>(sdy, cs)}};
}

// Forward (training) and backward of the kernels on d in layout cl against the double reference.
void compare_reference(const Data& d, bool cl) {
  const std::string what = label(d, true) + (cl ? " channels-last" : " NCHW") + " vs double";
  SCOPED_TRACE(what);
  const Tensor x = relayout(d.x, cl), dy = relayout(d.dy, cl);
  const Fwd f = forward(d, x, cl, true);
  check_forward(d, f, reference(d).f, true, what);
  const Bwd g = backward(d, dy, x, cl, f.mean, f.invstd, true, {true, true, true});
  check_backward(d, g, reference(d, f.mean, f.invstd).g, f.mean, f.invstd, true, what);
}

}  // namespace

// ------------------------------------------------------------------------------ against the NCHW kernels

TEST(BatchNormChannelsLast, MatchesNchwKernels) {
  manual_seed(1);
  // C = 1 (the layouts coincide), 3, 64, 100 (not a multiple of any vector width); rows N S from 2 to 40000.
  const std::vector<Shape> shapes = {{1, 64, 2},   {2, 3, 5},     {4, 100, 9},  {3, 1, 50},  {8, 64, 49},
                                     {5, 3, 1000}, {4, 100, 400}, {8, 64, 256}, {8, 3, 5000}};
  for (const Shape& s : shapes)
    for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
      for (bool training : {true, false}) {
        const bool small = s[0] * s[1] * s[2] <= 100000;
        // weight and bias: both, neither, weight only, bias only (all four on the smaller shapes).
        const int wb_cases = small ? 4 : 1;
        for (int k = 0; k < wb_cases; ++k) {
          const Data d = make_data(s[0], s[1], s[2], dt, k == 0 || k == 2, k == 0 || k == 3);
          compare_layouts(d, training, small);
        }
      }
}

TEST(BatchNormChannelsLast, FourDimChannelsLastViewMatchesNchw) {
  // The op layer's case: a [N, C, H, W] channels-last activation viewed as [N, C, H W].
  manual_seed(2);
  const int64_t N = 32, C = 64, H = 8, W = 8;
  for (DType dt : {DType::f32, DType::bf16}) {
    const Data d = make_data(N, C, H * W, dt, true, true);
    Tensor x4 = empty({N, H, W, C}, {.dtype = dt}).permute({0, 3, 1, 2});
    x4.copy_(d.x.view({N, C, H, W}));
    EXPECT_TRUE(x4.is_contiguous(MemoryFormat::channels_last));
    const Tensor xl = x4.view({N, C, H * W});
    ASSERT_EQ(xl.stride(1), 1);
    const Fwd fl = forward(d, xl, true, true), fr = forward(d, d.x, false, true);
    check_forward(d, fl, fr, true, label(d, true));
  }
}

TEST(BatchNormChannelsLast, MixedDtypesMatchOneDtype) {
  // amp: 16-bit x with f32 dy and dx. The values are the same as in the all-16-bit call (dy holds 16-bit values,
  // widened exactly) and the arithmetic is f32 either way, in the same order: dweight and dbias are identical,
  // and dx is the same f32 values before their rounding to 16 bits.
  manual_seed(7);
  for (const Shape& s : {Shape{8, 64, 49}, Shape{5, 3, 1000}})
    for (DType dt : {DType::bf16, DType::f16}) {
      const Data d = make_data(s[0], s[1], s[2], dt, true, true);
      SCOPED_TRACE(label(d, true));
      const Tensor xl = relayout(d.x, true), dyl = relayout(d.dy, true);
      const Fwd f = forward(d, xl, true, true);
      const Bwd one = backward(d, dyl, xl, true, f.mean, f.invstd, true, {true, true, true});
      const Tensor dy32 = relayout(d.dy.to(DType::f32), true);
      Bwd mixed{make(d.N, d.C, d.S, DType::f32, true), empty({d.C}), empty({d.C})};
      backend::batch_norm_backward_kernel.get(kCPU)(mixed.dx, mixed.dw, mixed.db, dy32, xl, f.mean, f.invstd, d.w, true,
                                                    Tensor(), Tensor());
      EXPECT_EQ(bytes(mixed.dw), bytes(one.dw));
      EXPECT_EQ(bytes(mixed.db), bytes(one.db));
      EXPECT_EQ(bytes(mixed.dx.to(dt)), bytes(one.dx));
    }
}

TEST(BatchNormChannelsLast, MismatchedLayoutsAreRejected) {
  // The contract: x, y, dy, dx of one call share x's layout (the kernels assert it rather than misread memory).
  const Data d = make_data(2, 8, 6, DType::f32, true, true);
  const Tensor xl = relayout(d.x, true), dyl = relayout(d.dy, true);
  Tensor m = empty({8}), v = empty({8}), r = empty({8}), dw = empty({8}), db = empty({8});
  const auto fwd = backend::batch_norm_forward_kernel.get(kCPU);
  const auto bwd = backend::batch_norm_backward_kernel.get(kCPU);
  EXPECT_THROW(fwd(make(2, 8, 6, DType::f32, false), m, v, r, xl, d.w, d.b, true, kEps, Tensor(), false), Error);
  EXPECT_THROW(fwd(make(2, 8, 6, DType::f32, true), m, v, r, d.x, d.w, d.b, true, kEps, Tensor(), false), Error);
  fwd(make(2, 8, 6, DType::f32, true), m, v, r, xl, d.w, d.b, true, kEps, Tensor(), false);
  EXPECT_THROW(bwd(make(2, 8, 6, DType::f32, false), dw, db, dyl, xl, m, r, d.w, true, Tensor(), Tensor()), Error);
  EXPECT_THROW(bwd(make(2, 8, 6, DType::f32, true), dw, db, d.dy, xl, m, r, d.w, true, Tensor(), Tensor()), Error);
  EXPECT_NO_THROW(bwd(make(2, 8, 6, DType::f32, true), dw, db, dyl, xl, m, r, d.w, true, Tensor(), Tensor()));
  // A strided x that is neither layout.
  const Tensor odd = empty({2, 8, 12}).narrow(2, 0, 6);
  EXPECT_THROW(fwd(make(2, 8, 6, DType::f32, false), m, v, r, odd, d.w, d.b, true, kEps, Tensor(), false), Error);
}

// ------------------------------------------------------------------------------ against double references

TEST(BatchNormChannelsLast, RowsMatchDoubleReference) {
  // [N, C] (S == 1) takes the rows kernels too; channels-last and NCHW also against double.
  manual_seed(3);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    for (const Shape& s : {Shape{2, 5, 1}, Shape{512, 96, 1}, Shape{3000, 3, 1}})
      compare_reference(make_data(s[0], s[1], s[2], dt, true, true), false);
    compare_reference(make_data(16, 100, 50, dt, true, false), true);
    compare_reference(make_data(16, 100, 50, dt, true, false), false);
  }
}

TEST(BatchNormChannelsLast, LargeCommonOffsetKeepsVariance) {
  // Mean 1e4, std 1 (f32): shifted sums about a pivot near the mean make x - pivot exact (Sterbenz); what
  // remains is rounding the mean to f32 (half an ulp of 1e4, 2^-11 ~ 4.9e-4) and f32 partial sums of
  // (x - pivot)^2 ~ 1 erring by ~1e-7 relative: the variance keeps ~1e-5 relative accuracy (allowed).
  manual_seed(4);
  const int64_t N = 16, C = 64, S = 256;
  Data d = make_data(N, C, S, DType::f32, false, false);
  d.x = randn({N, C, S}, {.dtype = DType::f64}, 1e4, 1.0).to(DType::f32);
  const ChannelScan ref = scan(d, vals(d.x));
  const Fwd f = forward(d, relayout(d.x, true), true, true);
  const std::vector<double> mean = vals(f.mean), var = vals(f.var);
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_NEAR(mean[c], ref.mean[c], 5e-4 + 1e-6) << "channel " << c;
    EXPECT_NEAR(var[c], ref.var[c], 1e-5 * ref.var[c]) << "channel " << c;
  }
  // The normalised output: within 1e-3 (the mean's rounding over std 1, plus the variance's 1e-5).
  const Reference r = reference(d);
  const std::vector<double> y = vals(f.y), yr = vals(r.f.y);
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::abs(y[i] - yr[i]));
  EXPECT_LE(worst, 1e-3);
}

TEST(BatchNormChannelsLast, FarPivotIsRedone) {
  // Note [batch norm over rows of channels]: the pivot of a channel is the mean of 16 rows spread evenly over
  // the batch (rows q R / 16, q < 16; row 0 among them). Channel 1 of R = 40000 rows of N(0, 1) has the value
  // 1000 at exactly those rows (its first row too): pivot 1000, mean 0.4, std ~20, so d^2 ~ 2500 var > 16 var
  // and the channel is redone about its mean. Without the redo, sums of (x - 1000)^2 ~ 1e6 to get a variance
  // of 400 leave the bf16 case 1.3e-5 off (measured: x - 1000 rounds the same way for a whole binade of bf16
  // x); with it the variance keeps 1e-5 relative accuracy (allowed) against double, in f32 and bf16 storage.
  // Channels 0 and 2 are plain (their pivots are kept).
  manual_seed(5);
  const int64_t N = 40, C = 3, S = 1000, R = N * S;
  for (DType dt : {DType::f32, DType::bf16}) {
    Data d = make_data(N, C, S, dt, true, true);
    Tensor x = randn({N, S, C});  // rows-major copy to poke rows into
    float* p = x.data_ptr<float>();
    for (int64_t q = 0; q < 16; ++q) p[(q * R / 16) * C + 1] = 1000.0f;
    d.x = x.permute({0, 2, 1}).to(dt).contiguous();
    const ChannelScan ref = scan(d, vals(d.x));
    ASSERT_GT(1000.0 * 1000.0, 100 * ref.var[1]);  // the pivot really is far past 4 std
    for (bool cl : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (cl ? " channels-last" : " NCHW"));
      const Fwd f = forward(d, relayout(d.x, cl), cl, true);
      const std::vector<double> mean = vals(f.mean), var = vals(f.var);
      for (int64_t c = 0; c < C; ++c) {
        EXPECT_NEAR(mean[c], ref.mean[c], 1e-6 * (std::abs(ref.mean[c]) + std::sqrt(ref.var[c]))) << "channel " << c;
        EXPECT_NEAR(var[c], ref.var[c], 1e-5 * ref.var[c]) << "channel " << c;
      }
    }
    compare_reference(d, true);
  }
}

// ------------------------------------------------------------------------------ determinism

TEST(BatchNormChannelsLast, BitIdenticalAcrossThreadCountsAndIsa) {
  // Chunks of rows are fixed by the shape and combined in chunk order; each ISA variant does the same
  // operations per channel (Note [ISA variants of the batch-norm loops]). Shapes big enough for the
  // parallel path (>= kParallelGrain values) with at least two chunks per thread; C = 100 and 3 leave partial
  // vectors whose handling differs between the ISA variants.
  manual_seed(6);
  const int max_threads = omp_get_max_threads();
  for (const Shape& s : {Shape{16, 64, 64}, Shape{8, 100, 64}, Shape{8, 3, 5000}, Shape{512, 96, 1}})
    for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
      const Data d = make_data(s[0], s[1], s[2], dt, true, true);
      const bool cl = s[2] > 1;
      const Tensor x = relayout(d.x, cl), dy = relayout(d.dy, cl);
      std::vector<std::vector<uint8_t>> first;
      int runs = 0;
      for (int threads : {1, 2})
        for (bool avx512 : {true, false}) {
          SCOPED_TRACE(label(d, true) + " threads " + std::to_string(threads) + (avx512 ? " avx512" : " no avx512"));
          omp_set_num_threads(threads);
          const bool was = backend::cpu::set_avx512_loops(avx512);
          const Fwd f = forward(d, x, cl, true);
          const Fwd e = forward(d, x, cl, false);
          const Bwd g = backward(d, dy, x, cl, f.mean, f.invstd, true, {true, true, true});
          const Bwd ge = backward(d, dy, x, cl, e.mean, e.invstd, false, {true, true, true});
          backend::cpu::set_avx512_loops(was);
          const std::vector<std::vector<uint8_t>> all = {bytes(f.y),   bytes(f.mean), bytes(f.var), bytes(f.invstd),
                                                         bytes(e.y),   bytes(g.dx),   bytes(g.dw),  bytes(g.db),
                                                         bytes(ge.dx), bytes(ge.dw),  bytes(ge.db)};
          if (runs++ == 0) {
            first = all;
          } else {
            for (size_t k = 0; k < all.size(); ++k) EXPECT_TRUE(all[k] == first[k]) << "output " << k;
          }
        }
      omp_set_num_threads(max_threads);
    }
}

// CPU softmax family: softmax / log-softmax along any dim (forward and backward) and the fused class
// losses (cross entropy = log-softmax + NLL, and NLL on log-probabilities), all in one place because
// they share the two loop shapes:
//  * rows (inner == 1: the dim is last and unit-stride): each OpenMP thread takes whole rows; a row is
//    brought into a compute-type buffer once (no copy for f32/f64) and passed over: max, sum of exp, write.
//  * columns (inner > 1: the dim is not last): no transposing copy; a block of up to kCol neighbouring
//    columns is processed together, walking the dim with stride `inner` so every load is a short
//    unit-stride segment, and each pass (max, sum, write) re-reads the segments.
// 16-bit tensors compute in f32 and store rounded; f64 computes in double.
// exp and log are math_exp/math_log (fast_math.hpp), so for float every pass is a vectorised loop;
// the loops that evaluate exp are force-inlined *Lanes functors run through call_isa, which also
// compiles them for AVX-512 and AVX2 (Note [AVX-512 element-wise loops] in loops.hpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/softmax_kernels.hpp"

namespace mp::backend::cpu {
namespace {

/// Columns processed together by the strided (inner > 1) loops.
constexpr int64_t kCol = 128;

template <class A>
constexpr A kNegInf = -std::numeric_limits<A>::infinity();

// Whether the lane functors take their vector copy (AVX-512 or AVX2; float only: double calls libm either way).
template <class A>
bool lanes_vector() {
  return std::is_same_v<A, float> && vector_loops_enabled();
}

// Column blocks narrower than this stay on the baseline lanes: with a few lanes per call the call
// and the loop set-up dominate and the AVX-512 copy was slower (measured: 0.9x at 4 columns, even at
// 8-16, 1.4-2x from 32).
constexpr int64_t kMinAvx512Cols = 16;

// ---------------------------------------------------------------- lane loops

// Max of x[0..n) (-inf when n == 0). A NaN may or may not win; either way the row's exp sum is NaN.
template <class A>
MP_FORCE_INLINE A lanes_max(const A* x, int64_t n) {
  A m = kNegInf<A>;
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// Softmax (or log-softmax) of one row x[0..n) into y.
template <class A>
struct RowSoftmaxLanes {
  MP_FORCE_INLINE void operator()(bool log, const A* x, A* y, int64_t n) const {
    const A m = lanes_max(x, n);
    A s = 0;
    if (log) {
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) s += math_exp(x[j] - m);
      // (x - m) - log s, not x - (m + log s): m + log s would round at the magnitude of m.
      const A ls = math_log(s);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) y[j] = (x[j] - m) - ls;
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) {
        const A e = math_exp(x[j] - m);
        y[j] = e;
        s += e;
      }
      const A inv = A(1) / s;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) y[j] *= inv;
    }
  }
};

// Row max *m and shifted log-sum-exp *l = log sum exp(x - m) of one row (Note [class loss with
// label smoothing]).
template <class A>
struct RowShiftedLseLanes {
  MP_FORCE_INLINE void operator()(const A* x, int64_t n, A* m_out, A* l_out) const {
    const A m = lanes_max(x, n);
    A s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) s += math_exp(x[j] - m);
    *m_out = m;
    *l_out = math_log(s);
  }
};

// One row of x[j] - m[j] for j < wd, across a block of columns: sum[j] += exp(x - m), and with
// `y` non-null also y[j] = exp(x - m).
template <class A>
struct ColsExpSumLanes {
  MP_FORCE_INLINE void operator()(const A* x, const A* m, A* sum, A* y, int64_t wd) const {
    if (y) {
#pragma omp simd
      for (int64_t j = 0; j < wd; ++j) {
        const A e = math_exp(x[j] - m[j]);
        y[j] = e;
        sum[j] += e;
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < wd; ++j) sum[j] += math_exp(x[j] - m[j]);
    }
  }
};

// y[j] = exp(x[j] - m[j]) * scale[j] for j < wd.
template <class A>
struct ColsExpScaleLanes {
  MP_FORCE_INLINE void operator()(const A* x, const A* m, const A* scale, A* y, int64_t wd) const {
#pragma omp simd
    for (int64_t j = 0; j < wd; ++j) y[j] = math_exp(x[j] - m[j]) * scale[j];
  }
};

// Log-softmax gradient o[j] = g[j] - exp(y[j]) * gsum[j] (gsum[0] for every j when kScalarSum).
template <class A, bool kScalarSum>
struct LogSoftmaxGradLanes {
  MP_FORCE_INLINE void operator()(const A* g, const A* y, const A* gsum, A* o, int64_t n) const {
    const LogSoftmaxGradFn<A> f;
    if constexpr (kScalarSum) {
      const A s = gsum[0];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) o[j] = f(g[j], y[j], s);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) o[j] = f(g[j], y[j], gsum[j]);
    }
  }
};

// One class row c of a column block of the class loss: xs = x - m; sum += exp(xs) (when with_exp),
// sx += xs, and xt = xs where the column's target is c. Targets are int32 (block_targets()): SSE2
// cannot compare int64 lanes, which kept these loops scalar.
template <class A>
struct ColsLossAccumLanes {
  MP_FORCE_INLINE void operator()(const A* x, const A* m, const int32_t* tgt, int32_t c, bool with_exp, A* sum, A* sx,
                                  A* xt, int64_t wd) const {
    if (with_exp) {
#pragma omp simd
      for (int64_t j = 0; j < wd; ++j) {
        const A xs = x[j] - m[j];
        sum[j] += math_exp(xs);
        sx[j] += xs;
        xt[j] = tgt[j] == c ? xs : xt[j];
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < wd; ++j) {
        const A xs = x[j] - m[j];
        sx[j] += xs;
        xt[j] = tgt[j] == c ? xs : xt[j];
      }
    }
  }
};

// Class-loss gradient of one row of C classes: out[c] = class_loss_grad(exp((x - m) - l), c == t, ...).
// The target class is redone after the loop (an int64 compare per lane would keep SSE2 scalar).
template <class A>
struct RowClassLossGradLanes {
  MP_FORCE_INLINE void operator()(const A* x, A m, A l, int64_t t, A eps, A eps_c, A w, A* out, int64_t C) const {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out[c] = class_loss_grad<A>(math_exp((x[c] - m) - l), false, eps, eps_c, w);
    out[t] = class_loss_grad<A>(math_exp((x[t] - m) - l), true, eps, eps_c, w);
  }
};

// c ? a : b, for float as a bit blend (blend_select): with ?: GCC sinks the unused arm's loads into a
// branch and the SSE2 loop stays scalar.
template <class A>
MP_FORCE_INLINE A select(bool c, A a, A b) {
  if constexpr (std::is_same_v<A, float>)
    return blend_select(c, a, b);
  else
    return c ? a : b;
}

// Class-loss gradient of class row c across a column block; x null for log-probabilities (p = 0).
// Columns with weight 0 (ignored rows) get exactly 0: their (possibly garbage) probability must not
// leak NaN into the zero.
template <class A>
struct ColsClassLossGradLanes {
  MP_FORCE_INLINE void operator()(const A* x, const A* m, const A* l, const A* wt, const int32_t* tgt, int32_t c, A eps,
                                  A eps_c, A* out, int64_t wd) const {
    if (x) {
#pragma omp simd
      for (int64_t j = 0; j < wd; ++j) out[j] = lane(math_exp((x[j] - m[j]) - l[j]), wt[j], tgt[j] == c, eps, eps_c);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < wd; ++j) out[j] = lane(A(0), wt[j], tgt[j] == c, eps, eps_c);
    }
  }
  MP_FORCE_INLINE static A lane(A p, A w, bool is_target, A eps, A eps_c) {
    const A g =
        select(is_target, class_loss_grad<A>(p, true, eps, eps_c, w), class_loss_grad<A>(p, false, eps, eps_c, w));
    return select(w == A(0), A(0), g);
  }
};

// The targets of a column block as int32 for the lane loops: t where 0 <= t < C, else -1 (ignored or
// out of range: such a column matches no class).
inline void block_targets(const int64_t* tgt, int64_t C, int64_t wd, int32_t* out) {
  for (int64_t j = 0; j < wd; ++j) out[j] = tgt[j] >= 0 && tgt[j] < C ? static_cast<int32_t>(tgt[j]) : -1;
}

// ---------------------------------------------------------------- softmax forward

template <class A>
void softmax_rows(bool log, const Tensor& out, const Tensor& in, int64_t rows, int64_t n) {
  const bool vec = lanes_vector<A>();
#pragma omp parallel if (should_parallelize(rows * n))
  {
    std::vector<A> xbuf(static_cast<size_t>(n)), ybuf(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const A* x = load_at<A>(in, r * n, n, xbuf.data());
      A* y = dest_at<A>(out, r * n, ybuf.data());
      call_isa(vec, RowSoftmaxLanes<A>{}, log, x, y, n);
      flush_at<A>(out, r * n, n, y);
    }
  }
}

template <class A>
void softmax_cols(bool log, const Tensor& out, const Tensor& in, const SoftmaxShape& s) {
  const int64_t nblk = (s.inner + kCol - 1) / kCol;
  const bool vec = lanes_vector<A>();
#pragma omp parallel for if (should_parallelize(s.outer * s.n * s.inner)) schedule(static)
  for (int64_t w = 0; w < s.outer * nblk; ++w) {
    const int64_t o = w / nblk, j0 = (w % nblk) * kCol, wd = std::min(kCol, s.inner - j0);
    const bool wide = vec && wd >= kMinAvx512Cols;
    const int64_t base = o * s.n * s.inner + j0;
    alignas(64) A m[kCol], sum[kCol], xbuf[kCol], ybuf[kCol];
    std::fill(m, m + wd, kNegInf<A>);
    std::fill(sum, sum + wd, A(0));
    for (int64_t c = 0; c < s.n; ++c) {
      const A* x = load_at<A>(in, base + c * s.inner, wd, xbuf);
#pragma omp simd
      for (int64_t j = 0; j < wd; ++j) m[j] = x[j] > m[j] ? x[j] : m[j];
    }
    // softmax into an output of the compute type keeps exp(x - m) there and rescales it in place;
    // otherwise the write pass recomputes it (a 16-bit output must be rounded only once).
    const bool keep_exp = !log && out.dtype() == dtype_of<A>();
    for (int64_t c = 0; c < s.n; ++c) {
      const A* x = load_at<A>(in, base + c * s.inner, wd, xbuf);
      A* y = keep_exp ? static_cast<A*>(out.raw_data()) + base + c * s.inner : nullptr;
      call_isa(wide, ColsExpSumLanes<A>{}, x, static_cast<const A*>(m), static_cast<A*>(sum), y, wd);
    }
    if (log) {
#pragma omp simd
      for (int64_t j = 0; j < wd; ++j) sum[j] = math_log(sum[j]);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < wd; ++j) sum[j] = A(1) / sum[j];
    }
    if (keep_exp) {
      for (int64_t c = 0; c < s.n; ++c) {
        A* y = static_cast<A*>(out.raw_data()) + base + c * s.inner;
#pragma omp simd
        for (int64_t j = 0; j < wd; ++j) y[j] *= sum[j];
      }
      continue;
    }
    for (int64_t c = 0; c < s.n; ++c) {
      const int64_t off = base + c * s.inner;
      const A* x = load_at<A>(in, off, wd, xbuf);
      A* y = dest_at<A>(out, off, ybuf);
      if (log) {
#pragma omp simd
        for (int64_t j = 0; j < wd; ++j) y[j] = (x[j] - m[j]) - sum[j];
      } else {
        call_isa(wide, ColsExpScaleLanes<A>{}, x, static_cast<const A*>(m), static_cast<const A*>(sum), y, wd);
      }
      flush_at<A>(out, off, wd, y);
    }
  }
}

void softmax_cpu(bool log, const Tensor& out, const Tensor& in, const SoftmaxShape& s) {
  if (s.outer * s.n * s.inner == 0) return;
  auto run = [&]<class A>() {
    if (s.inner == 1)
      softmax_rows<A>(log, out, in, s.outer, s.n);
    else
      softmax_cols<A>(log, out, in, s);
  };
  if (in.dtype() == DType::f64 || out.dtype() == DType::f64)
    run.template operator()<double>();
  else
    run.template operator()<float>();
}

// ---------------------------------------------------------------- softmax backward

template <class A>
void softmax_backward_rows(bool log, const Tensor& gi, const Tensor& go, const Tensor& y, int64_t rows, int64_t n) {
  const bool vec = lanes_vector<A>();
#pragma omp parallel if (should_parallelize(rows * n))
  {
    std::vector<A> gbuf(static_cast<size_t>(n)), ybuf(static_cast<size_t>(n)), obuf(static_cast<size_t>(n));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const A* g = load_at<A>(go, r * n, n, gbuf.data());
      const A* yy = load_at<A>(y, r * n, n, ybuf.data());
      A* o = dest_at<A>(gi, r * n, obuf.data());
      A acc = 0;
      if (log) {
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < n; ++j) acc += g[j];
        call_isa(vec, LogSoftmaxGradLanes<A, true>{}, g, yy, static_cast<const A*>(&acc), o, n);
      } else {
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < n; ++j) acc += g[j] * yy[j];
        const SoftmaxGradFn<A> f;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) o[j] = f(g[j], yy[j], acc);
      }
      flush_at<A>(gi, r * n, n, o);
    }
  }
}

template <class A>
void softmax_backward_cols(bool log, const Tensor& gi, const Tensor& go, const Tensor& y, const SoftmaxShape& s) {
  const int64_t nblk = (s.inner + kCol - 1) / kCol;
  const bool vec = lanes_vector<A>();
#pragma omp parallel for if (should_parallelize(s.outer * s.n * s.inner)) schedule(static)
  for (int64_t w = 0; w < s.outer * nblk; ++w) {
    const int64_t o = w / nblk, j0 = (w % nblk) * kCol, wd = std::min(kCol, s.inner - j0);
    const bool wide = vec && wd >= kMinAvx512Cols;
    const int64_t base = o * s.n * s.inner + j0;
    alignas(64) A acc[kCol], gbuf[kCol], ybuf[kCol], obuf[kCol];
    std::fill(acc, acc + wd, A(0));
    for (int64_t c = 0; c < s.n; ++c) {
      const A* g = load_at<A>(go, base + c * s.inner, wd, gbuf);
      if (log) {
#pragma omp simd
        for (int64_t j = 0; j < wd; ++j) acc[j] += g[j];
      } else {
        const A* yy = load_at<A>(y, base + c * s.inner, wd, ybuf);
#pragma omp simd
        for (int64_t j = 0; j < wd; ++j) acc[j] += g[j] * yy[j];
      }
    }
    for (int64_t c = 0; c < s.n; ++c) {
      const int64_t off = base + c * s.inner;
      const A* g = load_at<A>(go, off, wd, gbuf);
      const A* yy = load_at<A>(y, off, wd, ybuf);
      A* out = dest_at<A>(gi, off, obuf);
      if (log) {
        call_isa(wide, LogSoftmaxGradLanes<A, false>{}, g, yy, static_cast<const A*>(acc), out, wd);
      } else {
        const SoftmaxGradFn<A> f;
#pragma omp simd
        for (int64_t j = 0; j < wd; ++j) out[j] = f(g[j], yy[j], acc[j]);
      }
      flush_at<A>(gi, off, wd, out);
    }
  }
}

void softmax_backward_cpu(bool log, const Tensor& gi, const Tensor& go, const Tensor& y, const SoftmaxShape& s) {
  if (s.outer * s.n * s.inner == 0) return;
  auto run = [&]<class A>() {
    if (s.inner == 1)
      softmax_backward_rows<A>(log, gi, go, y, s.outer, s.n);
    else
      softmax_backward_cols<A>(log, gi, go, y, s);
  };
  if (gi.dtype() == DType::f64 || y.dtype() == DType::f64)
    run.template operator()<double>();
  else
    run.template operator()<float>();
}

// ---------------------------------------------------------------- class losses

// Keep the smallest flat position of an out-of-range target (threads race to report; rare).
void note_bad(int64_t& bad, int64_t r) {
#pragma omp critical(mp_class_loss_bad)
  {
    if (bad < 0 || r < bad) bad = r;
  }
}

template <class A>
void class_loss_rows(const Tensor& losses, const Tensor& stats, const Tensor& input, const int64_t* tgt,
                     const SoftmaxShape& s, const ClassLossParams& p, int64_t& bad) {
  const int64_t rows = s.outer, C = s.n;
  const A eps = static_cast<A>(p.label_smoothing);
  const bool vec = lanes_vector<A>();
  A* L = losses.data_ptr<A>();
  A* S = stats.defined() ? stats.data_ptr<A>() : nullptr;
#pragma omp parallel if (should_parallelize(rows * C))
  {
    std::vector<A> xbuf(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = tgt[r];
      L[r] = 0;
      if (S) S[2 * r] = S[2 * r + 1] = 0;
      if (t == p.ignore_index) continue;
      if (t < 0 || t >= C) {
        note_bad(bad, r);
        continue;
      }
      const A* x = load_at<A>(input, r * C, C, xbuf.data());
      // Shifted by the row max m (0 for log-probabilities): l = lse', xs = x' (Note [class loss with label smoothing]).
      A m = 0, l = 0;
      if (!p.log_probs) call_isa(vec, RowShiftedLseLanes<A>{}, x, C, &m, &l);
      A mean_x = 0;
      if (eps != A(0)) {
        A sx = 0;
#pragma omp simd reduction(+ : sx)
        for (int64_t c = 0; c < C; ++c) sx += x[c] - m;
        mean_x = sx / static_cast<A>(C);
      }
      L[r] = class_loss_value<A>(l, x[t] - m, mean_x, eps);
      if (S) {
        S[2 * r] = m;
        S[2 * r + 1] = l;
      }
    }
  }
}

template <class A>
void class_loss_cols(const Tensor& losses, const Tensor& stats, const Tensor& input, const int64_t* tgt,
                     const SoftmaxShape& s, const ClassLossParams& p, int64_t& bad) {
  const int64_t C = s.n, inner = s.inner, nblk = (inner + kCol - 1) / kCol;
  const A eps = static_cast<A>(p.label_smoothing);
  const bool vec = lanes_vector<A>();
  A* L = losses.data_ptr<A>();
  A* S = stats.defined() ? stats.data_ptr<A>() : nullptr;
#pragma omp parallel for if (should_parallelize(s.outer * C * inner)) schedule(static)
  for (int64_t w = 0; w < s.outer * nblk; ++w) {
    const int64_t o = w / nblk, j0 = (w % nblk) * kCol, wd = std::min(kCol, inner - j0);
    const bool wide = vec && wd >= kMinAvx512Cols;
    const int64_t base = o * C * inner + j0, rbase = o * inner + j0;
    alignas(64) A m[kCol], sum[kCol], sx[kCol], xt[kCol], xbuf[kCol];
    alignas(64) int32_t t32[kCol];
    block_targets(tgt + rbase, C, wd, t32);
    std::fill(m, m + wd, p.log_probs ? A(0) : kNegInf<A>);
    std::fill(sum, sum + wd, A(0));
    std::fill(sx, sx + wd, A(0));
    std::fill(xt, xt + wd, A(0));
    if (!p.log_probs) {
      for (int64_t c = 0; c < C; ++c) {
        const A* x = load_at<A>(input, base + c * inner, wd, xbuf);
#pragma omp simd
        for (int64_t j = 0; j < wd; ++j) m[j] = x[j] > m[j] ? x[j] : m[j];
      }
    }
    // Shifted by the column max m (0 for log-probabilities): Note [class loss with label smoothing].
    for (int64_t c = 0; c < C; ++c) {
      const A* x = load_at<A>(input, base + c * inner, wd, xbuf);
      call_isa(wide, ColsLossAccumLanes<A>{}, x, static_cast<const A*>(m), static_cast<const int32_t*>(t32),
               static_cast<int32_t>(c), !p.log_probs, static_cast<A*>(sum), static_cast<A*>(sx), static_cast<A*>(xt),
               wd);
    }
    for (int64_t j = 0; j < wd; ++j) {
      const int64_t r = rbase + j, t = tgt[r];
      L[r] = 0;
      if (S) S[2 * r] = S[2 * r + 1] = 0;
      if (t == p.ignore_index) continue;
      if (t < 0 || t >= C) {
        note_bad(bad, r);
        continue;
      }
      const A l = p.log_probs ? A(0) : math_log(sum[j]);
      L[r] = class_loss_value<A>(l, xt[j], sx[j] / static_cast<A>(C), eps);
      if (S) {
        S[2 * r] = m[j];
        S[2 * r + 1] = l;
      }
    }
  }
}

void class_loss_cpu(const char* op, const Tensor& losses, const Tensor& stats, const Tensor& input,
                    const Tensor& target, const SoftmaxShape& s, const ClassLossParams& p) {
  const int64_t* tgt = target.data_ptr<int64_t>();
  int64_t bad = -1;
  if (s.outer * s.inner > 0) {
    auto run = [&]<class A>() {
      if (s.inner == 1)
        class_loss_rows<A>(losses, stats, input, tgt, s, p, bad);
      else
        class_loss_cols<A>(losses, stats, input, tgt, s, p, bad);
    };
    if (losses.dtype() == DType::f64)
      run.template operator()<double>();
    else
      run.template operator()<float>();
  }
  MP_CHECK(bad < 0, op, ": target ", bad >= 0 ? tgt[bad] : 0, " (at flat position ", bad, ") is out of range for ", s.n,
           " classes; expected 0 <= target < ", s.n, " or target == ignore_index (", p.ignore_index, ")");
}

template <class A>
void class_loss_backward_rows(const Tensor& gi, const A* W, bool shared_w, const Tensor& input, const A* S,
                              const int64_t* tgt, const SoftmaxShape& s, const ClassLossParams& p) {
  const int64_t rows = s.outer, C = s.n;
  const A eps = static_cast<A>(p.label_smoothing), eps_c = eps / static_cast<A>(C);
  const bool vec = lanes_vector<A>();
#pragma omp parallel if (should_parallelize(rows * C))
  {
    std::vector<A> xbuf(static_cast<size_t>(C)), obuf(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = tgt[r];
      A* out = dest_at<A>(gi, r * C, obuf.data());
      if (t == p.ignore_index || t < 0 || t >= C) {
        std::fill(out, out + C, A(0));
      } else {
        const A w = W[shared_w ? 0 : r];
        if (p.log_probs) {
          for (int64_t c = 0; c < C; ++c) out[c] = class_loss_grad<A>(A(0), c == t, eps, eps_c, w);
        } else {
          const A* x = load_at<A>(input, r * C, C, xbuf.data());
          call_isa(vec, RowClassLossGradLanes<A>{}, x, S[2 * r], S[2 * r + 1], t, eps, eps_c, w, out, C);
        }
      }
      flush_at<A>(gi, r * C, C, out);
    }
  }
}

template <class A>
void class_loss_backward_cols(const Tensor& gi, const A* W, bool shared_w, const Tensor& input, const A* S,
                              const int64_t* tgt, const SoftmaxShape& s, const ClassLossParams& p) {
  const int64_t C = s.n, inner = s.inner, nblk = (inner + kCol - 1) / kCol;
  const A eps = static_cast<A>(p.label_smoothing), eps_c = eps / static_cast<A>(C);
  const bool vec = lanes_vector<A>();
#pragma omp parallel for if (should_parallelize(s.outer * C * inner)) schedule(static)
  for (int64_t w = 0; w < s.outer * nblk; ++w) {
    const int64_t o = w / nblk, j0 = (w % nblk) * kCol, wd = std::min(kCol, inner - j0);
    const bool wide = vec && wd >= kMinAvx512Cols;
    const int64_t base = o * C * inner + j0, rbase = o * inner + j0;
    alignas(64) A wt[kCol], m[kCol], l[kCol], xbuf[kCol], obuf[kCol];
    alignas(64) int32_t t32[kCol];
    block_targets(tgt + rbase, C, wd, t32);
    for (int64_t j = 0; j < wd; ++j) {
      const int64_t r = rbase + j, t = tgt[r];
      const bool valid = t != p.ignore_index && t >= 0 && t < C;
      wt[j] = valid ? W[shared_w ? 0 : r] : A(0);
      m[j] = S ? S[2 * r] : A(0);
      l[j] = S ? S[2 * r + 1] : A(0);
    }
    for (int64_t c = 0; c < C; ++c) {
      const int64_t off = base + c * inner;
      A* out = dest_at<A>(gi, off, obuf);
      const A* x = p.log_probs ? nullptr : load_at<A>(input, off, wd, xbuf);
      call_isa(wide, ColsClassLossGradLanes<A>{}, x, static_cast<const A*>(m), static_cast<const A*>(l),
               static_cast<const A*>(wt), static_cast<const int32_t*>(t32), static_cast<int32_t>(c), eps, eps_c, out,
               wd);
      flush_at<A>(gi, off, wd, out);
    }
  }
}

void class_loss_backward_cpu(const Tensor& gi, const Tensor& grad_rows, const Tensor& input, const Tensor& stats,
                             const Tensor& target, const SoftmaxShape& s, const ClassLossParams& p) {
  if (s.outer * s.n * s.inner == 0) return;
  const int64_t* tgt = target.data_ptr<int64_t>();
  auto run = [&]<class A>() {
    const A* W = grad_rows.data_ptr<A>();
    const bool shared = grad_rows.numel() == 1 && s.outer * s.inner != 1;
    const A* S = stats.defined() ? stats.data_ptr<A>() : nullptr;
    if (s.inner == 1)
      class_loss_backward_rows<A>(gi, W, shared, input, S, tgt, s, p);
    else
      class_loss_backward_cols<A>(gi, W, shared, input, S, tgt, s, p);
  };
  if (grad_rows.dtype() == DType::f64)
    run.template operator()<double>();
  else
    run.template operator()<float>();
}

}  // namespace

MP_REGISTER_KERNEL(softmax_kernel, DeviceType::cpu, &softmax_cpu);
MP_REGISTER_KERNEL(softmax_backward_kernel, DeviceType::cpu, &softmax_backward_cpu);
MP_REGISTER_KERNEL(class_loss_kernel, DeviceType::cpu, &class_loss_cpu);
MP_REGISTER_KERNEL(class_loss_backward_kernel, DeviceType::cpu, &class_loss_backward_cpu);

}  // namespace mp::backend::cpu

// CPU batch norm over rows of contiguous channels: x [N, C] (S == 1) and channels-last x [N, C, S] (memory a
// row-major [N S, C] matrix, as torch.channels_last activations), forward and backward.
//
// Note [batch norm over rows of channels]
// The R = N S rows are cut into chunks of whole steps fixed by the shape (never by the thread count); the
// threads take contiguous ranges of chunks. A step is U consecutive rows, W = U C values, with U = 1 unless C
// is small (U C >= kMinStep values, so a loop over a step is long enough to vectorise); every loop runs over
// the W contiguous values of a step with per-position constants (a channel's pivot, mean, scale, ... repeated U
// times), so it vectorises across channels and needs no horizontal reduction.
// - Statistics (training forward) in one pass of shifted sums about a per-channel pivot k, as the NCHW path
//   (Note [normalisation statistics on the CPU]): each step position w keeps two running sums in the
//   statistics type, sum(x - k) and sum((x - k)^2), over a run of kRun steps (kRun values each), then adds them
//   into the chunk's double sums. The chunks' sums are added in chunk order, then a channel's U positions in
//   order. So every result is a fixed sequence of operations: the same with any thread count and any ISA
//   variant (Note [ISA variants of the batch-norm loops]). The pivot is the mean of kPivotRows rows spread
//   evenly over the batch (a single row may sit in a channel's tails; spread rows sample several images); a
//   channel whose mean lands more than 4 std from its pivot (d^2 > 16 var) is redone about its mean: the
//   pass is repeated once with those pivots moved (other channels keep theirs and get the same sums again).
// - Backward sums sum(dy) and sum(dy (x - mean)) accumulate the same way.
// - Each kernel reads its inputs twice: the sums pass and the element-wise pass (y, or dx). The second pass
//   visits each thread's chunks in reverse order, so the chunks read last in the first pass, still in the
//   core's cache, are used first.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cpu/norm_common.hpp"
#include "backend/norm_kernels.hpp"

namespace mp::backend::cpu::norm_detail {
namespace {

// Steps per run: values in each f32 partial sum before it is added into double.
constexpr int64_t kRun = 32;
// Least values per step (U C >= kMinStep).
constexpr int64_t kMinStep = 64;
// Least values per chunk (a chunk is a whole number of steps).
constexpr int64_t kChunkValues = 16384;
// Most values per block (the piece converted at once when operands need bulk conversion), unless a step is longer.
constexpr int64_t kBlockValues = 1024;
// Rows averaged for the pivots.
constexpr int64_t kPivotRows = 16;

// The cut of R rows of C channels into steps, blocks and chunks (Note [batch norm over rows of channels]).
struct RowsPlan {
  int64_t R = 0, C = 0;
  int64_t U = 1, W = 0;      // rows per step, values per step
  int64_t L = 0;             // values in all (R C)
  int64_t B = 1;             // steps per block: a power of two <= kRun
  int64_t chunk_values = 0;  // values per chunk (a multiple of W)
  int64_t nchunks = 0;
  int64_t scratch = 0;  // values per scratch buffer: max(B W, 2 W)

  RowsPlan(int64_t rows, int64_t channels) : R(rows), C(channels) {
    U = std::max<int64_t>(1, (kMinStep + C - 1) / C);
    W = U * C;
    L = R * C;
    while (B * 2 <= kRun && B * 2 * W <= kBlockValues) B *= 2;
    chunk_values = (kChunkValues + W - 1) / W * W;
    nchunks = L == 0 ? 0 : (L + chunk_values - 1) / chunk_values;
    scratch = std::max(B * W, 2 * W);
  }
  int64_t begin(int64_t ch) const { return ch * chunk_values; }
  int64_t end(int64_t ch) const { return std::min(L, (ch + 1) * chunk_values); }
};

// Walks chunk ch of p: block(i, nv) for each block (element i, nv <= B W values: where operands are fetched or
// converted), then step(off, n) for each step of it (offset in the block, n = W or less for the last step),
// and run_end() after every kRun steps and at the end of the chunk.
template <class Block, class Step, class RunEnd>
MP_LOOP_INLINE void for_chunk_steps(const RowsPlan& p, int64_t ch, Block&& block, Step&& step, RunEnd&& run_end) {
  const int64_t e = p.end(ch);
  int64_t in_run = 0;
  for (int64_t i = p.begin(ch); i < e; i += p.B * p.W) {
    const int64_t nv = std::min(p.B * p.W, e - i);
    block(i, nv);
    for (int64_t off = 0; off < nv; off += p.W) {
      step(off, std::min(p.W, nv - off));
      if (++in_run == kRun) {
        run_end();
        in_run = 0;
      }
    }
  }
  if (in_run != 0) run_end();
}

// Adds the run sums (s1, s2: W values each) into the chunk's double sums d1, d2 and clears them.
template <class S>
MP_LOOP_INLINE void flush_run(int64_t W, S* s1, S* s2, double* d1, double* d2) {
  for (int64_t w = 0; w < W; ++w) {
    d1[w] += static_cast<double>(s1[w]);
    d2[w] += static_cast<double>(s2[w]);
    s1[w] = s2[w] = S(0);
  }
}

// NormAffineFn and NormBackwardFn with per-position constants. Out of the loop bodies: a functor built inside an
// `omp simd` loop becomes a per-lane array in memory (OpenMP lowering precedes inlining), which stops GCC from
// vectorising the loop.
template <class S>
MP_LOOP_INLINE S affine(S mu, S scale, S shift, S x) {
  return NormAffineFn<S>{mu, scale, shift}(x);
}
template <class S>
MP_LOOP_INLINE S backward_dx(S a, S b, S c, S mu, S dy, S x) {
  return NormBackwardFn<S>{a, b, c, mu}(dy, x);
}

// Operands of the forward kernel. Per step position w (W values): kw the pivot (statistics pass), mu, scale,
// shift the affine constants (output pass). part: 2 W double sums per chunk.
template <class S>
struct RowsForward {
  Operand xo, yo;
  RowsPlan p;
  const S *kw, *mu, *scale, *shift;
  double* part;
  Operand ro;         // the fused residual (or undefined)
  bool relu = false;  // the fused ReLU
};

// Shifted sums of chunk ch into part. b0: scratch for converted x; b1: the run sums (2 W).
template <class S, class T>
MP_LOOP_INLINE void rows_stats_chunk(const RowsForward<S>& a, int64_t ch, S* const* b) {
  using A = Access<S, T>;
  S* b0 = b[0];
  S* b1 = b[1];
  const int64_t W = a.p.W;
  S* s1 = b1;
  S* s2 = b1 + W;
  double* d1 = a.part + ch * 2 * W;
  double* d2 = d1 + W;
  std::fill(s1, s1 + 2 * W, S(0));
  std::fill(d1, d1 + 2 * W, 0.0);
  const S* kw = a.kw;
  const typename A::E* v = nullptr;
  for_chunk_steps(
      a.p, ch, [&](int64_t i, int64_t nv) MP_LAMBDA_INLINE { v = A::src(a.xo, i, nv, b0); },
      [&](int64_t off, int64_t n) MP_LAMBDA_INLINE {
        const typename A::E* vs = v + off;
#pragma omp simd
        for (int64_t w = 0; w < n; ++w) {
          const S d = A::in(vs[w]) - kw[w];
          s1[w] += d;
          s2[w] += d * d;
        }
      },
      [&]() MP_LAMBDA_INLINE { flush_run(W, s1, s2, d1, d2); });
}
MP_NORM_VARIANTS(rows_stats_chunk, RowsForward)

// y = (x - mean) * scale + shift over chunk ch, then the fused epilogue. b[0], b[1]: scratch for converted x
// and y; b[2], b[3]: for the epilogue.
template <class S, class T>
MP_LOOP_INLINE void rows_affine_chunk(const RowsForward<S>& a, int64_t ch, S* const* b) {
  using A = Access<S, T>;
  S* b0 = b[0];
  S* b1 = b[1];
  const bool fused = a.ro.defined() || a.relu;
  const S *mu = a.mu, *sc = a.scale, *sh = a.shift;
  const int64_t e = a.p.end(ch), step = a.p.B * a.p.W;
  for (int64_t i = a.p.begin(ch); i < e; i += step) {
    const int64_t nv = std::min(step, e - i);
    const typename A::E* v = A::src(a.xo, i, nv, b0);
    typename A::E* o = A::dst(a.yo, i, b1);
    for (int64_t off = 0; off < nv; off += a.p.W) {
      const int64_t n = std::min(a.p.W, nv - off);
      const typename A::E* vs = v + off;
      typename A::E* os = o + off;
#pragma omp simd
      for (int64_t w = 0; w < n; ++w) os[w] = A::out(affine(mu[w], sc[w], sh[w], A::in(vs[w])));
    }
    A::commit(a.yo, i, nv, o);
    if (fused) bn_epilogue_block<S, T>(a.yo, a.ro, a.relu, i, nv, o, b[2], b[3]);
  }
}
MP_NORM_VARIANTS(rows_affine_chunk, RowsForward)

// Operands of the backward kernel. Per step position w: mu the mean (sums pass), ca, cb, cc the
// NormBackwardFn constants (dx pass). part: 2 W double sums per chunk.
template <class S>
struct RowsBackward {
  Operand xo, dyo, dxo;
  RowsPlan p;
  const S *mu, *ca, *cb, *cc;
  double* part;
  Operand yo;  // the fused forward's output: the sums pass masks dy with y > 0 (or undefined)
  Operand zo;  // where the masked gradient goes (dz, or dx to be overwritten in place; or undefined)
};

// sum(dy) and sum(dy (x - mean)) of chunk ch into part, dy masked first when the ReLU was fused. b[0], b[1]:
// scratch for converted dy and x; b[2]: run sums; b[3], b[4]: for the mask.
template <class S, class T>
MP_LOOP_INLINE void rows_grad_sums_chunk(const RowsBackward<S>& a, int64_t ch, S* const* b) {
  using A = Access<S, T>;
  S* b0 = b[0];
  S* b1 = b[1];
  S* b2 = b[2];
  const int64_t W = a.p.W;
  S* s1 = b2;
  S* s2 = b2 + W;
  double* d1 = a.part + ch * 2 * W;
  double* d2 = d1 + W;
  std::fill(s1, s1 + 2 * W, S(0));
  std::fill(d1, d1 + 2 * W, 0.0);
  const S* mu = a.mu;
  const typename A::E* g = nullptr;
  const typename A::E* v = nullptr;
  for_chunk_steps(
      a.p, ch,
      [&](int64_t i, int64_t nv) MP_LAMBDA_INLINE {
        g = a.yo.defined() ? bn_relu_mask_block<S, T>(a.dyo, a.yo, a.zo, i, nv, b0, b[3], b[4])
                           : A::src(a.dyo, i, nv, b0);
        v = A::src(a.xo, i, nv, b1);
      },
      [&](int64_t off, int64_t n) MP_LAMBDA_INLINE {
        const typename A::E* gs = g + off;
        const typename A::E* vs = v + off;
#pragma omp simd
        for (int64_t w = 0; w < n; ++w) {
          const S gw = A::in(gs[w]);
          s1[w] += gw;
          s2[w] += gw * (A::in(vs[w]) - mu[w]);
        }
      },
      [&]() MP_LAMBDA_INLINE { flush_run(W, s1, s2, d1, d2); });
}
MP_NORM_VARIANTS(rows_grad_sums_chunk, RowsBackward)

// dx = a dy + b (x - mean) + c over chunk ch. b[0], b[1], b[2]: scratch for converted dy, x and dx.
template <class S, class T>
MP_LOOP_INLINE void rows_dx_chunk(const RowsBackward<S>& a, int64_t ch, S* const* b) {
  using A = Access<S, T>;
  S* b0 = b[0];
  S* b1 = b[1];
  S* b2 = b[2];
  const S *mu = a.mu, *ca = a.ca, *cb = a.cb, *cc = a.cc;
  const int64_t e = a.p.end(ch), step = a.p.B * a.p.W;
  for (int64_t i = a.p.begin(ch); i < e; i += step) {
    const int64_t nv = std::min(step, e - i);
    const typename A::E* g = A::src(a.dyo, i, nv, b0);
    const typename A::E* v = A::src(a.xo, i, nv, b1);
    typename A::E* o = A::dst(a.dxo, i, b2);
    for (int64_t off = 0; off < nv; off += a.p.W) {
      const int64_t n = std::min(a.p.W, nv - off);
      const typename A::E* gs = g + off;
      const typename A::E* vs = v + off;
      typename A::E* os = o + off;
#pragma omp simd
      for (int64_t w = 0; w < n; ++w)
        os[w] = A::out(backward_dx(ca[w], cb[w], cc[w], mu[w], A::in(gs[w]), A::in(vs[w])));
    }
    A::commit(a.dxo, i, nv, o);
  }
}
MP_NORM_VARIANTS(rows_dx_chunk, RowsBackward)

// Per-channel values repeated over the U rows of a step: out[u C + c] = v[c].
template <class S>
void repeat_per_step(const RowsPlan& p, const S* v, S* out) {
  for (int64_t u = 0; u < p.U; ++u) std::copy(v, v + p.C, out + u * p.C);
}

// Totals per channel of the chunk sums: t1[c] = sum over chunks (in order) and the channel's step positions
// (in order) of part's first sums, t2 likewise of the second.
void combine_chunks(const RowsPlan& p, const double* part, double* t1, double* t2) {
  std::fill(t1, t1 + p.C, 0.0);
  std::fill(t2, t2 + p.C, 0.0);
  for (int64_t ch = 0; ch < p.nchunks; ++ch)
    for (int64_t u = 0; u < p.U; ++u) {
      const double* d1 = part + ch * 2 * p.W + u * p.C;
      const double* d2 = d1 + p.W;
      for (int64_t c = 0; c < p.C; ++c) {
        t1[c] += d1[c];
        t2[c] += d2[c];
      }
    }
}

// This thread's share of the chunks of p, [lo, hi): a contiguous range (the whole when not in a parallel region).
struct ThreadChunks {
  int64_t lo, hi;
  explicit ThreadChunks(const RowsPlan& p) {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    lo = p.nchunks * t / nt;
    hi = p.nchunks * (t + 1) / nt;
  }
};

// Per-thread scratch: kScratchBuffers buffers of p.scratch values, as the array the loop bodies take.
template <class S>
struct Scratch {
  std::vector<S> buf;
  S* ptrs[kScratchBuffers];
  explicit Scratch(const RowsPlan& p) : buf(static_cast<size_t>(kScratchBuffers * p.scratch)) {
    for (int k = 0; k < kScratchBuffers; ++k) ptrs[k] = buf.data() + k * p.scratch;
  }
  S* const* b() const { return ptrs; }
};

// Per-channel values repeated over the U rows of a step, as a new vector of W values.
template <class S>
std::vector<S> per_step(const RowsPlan& p, const S* v) {
  std::vector<S> out(static_cast<size_t>(p.W));
  repeat_per_step(p, v, out.data());
  return out;
}

// Batch statistics from the chunk sums about the pivots k: mean and biased variance per channel, rounded to S.
// Unless `last`, moves the pivot of each channel whose mean lies more than 4 std from it to the mean and
// returns whether any moved (Note [normalisation statistics on the CPU]).
template <class S>
bool stats_from_sums(const RowsPlan& p, const double* part, std::vector<S>& k, S* mean, S* var, bool last) {
  std::vector<double> t1(static_cast<size_t>(p.C)), t2(static_cast<size_t>(p.C));
  combine_chunks(p, part, t1.data(), t2.data());
  const double M = static_cast<double>(p.R);
  bool redo = false;
  for (int64_t c = 0; c < p.C; ++c) {
    const double d = t1[c] / M;  // mean - pivot
    const double m = static_cast<double>(k[c]) + d;
    const double v = std::max(t2[c] / M - d * d, 0.0);
    mean[c] = static_cast<S>(m);
    var[c] = static_cast<S>(v);
    // Pivot within 4 std: accurate. Else (rare) redo this channel once about its mean.
    if (!(d * d <= 16.0 * v) && !last) {
      k[c] = static_cast<S>(m);
      redo = true;
    }
  }
  return redo;
}

}  // namespace

// Both kernels: one parallel region; the threads meet once between the two passes (and twice more in the rare
// pivot redo). After it each thread combines the chunk sums itself into its own copies of the per-position
// constants (the same values on every thread: the same operations on the same sums), and thread 0 writes the
// [C] outputs, so there is no second meeting before the element-wise pass.
template <class S>
void bn_forward_rows(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd, const Tensor& x,
                     const std::vector<S>& w, const std::vector<S>& b, bool training, double eps,
                     const Tensor& residual, bool relu) {
  const int64_t C = x.size(1), R = x.size(0) * x.size(2);
  const RowsPlan p(R, C);
  S* mean_p = mean.data_ptr<S>();
  S* var_p = var.data_ptr<S>();
  S* inv_p = invstd.data_ptr<S>();
  const Operand xo(x), yo(y);
  // Chunk sums (each chunk function clears its own).
  const std::unique_ptr<double[]> part(new double[training ? static_cast<size_t>(2 * p.W * p.nchunks) : 0]);
  std::vector<S> k(static_cast<size_t>(C), S(0));
  if (training && R > 0) {
    // Pivots: the mean of kPivotRows rows spread over the batch (Note [batch norm over rows of channels]).
    const int64_t P = std::min(R, kPivotRows);
    std::vector<S> row(static_cast<size_t>(C));
    std::vector<double> acc(static_cast<size_t>(C), 0.0);
    for (int64_t q = 0; q < P; ++q) {
      const S* v = xo.load<S>(q * R / P * C, C, row.data());
      for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<double>(v[c]);
    }
    for (int64_t c = 0; c < C; ++c) k[c] = static_cast<S>(acc[c] / static_cast<double>(P));
  }
  const bool same = y.dtype() == x.dtype() && (!residual.defined() || residual.dtype() == x.dtype());
  visit_storage<S>(x.dtype(), same, [&]<class T>() {
    const auto stats = rows_stats_chunk_fn<S, T>();
    const auto output = rows_affine_chunk_fn<S, T>();
#pragma omp parallel if (go_parallel(p.L))
    {
      Scratch<S> scratch(p);
      const ThreadChunks mine(p);
      const bool writer = omp_get_thread_num() == 0;
      std::vector<S> kt = k, m(static_cast<size_t>(C)), v(static_cast<size_t>(C));  // this thread's pivots, stats
      if (!training) {
        std::copy(mean_p, mean_p + C, m.begin());
        std::copy(var_p, var_p + C, v.begin());
      }
      std::vector<S> kw = per_step(p, kt.data());
      RowsForward<S> a{xo, yo, p, kw.data(), nullptr, nullptr, nullptr, part.get(), Operand(residual), relu};
      for (int attempt = 0; training; ++attempt) {
        for (int64_t ch = mine.lo; ch < mine.hi; ++ch) stats(a, ch, scratch.b());
#pragma omp barrier
        if (!stats_from_sums(p, part.get(), kt, m.data(), v.data(), attempt == 1)) break;
        repeat_per_step(p, kt.data(), kw.data());
        // Every thread has read the chunk sums before the pass overwrites them.
#pragma omp barrier
      }
      std::vector<S> scale(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) {
        const S r = static_cast<S>(1.0 / std::sqrt(static_cast<double>(v[c]) + eps));
        scale[c] = r * w[c];
        if (writer) inv_p[c] = r;
      }
      if (writer && training) {
        std::copy(m.begin(), m.end(), mean_p);
        std::copy(v.begin(), v.end(), var_p);
      }
      const std::vector<S> mu = per_step(p, m.data()), sc = per_step(p, scale.data()), sh = per_step(p, b.data());
      a.mu = mu.data();
      a.scale = sc.data();
      a.shift = sh.data();
      for (int64_t ch = mine.hi - 1; ch >= mine.lo; --ch) output(a, ch, scratch.b());
    }
  });
}

template <class S>
void bn_backward_rows(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                      const std::vector<S>& mean, const std::vector<S>& invstd, const std::vector<S>& w, bool training,
                      const Tensor& y, const Tensor& dz) {
  const int64_t C = x.size(1), R = x.size(0) * x.size(2);
  const RowsPlan p(R, C);
  S* dwp = dweight.defined() ? dweight.data_ptr<S>() : nullptr;
  S* dbp = dbias.defined() ? dbias.data_ptr<S>() : nullptr;
  // The fused ReLU's mask runs in the sums pass, which then also writes the masked gradient where the dx pass
  // reads it (dz, or dx itself).
  const bool fused = y.defined();
  const Tensor& zt = dz.defined() ? dz : dx;
  const bool need_sums = dwp != nullptr || dbp != nullptr || (training && dx.defined()) || (fused && zt.defined());
  const std::vector<S> mu = per_step(p, mean.data());
  const std::unique_ptr<double[]> part(new double[need_sums ? static_cast<size_t>(2 * p.W * p.nchunks) : 0]);
  auto same_dtype = [&](const Tensor& t) { return !t.defined() || t.dtype() == x.dtype(); };
  const bool same = dy.dtype() == x.dtype() && same_dtype(dx) && same_dtype(y) && same_dtype(dz);
  visit_storage<S>(x.dtype(), same, [&]<class T>() {
    const auto sums = rows_grad_sums_chunk_fn<S, T>();
    const auto dxf = rows_dx_chunk_fn<S, T>();
#pragma omp parallel if (go_parallel(p.L))
    {
      Scratch<S> scratch(p);
      const ThreadChunks mine(p);
      const bool writer = omp_get_thread_num() == 0;
      RowsBackward<S> a{Operand(x),
                        Operand(dy),
                        Operand(dx),
                        p,
                        mu.data(),
                        nullptr,
                        nullptr,
                        nullptr,
                        part.get(),
                        Operand(y),
                        fused ? Operand(zt) : Operand()};
      std::vector<double> sdy(static_cast<size_t>(C), 0.0), sdyx(static_cast<size_t>(C), 0.0);
      if (need_sums) {
        for (int64_t ch = mine.lo; ch < mine.hi; ++ch) sums(a, ch, scratch.b());
#pragma omp barrier
        combine_chunks(p, part.get(), sdy.data(), sdyx.data());
      }
      // dweight, dbias and the dx constants (NormBackwardFn).
      const double M = static_cast<double>(R);
      std::vector<S> a1(static_cast<size_t>(C)), b1(static_cast<size_t>(C)), c1(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) {
        const S r = invstd[c];
        if (writer && dbp) dbp[c] = static_cast<S>(sdy[c]);
        if (writer && dwp) dwp[c] = static_cast<S>(sdyx[c] * r);
        const double wr = static_cast<double>(w[c]) * r;
        a1[c] = static_cast<S>(wr);
        b1[c] = training ? static_cast<S>(-wr * r * r * sdyx[c] / M) : S(0);
        c1[c] = training ? static_cast<S>(-wr * sdy[c] / M) : S(0);
      }
      if (dx.defined()) {
        if (fused) a.dyo = a.zo;  // the masked gradient (the sums pass ran: need_sums)
        const std::vector<S> ca = per_step(p, a1.data()), cb = per_step(p, b1.data()), cc = per_step(p, c1.data());
        a.ca = ca.data();
        a.cb = cb.data();
        a.cc = cc.data();
        for (int64_t ch = mine.hi - 1; ch >= mine.lo; --ch) dxf(a, ch, scratch.b());
      }
    }
  });
}

template void bn_forward_rows<float>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const std::vector<float>&, const std::vector<float>&, bool, double, const Tensor&,
                                     bool);
template void bn_forward_rows<double>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      const std::vector<double>&, const std::vector<double>&, bool, double,
                                      const Tensor&, bool);
template void bn_backward_rows<float>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      const std::vector<float>&, const std::vector<float>&, const std::vector<float>&,
                                      bool, const Tensor&, const Tensor&);
template void bn_backward_rows<double>(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const std::vector<double>&, const std::vector<double>&,
                                       const std::vector<double>&, bool, const Tensor&, const Tensor&);

}  // namespace mp::backend::cpu::norm_detail

// CPU kernels of batch norm, forward and backward, each one fused pass per phase (layer norm: layer_norm.cpp).
//
// Note [normalisation statistics on the CPU]
// The one-pass E[x^2] - E[x]^2 formula cancels catastrophically when |mean| >> std, and an f32 running
// sum of n values of size |mean| errs by ~sqrt(n) ulp(n |mean|), i.e. ~1e-3 std for mean/std = 1e4 and
// n = 512 (a row of a layer norm) -- measured. Two ways around it are used:
// - Layer norm (layer_norm.cpp): two-pass statistics (mean, then the mean of squared deviations) with double sums, even
//   for f32 data; double sums leave only the final rounding of the mean to f32.
// - Batch norm (the CNN case, where these loops dominate): one pass of shifted sums s1 = sum(x - k),
//   s2 = sum((x - k)^2) about a pivot k near the mean, mean = k + s1 / M, var = s2 / M - (s1 / M)^2. The sums
//   accumulate in the statistics type (f32 for f32/f16/bf16 data) in partial sums of ~32 values each that are
//   added into double. With d = mean - k, the f32 partial sums err by ~sqrt(32) 2^-24 (var + d^2), so the
//   variance keeps ~1e-5 relative accuracy while d^2 <= 16 var; a worse pivot (data whose first values sit far
//   out in the tails) is detected and that channel's pass is redone once about its mean. x - k is exact in f32
//   for x within a factor 2 of k (Sterbenz), so a large common offset costs nothing: with mean 1e4 and std 1
//   what remains is the rounding of the mean to f32, as with double sums. (Farther from k, x - k rounds; for
//   16-bit x it rounds the same way across a binade, so those errors need not average out: ~2^-24 |x - k| on
//   the mean, i.e. a few 2^-24 std while d^2 <= 16 var.)
//   NCHW [N, C, S > 1] (here): the pivot is the mean of the channel's first kBlock values; each channel has
//   kLanes partial sums, added into double every >= kBlock values (LaneSums).
//   Rows of contiguous channels, [N, C] and channels-last [N, C, S] (batch_norm_rows.cpp, Note [batch norm over
//   rows of channels]): the pivot is the mean of rows spread over the batch; each channel has one partial sum
//   per run of 32 rows, added into per-chunk double sums.
//   The backward sums sum(dy) and sum(dy (x - mean)) accumulate the same way: dy (x - mean) has no offset
//   to cancel.
// bf16 operands of one dtype are converted inside the loops (a shift in, round to nearest even out); other
// 16-bit or mixed-dtype operands go through blocks converted with the bulk converters. Outputs are rounded
// once when stored.
//
// Batch norm on x [N, C, S]: with S > 1 in NCHW, groups of channels are processed in parallel, streaming each
// group's contiguous run x[n, c0:c0+G, :] n by n (see channel_group); a group is read twice per kernel (the
// statistics or gradient sums, then the element-wise pass), the second time from cache. With S == 1 ([N, C])
// or channels-last x, chunks of rows are processed in parallel, vectorised across channels (batch_norm_rows.cpp).
// The hot loops of both are compiled per ISA (Note [ISA variants of the batch-norm loops], norm_common.hpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/cpu/norm_common.hpp"
#include "backend/norm_kernels.hpp"

namespace mp::backend::cpu {
namespace {

using namespace norm_detail;

// ------------------------------------------------------------------------------ batch norm, [N, C, S > 1]

// Independent partial sums per reduction in the block sums: 64 bytes of S (4 SSE / 2 AVX / 1 AVX-512 register),
// so consecutive adds do not wait on each other. Which value goes to which partial sum is fixed by the source,
// so the results do not depend on the vector width.
template <class S>
inline constexpr int64_t kLanes = 64 / static_cast<int64_t>(sizeof(S));

// Two running sums of one channel: kLanes<S> partial sums each in S, added into double (and reset) whenever
// they hold >= kBlock values (Note [normalisation statistics on the CPU]). Short segments (a 7x7 plane) add
// into the same partial sums until then, so the lanes are reduced once per ~kBlock values, not per segment.
template <class S>
struct LaneSums {
  S a[kLanes<S>], b[kLanes<S>];
  int64_t count;
  double s1, s2;
  void clear() {
    for (int64_t l = 0; l < kLanes<S>; ++l) a[l] = b[l] = S(0);
    count = 0;
    s1 = s2 = 0;
  }
  MP_LOOP_INLINE void flush() {
    for (int64_t w = kLanes<S> / 2; w > 0; w /= 2)  // pairwise: log2(lanes) dependent steps
      for (int64_t l = 0; l < w; ++l) {
        a[l] += a[l + w];
        b[l] += b[l + w];
      }
    s1 += static_cast<double>(a[0]);
    s2 += static_cast<double>(b[0]);
    for (int64_t l = 0; l < kLanes<S>; ++l) a[l] = b[l] = S(0);
    count = 0;
  }
  // Adds fn(j, a_lane, b_lane) for j < n: value j goes to lane j % kLanes.
  template <class F>
  MP_LOOP_INLINE void add(int64_t n, F&& fn) {
    constexpr int64_t L = kLanes<S>;
    int64_t j = 0;
    for (; j + L <= n; j += L)
#pragma omp simd
      for (int64_t l = 0; l < L; ++l) fn(j + l, a[l], b[l]);
    for (int64_t l = 0; j < n; ++j, ++l) fn(j, a[l], b[l]);
    count += n;
    if (count >= kBlock) flush();
  }
};

// Adds sum(v - k) and sum((v - k)^2) of one block to ls.
template <class S, class T>
MP_LOOP_INLINE void block_shifted_sums(const typename Access<S, T>::E* v, int64_t n, S k, LaneSums<S>& ls) {
  ls.add(n, [&](int64_t j, S& a, S& b) MP_LAMBDA_INLINE {
    const S d = Access<S, T>::in(v[j]) - k;
    a += d;
    b += d * d;
  });
}

// Adds sum(dy) and sum(dy (x - mean)) of one block to ls.
template <class S, class T>
MP_LOOP_INLINE void block_grad_sums(const typename Access<S, T>::E* dy, const typename Access<S, T>::E* x, int64_t n,
                                    S mean, LaneSums<S>& ls) {
  ls.add(n, [&](int64_t j, S& a, S& b) MP_LAMBDA_INLINE {
    const S g = Access<S, T>::in(dy[j]);
    a += g;
    b += g * (Access<S, T>::in(x[j]) - mean);
  });
}

// Calls f(i, n) for the segments of channel c of x [N, C, S]: element offset i, length n <= kBlock.
template <class F>
void for_channel_segments(int64_t N, int64_t C, int64_t S, int64_t c, F&& f) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j0 = 0; j0 < S; j0 += kBlock) f((n * C + c) * S + j0, std::min(kBlock, S - j0));
}

// Most channels in a group; most values per piece of a group (see for_group_pieces), a multiple of kBlock.
constexpr int64_t kMaxGroup = 64;
constexpr int64_t kPiece = 4 * kBlock;

// Channels per group, for kernels that read `operands` tensors twice. A group's values x[n, c0:c0+G, :] are
// one contiguous run per n, visited n by n: runs of >= ~1024 values keep the hardware prefetchers streaming
// (per-channel runs of a 7x7 plane, 196 bytes at a stride of C planes, are latency-bound), and a group of at
// most ~256K values in all stays in cache between the two passes of a kernel. At least one group per
// thread. The grouping changes no result: each channel's sums add the same blocks in the same order.
int64_t channel_group(int64_t N, int64_t C, int64_t SP, int64_t operands) {
  int64_t g = (1024 + SP - 1) / SP;
  g = std::min(g, std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(1, operands * N * SP)));
  g = std::min(g, std::max<int64_t>(1, C / omp_get_max_threads()));
  return std::clamp<int64_t>(g, 1, kMaxGroup);
}

// One contiguous piece of a channel group: elements [i, i + nch * len) of x [N, C, SP] hold positions
// [s0, s0 + len) of channels j0 .. j0 + nch - 1 of the group (place in the group), channel j0 + t at t * len.
struct Piece {
  int64_t i, j0, nch, s0, len;
};

// Calls f(piece) for the pieces of channels c0 .. c0 + nc - 1 of x [N, C, SP], n by n: whole channels, as
// many as fit in kPiece values, or kPiece-value parts of one channel when SP > kPiece.
template <class F>
MP_LOOP_INLINE void for_group_pieces(int64_t N, int64_t C, int64_t SP, int64_t c0, int64_t nc, F&& f) {
  const int64_t per = SP <= kPiece ? std::max<int64_t>(1, kPiece / SP) : 1;
  const int64_t seg = std::min(SP, kPiece);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j0 = 0; j0 < nc; j0 += per)
      for (int64_t s0 = 0; s0 < SP; s0 += seg)
        f(Piece{(n * C + c0 + j0) * SP + s0, j0, std::min(per, nc - j0), s0, std::min(seg, SP - s0)});
}

// Calls f(j, offset, n) for the kBlock-value blocks of every channel of a piece: j the channel's place in the
// group, offset the block's start in the piece.
template <class F>
MP_LOOP_INLINE void for_piece_blocks(const Piece& pc, F&& f) {
  for (int64_t t = 0; t < pc.nch; ++t)
    for (int64_t b0 = 0; b0 < pc.len; b0 += kBlock) f(pc.j0 + t, t * pc.len + b0, std::min(kBlock, pc.len - b0));
}

// Batch means and biased variances of channels c0 .. c0 + nc - 1 of x [N, C, SP] from shifted sums about
// a pivot per channel (Note [normalisation statistics on the CPU]). buf: kPiece values of scratch.
template <class S, class T>
MP_LOOP_INLINE void group_stats(const Operand& xo, int64_t N, int64_t C, int64_t SP, int64_t c0, int64_t nc, S* buf,
                                double* mean, double* var) {
  using A = Access<S, T>;
  const double M = static_cast<double>(N * SP);
  S k[kMaxGroup];  // pivots: the mean of the first block of each channel (n = 0)
  for (int64_t j = 0; j < nc; ++j) {
    const int64_t n = std::min(kBlock, SP);
    const typename A::E* v = A::src(xo, (c0 + j) * SP, n, buf);
    double s = 0;
    for (int64_t t = 0; t < n; ++t) s += static_cast<double>(A::in(v[t]));
    k[j] = static_cast<S>(s / static_cast<double>(n));
  }
  LaneSums<S> ls[kMaxGroup];
  for (int64_t j = 0; j < nc; ++j) ls[j].clear();
  for_group_pieces(N, C, SP, c0, nc, [&](const Piece& pc) MP_LAMBDA_INLINE {
    const typename A::E* v = A::src(xo, pc.i, pc.nch * pc.len, buf);
    for_piece_blocks(pc, [&](int64_t j, int64_t off, int64_t n)
                             MP_LAMBDA_INLINE { block_shifted_sums<S, T>(v + off, n, k[j], ls[j]); });
  });
  for (int64_t j = 0; j < nc; ++j) {
    S kj = k[j];
    for (int attempt = 0;; ++attempt) {
      ls[j].flush();
      const double d = ls[j].s1 / M;  // mean - pivot
      mean[j] = static_cast<double>(kj) + d;
      var[j] = std::max(ls[j].s2 / M - d * d, 0.0);
      // Pivot within 4 std: accurate. Else (rare) redo this channel once about its mean.
      if (d * d <= 16.0 * var[j] || attempt == 1) break;
      kj = static_cast<S>(mean[j]);
      ls[j].clear();
      for_channel_segments(N, C, SP, c0 + j, [&](int64_t i, int64_t n) {
        block_shifted_sums<S, T>(A::src(xo, i, n, buf), n, kj, ls[j]);
      });
    }
  }
}

// Operands of the batch-norm forward.
template <class S>
struct BnForward {
  Operand xo, yo;
  int64_t N, C, SP, G;
  S *mean, *var, *invstd;
  const S *w, *b;
  bool training;
  double eps;
  Operand ro;         // the fused residual (or undefined)
  bool relu = false;  // the fused ReLU
};

// Batch-norm forward of channel group grp (channels grp * G ...): statistics when training, then
// y = (x - mean) * scale + shift, then the fused epilogue. b[0], b[1]: for x and y; b[2], b[3]: for the
// epilogue (kPiece values of scratch each).
template <class S, class T>
MP_LOOP_INLINE void bn_forward_group(const BnForward<S>& a, int64_t grp, S* const* b) {
  using A = Access<S, T>;
  S* b0 = b[0];
  S* b1 = b[1];
  const bool fused = a.ro.defined() || a.relu;
  const int64_t c0 = grp * a.G, nc = std::min(a.G, a.C - c0);
  if (a.training) {
    double mu[kMaxGroup], sigma2[kMaxGroup];
    group_stats<S, T>(a.xo, a.N, a.C, a.SP, c0, nc, b0, mu, sigma2);
    for (int64_t j = 0; j < nc; ++j) {
      a.mean[c0 + j] = static_cast<S>(mu[j]);
      a.var[c0 + j] = static_cast<S>(sigma2[j]);
    }
  }
  NormAffineFn<S> fn[kMaxGroup];
  for (int64_t j = 0; j < nc; ++j) {
    const int64_t c = c0 + j;
    const S r = static_cast<S>(1.0 / std::sqrt(static_cast<double>(a.var[c]) + a.eps));
    a.invstd[c] = r;
    fn[j] = NormAffineFn<S>{a.mean[c], r * a.w[c], a.b[c]};
  }
  for_group_pieces(a.N, a.C, a.SP, c0, nc, [&](const Piece& pc) MP_LAMBDA_INLINE {
    const typename A::E* v = A::src(a.xo, pc.i, pc.nch * pc.len, b0);
    typename A::E* o = A::dst(a.yo, pc.i, b1);
    for (int64_t t = 0; t < pc.nch; ++t) {
      const NormAffineFn<S> f = fn[pc.j0 + t];
      const typename A::E* vt = v + t * pc.len;
      typename A::E* ot = o + t * pc.len;
#pragma omp simd
      for (int64_t e = 0; e < pc.len; ++e) ot[e] = A::out(f(A::in(vt[e])));
    }
    A::commit(a.yo, pc.i, pc.nch * pc.len, o);
    if (fused) bn_epilogue_block<S, T>(a.yo, a.ro, a.relu, pc.i, pc.nch * pc.len, o, b[2], b[3]);
  });
}
MP_NORM_VARIANTS(bn_forward_group, BnForward)

// Operands of the batch-norm backward; dw, db may be null.
template <class S>
struct BnBackward {
  Operand xo, dyo, dxo;
  int64_t N, C, SP, G;
  const S *mean, *invstd, *w;
  S *dw, *db;
  bool training, need_sums;
  Operand yo;  // the fused forward's output: the sums pass masks dy with y > 0 (or undefined)
  Operand zo;  // where the masked gradient goes (dz, or dx to be overwritten in place; or undefined)
};

// Batch-norm backward of channel group grp: sum(dy) and sum(dy (x - mean)) per channel, dweight, dbias, then
// dx. b[0], b[1], b[2]: for dy, x and dx; b[3], b[4]: for the mask (kPiece values of scratch each).
template <class S, class T>
MP_LOOP_INLINE void bn_backward_group(const BnBackward<S>& a, int64_t grp, S* const* b) {
  using A = Access<S, T>;
  S* b0 = b[0];
  S* b1 = b[1];
  S* b2 = b[2];
  const int64_t c0 = grp * a.G, nc = std::min(a.G, a.C - c0);
  const double M = static_cast<double>(a.N * a.SP);
  LaneSums<S> ls[kMaxGroup];
  for (int64_t j = 0; j < nc; ++j) ls[j].clear();
  if (a.need_sums)
    for_group_pieces(a.N, a.C, a.SP, c0, nc, [&](const Piece& pc) MP_LAMBDA_INLINE {
      const int64_t n = pc.nch * pc.len;
      const typename A::E* g = a.yo.defined() ? bn_relu_mask_block<S, T>(a.dyo, a.yo, a.zo, pc.i, n, b0, b[3], b[4])
                                              : A::src(a.dyo, pc.i, n, b0);
      const typename A::E* v = A::src(a.xo, pc.i, n, b1);
      for_piece_blocks(pc, [&](int64_t j, int64_t off, int64_t n)
                               MP_LAMBDA_INLINE { block_grad_sums<S, T>(g + off, v + off, n, a.mean[c0 + j], ls[j]); });
    });
  NormBackwardFn<S> fn[kMaxGroup];
  for (int64_t j = 0; j < nc; ++j) {
    const int64_t c = c0 + j;
    const S r = a.invstd[c];
    ls[j].flush();
    const double sdy = ls[j].s1, sdyx = ls[j].s2;
    if (a.db) a.db[c] = static_cast<S>(sdy);
    if (a.dw) a.dw[c] = static_cast<S>(sdyx * r);
    const double wr = static_cast<double>(a.w[c]) * r;
    fn[j] = NormBackwardFn<S>{static_cast<S>(wr), a.training ? static_cast<S>(-wr * r * r * sdyx / M) : S(0),
                              a.training ? static_cast<S>(-wr * sdy / M) : S(0), a.mean[c]};
  }
  if (!a.dxo.defined()) return;
  const Operand& go = a.yo.defined() ? a.zo : a.dyo;  // the masked gradient (the sums pass ran: need_sums)
  for_group_pieces(a.N, a.C, a.SP, c0, nc, [&](const Piece& pc) MP_LAMBDA_INLINE {
    const typename A::E* g = A::src(go, pc.i, pc.nch * pc.len, b0);
    const typename A::E* v = A::src(a.xo, pc.i, pc.nch * pc.len, b1);
    typename A::E* o = A::dst(a.dxo, pc.i, b2);
    for (int64_t t = 0; t < pc.nch; ++t) {
      const NormBackwardFn<S> f = fn[pc.j0 + t];
      const typename A::E* gt = g + t * pc.len;
      const typename A::E* vt = v + t * pc.len;
      typename A::E* ot = o + t * pc.len;
#pragma omp simd
      for (int64_t e = 0; e < pc.len; ++e) ot[e] = A::out(f(A::in(gt[e]), A::in(vt[e])));
    }
    A::commit(a.dxo, pc.i, pc.nch * pc.len, o);
  });
}
MP_NORM_VARIANTS(bn_backward_group, BnBackward)

// Runs the group function `run` (from bn_forward_group_fn etc.) over the channel groups in parallel, with
// per-thread scratch.
template <class S, class Args, class Fn>
void run_groups(const Args& args, int64_t numel, Fn run) {
  const int64_t groups = (args.C + args.G - 1) / args.G;
#pragma omp parallel if (go_parallel(numel))
  {
    std::vector<S> buf(static_cast<size_t>(kScratchBuffers * kPiece));
    S* b[kScratchBuffers];
    for (int k = 0; k < kScratchBuffers; ++k) b[k] = buf.data() + k * kPiece;
#pragma omp for schedule(static)
    for (int64_t grp = 0; grp < groups; ++grp) run(args, grp, b);
  }
}

template <class S>
void bn_forward_spatial(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd, const Tensor& x,
                        const std::vector<S>& w, const std::vector<S>& b, bool training, double eps,
                        const Tensor& residual, bool relu) {
  const int64_t N = x.size(0), C = x.size(1), SP = x.size(2);
  const int64_t G = channel_group(N, C, SP, residual.defined() ? 2 : 1);
  const BnForward<S> args{Operand(x),
                          Operand(y),
                          N,
                          C,
                          SP,
                          G,
                          mean.data_ptr<S>(),
                          var.data_ptr<S>(),
                          invstd.data_ptr<S>(),
                          w.data(),
                          b.data(),
                          training,
                          eps,
                          Operand(residual),
                          relu};
  const bool same = y.dtype() == x.dtype() && (!residual.defined() || residual.dtype() == x.dtype());
  visit_storage<S>(x.dtype(), same, [&]<class T>() { run_groups<S>(args, x.numel(), bn_forward_group_fn<S, T>()); });
}

template <class S>
void bn_backward_spatial(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                         const Tensor& x, const std::vector<S>& mean, const std::vector<S>& invstd,
                         const std::vector<S>& w, bool training, const Tensor& y, const Tensor& dz) {
  const int64_t N = x.size(0), C = x.size(1), SP = x.size(2);
  S* dwp = dweight.defined() ? dweight.data_ptr<S>() : nullptr;
  S* dbp = dbias.defined() ? dbias.data_ptr<S>() : nullptr;
  // The fused ReLU's mask runs in the sums pass, which then also writes the masked gradient where the dx pass
  // reads it (dz, or dx itself).
  const bool fused = y.defined();
  const Tensor& zt = dz.defined() ? dz : dx;
  const bool need_sums = dwp != nullptr || dbp != nullptr || (training && dx.defined()) || (fused && zt.defined());
  const int64_t G = channel_group(N, C, SP, fused ? 3 : 2);
  const BnBackward<S> args{
      Operand(x),    Operand(dy), Operand(dx), N,   C,        SP,        G,          mean.data(),
      invstd.data(), w.data(),    dwp,         dbp, training, need_sums, Operand(y), fused ? Operand(zt) : Operand()};
  auto same_dtype = [&](const Tensor& t) { return !t.defined() || t.dtype() == x.dtype(); };
  const bool same = dy.dtype() == x.dtype() && same_dtype(dx) && same_dtype(y) && same_dtype(dz);
  visit_storage<S>(x.dtype(), same, [&]<class T>() { run_groups<S>(args, x.numel(), bn_backward_group_fn<S, T>()); });
}

// Whether batch norm on x [N, C, S] takes the rows path (batch_norm_rows.cpp): S == 1, or x channels-last (detected
// as x.stride(1) == 1 with S > 1 and C > 1; then x must be dense channels-last). Asserts that the `others`
// (y; dy and dx; each may be undefined) have x's shape and layout, as the kernel contract says.
bool bn_rows_layout(const Tensor& x, std::initializer_list<const Tensor*> others) {
  const int64_t C = x.size(1), S = x.size(2);
  const bool cl = x.stride(1) == 1 && S > 1 && C > 1;
  auto fits = [cl](const Tensor& t) { return cl ? bn_channels_last(t) : t.is_contiguous(); };
  MP_ASSERT(x.dim() == 3 && fits(x), "batch norm kernel: x ", x.describe(), " with strides ", shape_str(x.strides()),
            " is neither contiguous nor channels-last [N, C, S]");
  for (const Tensor* t : others)
    MP_ASSERT(!t->defined() || (t->sizes() == x.sizes() && fits(*t)), "batch norm kernel: ", t->describe(),
              " with strides ", shape_str(t->strides()), " does not have the layout of x ", x.describe(),
              " with strides ", shape_str(x.strides()));
  return cl || S == 1;
}

template <class S>
void bn_forward_typed(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd, const Tensor& x,
                      const Tensor& weight, const Tensor& bias, bool training, double eps, const Tensor& residual,
                      bool relu) {
  const int64_t C = x.size(1);
  const std::vector<S> w = load_vector<S>(weight, C, S(1)), b = load_vector<S>(bias, C, S(0));
  if (bn_rows_layout(x, {&y, &residual}))
    return bn_forward_rows<S>(y, mean, var, invstd, x, w, b, training, eps, residual, relu);
  bn_forward_spatial<S>(y, mean, var, invstd, x, w, b, training, eps, residual, relu);
}

template <class S>
void bn_backward_typed(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                       const Tensor& mean, const Tensor& invstd, const Tensor& weight, bool training, const Tensor& y,
                       const Tensor& dz) {
  const int64_t C = x.size(1);
  const std::vector<S> w = load_vector<S>(weight, C, S(1));
  const std::vector<S> m = load_vector<S>(mean, C, S(0)), r = load_vector<S>(invstd, C, S(1));
  if (y.defined())
    MP_ASSERT(dy.dtype() == x.dtype() && y.dtype() == x.dtype() && (!dx.defined() || dx.dtype() == x.dtype()) &&
                  (!dz.defined() || dz.dtype() == x.dtype()),
              "batch norm backward kernel: with the ReLU fused, dy, y, dx and dz must have x's dtype ",
              dtype_name(x.dtype()), ", got dy ", dy.describe(), " y ", y.describe());
  if (bn_rows_layout(x, {&dy, &dx, &y, &dz}))
    return bn_backward_rows<S>(dx, dweight, dbias, dy, x, m, r, w, training, y, dz);
  bn_backward_spatial<S>(dx, dweight, dbias, dy, x, m, r, w, training, y, dz);
}

void batch_norm_forward_cpu(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd,
                            const Tensor& x, const Tensor& weight, const Tensor& bias, bool training, double eps,
                            const Tensor& residual, bool relu) {
  if (mean.dtype() == DType::f64)
    return bn_forward_typed<double>(y, mean, var, invstd, x, weight, bias, training, eps, residual, relu);
  bn_forward_typed<float>(y, mean, var, invstd, x, weight, bias, training, eps, residual, relu);
}

void batch_norm_backward_cpu(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                             const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                             bool training, const Tensor& y, const Tensor& dz) {
  if (mean.dtype() == DType::f64)
    return bn_backward_typed<double>(dx, dweight, dbias, dy, x, mean, invstd, weight, training, y, dz);
  bn_backward_typed<float>(dx, dweight, dbias, dy, x, mean, invstd, weight, training, y, dz);
}

}  // namespace

MP_REGISTER_KERNEL(batch_norm_forward_kernel, DeviceType::cpu, &batch_norm_forward_cpu);
MP_REGISTER_KERNEL(batch_norm_backward_kernel, DeviceType::cpu, &batch_norm_backward_cpu);

}  // namespace mp::backend::cpu

// CPU fused scaled-dot-product attention: the FlashAttention-2 algorithm on tiles of kBr query rows and kBc
// keys, forward and backward, for f32, f64, bf16 and f16 (16-bit operands widened per tile, f32 compute;
// bf16 scores by VDPBF16PS where the CPU has it).
//
// Note [fused attention]
// Rule: the forward walks, for each (batch, head, query tile), the key tiles in order, keeping for each row
// the running max m and sum l of exp(s - m) in the compute type (f32; f64 for f64) and an output
// accumulator rescaled by exp(m_old - m_new) whenever the max grows; the output is divided by l and
// rounded once at the end. It saves only the output and each row's logsumexp lse = m + log l, so memory is
// O(B H T) instead of the T x T weights. The backward recomputes the weights tile by tile as
// P = exp(s - lse) and forms dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO o O)), dQ += dS K scale,
// dK += dS^T Q scale; it runs per (batch, head), each thread owning its head's dK, dV tile and dQ rows,
// so no atomics. The scale is folded into the widened query tile (both passes form the same scores).
// Causal masks are top-left aligned (key j > query i is masked), and tiles wholly above the diagonal
// are skipped. A row whose keys are all masked has l = 0: its output is 0 and its lse is stored as +inf,
// so the backward's exp(s - lse) gives it zero weights (PyTorch >= 2.5 returns 0 there as well).
// Dropout keeps weight (b, h, i, j) by the rule of Note [dropout mask] at element ((b H + h) Tq + i) Tk + j
// of the call's reserved Philox draws, so the backward regenerates the mask without storing it and the
// composite path (dropout of the [B, H, Tq, Tk] weights) draws the same mask; l sums the weights before
// dropout, as the composite's softmax does.
// Tile products are register-blocked loops on GCC vector types (4 rows x 64 keys, or 4 rows x 64
// columns of D), compiled for AVX-512 and AVX2 + FMA and picked at run time (call_isa). With bf16 inputs on a CPU with
// AVX512-BF16 every tile product runs on VDPBF16PS (attention_bf16.hpp: exact products of bf16 pairs, f32
// sums): q k^T and dO v^T on the inputs' bf16 as they are, and P v, P^T dO, dS k and dS^T q on the weights
// P and dS rounded to bf16 (to nearest even), as FlashAttention-2 and PyTorch's CPU flash attention do:
// one more relative rounding of at most 2^-8 per weight, whose bound the tests check; the running max, the
// sums l, the logsumexp and D_i stay f32, from the unrounded weights. The forward then packs a head's key and
// value tiles once for all its query tiles. Measured in bench/RESULTS.md ("Fused attention").
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/attention_kernels.hpp"
#include "backend/cpu/attention_bf16.hpp"
#include "backend/cpu/loops.hpp"
#include "backend/fast_math.hpp"
#include "backend/index_kernels.hpp"
#include "mp/core/cpu_features.hpp"

namespace mp::backend::cpu {
namespace {

constexpr int64_t kBr = 64;  // query rows per tile
constexpr int64_t kBc = 64;  // keys per tile

// Padded row lengths (Dp) are multiples of 64 bytes, whichever register blocking runs.
template <class A>
constexpr int64_t kLanes = static_cast<int64_t>(64 / sizeof(A));

// Register blocking of the tile products, per ISA: Bytes-wide vectors, NT vectors of key columns per block of
// q k^T-like products, NN vectors of D columns per block of p v-like ones, 4 rows each. AVX-512 (32 registers of
// 64 bytes): 4 x 4 accumulators. AVX2 and the baseline (16 registers of 32 or 16 bytes): 4 x 2 accumulators of
// 32 bytes; the AVX-512 blocking there spilled most accumulators to the stack (perf on AMD Zen 3: 30x slower).
typedef float VecF64 __attribute__((vector_size(64)));
typedef double VecD64 __attribute__((vector_size(64)));
typedef float VecF32 __attribute__((vector_size(32)));
typedef double VecD32 __attribute__((vector_size(32)));
template <int Bytes, int NT, int NN>
struct Blocking {
  static_assert(Bytes == 64 || Bytes == 32);
  template <class A>
  using Vec = std::conditional_t<std::is_same_v<A, float>, std::conditional_t<Bytes == 64, VecF64, VecF32>,
                                 std::conditional_t<Bytes == 64, VecD64, VecD32>>;
  template <class A>
  static constexpr int64_t lanes = Bytes / static_cast<int64_t>(sizeof(A));
  static constexpr int nt = NT, nn = NN;
};
using Wide = Blocking<64, 4, 4>;    // AVX-512
using Narrow = Blocking<32, 2, 2>;  // AVX2 + FMA, baseline

template <class A>
constexpr A kInf = std::numeric_limits<A>::infinity();

// ---------------------------------------------------------------- tile products

// c[r][0:NV W] = sum_d a[r * lda + d] * bt[d * kBc + 0:NV W] for R rows (bt: a key tile transposed, or columns of
// it).
template <class A, class G, int R, int NV>
MP_FORCE_INLINE void nt_block(const A* a, int64_t lda, const A* bt, A* c, int64_t D) {
  using V = typename G::template Vec<A>;
  constexpr int64_t W = G::template lanes<A>;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) acc[r][u] = V{};
  for (int64_t d = 0; d < D; ++d) {
    V b[NV];
    for (int u = 0; u < NV; ++u) std::memcpy(&b[u], bt + d * kBc + u * W, sizeof(V));
    for (int r = 0; r < R; ++r) {
      const A x = a[r * lda + d];
      for (int u = 0; u < NV; ++u) acc[r][u] += x * b[u];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) std::memcpy(c + r * kBc + u * W, &acc[r][u], sizeof(V));
}

// c[r][0:kBc] for R rows, a block of G::nt vectors of columns at a time.
template <class A, class G, int R>
MP_FORCE_INLINE void nt_rows(const A* a, int64_t lda, const A* bt, A* c, int64_t D) {
  constexpr int64_t cols = G::nt * G::template lanes<A>;
  static_assert(kBc % cols == 0);
  for (int64_t j0 = 0; j0 < kBc; j0 += cols) nt_block<A, G, R, G::nt>(a, lda, bt + j0, c + j0, D);
}

// c [rows, kBc] = a [rows, D] (row stride lda) times bt [D, kBc].
template <class A, class G>
MP_FORCE_INLINE void nt_tile(const A* a, int64_t lda, const A* bt, A* c, int64_t rows, int64_t D) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) nt_rows<A, G, 4>(a + r * lda, lda, bt, c + r * kBc, D);
  for (; r < rows; ++r) nt_rows<A, G, 1>(a + r * lda, lda, bt, c + r * kBc, D);
}

// c[r][cols] += sum_{j < inner} p[r * ldp + j] * v[j * ldv + cols] for R rows and NV vectors of columns.
template <class A, class G, int R, int NV>
MP_FORCE_INLINE void nn_block(const A* p, int64_t ldp, const A* v, int64_t ldv, A* c, int64_t ldc, int64_t inner) {
  using V = typename G::template Vec<A>;
  constexpr int64_t W = G::template lanes<A>;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) std::memcpy(&acc[r][u], c + r * ldc + u * W, sizeof(V));
  for (int64_t j = 0; j < inner; ++j) {
    V b[NV];
    for (int u = 0; u < NV; ++u) std::memcpy(&b[u], v + j * ldv + u * W, sizeof(V));
    for (int r = 0; r < R; ++r) {
      const A x = p[r * ldp + j];
      for (int u = 0; u < NV; ++u) acc[r][u] += x * b[u];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) std::memcpy(c + r * ldc + u * W, &acc[r][u], sizeof(V));
}

template <class A, class G, int R>
MP_FORCE_INLINE void nn_rows(const A* p, int64_t ldp, const A* v, int64_t ldv, A* c, int64_t ldc, int64_t inner,
                             int64_t Dp) {
  constexpr int64_t W = G::template lanes<A>;
  for (int64_t d0 = 0; d0 < Dp; d0 += G::nn * W) {
    const int64_t nv = std::min<int64_t>(G::nn, (Dp - d0) / W);
    if constexpr (G::nn >= 4) {
      if (nv == 4) {
        nn_block<A, G, R, 4>(p, ldp, v + d0, ldv, c + d0, ldc, inner);
        continue;
      }
      if (nv == 3) {
        nn_block<A, G, R, 3>(p, ldp, v + d0, ldv, c + d0, ldc, inner);
        continue;
      }
    }
    if (nv >= 2)
      nn_block<A, G, R, 2>(p, ldp, v + d0, ldv, c + d0, ldc, inner);
    else
      nn_block<A, G, R, 1>(p, ldp, v + d0, ldv, c + d0, ldc, inner);
  }
}

// c [rows, Dp] (row stride ldc) += p [rows, inner] (row stride ldp) times v [inner, Dp] (row stride ldv);
// Dp is a multiple of the vector width.
template <class A, class G>
MP_FORCE_INLINE void nn_acc(const A* p, int64_t ldp, const A* v, int64_t ldv, A* c, int64_t ldc, int64_t rows,
                            int64_t inner, int64_t Dp) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) nn_rows<A, G, 4>(p + r * ldp, ldp, v, ldv, c + r * ldc, ldc, inner, Dp);
  for (; r < rows; ++r) nn_rows<A, G, 1>(p + r * ldp, ldp, v, ldv, c + r * ldc, ldc, inner, Dp);
}

// FWide{}(args...) compiled for AVX-512 where this CPU has it, else FNarrow{}(args...) compiled for AVX2 + FMA
// (or the baseline where the CPU lacks them, or `vec` is false): call_isa with the blocking of each ISA.
template <class FWide, class FNarrow, class... Args>
MP_FORCE_INLINE void call_blocked(bool vec, Args... args) {
#if defined(MP_HAVE_AVX512_LOOPS)
  if (vec && avx512_loops_enabled()) return call_avx512(FWide{}, args...);
#endif
  call_isa(vec, FNarrow{}, args...);
}

// ---------------------------------------------------------------- bf16 operands

// Row r0 of a bf16 tensor ([*, D] contiguous) as raw bf16.
const uint16_t* raw_bf16(const Tensor& t, int64_t r0, int64_t D) {
  return static_cast<const uint16_t*>(t.raw_data()) + r0 * D;
}

constexpr int64_t round_even(int64_t n) { return (n + 1) / 2 * 2; }

// ---------------------------------------------------------------- shared pieces

// The operands of one call, typed.
template <class A>
struct Problem {
  const Tensor *q, *k, *v, *out, *dout;
  const A* mask = nullptr;  // additive, [B, H, Tq, Tk] with strides ms
  int64_t ms[4] = {0, 0, 0, 0};
  AttentionParams p;
  int64_t Dp = 0;  // D rounded up to the vector width
  int64_t D2 = 0;  // D rounded up to even (bf16 pairs)
  bool bf16dot = false;
};

template <class A>
Problem<A> make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                        const AttentionParams& p) {
  Problem<A> pr{&q, &k, &v, nullptr, nullptr};
  pr.p = p;
  pr.Dp = (p.D + kLanes<A> - 1) / kLanes<A> * kLanes<A>;
  pr.D2 = (p.D + 1) / 2 * 2;
  pr.bf16dot = std::is_same_v<A, float> && q.dtype() == DType::bf16 && attn_bf16::bf16_tiles_available();
  if (mask.defined()) {
    pr.mask = mask.data_ptr<A>();
    for (int d = 0; d < 4; ++d) pr.ms[d] = mask.stride(d);
  }
  return pr;
}

// dst[0:Dp] = row `row` of t ([*, D] contiguous) widened to A and times `mul`, zero-padded.
template <class A>
void widen_row(const Tensor& t, int64_t row, int64_t D, int64_t Dp, A mul, A* dst, A* tmp) {
  const A* src = load_at<A>(t, row * D, D, tmp);
  for (int64_t d = 0; d < D; ++d) dst[d] = src[d] * mul;
  for (int64_t d = D; d < Dp; ++d) dst[d] = A(0);
}

// Rows [r0, r0 + n) of t transposed into dst[d * kBc + j] (columns n..kBc zero).
template <class A>
void widen_transposed(const Tensor& t, int64_t r0, int64_t n, int64_t D, A* dst, A* tmp) {
  for (int64_t j = 0; j < n; ++j) {
    const A* src = load_at<A>(t, (r0 + j) * D, D, tmp);
    for (int64_t d = 0; d < D; ++d) dst[d * kBc + j] = src[d];
  }
  for (int64_t d = 0; d < D; ++d)
    for (int64_t j = n; j < kBc; ++j) dst[d * kBc + j] = A(0);
}

template <class A>
void store_row(const Tensor& t, int64_t row, int64_t D, const A* vals) {
  store_block<A>(static_cast<char*>(t.raw_data()) + row * D * static_cast<int64_t>(t.element_size()), 1, t.dtype(), D,
                 vals);
}

// Adds the mask and the causal rule to scores s[0:nc] of query i against keys k0.. (of head bh).
template <class A>
MP_FORCE_INLINE void mask_scores(const Problem<A>& pr, int64_t b, int64_t h, int64_t i, int64_t k0, int64_t nc, A* s) {
  if (pr.mask != nullptr) {
    const A* m = pr.mask + b * pr.ms[0] + h * pr.ms[1] + i * pr.ms[2] + k0 * pr.ms[3];
    const int64_t sj = pr.ms[3];
    if (sj == 1) {
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) s[j] += m[j];
    } else {
      for (int64_t j = 0; j < nc; ++j) s[j] += m[j * sj];
    }
  }
  if (pr.p.causal)
    for (int64_t j = std::max<int64_t>(i - k0 + 1, 0); j < nc; ++j) s[j] = -kInf<A>;
}

// z[0:nc] = dropout factor (0 or 1 / (1 - p)) of weights (bh, i, k0..k0 + nc) (Note [dropout mask]).
template <class A>
void dropout_factors(const AttentionParams& p, int64_t bh, int64_t i, int64_t k0, int64_t nc, A* z) {
  const float pf = static_cast<float>(p.dropout_p);
  const A keep = static_cast<A>(1.0 / (1.0 - p.dropout_p));
  const uint64_t e0 = p.dropout_rng.offset + static_cast<uint64_t>((bh * p.Tq + i) * p.Tk + k0);
  uint64_t cached = ~uint64_t{0};
  U32x4 blk{};
  for (int64_t j = 0; j < nc; ++j) {
    const uint64_t e = e0 + static_cast<uint64_t>(j);
    if ((e >> 2) != cached) {
      cached = e >> 2;
      blk = philox_block(p.dropout_rng.seed, cached);
    }
    z[j] = dropout_keeps(philox_to_uniform(blk.v[e & 3]), pf) ? keep : A(0);
  }
}

// ---------------------------------------------------------------- forward

// The online-softmax step of query row i against keys k0..k0 + nc: sr holds the row's scores (unmasked) and
// leaves with its weights exp(s - m) (times the dropout factors), m and l are the running max and sum, and
// the output row orow[0:Dp] is rescaled when the max grows.
template <class A>
MP_FORCE_INLINE void online_softmax_row(const Problem<A>& pr, int64_t bh, int64_t i, int64_t k0, int64_t nc, A* sr,
                                        A& m, A& l, A* orow, A* z) {
  const AttentionParams& p = pr.p;
  mask_scores(pr, bh / p.H, bh % p.H, i, k0, nc, sr);
  A mx = -kInf<A>;
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < nc; ++j) mx = sr[j] > mx ? sr[j] : mx;
  const A mnew = std::max(m, mx);
  if (mnew == -kInf<A>) {  // every key so far masked: nothing to add
    std::fill(sr, sr + nc, A(0));
    return;
  }
  const A alpha = math_exp(m - mnew);
  A sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < nc; ++j) {
    const A e = math_exp(sr[j] - mnew);
    sr[j] = e;
    sum += e;
  }
  l = l * alpha + sum;
  m = mnew;
  if (alpha != A(1)) {
#pragma omp simd
    for (int64_t d = 0; d < pr.Dp; ++d) orow[d] *= alpha;
  }
  if (p.dropout_p > 0) {
    dropout_factors<A>(p, bh, i, k0, nc, z);
#pragma omp simd
    for (int64_t j = 0; j < nc; ++j) sr[j] *= z[j];
  }
}

// Divides the query tile's output rows by l, stores them and their logsumexp.
template <class A>
MP_FORCE_INLINE void finish_rows(const Problem<A>& pr, const Tensor& lse, int64_t bh, int64_t q0, int64_t nr,
                                 const A* m, const A* l, A* o) {
  const AttentionParams& p = pr.p;
  A* lse_p = lse.data_ptr<A>() + bh * p.Tq + q0;
  for (int64_t r = 0; r < nr; ++r) {
    const bool empty = l[r] == A(0);
    const A inv = empty ? A(0) : A(1) / l[r];
    A* orow = o + r * pr.Dp;
#pragma omp simd
    for (int64_t d = 0; d < p.D; ++d) orow[d] *= inv;
    lse_p[r] = empty ? kInf<A> : m[r] + std::log(l[r]);
    store_row<A>(*pr.out, bh * p.Tq + q0 + r, p.D, orow);
  }
}

template <class A>
struct ForwardScratch {
  std::vector<A> qf, kt, vf, s, o, m, l, z, tmp;
  // bf16 operands (bf16dot): the query tile's pairs, its weights, and the head's packed key and value tiles,
  // packed once per head (packed_bh) as far as the items reached (packed_tiles).
  std::vector<uint16_t> qp, pb, kp, vp;
  int64_t packed_bh = -1, packed_tiles = 0;
  ForwardScratch(const Problem<A>& pr)
      : qf(pr.bf16dot ? 0 : kBr * pr.Dp),
        kt(pr.bf16dot ? 0 : pr.p.D * kBc),
        vf(pr.bf16dot ? 0 : kBc * pr.Dp),
        s(kBr * kBc),
        o(kBr * pr.Dp),
        m(kBr),
        l(kBr),
        z(kBc),
        tmp(std::max(pr.p.D, kBc)),
        qp(pr.bf16dot ? kBr * pr.D2 : 0),
        pb(pr.bf16dot ? kBr * kBc : 0),
        kp(pr.bf16dot ? (pr.p.Tk + kBc - 1) / kBc * kBc * pr.D2 : 0),
        vp(pr.bf16dot ? (pr.p.Tk + kBc - 1) / kBc * kBc * pr.Dp : 0) {}
};

// One (batch, head, query tile) of the forward, all in A, with blocking G.
template <class A, class G>
struct ForwardTile {
  MP_FORCE_INLINE void operator()(const Problem<A>* prp, const Tensor* lse, int64_t item, ForwardScratch<A>* w) const {
    const Problem<A>& pr = *prp;
    const AttentionParams& p = pr.p;
    const int64_t D = p.D, Dp = pr.Dp;
    const int64_t n_qt = (p.Tq + kBr - 1) / kBr;
    const int64_t bh = item / n_qt, q0 = (item % n_qt) * kBr;
    const int64_t nr = std::min(kBr, p.Tq - q0);
    A *qf = w->qf.data(), *kt = w->kt.data(), *vf = w->vf.data(), *s = w->s.data(), *o = w->o.data();
    A *m = w->m.data(), *l = w->l.data(), *z = w->z.data(), *tmp = w->tmp.data();
    for (int64_t r = 0; r < nr; ++r) {
      widen_row<A>(*pr.q, bh * p.Tq + q0 + r, D, Dp, static_cast<A>(p.scale), qf + r * Dp, tmp);
      m[r] = -kInf<A>;
      l[r] = A(0);
    }
    std::fill(o, o + nr * Dp, A(0));
    // Causal: keys past the tile's last row are masked for every row of it.
    const int64_t k_end = p.causal ? std::min(p.Tk, q0 + nr) : p.Tk;
    for (int64_t k0 = 0; k0 < k_end; k0 += kBc) {
      const int64_t nc = std::min(kBc, p.Tk - k0);
      for (int64_t j = 0; j < nc; ++j) widen_row<A>(*pr.v, bh * p.Tk + k0 + j, D, Dp, A(1), vf + j * Dp, tmp);
      widen_transposed<A>(*pr.k, bh * p.Tk + k0, nc, D, kt, tmp);
      nt_tile<A, G>(qf, Dp, kt, s, nr, D);
      for (int64_t r = 0; r < nr; ++r) online_softmax_row(pr, bh, q0 + r, k0, nc, s + r * kBc, m[r], l[r], o + r * Dp, z);
      nn_acc<A, G>(s, kBc, vf, Dp, o, Dp, nr, nc, Dp);
    }
    finish_rows(pr, *lse, bh, q0, nr, m, l, o);
  }
};

// The same with bf16 operands on VDPBF16PS (pr.bf16dot): scores from the bf16 pairs of q and k, and the
// weights rounded to bf16 for the product with v (Note [fused attention]).
struct ForwardTileBf16 {
  MP_FORCE_INLINE void operator()(const Problem<float>* prp, const Tensor* lse, int64_t item,
                                  ForwardScratch<float>* w) const {
    const Problem<float>& pr = *prp;
    const AttentionParams& p = pr.p;
    const int64_t D = p.D, Dp = pr.Dp, D2 = pr.D2;
    const int64_t n_qt = (p.Tq + kBr - 1) / kBr;
    const int64_t bh = item / n_qt, q0 = (item % n_qt) * kBr;
    const int64_t nr = std::min(kBr, p.Tq - q0);
    float *s = w->s.data(), *o = w->o.data(), *m = w->m.data(), *l = w->l.data(), *z = w->z.data();
    std::fill(m, m + nr, -kInf<float>);
    std::fill(l, l + nr, 0.0f);
    std::fill(o, o + nr * Dp, 0.0f);
    attn_bf16::pack_rows(raw_bf16(*pr.q, bh * p.Tq + q0, D), nr, D, D2, w->qp.data());
    if (w->packed_bh != bh) {
      w->packed_bh = bh;
      w->packed_tiles = 0;
    }
    const int64_t k_end = p.causal ? std::min(p.Tk, q0 + nr) : p.Tk;
    for (int64_t k0 = 0, kt = 0; k0 < k_end; k0 += kBc, ++kt) {
      const int64_t nc = std::min(kBc, p.Tk - k0), nc2 = round_even(nc);
      uint16_t* kp = w->kp.data() + kt * kBc * D2;
      uint16_t* vp = w->vp.data() + kt * kBc * Dp;
      if (kt >= w->packed_tiles) {
        attn_bf16::pack_transposed_vnni(raw_bf16(*pr.k, bh * p.Tk + k0, D), nc, D, D2, kBc, kp);
        attn_bf16::pack_vnni(raw_bf16(*pr.v, bh * p.Tk + k0, D), nc, nc2, D, Dp, vp);
        w->packed_tiles = kt + 1;
      }
      attn_bf16::gemm(w->qp.data(), D2, kp, kBc, s, kBc, nr, D2 / 2, false, static_cast<float>(p.scale));
      for (int64_t r = 0; r < nr; ++r) online_softmax_row(pr, bh, q0 + r, k0, nc, s + r * kBc, m[r], l[r], o + r * Dp, z);
      attn_bf16::f32_rows_to_bf16(s, kBc, nr, nc, nc2, w->pb.data(), kBc);
      attn_bf16::gemm(w->pb.data(), kBc, vp, Dp, o, Dp, nr, nc2 / 2, true, 1.0f);
    }
    finish_rows(pr, *lse, bh, q0, nr, m, l, o);
  }
};

template <class A>
void forward_typed(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& mask, const AttentionParams& p) {
  Problem<A> pr = make_problem<A>(q, k, v, mask, p);
  pr.out = &out;
  const int64_t n_qt = (p.Tq + kBr - 1) / kBr;
  const int64_t items = p.B * p.H * n_qt;
  const bool vec = vector_loops_enabled();
  // bf16: a thread takes a head's query tiles one after another, so it packs the head's keys and values once,
  // unless there are too few heads to keep the threads busy.
  const int64_t chunk = pr.bf16dot && p.B * p.H >= 2 * omp_get_max_threads() ? n_qt : 1;
#pragma omp parallel if (items > 1)
  {
    ForwardScratch<A> w(pr);
#pragma omp for schedule(dynamic, chunk)
    for (int64_t it = 0; it < items; ++it) {
      if constexpr (std::is_same_v<A, float>) {
        if (pr.bf16dot) {
          call_isa(vec, ForwardTileBf16{}, &pr, &lse, it, &w);
          continue;
        }
      }
      call_blocked<ForwardTile<A, Wide>, ForwardTile<A, Narrow>>(vec, &pr, &lse, it, &w);
    }
  }
}

// ---------------------------------------------------------------- backward

// rowsum(dO o O) of the head's query rows, in A (FlashAttention's D_i).
template <class A>
void dout_dot_out(const Problem<A>& pr, int64_t bh, A* dvec, A* tmp, A* tmp2) {
  const AttentionParams& p = pr.p;
  for (int64_t i = 0; i < p.Tq; ++i) {
    const A* orow = load_at<A>(*pr.out, (bh * p.Tq + i) * p.D, p.D, tmp);
    const A* dorow = load_at<A>(*pr.dout, (bh * p.Tq + i) * p.D, p.D, tmp2);
    A acc = 0;
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < p.D; ++d) acc += dorow[d] * orow[d];
    dvec[i] = acc;
  }
}

// Query row i against keys k0..k0 + nc: sr enters with the scores and leaves with the weights P (times the
// dropout factors), dpr enters with dO v^T and leaves with dS = P (dP - D_i).
template <class A>
MP_FORCE_INLINE void weights_and_dscores_row(const Problem<A>& pr, int64_t bh, int64_t i, int64_t k0, int64_t nc,
                                             A li, A di, A* sr, A* dpr, A* z) {
  const AttentionParams& p = pr.p;
  mask_scores(pr, bh / p.H, bh % p.H, i, k0, nc, sr);
#pragma omp simd
  for (int64_t j = 0; j < nc; ++j) sr[j] = math_exp(sr[j] - li);
  if (p.dropout_p > 0) {
    dropout_factors<A>(p, bh, i, k0, nc, z);
#pragma omp simd
    for (int64_t j = 0; j < nc; ++j) {
      dpr[j] = sr[j] * (dpr[j] * z[j] - di);
      sr[j] *= z[j];
    }
  } else {
#pragma omp simd
    for (int64_t j = 0; j < nc; ++j) dpr[j] = sr[j] * (dpr[j] - di);
  }
}

template <class A>
struct BackwardScratch {
  std::vector<A> qs, dob, dq, dvec, kf, kt, vt, dk, dv, s, dp, t, z, tmp, tmp2;
  // bf16 operands (bf16dot): the head's q and dO as row pairs and transposed, the key tile's packings, the
  // weights' and dS's.
  std::vector<uint16_t> qp, dop, qT, doT, kp, vp, kv, pv, dsv, dsr;
  BackwardScratch(const Problem<A>& pr)
      : qs(pr.bf16dot ? 0 : pr.p.Tq * pr.Dp),
        dob(pr.bf16dot ? 0 : pr.p.Tq * pr.Dp),
        dq(pr.p.Tq * pr.Dp),
        dvec(pr.p.Tq),
        kf(pr.bf16dot ? 0 : kBc * pr.Dp),
        kt(pr.bf16dot ? 0 : pr.p.D * kBc),
        vt(pr.bf16dot ? 0 : pr.p.D * kBc),
        dk(kBc * pr.Dp),
        dv(kBc * pr.Dp),
        s(kBr * kBc),
        dp(kBr * kBc),
        t(kBc * kBr),
        z(kBc),
        tmp(std::max(pr.p.D, kBc)),
        tmp2(std::max(pr.p.D, kBc)) {
    if (!pr.bf16dot) return;
    const int64_t Tq2 = round_even(pr.p.Tq);
    qp.resize(pr.p.Tq * pr.D2);
    dop.resize(pr.p.Tq * pr.D2);
    qT.resize(pr.p.D * Tq2);
    doT.resize(pr.p.D * Tq2);
    kp.resize(kBc * pr.D2);
    vp.resize(kBc * pr.D2);
    kv.resize(kBc * pr.Dp);
    pv.resize(kBr * kBc);
    dsv.resize(kBr * kBc);
    dsr.resize(kBr * kBc);
  }
};

// dq (head bh's [Tq, Dp] rows) times the scale, stored.
template <class A>
MP_FORCE_INLINE void store_dq(const Problem<A>& pr, const Tensor& dq_t, int64_t bh, A* dq) {
  const AttentionParams& p = pr.p;
  const A sc = static_cast<A>(p.scale);
  for (int64_t i = 0; i < p.Tq; ++i) {
    A* row = dq + i * pr.Dp;
#pragma omp simd
    for (int64_t d = 0; d < p.D; ++d) row[d] *= sc;
    store_row<A>(dq_t, bh * p.Tq + i, p.D, row);
  }
}

// One (batch, head) of the backward, all in A, with blocking G.
template <class A, class G>
struct BackwardHead {
  MP_FORCE_INLINE void operator()(const Problem<A>* prp, const Tensor* lse_t, const Tensor* dq_t, const Tensor* dk_t,
                                  const Tensor* dv_t, int64_t bh, BackwardScratch<A>* w) const {
    const Problem<A>& pr = *prp;
    const AttentionParams& p = pr.p;
    const int64_t D = p.D, Dp = pr.Dp;
    A *qs = w->qs.data(), *dob = w->dob.data(), *dq = w->dq.data(), *dvec = w->dvec.data();
    A *kf = w->kf.data(), *kt = w->kt.data(), *vt = w->vt.data(), *dk = w->dk.data(), *dv = w->dv.data();
    A *s = w->s.data(), *dp = w->dp.data(), *t = w->t.data(), *z = w->z.data(), *tmp = w->tmp.data();
    const A* lse = lse_t->data_ptr<A>() + bh * p.Tq;
    // The head's queries (scaled) and output gradients, widened once.
    for (int64_t i = 0; i < p.Tq; ++i) {
      widen_row<A>(*pr.q, bh * p.Tq + i, D, Dp, static_cast<A>(p.scale), qs + i * Dp, tmp);
      widen_row<A>(*pr.dout, bh * p.Tq + i, D, Dp, A(1), dob + i * Dp, tmp);
    }
    dout_dot_out(pr, bh, dvec, tmp, w->tmp2.data());
    std::fill(dq, dq + p.Tq * Dp, A(0));
    for (int64_t k0 = 0; k0 < p.Tk; k0 += kBc) {
      const int64_t nc = std::min(kBc, p.Tk - k0);
      for (int64_t j = 0; j < nc; ++j) widen_row<A>(*pr.k, bh * p.Tk + k0 + j, D, Dp, A(1), kf + j * Dp, tmp);
      widen_transposed<A>(*pr.k, bh * p.Tk + k0, nc, D, kt, tmp);
      widen_transposed<A>(*pr.v, bh * p.Tk + k0, nc, D, vt, tmp);
      std::fill(dk, dk + nc * Dp, A(0));
      std::fill(dv, dv + nc * Dp, A(0));
      // Causal: query tiles wholly before key k0 see none of these keys.
      const int64_t q_begin = p.causal ? k0 / kBr * kBr : 0;
      for (int64_t q0 = q_begin; q0 < p.Tq; q0 += kBr) {
        const int64_t nr = std::min(kBr, p.Tq - q0);
        nt_tile<A, G>(qs + q0 * Dp, Dp, kt, s, nr, D);
        nt_tile<A, G>(dob + q0 * Dp, Dp, vt, dp, nr, D);
        for (int64_t r = 0; r < nr; ++r)
          weights_and_dscores_row(pr, bh, q0 + r, k0, nc, lse[q0 + r], dvec[q0 + r], s + r * kBc, dp + r * kBc, z);
        for (int64_t r = 0; r < nr; ++r)
          for (int64_t j = 0; j < nc; ++j) t[j * kBr + r] = s[r * kBc + j];
        nn_acc<A, G>(t, kBr, dob + q0 * Dp, Dp, dv, Dp, nc, nr, Dp);  // dV += P^T dO
        nn_acc<A, G>(dp, kBc, kf, Dp, dq + q0 * Dp, Dp, nr, nc, Dp);  // dQ += dS K (scaled at the end)
        for (int64_t r = 0; r < nr; ++r)
          for (int64_t j = 0; j < nc; ++j) t[j * kBr + r] = dp[r * kBc + j];
        nn_acc<A, G>(t, kBr, qs + q0 * Dp, Dp, dk, Dp, nc, nr, Dp);  // dK += dS^T (Q scale)
      }
      for (int64_t j = 0; j < nc; ++j) {
        store_row<A>(*dk_t, bh * p.Tk + k0 + j, D, dk + j * Dp);
        store_row<A>(*dv_t, bh * p.Tk + k0 + j, D, dv + j * Dp);
      }
    }
    store_dq(pr, *dq_t, bh, dq);
  }

};

// The same with bf16 operands on VDPBF16PS (pr.bf16dot): the two score-shaped products from the bf16 pairs,
// and P and dS rounded to bf16 for the three products with them (Note [fused attention]). dK and dV are
// accumulated transposed ([D, kBc]), so that every product sums over the pairs of one operand's rows.
struct BackwardHeadBf16 {
  MP_FORCE_INLINE void operator()(const Problem<float>* prp, const Tensor* lse_t, const Tensor* dq_t,
                                  const Tensor* dk_t, const Tensor* dv_t, int64_t bh,
                                  BackwardScratch<float>* w) const {
    const Problem<float>& pr = *prp;
    const AttentionParams& p = pr.p;
    const int64_t D = p.D, Dp = pr.Dp, D2 = pr.D2, Tq2 = round_even(p.Tq);
    float *dq = w->dq.data(), *dvec = w->dvec.data(), *dkt = w->dk.data(), *dvt = w->dv.data();
    float *s = w->s.data(), *dp = w->dp.data(), *z = w->z.data(), *tmp = w->tmp.data();
    const float* lse = lse_t->data_ptr<float>() + bh * p.Tq;
    const float scale = static_cast<float>(p.scale);
    const uint16_t* qraw = raw_bf16(*pr.q, bh * p.Tq, D);
    const uint16_t* doraw = raw_bf16(*pr.dout, bh * p.Tq, D);
    attn_bf16::pack_rows(qraw, p.Tq, D, D2, w->qp.data());
    attn_bf16::pack_rows(doraw, p.Tq, D, D2, w->dop.data());
    attn_bf16::pack_transposed_rows(qraw, p.Tq, D, Tq2, w->qT.data());
    attn_bf16::pack_transposed_rows(doraw, p.Tq, D, Tq2, w->doT.data());
    dout_dot_out(pr, bh, dvec, tmp, w->tmp2.data());
    std::fill(dq, dq + p.Tq * Dp, 0.0f);
    for (int64_t k0 = 0; k0 < p.Tk; k0 += kBc) {
      const int64_t nc = std::min(kBc, p.Tk - k0), nc2 = round_even(nc);
      const uint16_t* kraw = raw_bf16(*pr.k, bh * p.Tk + k0, D);
      attn_bf16::pack_transposed_vnni(kraw, nc, D, D2, kBc, w->kp.data());
      attn_bf16::pack_transposed_vnni(raw_bf16(*pr.v, bh * p.Tk + k0, D), nc, D, D2, kBc, w->vp.data());
      attn_bf16::pack_vnni(kraw, nc, nc2, D, Dp, w->kv.data());
      std::fill(dkt, dkt + D * kBc, 0.0f);
      std::fill(dvt, dvt + D * kBc, 0.0f);
      const int64_t q_begin = p.causal ? k0 / kBr * kBr : 0;
      for (int64_t q0 = q_begin; q0 < p.Tq; q0 += kBr) {
        const int64_t nr = std::min(kBr, p.Tq - q0), nr2 = round_even(nr);
        attn_bf16::gemm(w->qp.data() + q0 * D2, D2, w->kp.data(), kBc, s, kBc, nr, D2 / 2, false, scale);
        attn_bf16::gemm(w->dop.data() + q0 * D2, D2, w->vp.data(), kBc, dp, kBc, nr, D2 / 2, false, 1.0f);
        for (int64_t r = 0; r < nr; ++r)
          weights_and_dscores_row(pr, bh, q0 + r, k0, nc, lse[q0 + r], dvec[q0 + r], s + r * kBc, dp + r * kBc, z);
        attn_bf16::f32_rows_to_vnni(s, kBc, nr, nr2, nc, kBc, w->pv.data());
        attn_bf16::f32_rows_to_vnni(dp, kBc, nr, nr2, nc, kBc, w->dsv.data());
        attn_bf16::f32_rows_to_bf16(dp, kBc, nr, nc, nc2, w->dsr.data(), kBc);
        // dV^T += dO^T P, dK^T += Q^T dS (scaled when stored), dQ += dS K (scaled at the end).
        attn_bf16::gemm(w->doT.data() + q0, Tq2, w->pv.data(), kBc, dvt, kBc, D, nr2 / 2, true, 1.0f);
        attn_bf16::gemm(w->qT.data() + q0, Tq2, w->dsv.data(), kBc, dkt, kBc, D, nr2 / 2, true, 1.0f);
        attn_bf16::gemm(w->dsr.data(), kBc, w->kv.data(), Dp, dq + q0 * Dp, Dp, nr, nc2 / 2, true, 1.0f);
      }
      for (int64_t j = 0; j < nc; ++j) {
        for (int64_t d = 0; d < D; ++d) tmp[d] = dkt[d * kBc + j] * scale;
        store_row<float>(*dk_t, bh * p.Tk + k0 + j, D, tmp);
        for (int64_t d = 0; d < D; ++d) tmp[d] = dvt[d * kBc + j];
        store_row<float>(*dv_t, bh * p.Tk + k0 + j, D, tmp);
      }
    }
    store_dq<float>(pr, *dq_t, bh, dq);
  }
};

template <class A>
void backward_typed(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                    const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& mask,
                    const AttentionParams& p) {
  Problem<A> pr = make_problem<A>(q, k, v, mask, p);
  pr.out = &out;
  pr.dout = &dout;
  const int64_t heads = p.B * p.H;
  const bool vec = vector_loops_enabled();
#pragma omp parallel if (heads > 1)
  {
    BackwardScratch<A> w(pr);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < heads; ++bh) {
      if constexpr (std::is_same_v<A, float>) {
        if (pr.bf16dot) {
          call_isa(vec, BackwardHeadBf16{}, &pr, &lse, &dq, &dk, &dv, bh, &w);
          continue;
        }
      }
      call_blocked<BackwardHead<A, Wide>, BackwardHead<A, Narrow>>(vec, &pr, &lse, &dq, &dk, &dv, bh, &w);
    }
  }
}

// ---------------------------------------------------------------- entry points

void attention_forward_cpu(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& mask, const AttentionParams& p) {
  if (q.dtype() == DType::f64)
    forward_typed<double>(out, lse, q, k, v, mask, p);
  else
    forward_typed<float>(out, lse, q, k, v, mask, p);
}

void attention_backward_cpu(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                            const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& mask,
                            const AttentionParams& p) {
  if (q.dtype() == DType::f64)
    backward_typed<double>(dq, dk, dv, dout, q, k, v, out, lse, mask, p);
  else
    backward_typed<float>(dq, dk, dv, dout, q, k, v, out, lse, mask, p);
}

}  // namespace

MP_REGISTER_KERNEL(attention_forward_kernel, DeviceType::cpu, &attention_forward_cpu);
MP_REGISTER_KERNEL(attention_backward_kernel, DeviceType::cpu, &attention_backward_cpu);

}  // namespace mp::backend::cpu

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
// columns of D), compiled for AVX-512 and picked at run time (call_isa). With bf16 inputs on a CPU with
// AVX512-BF16 the two score-shaped products (q k^T, and dO v^T in the backward) take the bf16 pairs as
// they are (VDPBF16PS: exact products, f32 sums; the scale multiplies the f32 scores), 1.13x on the whole
// op; the products with the f32 weights (P v, P^T dO, dS k, dS^T q) stay f32, so the weights are never
// rounded to 16 bits. Measured against the oneDNN composite in bench/RESULTS.md ("Fused attention").
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
#include "backend/cpu/loops.hpp"
#include "backend/fast_math.hpp"
#include "backend/index_kernels.hpp"
#include "mp/core/cpu_features.hpp"

namespace mp::backend::cpu {
namespace {

constexpr int64_t kBr = 64;  // query rows per tile
constexpr int64_t kBc = 64;  // keys per tile

typedef float VecF __attribute__((vector_size(64)));
typedef double VecD __attribute__((vector_size(64)));
template <class A>
using Vec = std::conditional_t<std::is_same_v<A, float>, VecF, VecD>;
template <class A>
constexpr int64_t kLanes = static_cast<int64_t>(64 / sizeof(A));

template <class A>
constexpr A kInf = std::numeric_limits<A>::infinity();

// ---------------------------------------------------------------- tile products

// c[r][0:kBc] = sum_d a[r * lda + d] * bt[d * kBc + 0:kBc] for R rows (bt: a key tile transposed).
template <class A, int R>
MP_FORCE_INLINE void nt_rows(const A* a, int64_t lda, const A* bt, A* c, int64_t D) {
  using V = Vec<A>;
  constexpr int64_t W = kLanes<A>, NV = kBc / W;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int64_t u = 0; u < NV; ++u) acc[r][u] = V{};
  for (int64_t d = 0; d < D; ++d) {
    V b[NV];
    for (int64_t u = 0; u < NV; ++u) std::memcpy(&b[u], bt + d * kBc + u * W, sizeof(V));
    for (int r = 0; r < R; ++r) {
      const A x = a[r * lda + d];
      for (int64_t u = 0; u < NV; ++u) acc[r][u] += x * b[u];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int64_t u = 0; u < NV; ++u) std::memcpy(c + r * kBc + u * W, &acc[r][u], sizeof(V));
}

// c [rows, kBc] = a [rows, D] (row stride lda) times bt [D, kBc].
template <class A>
MP_FORCE_INLINE void nt_tile(const A* a, int64_t lda, const A* bt, A* c, int64_t rows, int64_t D) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) nt_rows<A, 4>(a + r * lda, lda, bt, c + r * kBc, D);
  for (; r < rows; ++r) nt_rows<A, 1>(a + r * lda, lda, bt, c + r * kBc, D);
}

// c[r][cols] += sum_{j < inner} p[r * ldp + j] * v[j * ldv + cols] for R rows and NV vectors of columns.
template <class A, int R, int NV>
MP_FORCE_INLINE void nn_block(const A* p, int64_t ldp, const A* v, int64_t ldv, A* c, int64_t ldc, int64_t inner) {
  using V = Vec<A>;
  constexpr int64_t W = kLanes<A>;
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

template <class A, int R>
MP_FORCE_INLINE void nn_rows(const A* p, int64_t ldp, const A* v, int64_t ldv, A* c, int64_t ldc, int64_t inner,
                             int64_t Dp) {
  constexpr int64_t W = kLanes<A>;
  for (int64_t d0 = 0; d0 < Dp; d0 += 4 * W) {
    switch (std::min<int64_t>(4, (Dp - d0) / W)) {
      case 4: nn_block<A, R, 4>(p, ldp, v + d0, ldv, c + d0, ldc, inner); break;
      case 3: nn_block<A, R, 3>(p, ldp, v + d0, ldv, c + d0, ldc, inner); break;
      case 2: nn_block<A, R, 2>(p, ldp, v + d0, ldv, c + d0, ldc, inner); break;
      default: nn_block<A, R, 1>(p, ldp, v + d0, ldv, c + d0, ldc, inner); break;
    }
  }
}

// c [rows, Dp] (row stride ldc) += p [rows, inner] (row stride ldp) times v [inner, Dp] (row stride ldv);
// Dp is a multiple of the vector width.
template <class A>
MP_FORCE_INLINE void nn_acc(const A* p, int64_t ldp, const A* v, int64_t ldv, A* c, int64_t ldc, int64_t rows,
                            int64_t inner, int64_t Dp) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) nn_rows<A, 4>(p + r * ldp, ldp, v, ldv, c + r * ldc, ldc, inner, Dp);
  for (; r < rows; ++r) nn_rows<A, 1>(p + r * ldp, ldp, v, ldv, c + r * ldc, ldc, inner, Dp);
}

// ---------------------------------------------------------------- bf16 dot products

// Rows [r0, r0 + n) of a bf16 tensor t ([*, D] contiguous) as raw bf16 into dst rows of D2 (D rounded up to
// even; the pad is 0), so that each 32-bit word holds the pair (2p, 2p + 1).
void pack_rows_bf16(const Tensor& t, int64_t r0, int64_t n, int64_t D, int64_t D2, uint16_t* dst) {
  const uint16_t* src = static_cast<const uint16_t*>(t.raw_data()) + r0 * D;
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(dst + r * D2, src + r * D, static_cast<size_t>(D) * sizeof(uint16_t));
    if (D2 > D) dst[r * D2 + D] = 0;
  }
}

// Keys [r0, r0 + n) of a bf16 tensor laid out for VDPBF16PS: dst[(p kBc + j) 2 + e] = key j's element 2p + e
// (0 past D and for j >= n).
void pack_keys_bf16(const Tensor& t, int64_t r0, int64_t n, int64_t D, int64_t D2, uint16_t* dst) {
  const uint16_t* src = static_cast<const uint16_t*>(t.raw_data()) + r0 * D;
  std::fill(dst, dst + D2 * kBc, uint16_t{0});
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < D; ++d) dst[((d >> 1) * kBc + j) * 2 + (d & 1)] = src[j * D + d];
}

#if defined(MP_HAVE_AVX512_LOOPS)
#define MP_AVX512_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// c[r][0:kBc] = scale * sum_p a-pair(r, p) . key-pairs(p, 0:kBc) for R rows: VDPBF16PS multiplies the bf16
// pairs exactly and accumulates in f32.
template <int R>
MP_AVX512_BF16_TARGET inline __attribute__((always_inline)) void nt_rows_bf16(const uint16_t* a, int64_t lda,
                                                                              const uint16_t* kp, float* c, int64_t Dh,
                                                                              float scale) {
  __m512 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t p = 0; p < Dh; ++p) {
    __m512bh b[4];
    for (int u = 0; u < 4; ++u) b[u] = (__m512bh)_mm512_loadu_si512(kp + (p * kBc + u * 16) * 2);
    for (int r = 0; r < R; ++r) {
      uint32_t w;
      std::memcpy(&w, a + r * lda + 2 * p, sizeof w);
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(w));
      for (int u = 0; u < 4; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], x, b[u]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < 4; ++u) _mm512_storeu_ps(c + r * kBc + u * 16, _mm512_mul_ps(acc[r][u], sc));
}

// c [rows, kBc] = scale * a [rows, D2] (bf16 pairs, row stride lda) times packed keys kp.
MP_AVX512_BF16_TARGET void nt_tile_bf16(const uint16_t* a, int64_t lda, const uint16_t* kp, float* c, int64_t rows,
                                        int64_t D2, float scale) {
  const int64_t Dh = D2 / 2;
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) nt_rows_bf16<4>(a + r * lda, lda, kp, c + r * kBc, Dh, scale);
  for (; r < rows; ++r) nt_rows_bf16<1>(a + r * lda, lda, kp, c + r * kBc, Dh, scale);
}
#endif

// Whether bf16 operands take VDPBF16PS for the q k^T and dO v^T tiles.
bool use_bf16_dot(const Tensor& q) {
#if defined(MP_HAVE_AVX512_LOOPS)
  return q.dtype() == DType::bf16 && cpu_features().avx512_bf16 && avx512_loops_enabled();
#else
  return false;
#endif
}

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
  pr.bf16dot = std::is_same_v<A, float> && use_bf16_dot(q);
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

// c [rows, kBc] = scale * (bf16 pairs a) . (packed keys kp) through VDPBF16PS (only called when pr.bf16dot).
template <class A>
void nt_scores(const Problem<A>& pr, const uint16_t* a, const uint16_t* kp, A* c, int64_t rows, bool scaled = true) {
#if defined(MP_HAVE_AVX512_LOOPS)
  if constexpr (std::is_same_v<A, float>) {
    nt_tile_bf16(a, pr.D2, kp, c, rows, pr.D2, scaled ? static_cast<float>(pr.p.scale) : 1.0f);
    return;
  }
#endif
  MP_ASSERT(false, "nt_scores without VDPBF16PS");
}

// ---------------------------------------------------------------- forward

template <class A>
struct ForwardScratch {
  std::vector<A> qf, kt, vf, s, o, m, l, z, tmp;
  std::vector<uint16_t> qp, kp;  // bf16 pairs (bf16dot)
  ForwardScratch(int64_t D, int64_t Dp, int64_t D2)
      : qf(kBr * Dp),
        kt(D * kBc),
        vf(kBc * Dp),
        s(kBr * kBc),
        o(kBr * Dp),
        m(kBr),
        l(kBr),
        z(kBc),
        tmp(std::max(D, kBc)),
        qp(kBr * D2),
        kp(kBc * D2) {}
};

// One (batch, head, query tile) of the forward.
template <class A>
struct ForwardTile {
  MP_FORCE_INLINE void operator()(const Problem<A>* prp, const Tensor* lse, int64_t item, ForwardScratch<A>* w) const {
    const Problem<A>& pr = *prp;
    const AttentionParams& p = pr.p;
    const int64_t D = p.D, Dp = pr.Dp;
    const int64_t n_qt = (p.Tq + kBr - 1) / kBr;
    const int64_t bh = item / n_qt, q0 = (item % n_qt) * kBr;
    const int64_t b = bh / p.H, h = bh % p.H;
    const int64_t nr = std::min(kBr, p.Tq - q0);
    A *qf = w->qf.data(), *kt = w->kt.data(), *vf = w->vf.data(), *s = w->s.data(), *o = w->o.data();
    A *m = w->m.data(), *l = w->l.data(), *z = w->z.data(), *tmp = w->tmp.data();
    for (int64_t r = 0; r < nr; ++r) {
      if (!pr.bf16dot) widen_row<A>(*pr.q, bh * p.Tq + q0 + r, D, Dp, static_cast<A>(p.scale), qf + r * Dp, tmp);
      m[r] = -kInf<A>;
      l[r] = A(0);
    }
    if (pr.bf16dot) pack_rows_bf16(*pr.q, bh * p.Tq + q0, nr, D, pr.D2, w->qp.data());
    std::fill(o, o + nr * Dp, A(0));
    // Causal: keys past the tile's last row are masked for every row of it.
    const int64_t k_end = p.causal ? std::min(p.Tk, q0 + nr) : p.Tk;
    for (int64_t k0 = 0; k0 < k_end; k0 += kBc) {
      const int64_t nc = std::min(kBc, p.Tk - k0);
      for (int64_t j = 0; j < nc; ++j) widen_row<A>(*pr.v, bh * p.Tk + k0 + j, D, Dp, A(1), vf + j * Dp, tmp);
      if (pr.bf16dot) {
        pack_keys_bf16(*pr.k, bh * p.Tk + k0, nc, D, pr.D2, w->kp.data());
        nt_scores(pr, w->qp.data(), w->kp.data(), s, nr);
      } else {
        widen_transposed<A>(*pr.k, bh * p.Tk + k0, nc, D, kt, tmp);
        nt_tile<A>(qf, Dp, kt, s, nr, D);
      }
      for (int64_t r = 0; r < nr; ++r) {
        A* sr = s + r * kBc;
        mask_scores(pr, b, h, q0 + r, k0, nc, sr);
        A mx = -kInf<A>;
#pragma omp simd reduction(max : mx)
        for (int64_t j = 0; j < nc; ++j) mx = sr[j] > mx ? sr[j] : mx;
        const A mnew = std::max(m[r], mx);
        if (mnew == -kInf<A>) {  // every key so far masked: nothing to add
          std::fill(sr, sr + nc, A(0));
          continue;
        }
        const A alpha = math_exp(m[r] - mnew);
        A sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t j = 0; j < nc; ++j) {
          const A e = math_exp(sr[j] - mnew);
          sr[j] = e;
          sum += e;
        }
        l[r] = l[r] * alpha + sum;
        m[r] = mnew;
        if (alpha != A(1)) {
          A* orow = o + r * Dp;
#pragma omp simd
          for (int64_t d = 0; d < Dp; ++d) orow[d] *= alpha;
        }
        if (p.dropout_p > 0) {
          dropout_factors<A>(p, bh, q0 + r, k0, nc, z);
#pragma omp simd
          for (int64_t j = 0; j < nc; ++j) sr[j] *= z[j];
        }
      }
      nn_acc<A>(s, kBc, vf, Dp, o, Dp, nr, nc, Dp);
    }
    A* lse_p = lse->data_ptr<A>() + bh * p.Tq + q0;
    for (int64_t r = 0; r < nr; ++r) {
      const bool empty = l[r] == A(0);
      const A inv = empty ? A(0) : A(1) / l[r];
      A* orow = o + r * Dp;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) orow[d] *= inv;
      lse_p[r] = empty ? kInf<A> : m[r] + std::log(l[r]);
      store_row<A>(*pr.out, bh * p.Tq + q0 + r, D, orow);
    }
  }
};

template <class A>
void forward_typed(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& mask, const AttentionParams& p) {
  Problem<A> pr = make_problem<A>(q, k, v, mask, p);
  pr.out = &out;
  const int64_t n_qt = (p.Tq + kBr - 1) / kBr;
  const int64_t items = p.B * p.H * n_qt;
  const bool avx512 = avx512_loops_enabled();
#pragma omp parallel if (items > 1)
  {
    ForwardScratch<A> w(p.D, pr.Dp, pr.D2);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) call_isa(avx512, ForwardTile<A>{}, &pr, &lse, it, &w);
  }
}

// ---------------------------------------------------------------- backward

template <class A>
struct BackwardScratch {
  std::vector<A> qs, dob, dq, dvec, kf, kt, vt, dk, dv, s, dp, t, z, tmp;
  std::vector<uint16_t> qp, dop, kp, vp;  // bf16 pairs (bf16dot)
  BackwardScratch(int64_t Tq, int64_t D, int64_t Dp, int64_t D2, bool bf16dot)
      : qs(Tq * Dp),
        dob(Tq * Dp),
        dq(Tq * Dp),
        dvec(Tq),
        kf(kBc * Dp),
        kt(D * kBc),
        vt(D * kBc),
        dk(kBc * Dp),
        dv(kBc * Dp),
        s(kBr * kBc),
        dp(kBr * kBc),
        t(kBc * kBr),
        z(kBc),
        tmp(std::max(D, kBc)),
        qp(bf16dot ? Tq * D2 : 0),
        dop(bf16dot ? Tq * D2 : 0),
        kp(bf16dot ? kBc * D2 : 0),
        vp(bf16dot ? kBc * D2 : 0) {}
};

// One (batch, head) of the backward.
template <class A>
struct BackwardHead {
  MP_FORCE_INLINE void operator()(const Problem<A>* prp, const Tensor* lse_t, const Tensor* dq_t, const Tensor* dk_t,
                                  const Tensor* dv_t, int64_t bh, BackwardScratch<A>* w) const {
    const Problem<A>& pr = *prp;
    const AttentionParams& p = pr.p;
    const int64_t D = p.D, Dp = pr.Dp;
    const int64_t b = bh / p.H, h = bh % p.H;
    A *qs = w->qs.data(), *dob = w->dob.data(), *dq = w->dq.data(), *dvec = w->dvec.data();
    A *kf = w->kf.data(), *kt = w->kt.data(), *vt = w->vt.data(), *dk = w->dk.data(), *dv = w->dv.data();
    A *s = w->s.data(), *dp = w->dp.data(), *t = w->t.data(), *z = w->z.data(), *tmp = w->tmp.data();
    const A* lse = lse_t->data_ptr<A>() + bh * p.Tq;
    // The head's queries (scaled), output gradients and rowsum(dO o O), widened once.
    for (int64_t i = 0; i < p.Tq; ++i) {
      widen_row<A>(*pr.q, bh * p.Tq + i, D, Dp, static_cast<A>(p.scale), qs + i * Dp, tmp);
      widen_row<A>(*pr.dout, bh * p.Tq + i, D, Dp, A(1), dob + i * Dp, tmp);
      const A* orow = load_at<A>(*pr.out, (bh * p.Tq + i) * D, D, tmp);
      const A* dorow = dob + i * Dp;
      A acc = 0;
#pragma omp simd reduction(+ : acc)
      for (int64_t d = 0; d < D; ++d) acc += dorow[d] * orow[d];
      dvec[i] = acc;
    }
    std::fill(dq, dq + p.Tq * Dp, A(0));
    if (pr.bf16dot) {
      pack_rows_bf16(*pr.q, bh * p.Tq, p.Tq, D, pr.D2, w->qp.data());
      pack_rows_bf16(*pr.dout, bh * p.Tq, p.Tq, D, pr.D2, w->dop.data());
    }
    for (int64_t k0 = 0; k0 < p.Tk; k0 += kBc) {
      const int64_t nc = std::min(kBc, p.Tk - k0);
      for (int64_t j = 0; j < nc; ++j) widen_row<A>(*pr.k, bh * p.Tk + k0 + j, D, Dp, A(1), kf + j * Dp, tmp);
      if (pr.bf16dot) {
        pack_keys_bf16(*pr.k, bh * p.Tk + k0, nc, D, pr.D2, w->kp.data());
        pack_keys_bf16(*pr.v, bh * p.Tk + k0, nc, D, pr.D2, w->vp.data());
      } else {
        widen_transposed<A>(*pr.k, bh * p.Tk + k0, nc, D, kt, tmp);
        widen_transposed<A>(*pr.v, bh * p.Tk + k0, nc, D, vt, tmp);
      }
      std::fill(dk, dk + nc * Dp, A(0));
      std::fill(dv, dv + nc * Dp, A(0));
      // Causal: query tiles wholly before key k0 see none of these keys.
      const int64_t q_begin = p.causal ? k0 / kBr * kBr : 0;
      for (int64_t q0 = q_begin; q0 < p.Tq; q0 += kBr) {
        const int64_t nr = std::min(kBr, p.Tq - q0);
        if (pr.bf16dot) {
          nt_scores(pr, w->qp.data() + q0 * pr.D2, w->kp.data(), s, nr);
          nt_scores(pr, w->dop.data() + q0 * pr.D2, w->vp.data(), dp, nr, false);
        } else {
          nt_tile<A>(qs + q0 * Dp, Dp, kt, s, nr, D);
          nt_tile<A>(dob + q0 * Dp, Dp, vt, dp, nr, D);
        }
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t i = q0 + r;
          A *sr = s + r * kBc, *dpr = dp + r * kBc;
          mask_scores(pr, b, h, i, k0, nc, sr);
          const A li = lse[i], di = dvec[i];
#pragma omp simd
          for (int64_t j = 0; j < nc; ++j) sr[j] = math_exp(sr[j] - li);
          if (p.dropout_p > 0) {
            dropout_factors<A>(p, bh, i, k0, nc, z);
            for (int64_t j = 0; j < nc; ++j) {
              t[j * kBr + r] = sr[j] * z[j];  // dropped weights, transposed (for dV)
              dpr[j] = sr[j] * (dpr[j] * z[j] - di);
            }
          } else {
            for (int64_t j = 0; j < nc; ++j) {
              t[j * kBr + r] = sr[j];
              dpr[j] = sr[j] * (dpr[j] - di);
            }
          }
        }
        nn_acc<A>(t, kBr, dob + q0 * Dp, Dp, dv, Dp, nc, nr, Dp);  // dV += P^T dO
        nn_acc<A>(dp, kBc, kf, Dp, dq + q0 * Dp, Dp, nr, nc, Dp);  // dQ += dS K (scaled at the end)
        for (int64_t r = 0; r < nr; ++r)
          for (int64_t j = 0; j < nc; ++j) t[j * kBr + r] = dp[r * kBc + j];
        nn_acc<A>(t, kBr, qs + q0 * Dp, Dp, dk, Dp, nc, nr, Dp);  // dK += dS^T (Q scale)
      }
      for (int64_t j = 0; j < nc; ++j) {
        store_row<A>(*dk_t, bh * p.Tk + k0 + j, D, dk + j * Dp);
        store_row<A>(*dv_t, bh * p.Tk + k0 + j, D, dv + j * Dp);
      }
    }
    const A sc = static_cast<A>(p.scale);
    for (int64_t i = 0; i < p.Tq; ++i) {
      A* row = dq + i * Dp;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) row[d] *= sc;
      store_row<A>(*dq_t, bh * p.Tq + i, D, row);
    }
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
  const bool avx512 = avx512_loops_enabled();
#pragma omp parallel if (heads > 1)
  {
    BackwardScratch<A> w(p.Tq, p.D, pr.Dp, pr.D2, pr.bf16dot);
#pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < heads; ++bh) call_isa(avx512, BackwardHead<A>{}, &pr, &lse, &dq, &dk, &dv, bh, &w);
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

// CUDA scaled-dot-product attention (the slots of attention_kernels.hpp): products on cuBLASLt's tensor cores,
// one fused row kernel for the masked softmax (forward) and for its gradient (backward).
//
// Note [CUDA attention]
// The CPU's fused kernel (Note [fused attention]) tiles the scores in registers; here the products are batched
// cuBLASLt GEMMs over chunks of (batch, head) pairs and the scores of a chunk live in device memory:
//  * forward: S = scale q k^T (f32; f64 for f64), then one row kernel adds the mask (additive, any strides) and the
//    causal rule, computes each row's log-sum-exp in f32 and writes P = exp(S - lse) times the dropout factor
//    (the CPU's Philox draws: weight (b, h, i, j) is element ((b H + h) Tq + i) Tk + j of the call's reserved
//    stream) in the input dtype; out = P v. A row whose keys are all masked gets lse = +inf and zero weights.
//  * backward: S is recomputed from q, k and lse, dP' = dout v^T (f32); the row kernel forms P, the dropout factor
//    z, Delta_i = sum_j P_ij z_ij dP'_ij (= rowsum(dout o)) and writes P z and dS = scale P (z dP' - Delta) in the
//    input dtype; dv = (P z)^T dout, dq = dS k, dk = dS^T q.
// Only lse is kept for the backward, as on the CPU: memory saved per call is O(T). The scratch of a chunk is
// O(chunk Tq Tk) and chunks are sized to kScratchBytes, so long sequences run in several chunks. 16-bit inputs
// round the weights and dS to 16 bits before their products (what FlashAttention does); f32 and f64 keep them in
// the compute type. Leading dimensions of the scratch are padded to 8 elements so every batch entry of the
// GEMMs is 16-byte aligned; q, k, v whose [T, D] blocks are not (D odd, say) go one (batch, head) at a time.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/attention_kernels.hpp"
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cublaslt.hpp"
#include "backend/cuda/loops.cuh"
#include "backend/cuda/rows.cuh"
#include "backend/cuda/runtime.hpp"
#include "backend/fast_math.hpp"
#include "backend/index_kernels.hpp"

namespace mp::backend::cuda {
namespace {

constexpr int kRowThreads = 256;
// Bytes of score scratch one chunk of (batch, head) pairs may use.
constexpr int64_t kScratchBytes = int64_t{1} << 30;

int64_t pad8(int64_t n) { return (n + 7) / 8 * 8; }

// Where a row's scores come from, and its mask and dropout.
template <class A>
struct RowArgs {
  int64_t H, Tq, Tk, ld;  // ld: elements between rows of the scratch
  int64_t bh0;            // global (batch, head) index of the chunk's first pair
  A scale;
  bool causal;
  const A* mask;  // null: none
  int64_t ms[4];  // mask strides (b, h, i, j)
  float drop_p;   // 0: no dropout
  A keep;         // 1 / (1 - p)
  uint64_t seed, offset;
};

// The masked score of row (bh, i), key j: S + mask, -inf where causal hides it.
template <class A>
__device__ MP_FORCE_INLINE A masked(const RowArgs<A>& a, A s, int64_t bh, int64_t i, int64_t j) {
  if (a.causal && j > i) return neg_inf<A>();
  if (a.mask != nullptr) {
    const int64_t b = bh / a.H, h = bh - b * a.H;
    s += a.mask[b * a.ms[0] + h * a.ms[1] + i * a.ms[2] + j * a.ms[3]];
  }
  return s;
}

// The dropout factor of weight (bh, i, j): 0 or 1 / (1 - p) (Note [dropout mask]).
template <class A>
__device__ MP_FORCE_INLINE A drop_factor(const RowArgs<A>& a, int64_t bh, int64_t i, int64_t j) {
  if (a.drop_p <= 0.0f) return A(1);
  const uint64_t e = a.offset + static_cast<uint64_t>((bh * a.Tq + i) * a.Tk + j);
  const U32x4 blk = philox_block(a.seed, e >> 2);
  return dropout_keeps(philox_to_uniform(blk.v[e & 3]), a.drop_p) ? a.keep : A(0);
}

// Forward rows: S (compute type, rows of ld) of the chunk -> P (T, rows of ld) and lse of each row.
template <class T, class A>
__global__ void __launch_bounds__(kRowThreads)
    attention_softmax_kernel(T* P, A* __restrict__ lse, const A* S, int64_t rows, RowArgs<A> a) {  // P may alias S
  __shared__ RowSmem smem;
  const int tid = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t bh = a.bh0 + r / a.Tq, i = r % a.Tq;
    const A* s = S + r * a.ld;
    T* p = P + r * a.ld;
    A m = neg_inf<A>();
    for (int64_t j = tid; j < a.Tk; j += kRowThreads) m = Max<A>{}(m, masked(a, s[j], bh, i, j));
    m = row_allreduce<kRowThreads>(m, Max<A>{}, neg_inf<A>(), smem);
    if (m == neg_inf<A>()) {  // every key masked: zero weights, lse = +inf
      for (int64_t j = tid; j < a.Tk; j += kRowThreads) p[j] = device_cast<T>(A(0));
      if (tid == 0) lse[r] = -neg_inf<A>();
      continue;
    }
    A sum = 0;
    for (int64_t j = tid; j < a.Tk; j += kRowThreads) sum += math_exp(masked(a, s[j], bh, i, j) - m);
    sum = row_allreduce<kRowThreads>(sum, Plus<A>{}, A(0), smem);
    const A l = m + math_log(sum);
    for (int64_t j = tid; j < a.Tk; j += kRowThreads)
      p[j] = device_cast<T>(math_exp(masked(a, s[j], bh, i, j) - l) * drop_factor(a, bh, i, j));
    if (tid == 0) lse[r] = l;
  }
}

// Backward rows: S and dP' (compute type) -> Pz = P z and dS = scale P (z dP' - Delta) (T; may alias S and dP').
template <class T, class A>
__global__ void __launch_bounds__(kRowThreads)
    attention_softmax_backward_kernel(T* Pz, T* dS, const A* S, const A* dP, const A* __restrict__ lse, int64_t rows,
                                      RowArgs<A> a) {
  __shared__ RowSmem smem;
  const int tid = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t bh = a.bh0 + r / a.Tq, i = r % a.Tq;
    const A l = lse[r];
    const A* s = S + r * a.ld;
    const A* dp = dP + r * a.ld;
    T* pz = Pz + r * a.ld;
    T* ds = dS + r * a.ld;
    if (l == -neg_inf<A>()) {
      for (int64_t j = tid; j < a.Tk; j += kRowThreads) pz[j] = ds[j] = device_cast<T>(A(0));
      continue;
    }
    A delta = 0;
    for (int64_t j = tid; j < a.Tk; j += kRowThreads)
      delta += math_exp(masked(a, s[j], bh, i, j) - l) * drop_factor(a, bh, i, j) * dp[j];
    delta = row_allreduce<kRowThreads>(delta, Plus<A>{}, A(0), smem);
    for (int64_t j = tid; j < a.Tk; j += kRowThreads) {
      const A p = math_exp(masked(a, s[j], bh, i, j) - l), z = drop_factor(a, bh, i, j), g = dp[j];
      pz[j] = device_cast<T>(p * z);
      ds[j] = device_cast<T>(a.scale * p * (z * g - delta));  // reads before writes: S, dP may alias Pz, dS
    }
  }
}

// Row-major batched product C[b] (M x N, rows of ldc) = alpha op(A[b]) op(B[b]), op(X) = X^T when tX; A stored
// with rows of lda (M x K, or K x M when ta), B with rows of ldb (K x N, or N x K when tb).
struct Bmm {
  int device;
  DType ab, c;
  const void* A;
  bool ta;
  int64_t lda, sa;
  const void* B;
  bool tb;
  int64_t ldb, sb;
  void* C;
  int64_t ldc, sc;
  int64_t M, N, K, batch;
  double alpha = 1.0;
};

void bmm(const Bmm& x) {
  // Column-major view: C^T (N x M) = op(B)^T op(A)^T.
  GemmArgs g;
  g.device = x.device;
  g.a = x.B;
  g.trans_a = x.tb;
  g.lda = x.ldb;
  g.b = x.A;
  g.trans_b = x.ta;
  g.ldb = x.lda;
  g.d = x.C;
  g.ab_dtype = x.ab;
  g.d_dtype = x.c;
  g.m = x.N;
  g.n = x.M;
  g.k = x.K;
  g.ldd = x.ldc;
  g.batch = x.batch;
  g.stride_a = x.sb;
  g.stride_b = x.sa;
  g.stride_d = x.sc;
  g.alpha = x.alpha;
  gemm(g);
}

// The same products one batch entry at a time (entries not 16-byte aligned).
void bmm_each(const Bmm& x, bool batched) {
  if (batched || x.batch == 1) return bmm(x);
  const size_t ea = dtype_size(x.ab), ec = dtype_size(x.c);
  for (int64_t b = 0; b < x.batch; ++b) {
    Bmm one = x;
    one.batch = 1;
    one.A = static_cast<const char*>(x.A) + b * x.sa * static_cast<int64_t>(ea);
    one.B = static_cast<const char*>(x.B) + b * x.sb * static_cast<int64_t>(ea);
    one.C = static_cast<char*>(x.C) + b * x.sc * static_cast<int64_t>(ec);
    bmm(one);
  }
}

template <class A>
RowArgs<A> row_args(const AttentionParams& p, const Tensor& mask, int64_t ld) {
  RowArgs<A> a{};
  a.H = p.H;
  a.Tq = p.Tq;
  a.Tk = p.Tk;
  a.ld = ld;
  a.scale = static_cast<A>(p.scale);
  a.causal = p.causal;
  a.mask = mask.defined() ? mask.data_ptr<A>() : nullptr;
  for (int d = 0; d < 4; ++d) a.ms[d] = mask.defined() ? mask.stride(d) : 0;
  a.drop_p = static_cast<float>(p.dropout_p);
  a.keep = static_cast<A>(p.dropout_p > 0 ? 1.0 / (1.0 - p.dropout_p) : 1.0);
  a.seed = p.dropout_rng.seed;
  a.offset = p.dropout_rng.offset;
  return a;
}

// Per (batch, head) pair: [Tq, D] and [Tk, D] blocks 16-byte aligned, so one batched GEMM serves a chunk.
bool blocks_aligned(const AttentionParams& p, DType dt) {
  const int64_t e = static_cast<int64_t>(dtype_size(dt));
  return (p.Tq * p.D * e) % 16 == 0 && (p.Tk * p.D * e) % 16 == 0;
}

template <class T>
void forward_typed(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& mask, const AttentionParams& p) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  constexpr bool kSame = std::is_same_v<T, A>;
  const Device dev = q.device();
  const DType dt = q.dtype(), at = dtype_of<A>();
  const int64_t ld = pad8(p.Tk), BH = p.B * p.H;
  const int64_t per = p.Tq * ld * static_cast<int64_t>(sizeof(A) + (kSame ? 0 : sizeof(T)));
  const int64_t chunk = std::clamp<int64_t>(kScratchBytes / std::max<int64_t>(per, 1), 1, BH);
  const bool batched = blocks_aligned(p, dt);
  const size_t e = sizeof(T);
  cudaStream_t stream = stream_of(q);
  for (int64_t c0 = 0; c0 < BH; c0 += chunk) {
    const int64_t n = std::min(chunk, BH - c0);
    Tensor S = mp::empty({n, p.Tq, ld}, {.dtype = at, .device = dev});
    Tensor P = kSame ? S : mp::empty({n, p.Tq, ld}, {.dtype = dt, .device = dev});
    const char* qp = static_cast<const char*>(q.raw_data()) + c0 * p.Tq * p.D * static_cast<int64_t>(e);
    const char* kp = static_cast<const char*>(k.raw_data()) + c0 * p.Tk * p.D * static_cast<int64_t>(e);
    const char* vp = static_cast<const char*>(v.raw_data()) + c0 * p.Tk * p.D * static_cast<int64_t>(e);
    char* op = static_cast<char*>(out.raw_data()) + c0 * p.Tq * p.D * static_cast<int64_t>(e);
    // S = scale q k^T
    bmm_each({.device = dev.index, .ab = dt, .c = at, .A = qp, .ta = false, .lda = p.D, .sa = p.Tq * p.D,
              .B = kp, .tb = true, .ldb = p.D, .sb = p.Tk * p.D, .C = S.raw_data(), .ldc = ld, .sc = p.Tq * ld,
              .M = p.Tq, .N = p.Tk, .K = p.D, .batch = n, .alpha = p.scale},
             batched);
    RowArgs<A> a = row_args<A>(p, mask, ld);
    a.bh0 = c0;
    const int64_t rows = n * p.Tq;
    attention_softmax_kernel<T, A><<<blocks_for(rows * kRowThreads, kRowThreads, dev.index), kRowThreads, 0, stream>>>(
        static_cast<T*>(P.raw_data()), lse.data_ptr<A>() + c0 * p.Tq, S.data_ptr<A>(), rows, a);
    MP_CUDA_CHECK_LAUNCH();
    // out = P v
    bmm_each({.device = dev.index, .ab = dt, .c = dt, .A = P.raw_data(), .ta = false, .lda = ld, .sa = p.Tq * ld,
              .B = vp, .tb = false, .ldb = p.D, .sb = p.Tk * p.D, .C = op, .ldc = p.D, .sc = p.Tq * p.D, .M = p.Tq,
              .N = p.D, .K = p.Tk, .batch = n},
             batched);
  }
}

template <class T>
void backward_typed(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                    const Tensor& k, const Tensor& v, const Tensor& lse, const Tensor& mask, const AttentionParams& p) {
  using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
  constexpr bool kSame = std::is_same_v<T, A>;
  const Device dev = q.device();
  const DType dt = q.dtype(), at = dtype_of<A>();
  const int64_t ld = pad8(p.Tk), BH = p.B * p.H;
  const int64_t per = p.Tq * ld * static_cast<int64_t>(2 * sizeof(A) + (kSame ? 0 : 2 * sizeof(T)));
  const int64_t chunk = std::clamp<int64_t>(kScratchBytes / std::max<int64_t>(per, 1), 1, BH);
  const bool batched = blocks_aligned(p, dt);
  const int64_t e = static_cast<int64_t>(sizeof(T));
  cudaStream_t stream = stream_of(q);
  for (int64_t c0 = 0; c0 < BH; c0 += chunk) {
    const int64_t n = std::min(chunk, BH - c0);
    Tensor S = mp::empty({n, p.Tq, ld}, {.dtype = at, .device = dev});
    Tensor dP = mp::empty({n, p.Tq, ld}, {.dtype = at, .device = dev});
    Tensor Pz = kSame ? S : mp::empty({n, p.Tq, ld}, {.dtype = dt, .device = dev});
    Tensor dS = kSame ? dP : mp::empty({n, p.Tq, ld}, {.dtype = dt, .device = dev});
    const auto at_q = [&](const Tensor& t) { return static_cast<char*>(t.raw_data()) + c0 * p.Tq * p.D * e; };
    const auto at_k = [&](const Tensor& t) { return static_cast<char*>(t.raw_data()) + c0 * p.Tk * p.D * e; };
    // S = scale q k^T, dP' = dout v^T
    bmm_each({.device = dev.index, .ab = dt, .c = at, .A = at_q(q), .ta = false, .lda = p.D, .sa = p.Tq * p.D,
              .B = at_k(k), .tb = true, .ldb = p.D, .sb = p.Tk * p.D, .C = S.raw_data(), .ldc = ld, .sc = p.Tq * ld,
              .M = p.Tq, .N = p.Tk, .K = p.D, .batch = n, .alpha = p.scale},
             batched);
    bmm_each({.device = dev.index, .ab = dt, .c = at, .A = at_q(dout), .ta = false, .lda = p.D, .sa = p.Tq * p.D,
              .B = at_k(v), .tb = true, .ldb = p.D, .sb = p.Tk * p.D, .C = dP.raw_data(), .ldc = ld,
              .sc = p.Tq * ld, .M = p.Tq, .N = p.Tk, .K = p.D, .batch = n},
             batched);
    RowArgs<A> a = row_args<A>(p, mask, ld);
    a.bh0 = c0;
    const int64_t rows = n * p.Tq;
    attention_softmax_backward_kernel<T, A>
        <<<blocks_for(rows * kRowThreads, kRowThreads, dev.index), kRowThreads, 0, stream>>>(
            static_cast<T*>(Pz.raw_data()), static_cast<T*>(dS.raw_data()), S.data_ptr<A>(), dP.data_ptr<A>(),
            lse.data_ptr<A>() + c0 * p.Tq, rows, a);
    MP_CUDA_CHECK_LAUNCH();
    // dv = (P z)^T dout, dq = dS k, dk = dS^T q
    bmm_each({.device = dev.index, .ab = dt, .c = dt, .A = Pz.raw_data(), .ta = true, .lda = ld, .sa = p.Tq * ld,
              .B = at_q(dout), .tb = false, .ldb = p.D, .sb = p.Tq * p.D, .C = at_k(dv), .ldc = p.D,
              .sc = p.Tk * p.D, .M = p.Tk, .N = p.D, .K = p.Tq, .batch = n},
             batched);
    bmm_each({.device = dev.index, .ab = dt, .c = dt, .A = dS.raw_data(), .ta = false, .lda = ld, .sa = p.Tq * ld,
              .B = at_k(k), .tb = false, .ldb = p.D, .sb = p.Tk * p.D, .C = at_q(dq), .ldc = p.D, .sc = p.Tq * p.D,
              .M = p.Tq, .N = p.D, .K = p.Tk, .batch = n},
             batched);
    bmm_each({.device = dev.index, .ab = dt, .c = dt, .A = dS.raw_data(), .ta = true, .lda = ld, .sa = p.Tq * ld,
              .B = at_q(q), .tb = false, .ldb = p.D, .sb = p.Tq * p.D, .C = at_k(dk), .ldc = p.D, .sc = p.Tk * p.D,
              .M = p.Tk, .N = p.D, .K = p.Tq, .batch = n},
             batched);
  }
}

void attention_forward_cuda(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& mask, const AttentionParams& p) {
  DeviceGuard guard(q.device(), "scaled_dot_product_attention");
  visit_floating(q.dtype(), "scaled_dot_product_attention on CUDA", [&]<class T>() { forward_typed<T>(out, lse, q, k, v, mask, p); });
}

void attention_backward_cuda(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                             const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& /*out*/,
                             const Tensor& lse, const Tensor& mask, const AttentionParams& p) {
  DeviceGuard guard(q.device(), "scaled_dot_product_attention");
  visit_floating(q.dtype(), "scaled_dot_product_attention on CUDA", [&]<class T>() { backward_typed<T>(dq, dk, dv, dout, q, k, v, lse, mask, p); });
}

}  // namespace

MP_REGISTER_KERNEL(attention_forward_kernel, DeviceType::cuda, &attention_forward_cuda);
MP_REGISTER_KERNEL(attention_backward_kernel, DeviceType::cuda, &attention_backward_cuda);

}  // namespace mp::backend::cuda

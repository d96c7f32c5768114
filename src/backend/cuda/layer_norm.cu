// CUDA layer norm (layer_norm_forward / layer_norm_backward of norm_kernels.hpp) over the rows of x [M, N].
// Statistics are in the statistics type S (f32 for f32/f16/bf16 data, f64 for f64), with the CPU's
// formulas (cpu/layer_norm.cpp, Note [normalisation statistics on the CPU]): two-pass mean and variance whose
// sums are taken in double even for f32 data (one extra FP64 add per element, far below the memory
// time on the A100/H100 class of GPUs), the affine and backward arithmetic through the shared
// NormAffineFn / NormBackwardFn.
//
// Rows: a warp per row when N <= kWarpRowMax, else a block of kBlockRowThreads per row. Each thread walks
// its share with 16-byte vector loads after a scalar head (when x, y / dy, dx rows share their offset from a
// 16-byte boundary); the row sums are combined by a butterfly (and shared memory for blocks) and lane 0's
// value broadcast, so all threads use the same bits. The row is re-read per pass (from L1/L2).
//
// Note [CUDA layer-norm weight gradients]: dweight[j] = sum over rows of dy * xhat and dbias[j] = sum of dy
// are column sums over all M rows, taken deterministically in two stages without atomics: stage 1 gives
// each block 32 columns of a chunk of rows (8 row lanes per column, each summing every 8th row, then added
// in lane order through shared memory) and writes one double partial per (chunk, column); stage 2 adds a
// column's chunk partials in chunk order. The chunking depends only on M, N and the device's SM count.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/loops.cuh"
#include "backend/cuda/rows.cuh"
#include "backend/cuda/runtime.hpp"
#include "backend/norm_kernels.hpp"

namespace mp::backend::cuda {
namespace {

// Rows up to this long take a warp each; longer rows a block of kBlockRowThreads.
constexpr int64_t kWarpRowMax = 1024;
constexpr int kBlockRowThreads = 512;
// Threads per block of the warp-per-row kernels.
constexpr int kWarpRowBlock = 128;
// Stage 1 of the column sums: 32 columns x kColLanes row lanes per block.
constexpr int kColLanes = 8;

struct DPlus {
  __device__ MP_FORCE_INLINE double operator()(double a, double b) const { return a + b; }
};
struct D2 {
  double a, b;
};
struct D2Plus {
  __device__ MP_FORCE_INLINE D2 operator()(D2 x, D2 y) const { return {x.a + y.a, x.b + y.b}; }
};

// ---------------------------------------------------------------- forward

// w, b: [N] in S or null (1 and 0).
template <class T, int kRowThreads>
__global__ void __launch_bounds__(kRowThreads == kWarpSize ? kWarpRowBlock : kBlockRowThreads)
    ln_forward_kernel(T* __restrict__ y, acc_t<T>* __restrict__ mean, acc_t<T>* __restrict__ rstd,
                      const T* __restrict__ x, const acc_t<T>* __restrict__ w, const acc_t<T>* __restrict__ b,
                      int64_t M, int64_t N, double eps) {
  using S = acc_t<T>;
  __shared__ RowSmem smem;
  const RowSched<kRowThreads> rs;
  for (int64_t row = rs.first; row < M; row += rs.step) {
    const T* const xr[1] = {x + row * N};
    double s = 0;
    row_loop<S, false>(xr, nullptr, N, rs.tid, kRowThreads,
                       [&](const S* v, int64_t) { s += static_cast<double>(v[0]); });
    s = row_allreduce<kRowThreads>(s, DPlus{}, 0.0, smem);
    const S mu = static_cast<S>(s / static_cast<double>(N));
    const auto md = static_cast<double>(mu);
    double q = 0;
    row_loop<S, false>(xr, nullptr, N, rs.tid, kRowThreads, [&](const S* v, int64_t) {
      const double d = static_cast<double>(v[0]) - md;
      q += d * d;
    });
    q = row_allreduce<kRowThreads>(q, DPlus{}, 0.0, smem);
    const S r = static_cast<S>(1.0 / sqrt(q / static_cast<double>(N) + eps));
    if (rs.tid == 0) {
      mean[row] = mu;
      rstd[row] = r;
    }
    row_loop<S, true>(xr, y + row * N, N, rs.tid, kRowThreads, [&](const S* v, int64_t j) {
      return NormAffineFn<S>{mu, r * (w ? w[j] : S(1)), b ? b[j] : S(0)}(v[0]);
    });
  }
}

// ---------------------------------------------------------------- backward

// dx of each row (NormBackwardFn with the row's sums of dy * w and dy * w * (x - mean), in double).
template <class T, int kRowThreads>
__global__ void __launch_bounds__(kRowThreads == kWarpSize ? kWarpRowBlock : kBlockRowThreads)
    ln_backward_dx_kernel(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                          const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                          const acc_t<T>* __restrict__ w, int64_t M, int64_t N) {
  using S = acc_t<T>;
  __shared__ RowSmem smem;
  const RowSched<kRowThreads> rs;
  const double dN = static_cast<double>(N);
  for (int64_t row = rs.first; row < M; row += rs.step) {
    const T* const gx[2] = {dy + row * N, x + row * N};
    const S mu = mean[row], r = rstd[row];
    const auto md = static_cast<double>(mu);
    D2 acc{0, 0};  // a: sum(dy w), b: sum(dy w (x - mean))
    row_loop<S, false>(gx, nullptr, N, rs.tid, kRowThreads, [&](const S* v, int64_t j) {
      const auto gw = static_cast<double>(v[0] * (w ? w[j] : S(1)));
      acc.a += gw;
      acc.b += gw * (static_cast<double>(v[1]) - md);
    });
    acc = row_allreduce<kRowThreads>(acc, D2Plus{}, D2{0, 0}, smem);
    const S cb = static_cast<S>(-static_cast<double>(r) * r * r * acc.b / dN);
    const S cc = static_cast<S>(-static_cast<double>(r) * acc.a / dN);
    row_loop<S, true>(gx, dx + row * N, N, rs.tid, kRowThreads, [&](const S* v, int64_t j) {
      return NormBackwardFn<S>{(w ? w[j] : S(1)) * r, cb, cc, mu}(v[0], v[1]);
    });
  }
}

// Stage 1 of Note [CUDA layer-norm weight gradients]: block (blockIdx.x, blockIdx.y) = 32 columns from
// 32 * blockIdx.x, rows [blockIdx.y * rows_per_chunk, ...). pw / pb: [chunks, N] double partials (null
// when not wanted).
template <class T>
__global__ void ln_column_partials_kernel(double* __restrict__ pw, double* __restrict__ pb, const T* __restrict__ dy,
                                          const T* __restrict__ x, const acc_t<T>* __restrict__ mean,
                                          const acc_t<T>* __restrict__ rstd, int64_t M, int64_t N,
                                          int64_t rows_per_chunk) {
  using S = acc_t<T>;
  __shared__ double sw[kColLanes][kWarpSize + 1], sb[kColLanes][kWarpSize + 1];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kWarpSize + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk, r1 = min(r0 + rows_per_chunk, M);
  double aw = 0, ab = 0;
  if (j < N) {
    for (int64_t row = r0 + ty; row < r1; row += kColLanes) {
      const S g = device_cast<S>(dy[row * N + j]);
      if (pw) aw += static_cast<double>(g) * ((device_cast<S>(x[row * N + j]) - mean[row]) * rstd[row]);
      ab += static_cast<double>(g);
    }
  }
  sw[ty][tx] = aw;
  sb[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && j < N) {
    for (int l = 1; l < kColLanes; ++l) {
      aw += sw[l][tx];
      ab += sb[l][tx];
    }
    const int64_t o = static_cast<int64_t>(blockIdx.y) * N + j;
    if (pw) pw[o] = aw;
    if (pb) pb[o] = ab;
  }
}

// Stage 2: out[j] = sum over chunks of partial[chunk, j], in chunk order.
template <class S>
__global__ void ln_column_finish_kernel(S* __restrict__ dw, S* __restrict__ db, const double* __restrict__ pw,
                                        const double* __restrict__ pb, int64_t chunks, int64_t N) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < N;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double aw = 0, ab = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      if (dw) aw += pw[c * N + j];
      if (db) ab += pb[c * N + j];
    }
    if (dw) dw[j] = static_cast<S>(aw);
    if (db) db[j] = static_cast<S>(ab);
  }
}

// ---------------------------------------------------------------- entry points

template <class... P, class... Args>
void launch_rows(int64_t rows, int64_t n, int dev, cudaStream_t stream, void (*warp_kernel)(P...),
                 void (*block_kernel)(P...), Args... args) {
  if (n <= kWarpRowMax) {
    warp_kernel<<<blocks_for(rows * kWarpSize, kWarpRowBlock, dev), kWarpRowBlock, 0, stream>>>(args...);
  } else {
    block_kernel<<<blocks_for(rows * kBlockRowThreads, kBlockRowThreads, dev), kBlockRowThreads, 0, stream>>>(args...);
  }
  MP_CUDA_CHECK_LAUNCH();
}

// A [N] parameter as the statistics dtype (converted on the device when needed); undefined stays undefined.
Tensor param_as(const Tensor& t, DType sdt) { return !t.defined() || t.dtype() == sdt ? t : t.to(sdt); }

// Calls f.template operator()<T>() with T the element type of dtype dt when acc_t<T> is the statistics type
// S (the ops' case), else returns false so the caller converts the operands to S first.
template <class S, class F>
bool visit_data(DType dt, F&& f) {
  if (dt == dtype_of<S>()) return f.template operator()<S>(), true;
  if constexpr (std::is_same_v<S, float>) {
    if (dt == DType::f16) return f.template operator()<Half>(), true;
    if (dt == DType::bf16) return f.template operator()<BFloat16>(), true;
  }
  return false;
}

template <class S>
void ln_forward_typed(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                      const Tensor& bias, double eps) {
  const int64_t M = x.size(0), N = x.size(1);
  const DType sdt = dtype_of<S>();
  const Tensor w = param_as(weight, sdt), b = param_as(bias, sdt);
  const int dev = y.device().index;
  cudaStream_t stream = stream_of(y);
  const bool done =
      y.dtype() == x.dtype() && visit_data<S>(x.dtype(), [&]<class T>() {
        launch_rows(M, N, dev, stream, &ln_forward_kernel<T, kWarpSize>, &ln_forward_kernel<T, kBlockRowThreads>,
                    static_cast<T*>(y.raw_data()), mean.data_ptr<S>(), rstd.data_ptr<S>(),
                    static_cast<const T*>(x.raw_data()), w.defined() ? w.data_ptr<S>() : nullptr,
                    b.defined() ? b.data_ptr<S>() : nullptr, M, N, eps);
      });
  if (done) return;
  // Mixed dtypes (the op never passes them): x as S, y through an S temporary, rounded once.
  Tensor y2 = empty(y.sizes(), {.dtype = sdt, .device = y.device()});
  ln_forward_typed<S>(y2, mean, rstd, x.to(sdt), w, b, eps);
  Tensor yo = y;
  yo.copy_(y2);
}

// Stage-1 chunks for M rows and N columns: about 8 blocks per SM in all, at least 32 rows per chunk.
int64_t column_chunks(int64_t M, int64_t N, int dev) {
  const int64_t tiles = (N + kWarpSize - 1) / kWarpSize;
  const int64_t want = std::max<int64_t>(1, 8 * device_properties(dev).multiprocessors / std::max<int64_t>(tiles, 1));
  return std::clamp<int64_t>(want, 1, std::max<int64_t>(1, (M + 31) / 32));
}

template <class S>
void ln_backward_typed(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                       const Tensor& mean, const Tensor& rstd, const Tensor& weight) {
  const int64_t M = x.size(0), N = x.size(1);
  const DType sdt = dtype_of<S>();
  const Tensor w = param_as(weight, sdt);
  const Device d = x.device();
  const int dev = d.index;
  cudaStream_t stream = stream_of(x);
  const bool same = dy.dtype() == x.dtype() && (!dx.defined() || dx.dtype() == x.dtype());
  const bool done =
      same && visit_data<S>(x.dtype(), [&]<class T>() {
        const T* dyp = static_cast<const T*>(dy.raw_data());
        const T* xp = static_cast<const T*>(x.raw_data());
        const S* mp = mean.data_ptr<S>();
        const S* rp = rstd.data_ptr<S>();
        if (dx.defined() && M * N > 0)
          launch_rows(M, N, dev, stream, &ln_backward_dx_kernel<T, kWarpSize>,
                      &ln_backward_dx_kernel<T, kBlockRowThreads>, static_cast<T*>(dx.raw_data()), dyp, xp, mp, rp,
                      w.defined() ? w.data_ptr<S>() : nullptr, M, N);
        const bool need_w = dweight.defined(), need_b = dbias.defined();
        if ((!need_w && !need_b) || N == 0) return;
        S* dwp = need_w ? dweight.data_ptr<S>() : nullptr;
        S* dbp = need_b ? dbias.data_ptr<S>() : nullptr;
        if (M == 0) {  // empty sums
          if (dwp) MP_CUDA_CHECK(cudaMemsetAsync(dwp, 0, static_cast<size_t>(N) * sizeof(S), stream));
          if (dbp) MP_CUDA_CHECK(cudaMemsetAsync(dbp, 0, static_cast<size_t>(N) * sizeof(S), stream));
          return;
        }
        int64_t chunks = column_chunks(M, N, dev);
        const int64_t rows_per_chunk = (M + chunks - 1) / chunks;
        chunks = (M + rows_per_chunk - 1) / rows_per_chunk;
        const TensorOptions f64{.dtype = DType::f64, .device = d};
        Tensor pw = need_w ? empty({chunks, N}, f64) : Tensor();
        Tensor pb = need_b ? empty({chunks, N}, f64) : Tensor();
        double* pwp = need_w ? pw.data_ptr<double>() : nullptr;
        double* pbp = need_b ? pb.data_ptr<double>() : nullptr;
        const dim3 grid(static_cast<unsigned>((N + kWarpSize - 1) / kWarpSize), static_cast<unsigned>(chunks));
        ln_column_partials_kernel<T>
            <<<grid, dim3(kWarpSize, kColLanes), 0, stream>>>(pwp, pbp, dyp, xp, mp, rp, M, N, rows_per_chunk);
        MP_CUDA_CHECK_LAUNCH();
        ln_column_finish_kernel<S>
            <<<blocks_for(N, kThreads, dev), kThreads, 0, stream>>>(dwp, dbp, pwp, pbp, chunks, N);
        MP_CUDA_CHECK_LAUNCH();
      });
  if (done) return;
  // Mixed dtypes: dy and x as S, dx through an S temporary, rounded once.
  Tensor dx2 = dx.defined() ? empty(dx.sizes(), {.dtype = sdt, .device = d}) : Tensor();
  ln_backward_typed<S>(dx2, dweight, dbias, dy.dtype() == sdt ? dy : dy.to(sdt), x.dtype() == sdt ? x : x.to(sdt), mean,
                       rstd, w);
  if (dx.defined()) {
    Tensor o = dx;
    o.copy_(dx2);
  }
}

void layer_norm_forward_cuda(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                             const Tensor& weight, const Tensor& bias, double eps) {
  DeviceGuard guard(y.device(), "layer_norm");
  if (x.size(0) == 0) return;
  if (mean.dtype() == DType::f64) return ln_forward_typed<double>(y, mean, rstd, x, weight, bias, eps);
  ln_forward_typed<float>(y, mean, rstd, x, weight, bias, eps);
}

void layer_norm_backward_cuda(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                              const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight) {
  DeviceGuard guard(x.device(), "layer_norm_backward");
  if (mean.dtype() == DType::f64) return ln_backward_typed<double>(dx, dweight, dbias, dy, x, mean, rstd, weight);
  ln_backward_typed<float>(dx, dweight, dbias, dy, x, mean, rstd, weight);
}

}  // namespace

MP_REGISTER_KERNEL(layer_norm_forward_kernel, DeviceType::cuda, &layer_norm_forward_cuda);
MP_REGISTER_KERNEL(layer_norm_backward_kernel, DeviceType::cuda, &layer_norm_backward_cuda);

}  // namespace mp::backend::cuda

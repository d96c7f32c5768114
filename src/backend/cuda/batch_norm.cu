// CUDA batch norm (forward and backward over x [N, C, S]): cuDNN's batch-norm calls
// (cudnnBatchNormalizationForwardTraining / Backward, CUDNN_BATCHNORM_SPATIAL) where they fit the
// slot, mixprec's own kernels with the shared formulas (NormAffineFn, NormBackwardFn) elsewhere.
// Contract: src/backend/norm_kernels.hpp (reference: cpu/batch_norm.cpp).
//
// Note [batch norm on cuDNN]
// The slot wants, in training, the batch mean, the biased batch variance and invstd = 1/sqrt(var +
// eps) in the statistics dtype (f32 for f32/f16/bf16 data, f64 for f64), and it updates no running
// statistics (src/ops/norm.cpp does). cuDNN's forward training returns the mean and invstd
// (resultSaveMean, resultSaveInvVariance: an inverse standard deviation despite the name), but the
// variance only through its running-variance update, which uses the unbiased variance M/(M-1) var
// (M = N S values per channel). So the call gets zeroed running buffers and factor 1 (new = 1 * batch
// + 0 * old), and a tiny kernel turns the unbiased variance back into the biased one:
// var = unbiased * (M - 1) / M (M > 1 is guaranteed by the op in training), about 1 ulp from the
// variance itself. cuDNN's backward takes the saved mean/invstd and returns dx, dweight and dbias,
// exactly the slot's training contract (dweight = sum(dy (x - mean) invstd), dbias = sum(dy)).
// cuDNN runs when: x is contiguous (NCHW) f32, f16 or f64 with one dtype for x, y (dy, dx), the statistics in f32
// (f64 for f64); training; S > 1; fewer than 2^31 elements and N <= 880801 (the limits PyTorch
// applies to cuDNN's kernels); MP_CUDNN_BATCH_NORM is not 0; and, backward, dx is wanted. Mode
// CUDNN_BATCHNORM_SPATIAL (not SPATIAL_PERSISTENT, which cuDNN documents as possibly overflowing to
// NaN/inf on large values). bf16 stays on the own kernels, as in PyTorch (which does not send bf16
// batch norm to cuDNN), and so do the [N, C] case (S == 1) and eval mode.
//
// Note [batch norm own kernels]
// Forward training: per-channel statistics in two passes over blocks: each (channel, part) block
// merges its values with Welford / Chan updates in the statistics type over short runs and in
// double beyond (robust when |mean| >> std, like the CPU's shifted sums), writing (count, mean, M2)
// partials; one thread per channel merges the parts in order (deterministic) and writes mean, var
// (biased) and invstd = (S)(1 / sqrt((double)var + eps)) as the CPU does. Eval: invstd from the given
// variance the same way. Then y = NormAffineFn{mean, invstd * w, b}(x) element-wise. Backward: the
// per-channel sums sum(dy) and sum(dy (x - mean)) (per_channel_sums), a per-channel pass forming
// dweight, dbias and the NormBackwardFn constants exactly as the CPU does (in double, rounded to the
// statistics type), then dx = NormBackwardFn(dy, x) element-wise. Element-wise passes and loads use
// 16-byte vectors when S is a multiple of the vector width and the pointers are aligned. Operands of
// mixed dtypes (dy or dx of another dtype than x) are widened to the statistics type first.
// Channels-last operands (strides {S C, 1, C}, detected as on the CPU; all operands in one layout) always
// run on the own kernels: the statistics and the backward sums are column reductions of the [N S, C] matrix
// (Note [column reductions] in cudnn/common.hpp), the statistics as sums shifted by the channel's value in
// row 0 (in the statistics type over runs, in double beyond: mean = k + su / M, var = sv / M - (su / M)^2,
// formed in double); the element-wise passes vectorise along C, and when the block size is a multiple of
// C / VEC each thread keeps one set of channels and reads their constants once.
#if defined(MP_HAVE_CUDNN)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cudnn/common.hpp"
#include "backend/cuda/loops.cuh"
#include "backend/key_hash.hpp"
#include "backend/norm_kernels.hpp"
#include "backend/pointwise_kernels.hpp"

namespace mp::backend::cuda {
namespace {

// ------------------------------------------------------------------ own kernels

// Chan's merge of two (count, mean, M2) summaries, in double; an empty side leaves the other.
struct ChanMerge {
  __device__ DoubleTuple<3> operator()(const DoubleTuple<3>& a, const DoubleTuple<3>& b) const {
    if (b.v[0] == 0.0) return a;
    if (a.v[0] == 0.0) return b;
    const double n = a.v[0] + b.v[0], d = b.v[1] - a.v[1];
    return DoubleTuple<3>{{n, a.v[1] + d * (b.v[0] / n), a.v[2] + b.v[2] + d * d * (a.v[0] * (b.v[0] / n))}};
  }
};

// Runs of this many vectors merge into the double summary (bounds the statistics-type error).
constexpr int kRun = 64;

// Per-(channel, part) statistics partials of x [N, C, S] (S in units of VEC): each thread keeps a
// summary in S over runs of kRun vectors (each vector merged as a group: its own mean and M2, then
// one Chan step) and merges it into a double summary after each run; the block merges in double.
// partials: [C * parts][3] = (count, mean, M2).
template <class T, class S, int VEC>
__global__ void __launch_bounds__(kDnnThreads)
    bn_stats_partials(const T* x, int64_t C, int64_t Sv, int64_t Mv, ChannelSplit split, double* partials) {
  const int64_t blocks = C * split.parts;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t c = b / split.parts, p = b - c * split.parts;
    const int64_t j0 = p * split.chunk, j1 = j0 + split.chunk < Mv ? j0 + split.chunk : Mv;
    DoubleTuple<3> total{{0.0, 0.0, 0.0}};
    const int64_t jt = j0 + threadIdx.x;
    if (jt < j1) {
      S n = 0, mean = 0, m2 = 0;
      int run = 0;
      NcsChannelWalk w(jt, blockDim.x, c, Sv, C);
      for (int64_t j = jt; j < j1; j += blockDim.x, w.next()) {
        T raw[VEC];
        load_vec<VEC>(x + w.off * VEC, raw);
        S v[VEC];
        S vs = 0;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          v[k] = device_cast<S>(raw[k]);
          vs += v[k];
        }
        const S vm = vs / S(VEC);
        S vq = 0;
#pragma unroll
        for (int k = 0; k < VEC; ++k) vq += (v[k] - vm) * (v[k] - vm);
        const S nn = n + S(VEC), d = vm - mean;
        mean += d * (S(VEC) / nn);
        m2 += vq + d * d * (n * (S(VEC) / nn));
        n = nn;
        if (++run == kRun) {
          total = ChanMerge{}(
              total, DoubleTuple<3>{{static_cast<double>(n), static_cast<double>(mean), static_cast<double>(m2)}});
          n = mean = m2 = S(0);
          run = 0;
        }
      }
      total = ChanMerge{}(total,
                          DoubleTuple<3>{{static_cast<double>(n), static_cast<double>(mean), static_cast<double>(m2)}});
    }
    const DoubleTuple<3> r = block_combine<3>(total, DoubleTuple<3>{{0.0, 0.0, 0.0}}, ChanMerge{});
    if (threadIdx.x == 0) {
      partials[3 * b] = r.v[0];
      partials[3 * b + 1] = r.v[1];
      partials[3 * b + 2] = r.v[2];
    }
  }
}

// One thread per channel: merge the parts in order; mean, biased var, invstd as the CPU rounds them.
template <class S>
__global__ void __launch_bounds__(kDnnThreads)
    bn_stats_finalize(const double* partials, int64_t C, int64_t parts, double eps, S* mean, S* var, S* invstd) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += step) {
    DoubleTuple<3> t{{0.0, 0.0, 0.0}};
    for (int64_t p = 0; p < parts; ++p) {
      const double* q = partials + 3 * (c * parts + p);
      t = ChanMerge{}(t, DoubleTuple<3>{{q[0], q[1], q[2]}});
    }
    const S v = static_cast<S>(t.v[0] > 0.0 ? fmax(t.v[2] / t.v[0], 0.0) : 0.0);
    mean[c] = static_cast<S>(t.v[1]);
    var[c] = v;
    invstd[c] = static_cast<S>(1.0 / sqrt(static_cast<double>(v) + eps));
  }
}

// invstd = (S)(1 / sqrt((double)var + eps)) (eval mode: var is the running variance).
template <class S>
__global__ void __launch_bounds__(kDnnThreads) bn_invstd(const S* var, S* invstd, int64_t C, double eps) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += step)
    invstd[c] = static_cast<S>(1.0 / sqrt(static_cast<double>(var[c]) + eps));
}

// var = unbiased * (M - 1) / M: cuDNN's running-variance output back to the biased variance.
template <class S>
__global__ void __launch_bounds__(kDnnThreads) bn_unbias_to_biased(S* var, int64_t C, double factor) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += step)
    var[c] = static_cast<S>(static_cast<double>(var[c]) * factor);
}

// y = fk(k)(x) for the elements k of vector i (fk(k): element k's NormAffineFn), then the fused epilogue (Note
// [batch norm + add + ReLU]): y = relu?(y + r?) with y rounded to T first and the sum computed in S and
// rounded, as the add and relu kernels would (their compute type is S: f32, or f64 for f64 data).
template <class T, class S, int VEC, class Fk>
__device__ MP_FORCE_INLINE void bn_apply_vec(const T* x, T* y, const T* r, bool relu, int64_t i, const Fk& fk) {
  T v[VEC];
  load_vec<VEC>(x + i * VEC, v);
#pragma unroll
  for (int k = 0; k < VEC; ++k) v[k] = device_cast<T>(fk(k)(device_cast<S>(v[k])));
  if (r != nullptr) {
    T rv[VEC];
    load_vec<VEC>(r + i * VEC, rv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = device_cast<T>(device_cast<S>(v[k]) + device_cast<S>(rv[k]));
  }
  if (relu) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = device_cast<T>(ReluFn<S>{}(device_cast<S>(v[k])));
  }
  store_vec<VEC>(y + i * VEC, v);
}

// y = NormAffineFn{mean[c], invstd[c] * w[c], b[c]}(x), then the epilogue (bn_apply_vec); walk dims Sv, Cv:
// channel_of.
template <class T, class S, int VEC, bool ROWS>
__global__ void __launch_bounds__(kDnnThreads)
    bn_apply(const T* x, T* y, const S* mean, const S* invstd, const S* w, const S* b, int64_t total, int64_t Sv,
             int64_t Cv, const T* r, bool relu) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (start >= total) return;
  NcsIndexWalk it(start, step, Sv, Cv);
  for (int64_t i = start; i < total; i += step, it.next())
    bn_apply_vec<T, S, VEC>(x, y, r, relu, i, [&](int k) {
      const int64_t c = channel_of<ROWS, VEC>(it, k);
      return NormAffineFn<S>{mean[c], invstd[c] * w[c], b[c]};
    });
}

// bn_apply for channels-last rows of Cv vectors when the grid's step is a multiple of Cv: every vector a thread
// visits holds the same channels, whose constants it reads once.
template <class T, class S, int VEC>
__global__ void __launch_bounds__(kDnnThreads)
    bn_apply_rows(const T* x, T* y, const S* mean, const S* invstd, const S* w, const S* b, int64_t total, int64_t Cv,
                  const T* r, bool relu) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (start >= total) return;
  const int64_t c0 = start % Cv * VEC;
  NormAffineFn<S> fn[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) fn[k] = NormAffineFn<S>{mean[c0 + k], invstd[c0 + k] * w[c0 + k], b[c0 + k]};
  for (int64_t i = start; i < total; i += step) bn_apply_vec<T, S, VEC>(x, y, r, relu, i, [&](int k) { return fn[k]; });
}

// Per channel, from the double sums: dbias, dweight and the NormBackwardFn constants (a, b, c, mean)
// as cpu/batch_norm.cpp forms them. coef: [C][4].
template <class S>
__global__ void __launch_bounds__(kDnnThreads)
    bn_backward_finalize(const double* sum_dy, const double* sum_dy_xmu, const S* mean, const S* invstd, const S* w,
                         int64_t C, double M, bool training, S* dweight, S* dbias, S* coef) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < C; c += step) {
    const S r = invstd[c];
    const double sdy = sum_dy != nullptr ? sum_dy[c] : 0.0, sdyx = sum_dy_xmu != nullptr ? sum_dy_xmu[c] : 0.0;
    if (dbias != nullptr) dbias[c] = static_cast<S>(sdy);
    if (dweight != nullptr) dweight[c] = static_cast<S>(sdyx * static_cast<double>(r));
    if (coef != nullptr) {
      const double rd = static_cast<double>(r), wr = static_cast<double>(w[c]) * rd;
      coef[4 * c] = static_cast<S>(wr);
      coef[4 * c + 1] = training ? static_cast<S>(-wr * rd * rd * sdyx / M) : S(0);
      coef[4 * c + 2] = training ? static_cast<S>(-wr * sdy / M) : S(0);
      coef[4 * c + 3] = mean[c];
    }
  }
}

// dx = fk(k)(dy, x) for the elements k of vector i (fk(k): element k's NormBackwardFn).
template <class T, class S, int VEC, class Fk>
__device__ MP_FORCE_INLINE void bn_backward_vec(const T* dy, const T* x, T* dx, int64_t i, const Fk& fk) {
  T g[VEC], v[VEC];
  load_vec<VEC>(dy + i * VEC, g);
  load_vec<VEC>(x + i * VEC, v);
#pragma unroll
  for (int k = 0; k < VEC; ++k) g[k] = device_cast<T>(fk(k)(device_cast<S>(g[k]), device_cast<S>(v[k])));
  store_vec<VEC>(dx + i * VEC, g);
}

// dx = NormBackwardFn{a, b, c, mean}(dy, x) (walk dims Sv, Cv: channel_of).
template <class T, class S, int VEC, bool ROWS>
__global__ void __launch_bounds__(kDnnThreads)
    bn_backward_apply(const T* dy, const T* x, T* dx, const S* coef, int64_t total, int64_t Sv, int64_t Cv) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (start >= total) return;
  NcsIndexWalk it(start, step, Sv, Cv);
  for (int64_t i = start; i < total; i += step, it.next())
    bn_backward_vec<T, S, VEC>(dy, x, dx, i, [&](int k) {
      const S* k4 = coef + 4 * channel_of<ROWS, VEC>(it, k);
      return NormBackwardFn<S>{k4[0], k4[1], k4[2], k4[3]};
    });
}

// bn_backward_apply for channels-last rows when the grid's step is a multiple of Cv (as bn_apply_rows).
template <class T, class S, int VEC>
__global__ void __launch_bounds__(kDnnThreads)
    bn_backward_apply_rows(const T* dy, const T* x, T* dx, const S* coef, int64_t total, int64_t Cv) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (start >= total) return;
  const int64_t c0 = start % Cv * VEC;
  NormBackwardFn<S> fn[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const S* k4 = coef + 4 * (c0 + k);
    fn[k] = NormBackwardFn<S>{k4[0], k4[1], k4[2], k4[3]};
  }
  for (int64_t i = start; i < total; i += step) bn_backward_vec<T, S, VEC>(dy, x, dx, i, [&](int k) { return fn[k]; });
}

// Shifted moments down one column of channels-last rows (Note [column reductions]): u = x - k, v = u^2 with
// k = the column's value in row 0, so the sums stay small when |mean| >> std.
template <class T, class S>
struct ShiftedMoments {
  using Stat = S;
  const T* x;
  __device__ S constant(int64_t c) const { return device_cast<S>(x[c]); }
  __device__ MP_FORCE_INLINE void add(S& u, S& v, T a, T, S k) const {
    const S d = device_cast<S>(a) - k;
    u += d;
    v += d * d;
  }
};

// One warp per channel: the shifted sums' parts added (warp_part_sums), then mean = k + su / M, the biased
// var = sv / M - (su / M)^2 (at least 0) and invstd = (S)(1 / sqrt((double)var + eps)) as the CPU rounds them.
template <class T, class S>
__global__ void __launch_bounds__(kDnnThreads)
    bn_shifted_finalize(const double* partials, const T* x, int64_t C, int64_t parts, double M, double eps, S* mean,
                        S* var, S* invstd) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); c < C; c += warps) {
    double su, sv;
    warp_part_sums(partials, c, parts, su, sv);
    if ((threadIdx.x & 31u) == 0) {
      const double m1 = su / M;
      const S v = static_cast<S>(fmax(sv / M - m1 * m1, 0.0));
      mean[c] = static_cast<S>(static_cast<double>(device_cast<S>(x[c])) + m1);
      var[c] = v;
      invstd[c] = static_cast<S>(1.0 / sqrt(static_cast<double>(v) + eps));
    }
  }
}

// ------------------------------------------------------------------ host side

template <class T>
using StatT = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Calls f.template operator()<T>() for x's element type.
template <class F>
void visit_data_type(DType dt, F&& f) {
  switch (dt) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    default: MP_FAIL("batch_norm on cuda: expected f32, f64, f16 or bf16 data, got ", dtype_name(dt));
  }
}

// y = affine normalisation of x with mean/invstd/w/b ([C], statistics type), then relu?(y + residual?) (residual
// undefined or of y's dtype and layout), own kernel.
template <class T>
void launch_apply(const Tensor& y, const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& w,
                  const Tensor& b, const Tensor& residual, bool relu) {
  using S = StatT<T>;
  if (x.numel() == 0) return;
  const bool rows = channels_last_rows(x);
  const auto* rp = residual.defined() ? static_cast<const T*>(residual.raw_data()) : nullptr;
  const ElementwiseShape e = elementwise_shape<T>(x, rows, {x.raw_data(), y.raw_data(), rp});
  const unsigned grid = blocks_for(e.total, kDnnThreads, x.device().index);
  const auto* xp = static_cast<const T*>(x.raw_data());
  auto* yp = static_cast<T*>(y.raw_data());
  const auto *mp_ = static_cast<const S*>(mean.raw_data()), *ip = static_cast<const S*>(invstd.raw_data());
  const auto *wp = static_cast<const S*>(w.raw_data()), *bp = static_cast<const S*>(b.raw_data());
  launch_elementwise<T>(e, rows, [&]<int V, bool R>() {
    if constexpr (R) {
      if (kDnnThreads % e.Cv == 0) {  // every step a multiple of Cv: fixed channels per thread
        bn_apply_rows<T, S, V>
            <<<grid, kDnnThreads, 0, stream_of(x)>>>(xp, yp, mp_, ip, wp, bp, e.total, e.Cv, rp, relu);
        return;
      }
    }
    bn_apply<T, S, V, R>
        <<<grid, kDnnThreads, 0, stream_of(x)>>>(xp, yp, mp_, ip, wp, bp, e.total, e.Sv, e.Cv, rp, relu);
  });
}

// Batch statistics of x into mean/var/invstd with the own kernels.
template <class T>
void launch_stats(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& invstd, double eps) {
  using S = StatT<T>;
  const int64_t N = x.size(0), C = x.size(1), SP = x.size(2);
  const int dev = x.device().index;
  if (channels_last_rows(x)) {  // a column reduction of the [N S, C] matrix (Note [column reductions])
    const T* xp = static_cast<const T*>(x.raw_data());
    const ColumnTiling t = column_tiling(N * SP, C, column_vec<T>(C, xp, nullptr), dev);
    Tensor partials = mp::empty({C * t.parts * 2}, {.dtype = DType::f64, .device = x.device()});
    auto* pp = static_cast<double*>(partials.raw_data());
    launch_column_sums(t, xp, static_cast<const T*>(nullptr), N * SP, C, ShiftedMoments<T, S>{xp}, pp, dev);
    bn_shifted_finalize<T, S><<<blocks_for(C * 32, kDnnThreads, dev), kDnnThreads, 0, stream_of(x)>>>(
        pp, xp, C, t.parts, static_cast<double>(N) * static_cast<double>(SP), eps, static_cast<S*>(mean.raw_data()),
        static_cast<S*>(var.raw_data()), static_cast<S*>(invstd.raw_data()));
    MP_CUDA_CHECK_LAUNCH();
    return;
  }
  const int vec = vec_width_for<T>(SP, {x.raw_data()});
  const int64_t Sv = SP / vec, Mv = N * Sv;
  const ChannelSplit split = channel_split(C, Mv, dev);
  Tensor partials = mp::empty({C * split.parts * 3}, {.dtype = DType::f64, .device = x.device()});
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(C * split.parts, INT32_MAX));
  const auto* xp = static_cast<const T*>(x.raw_data());
  auto* pp = static_cast<double*>(partials.raw_data());
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  if (vec == kVec)
    bn_stats_partials<T, S, kVec><<<grid, kDnnThreads, 0, stream_of(x)>>>(xp, C, Sv, Mv, split, pp);
  else
    bn_stats_partials<T, S, 1><<<grid, kDnnThreads, 0, stream_of(x)>>>(xp, C, Sv, Mv, split, pp);
  MP_CUDA_CHECK_LAUNCH();
  bn_stats_finalize<S><<<blocks_for(C, kDnnThreads, dev), kDnnThreads, 0, stream_of(x)>>>(
      pp, C, split.parts, eps, static_cast<S*>(mean.raw_data()), static_cast<S*>(var.raw_data()),
      static_cast<S*>(invstd.raw_data()));
  MP_CUDA_CHECK_LAUNCH();
}

// Whether this batch norm call may go to cuDNN (Note [batch norm on cuDNN]).
bool cudnn_fits(const Tensor& x, const Tensor& stats) {
  const DType dt = x.dtype();
  const int64_t N = x.size(0), C = x.size(1), SP = x.size(2);
  return cudnn_options().batch_norm && x.is_contiguous() &&
         (dt == DType::f32 || dt == DType::f16 || dt == DType::f64) &&
         stats.dtype() == (dt == DType::f64 ? DType::f64 : DType::f32) && SP > 1 && N <= 880801 &&
         fits_int(x.numel()) && fits_int(C) && is_aligned(x.raw_data(), 16);
}

// Descriptors of x [N, C, S, 1] and of its [1, C, 1, 1] statistics, built once per (dtype, shape)
// and device, kept for the process; only touched while the device's CudnnHandle is held (Note
// [cuDNN handle]).
struct BnPlan {
  CudnnTensorDescriptor x, stats;
};

using BnKey = std::array<int64_t, 4>;

using BnPlanMap = std::unordered_map<BnKey, std::unique_ptr<BnPlan>, KeyHash<BnKey>>;

// The plan for x on its device; the caller holds that device's CudnnHandle.
const BnPlan& bn_plan(const Tensor& x) {
  BnPlanMap& cache = per_device<BnPlanMap>(x.device().index);
  const BnKey key{static_cast<int64_t>(x.dtype()), x.size(0), x.size(1), x.size(2)};
  auto it = cache.find(key);
  if (it == cache.end()) {
    auto plan = std::make_unique<BnPlan>();
    plan->x.set_nchw(cudnn_dtype(x.dtype(), "batch_norm"), x.size(0), x.size(1), x.size(2), 1);
    MP_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(plan->stats.get(), plan->x.get(), CUDNN_BATCHNORM_SPATIAL));
    it = cache.emplace(key, std::move(plan)).first;
  }
  return *it->second;
}

std::string bn_context(const Tensor& x) {
  return detail::str_cat("batch_norm ", dtype_name(x.dtype()), " on [", x.size(0), ", ", x.size(1), ", ", x.size(2),
                         "]");
}

void cudnn_forward_training(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd,
                            const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  const Device dev = x.device();
  const int64_t C = x.size(1), M = x.size(0) * x.size(2);
  cudaStream_t stream = stream_of(x);
  const size_t sbytes = static_cast<size_t>(C) * mean.element_size();
  // Running buffers of cuDNN's update: zeroed, so that factor 1 leaves exactly the batch values.
  const Tensor running_mean = mp::empty({C}, {.dtype = mean.dtype(), .device = dev});
  MP_CUDA_CHECK(cudaMemsetAsync(running_mean.raw_data(), 0, sbytes, stream));
  MP_CUDA_CHECK(cudaMemsetAsync(var.raw_data(), 0, sbytes, stream));
  const Tensor yo = is_aligned(y.raw_data(), 16) ? y : mp::empty(y.sizes(), {.dtype = y.dtype(), .device = dev});
  {
    CudnnHandle h(dev.index);
    const BnPlan& d = bn_plan(x);
    const cudnnDataType_t sc = mean.dtype() == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    MP_CUDNN_CHECK_CTX(cudnnBatchNormalizationForwardTraining(
                           h.get(), CUDNN_BATCHNORM_SPATIAL, cudnn_scale(sc, 1.0), cudnn_scale(sc, 0.0), d.x.get(),
                           x.raw_data(), d.x.get(), yo.raw_data(), d.stats.get(), w.raw_data(), b.raw_data(), 1.0,
                           running_mean.raw_data(), var.raw_data(), eps, mean.raw_data(), invstd.raw_data()),
                       bn_context(x));
  }
  const double factor = static_cast<double>(M - 1) / static_cast<double>(M);
  const unsigned grid = blocks_for(C, kDnnThreads, dev.index);
  if (mean.dtype() == DType::f64)
    bn_unbias_to_biased<double><<<grid, kDnnThreads, 0, stream>>>(static_cast<double*>(var.raw_data()), C, factor);
  else
    bn_unbias_to_biased<float><<<grid, kDnnThreads, 0, stream>>>(static_cast<float*>(var.raw_data()), C, factor);
  MP_CUDA_CHECK_LAUNCH();
  if (yo.raw_data() != y.raw_data())
    MP_CUDA_CHECK(cudaMemcpyAsync(y.raw_data(), yo.raw_data(), static_cast<size_t>(y.numel()) * y.element_size(),
                                  cudaMemcpyDeviceToDevice, stream));
}

// The compute type of the element-wise steps of the fused epilogue (as the add / relu ops pick it).
DType epilogue_compute(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

// Note [batch norm + add + ReLU] on CUDA: the own apply kernel (channels-last data, eval, f64) adds the residual
// and applies the ReLU itself; after cuDNN's batch norm (contiguous NCHW training) they run as the element-wise
// kernels the unfused ops would launch. The backward's mask is one relu_backward kernel writing dz, which the
// sums and dx kernels then read (masking inside the column sums is left for when it can be measured).
void bn_forward_epilogue(const Tensor& y, const Tensor& residual, bool relu) {
  const auto pw = pointwise_kernel.get(y.device());
  if (residual.defined()) pw(PointwiseOp::add, y, std::vector<Tensor>{y, residual}, epilogue_compute(y.dtype()), {});
  if (relu) pw(PointwiseOp::relu, y, std::vector<Tensor>{y}, epilogue_compute(y.dtype()), {});
}

void batch_norm_forward_cuda(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd,
                             const Tensor& x, const Tensor& weight, const Tensor& bias, bool training, double eps,
                             const Tensor& residual, bool relu) {
  DeviceGuard guard(x.device(), "batch_norm");
  MP_ASSERT(x.dim() == 3 && (x.is_contiguous() || channels_last_rows(x)) && same_dense_layout(y, x),
            "batch_norm kernel: expected x and y [N, C, S], both contiguous or both channels-last, got ", x.describe(),
            " and ", y.describe());
  const DType sdt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  MP_ASSERT(mean.dtype() == sdt && var.dtype() == sdt && invstd.dtype() == sdt && mean.is_contiguous() &&
                var.is_contiguous() && invstd.is_contiguous(),
            "batch_norm kernel: statistics must be contiguous ", dtype_name(sdt));
  const Device dev = x.device();
  const int64_t C = x.size(1);
  if (C == 0) return;
  const Tensor w = param_vector(weight, C, sdt, 1.0, dev), b = param_vector(bias, C, sdt, 0.0, dev);
  // Mixed dtypes (y not in x's dtype): compute into a tensor of x's dtype, convert at the end.
  const Tensor yo = y.dtype() == x.dtype() ? y : empty_like_layout(y, x.dtype());
  // The epilogue goes into the own apply kernel when the data is in one dtype, else element-wise after.
  const bool fuse = yo.raw_data() == y.raw_data() && (!residual.defined() || residual.dtype() == y.dtype());
  bool epilogue_done = false;
  if (training && x.numel() > 0 && cudnn_fits(x, mean)) {
    cudnn_forward_training(yo, mean, var, invstd, x, w, b, eps);
  } else {
    epilogue_done = fuse;
    visit_data_type(x.dtype(), [&]<class T>() {
      using S = StatT<T>;
      if (training) {
        launch_stats<T>(x, mean, var, invstd, eps);
      } else {
        bn_invstd<S><<<blocks_for(C, kDnnThreads, dev.index), kDnnThreads, 0, stream_of(x)>>>(
            static_cast<const S*>(var.raw_data()), static_cast<S*>(invstd.raw_data()), C, eps);
        MP_CUDA_CHECK_LAUNCH();
      }
      launch_apply<T>(yo, x, mean, invstd, w, b, fuse ? residual : Tensor(), fuse && relu);
    });
  }
  if (yo.raw_data() != y.raw_data()) convert_dtype_into(y, yo);
  if (!epilogue_done) bn_forward_epilogue(y, residual, relu);
}

bool cudnn_backward(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                    const Tensor& mean, const Tensor& invstd, const Tensor& w) {
  if (!dx.defined() || dy.dtype() != x.dtype() || dx.dtype() != x.dtype() || !cudnn_fits(x, mean) ||
      !is_aligned(dy.raw_data(), 16) || !is_aligned(dx.raw_data(), 16))
    return false;
  const Device dev = x.device();
  const int64_t C = x.size(1);
  const Tensor dw = dweight.defined() ? dweight : mp::empty({C}, {.dtype = mean.dtype(), .device = dev});
  const Tensor db = dbias.defined() ? dbias : mp::empty({C}, {.dtype = mean.dtype(), .device = dev});
  CudnnHandle h(dev.index);
  const BnPlan& d = bn_plan(x);
  const cudnnDataType_t sc = mean.dtype() == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const void* one = cudnn_scale(sc, 1.0);
  const void* zero = cudnn_scale(sc, 0.0);
  // epsilon is only used by cuDNN when no saved statistics are passed; they always are here.
  MP_CUDNN_CHECK_CTX(
      cudnnBatchNormalizationBackward(h.get(), CUDNN_BATCHNORM_SPATIAL, one, zero, one, zero, d.x.get(), x.raw_data(),
                                      d.x.get(), dy.raw_data(), d.x.get(), dx.raw_data(), d.stats.get(), w.raw_data(),
                                      dw.raw_data(), db.raw_data(), 1e-5, mean.raw_data(), invstd.raw_data()),
      bn_context(x));
  return true;
}

void batch_norm_backward_cuda(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy_in,
                              const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                              bool training, const Tensor& y, const Tensor& dz) {
  DeviceGuard guard(x.device(), "batch_norm backward");
  // The fused ReLU: dy masked first (Note [batch norm + add + ReLU] on CUDA).
  Tensor dy = dy_in;
  if (y.defined()) {
    dy = dz.defined() ? dz : empty_like_layout(dy_in, dy_in.dtype());
    pointwise_kernel.get(x.device())(PointwiseOp::relu_backward, dy, std::vector<Tensor>{dy_in, y},
                                     epilogue_compute(dy_in.dtype()), {});
  }
  MP_ASSERT(x.dim() == 3 && (x.is_contiguous() || channels_last_rows(x)) && same_dense_layout(dy, x) &&
                (!dx.defined() || same_dense_layout(dx, x)),
            "batch_norm backward kernel: expected x, dy, dx [N, C, S], all contiguous or all channels-last");
  const DType sdt = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  MP_ASSERT(mean.dtype() == sdt && invstd.dtype() == sdt && (!dweight.defined() || dweight.dtype() == sdt) &&
                (!dbias.defined() || dbias.dtype() == sdt),
            "batch_norm backward kernel: statistics and parameter gradients must be ", dtype_name(sdt));
  const Device dev = x.device();
  const int64_t N = x.size(0), C = x.size(1), SP = x.size(2);
  if (C == 0) return;
  const Tensor w = param_vector(weight, C, sdt, 1.0, dev);
  const Tensor mc = param_vector(mean, C, sdt, 0.0, dev), rc = param_vector(invstd, C, sdt, 1.0, dev);
  if (training && x.numel() > 0 && cudnn_backward(dx, dweight, dbias, dy, x, mc, rc, w)) return;

  // Own kernels. Mixed dtypes: x and dy widened to the statistics type (exact), dx computed in it.
  const bool same = dy.dtype() == x.dtype();
  const DType cdt = same ? x.dtype() : sdt;
  auto widen = [&](const Tensor& t) {
    if (t.dtype() == cdt) return t;
    Tensor o = empty_like_layout(t, cdt);
    convert_dtype_into(o, t);
    return o;
  };
  const Tensor xc = widen(x), dyc = widen(dy);
  const Tensor dxo = !dx.defined() || dx.dtype() == cdt ? dx : empty_like_layout(dx, cdt);
  const bool need_sums = dweight.defined() || dbias.defined() || (training && dx.defined());
  Tensor sdy, sdyx;
  if (need_sums && x.numel() > 0) {
    sdy = mp::empty({C}, {.dtype = DType::f64, .device = dev});
    sdyx = mp::empty({C}, {.dtype = DType::f64, .device = dev});
    per_channel_sums(sdy, sdyx, dyc, xc, mc);
  }
  const Tensor coef = dx.defined() ? mp::empty({C * 4}, {.dtype = sdt, .device = dev}) : Tensor();
  visit_data_type(cdt, [&]<class T>() {
    using S = StatT<T>;
    cudaStream_t stream = stream_of(x);
    bn_backward_finalize<S><<<blocks_for(C, kDnnThreads, dev.index), kDnnThreads, 0, stream>>>(
        sdy.defined() ? static_cast<const double*>(sdy.raw_data()) : nullptr,
        sdyx.defined() ? static_cast<const double*>(sdyx.raw_data()) : nullptr, static_cast<const S*>(mc.raw_data()),
        static_cast<const S*>(rc.raw_data()), static_cast<const S*>(w.raw_data()), C,
        static_cast<double>(N) * static_cast<double>(SP), training,
        dweight.defined() ? static_cast<S*>(dweight.raw_data()) : nullptr,
        dbias.defined() ? static_cast<S*>(dbias.raw_data()) : nullptr,
        coef.defined() ? static_cast<S*>(coef.raw_data()) : nullptr);
    MP_CUDA_CHECK_LAUNCH();
    if (!dx.defined() || x.numel() == 0) return;
    const bool rows = channels_last_rows(xc);
    const ElementwiseShape e = elementwise_shape<T>(xc, rows, {dyc.raw_data(), xc.raw_data(), dxo.raw_data()});
    const unsigned grid = blocks_for(e.total, kDnnThreads, dev.index);
    const auto* gp = static_cast<const T*>(dyc.raw_data());
    const auto* xp = static_cast<const T*>(xc.raw_data());
    auto* op = static_cast<T*>(dxo.raw_data());
    const auto* kp = static_cast<const S*>(coef.raw_data());
    launch_elementwise<T>(e, rows, [&]<int V, bool R>() {
      if constexpr (R) {
        if (kDnnThreads % e.Cv == 0) {  // fixed channels per thread (as in launch_apply)
          bn_backward_apply_rows<T, S, V><<<grid, kDnnThreads, 0, stream>>>(gp, xp, op, kp, e.total, e.Cv);
          return;
        }
      }
      bn_backward_apply<T, S, V, R><<<grid, kDnnThreads, 0, stream>>>(gp, xp, op, kp, e.total, e.Sv, e.Cv);
    });
  });
  if (dx.defined() && dxo.raw_data() != dx.raw_data()) convert_dtype_into(dx, dxo);
}

}  // namespace

MP_REGISTER_KERNEL(batch_norm_forward_kernel, DeviceType::cuda, &batch_norm_forward_cuda);
MP_REGISTER_KERNEL(batch_norm_backward_kernel, DeviceType::cuda, &batch_norm_backward_cuda);

}  // namespace mp::backend::cuda

#endif  // MP_HAVE_CUDNN

// CUDA 2-D pooling (the slots of pool_kernels.hpp): max, average and adaptive average, forward and
// backward, over contiguous NCHW planes. Elements are loaded to the compute type A (f32 for f32/f16/bf16,
// f64 for f64: acc_t of the dtype), results are rounded once when stored, as on the CPU (cpu/pool.cpp).
//
// Note [CUDA pooling: same sums as the CPU]
// Every output and every gradient is a sum taken in the CPU's order, so results match the CPU bit for bit
// (except the 1x1 adaptive average, whose CPU plane sum uses partial sums in another order):
//  * Forward: one thread per output scans its window row by row (max pool: update when v > max or v is
//    NaN, so ties keep the first and the last NaN wins; the index is the flat ih * W + iw in the plane).
//  * Average / adaptive backward: gather. One thread per input element walks the outputs whose windows
//    contain it, in row-major output order, adding dy / divisor into 0: the CPU's scatter adds them to the
//    zeroed plane in that same order. No atomics, deterministic.
//  * Max-pool backward: the slot gets only the saved indices, not the window, so which outputs may point at
//    an input is unknown and a gather is impossible. One warp per plane scatters the plane's dy in output
//    order, 32 outputs at a time; outputs of one group of 32 that hit the same input are added one after
//    the other in lane order (__match_any_sync ranks them), so each input receives its contributions in
//    output order, like the CPU loop, deterministically and without atomics. 16-bit planes accumulate in
//    an f32 scratch tensor and are rounded once at the end.
#include <cuda_runtime_api.h>

#include <type_traits>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/loops.cuh"
#include "backend/cuda/runtime.hpp"
#include "backend/pool_kernels.hpp"

namespace mp::backend::cuda {
namespace {

// Threads per block of the one-thread-per-element kernels.
constexpr int kPoolThreads = 256;
// Warps per block of the warp-per-plane kernels.
constexpr int kPlaneWarps = 8;

// Linear index -> (plane, row, column) of a [P, R, Cc] iteration space.
struct Decomp {
  IntDivider plane;  // R * Cc
  IntDivider cols;   // Cc
  bool use32;        // every index < 2^31
  __device__ MP_FORCE_INLINE void get(int64_t e, int64_t& p, int64_t& r, int64_t& c) const {
    if (use32) {
      const uint32_t u = static_cast<uint32_t>(e);
      const uint32_t pq = plane.div32(u);
      const uint32_t rem = u - pq * static_cast<uint32_t>(plane.d64);
      const uint32_t rq = cols.div32(rem);
      p = pq;
      r = rq;
      c = rem - rq * static_cast<uint32_t>(cols.d64);
    } else {
      p = e / plane.d64;
      const int64_t rem = e - p * plane.d64;
      r = rem / cols.d64;
      c = rem - r * cols.d64;
    }
  }
};

Decomp decomp(int64_t numel, int64_t rows, int64_t cols) {
  return {IntDivider(std::max<int64_t>(rows * cols, 1)), IntDivider(std::max<int64_t>(cols, 1)), numel <= INT32_MAX};
}

// Fixed-window geometry passed to the kernels.
struct Geom {
  int64_t H, W, OH, OW;
  int64_t kh, kw, sh, sw, ph, pw;
};

Geom geom(int64_t H, int64_t W, int64_t OH, int64_t OW, const Pool2dWindow& w) {
  return {H, W, OH, OW, w.kernel[0], w.kernel[1], w.stride[0], w.stride[1], w.padding[0], w.padding[1]};
}


// Floor division for a positive divisor.
__device__ MP_FORCE_INLINE int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

#define MP_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// ----------------------------------------------------------------------------------------- max pool

template <class T, class I>
__global__ void max_pool_forward_kernel(T* __restrict__ out, I* __restrict__ indices, const T* __restrict__ x, Geom g,
                                        int64_t numel, Decomp d) {
  using A = acc_t<T>;
  MP_GRID_STRIDE(e, numel) {
    int64_t p, oy, ox;
    d.get(e, p, oy, ox);
    const T* xp = x + p * g.H * g.W;
    const int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
    const int64_t y1 = min(y0 + g.kh, g.H), x1 = min(x0 + g.kw, g.W);
    const int64_t ys = max(y0, int64_t{0}), xs = max(x0, int64_t{0});
    // Padding is -inf: only the in-bounds part is read. NaN wins; ties keep the first (cpu/pool.cpp).
    int64_t best = ys * g.W + xs;
    A m = neg_inf<A>();
    for (int64_t iy = ys; iy < y1; ++iy)
      for (int64_t ix = xs; ix < x1; ++ix) {
        const A v = device_cast<A>(xp[iy * g.W + ix]);
        if (v > m || v != v) {
          m = v;
          best = iy * g.W + ix;
        }
      }
    out[e] = device_cast<T>(m);
    indices[e] = static_cast<I>(best);
  }
}

// Note [CUDA pooling: same sums as the CPU], max-pool backward. acc is dx itself when T is A, else the
// f32 scratch (then rounded into dx at the end of each plane).
template <class T, class I>
__global__ void max_pool_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, const I* __restrict__ indices,
                                         acc_t<T>* __restrict__ scratch, int64_t planes, int64_t in_plane,
                                         int64_t out_plane) {
  using A = acc_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t p = warp; p < planes; p += nwarps) {
    A* acc;
    if constexpr (std::is_same_v<T, A>)
      acc = dx + p * in_plane;
    else
      acc = scratch + p * in_plane;
    for (int64_t i = lane; i < in_plane; i += kWarpSize) acc[i] = A(0);
    __syncwarp();
    const T* g = dy + p * out_plane;
    const I* ip = indices + p * out_plane;
    for (int64_t o0 = 0; o0 < out_plane; o0 += kWarpSize) {
      const int64_t o = o0 + lane;
      const bool active = o < out_plane;
      const long long k = active ? static_cast<long long>(ip[o]) : -1;
      const A v = active ? device_cast<A>(g[o]) : A(0);
      // Lanes hitting the same input add in lane (= output) order, one rank per step.
      const unsigned peers = __match_any_sync(0xffffffffu, k);
      const unsigned rank = static_cast<unsigned>(__popc(peers & ((1u << lane) - 1u)));
      const unsigned max_rank = __reduce_max_sync(0xffffffffu, active ? rank : 0u);
      const bool valid = active && k >= 0 && k < in_plane;
      for (unsigned r = 0; r <= max_rank; ++r) {
        if (valid && rank == r) acc[k] += v;
        __syncwarp();
      }
    }
    if constexpr (!std::is_same_v<T, A>) {
      T* d = dx + p * in_plane;
      for (int64_t i = lane; i < in_plane; i += kWarpSize) d[i] = device_cast<T>(acc[i]);
      __syncwarp();
    }
  }
}

// ----------------------------------------------------------------------------------------- average pool

// PyTorch's average-pool window of output (oy, ox) (cpu/pool.cpp avg_window): in-bounds rows [y0, y1),
// columns [x0, x1) and the divisor.
struct AvgWin {
  int64_t y0, y1, x0, x1, divisor;
};

__device__ MP_FORCE_INLINE AvgWin avg_window(int64_t oy, int64_t ox, const Geom& g, bool count_include_pad) {
  int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
  int64_t y1 = min(y0 + g.kh, g.H + g.ph), x1 = min(x0 + g.kw, g.W + g.pw);
  const int64_t padded = (y1 - y0) * (x1 - x0);
  y0 = max(y0, int64_t{0});
  x0 = max(x0, int64_t{0});
  y1 = min(y1, g.H);
  x1 = min(x1, g.W);
  const int64_t inside = max(y1 - y0, int64_t{0}) * max(x1 - x0, int64_t{0});
  return {y0, y1, x0, x1, count_include_pad ? padded : inside};
}

template <class T>
__global__ void avg_pool_forward_kernel(T* __restrict__ out, const T* __restrict__ x, Geom g, bool cip, int64_t numel,
                                        Decomp d) {
  using A = acc_t<T>;
  MP_GRID_STRIDE(e, numel) {
    int64_t p, oy, ox;
    d.get(e, p, oy, ox);
    const T* xp = x + p * g.H * g.W;
    const AvgWin w = avg_window(oy, ox, g, cip);
    A s = 0;
    for (int64_t iy = w.y0; iy < w.y1; ++iy)
      for (int64_t ix = w.x0; ix < w.x1; ++ix) s += device_cast<A>(xp[iy * g.W + ix]);
    out[e] = device_cast<T>(w.divisor > 0 ? s / static_cast<A>(w.divisor) : A(0));
  }
}

// Gather (Note [CUDA pooling: same sums as the CPU]): input (iy, ix) lies in the windows of outputs oy with
// oy * sh - ph <= iy < oy * sh - ph + kh (the clipping to H + ph never excludes an input row), likewise ox.
template <class T>
__global__ void avg_pool_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, Geom g, bool cip, int64_t numel,
                                         Decomp d) {
  using A = acc_t<T>;
  MP_GRID_STRIDE(e, numel) {
    int64_t p, iy, ix;
    d.get(e, p, iy, ix);
    const T* gp = dy + p * g.OH * g.OW;
    const int64_t oy0 = max(floor_div(iy + g.ph - g.kh, g.sh) + 1, int64_t{0});
    const int64_t oy1 = min((iy + g.ph) / g.sh, g.OH - 1);
    const int64_t ox0 = max(floor_div(ix + g.pw - g.kw, g.sw) + 1, int64_t{0});
    const int64_t ox1 = min((ix + g.pw) / g.sw, g.OW - 1);
    A s = 0;
    for (int64_t oy = oy0; oy <= oy1; ++oy)
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        const AvgWin w = avg_window(oy, ox, g, cip);
        if (w.divisor <= 0 || iy < w.y0 || iy >= w.y1 || ix < w.x0 || ix >= w.x1) continue;
        s += device_cast<A>(gp[oy * g.OW + ox]) / static_cast<A>(w.divisor);
      }
    dx[e] = device_cast<T>(s);
  }
}

// ----------------------------------------------------------------------------------------- adaptive average

template <class T>
__global__ void adaptive_avg_forward_kernel(T* __restrict__ out, const T* __restrict__ x, Geom g, int64_t numel,
                                            Decomp d) {
  using A = acc_t<T>;
  MP_GRID_STRIDE(e, numel) {
    int64_t p, oy, ox;
    d.get(e, p, oy, ox);
    const T* xp = x + p * g.H * g.W;
    const int64_t y0 = adaptive_start(oy, g.H, g.OH), y1 = adaptive_end(oy, g.H, g.OH);
    const int64_t x0 = adaptive_start(ox, g.W, g.OW), x1 = adaptive_end(ox, g.W, g.OW);
    A s = 0;
    for (int64_t iy = y0; iy < y1; ++iy)
      for (int64_t ix = x0; ix < x1; ++ix) s += device_cast<A>(xp[iy * g.W + ix]);
    out[e] = device_cast<T>(s / static_cast<A>((y1 - y0) * (x1 - x0)));
  }
}

// Global average (1x1 output): one warp per plane, a strided partial sum per lane and a butterfly.
template <class T>
__global__ void global_avg_forward_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t planes, int64_t n) {
  using A = acc_t<T>;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t p = warp; p < planes; p += nwarps) {
    const T* xp = x + p * n;
    A s = 0;
    for (int64_t i = lane; i < n; i += kWarpSize) s += device_cast<A>(xp[i]);
    s = warp_reduce(s, [](A a, A b) { return a + b; });
    if (lane == 0) out[p] = device_cast<T>(s / static_cast<A>(n));
  }
}

// Gather: input row iy lies in bins oy with adaptive_start(oy) <= iy < adaptive_end(oy), i.e. oy from
// floor(iy * OH / H) to ceil((iy + 1) * OH / H) - 1 (each bin re-checked), likewise columns.
template <class T>
__global__ void adaptive_avg_backward_kernel(T* __restrict__ dx, const T* __restrict__ dy, Geom g, int64_t numel,
                                             Decomp d) {
  using A = acc_t<T>;
  MP_GRID_STRIDE(e, numel) {
    int64_t p, iy, ix;
    d.get(e, p, iy, ix);
    const T* gp = dy + p * g.OH * g.OW;
    const int64_t oy0 = (iy * g.OH) / g.H, oy1 = min(((iy + 1) * g.OH + g.H - 1) / g.H - 1, g.OH - 1);
    const int64_t ox0 = (ix * g.OW) / g.W, ox1 = min(((ix + 1) * g.OW + g.W - 1) / g.W - 1, g.OW - 1);
    A s = 0;
    for (int64_t oy = oy0; oy <= oy1; ++oy) {
      const int64_t y0 = adaptive_start(oy, g.H, g.OH), y1 = adaptive_end(oy, g.H, g.OH);
      if (iy < y0 || iy >= y1) continue;
      for (int64_t ox = ox0; ox <= ox1; ++ox) {
        const int64_t x0 = adaptive_start(ox, g.W, g.OW), x1 = adaptive_end(ox, g.W, g.OW);
        if (ix < x0 || ix >= x1) continue;
        s += device_cast<A>(gp[oy * g.OW + ox]) / static_cast<A>((y1 - y0) * (x1 - x0));
      }
    }
    dx[e] = device_cast<T>(s);
  }
}

// ----------------------------------------------------------------------------------------- entry points

// The compute type of a floating dtype as a dtype (acc_t: f64 for f64, else f32).
DType compute_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

// Runs run(out', in') with out' and in' of one floating dtype: the tensors themselves when their dtypes
// agree (the ops always pass matching dtypes), else in' converted to the compute dtype `cd` (the CPU's
// visit_compute of the same operand) and out' a cd temporary copied into out afterwards: the CPU's
// semantics (load as A, round once on store).
template <class F>
void with_common_dtype(const Tensor& out, const Tensor& in, DType cd, F&& run) {
  if (out.dtype() == in.dtype()) return run(out, in);
  Tensor in2 = in.dtype() == cd ? in : in.to(cd);
  Tensor out2 = out.dtype() == cd ? out : empty(out.sizes(), {.dtype = cd, .device = out.device()});
  run(out2, in2);
  if (!out2.is_alias_of(out)) {
    Tensor o = out;
    o.copy_(out2);
  }
}

void max_pool2d_forward_cuda(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dWindow& w) {
  DeviceGuard guard(out.device(), "max_pool2d");
  MP_ASSERT(indices.is_contiguous() && indices.sizes() == out.sizes(), "max_pool2d kernel: bad indices tensor");
  const int64_t numel = out.numel();
  if (numel == 0) return;
  const Geom g = geom(x.size(2), x.size(3), out.size(2), out.size(3), w);
  const Decomp d = decomp(numel, g.OH, g.OW);
  const int dev = out.device().index;
  with_common_dtype(out, x, compute_dtype(x.dtype()), [&](const Tensor& o, const Tensor& xi) {
    visit_floating(xi.dtype(), "max_pool2d", [&]<class T>() {
      auto launch = [&]<class I>() {
        max_pool_forward_kernel<T, I><<<blocks_for(numel, kPoolThreads, dev), kPoolThreads, 0, stream_of(o)>>>(
            static_cast<T*>(o.raw_data()), indices.data_ptr<I>(), static_cast<const T*>(xi.raw_data()), g, numel, d);
        MP_CUDA_CHECK_LAUNCH();
      };
      if (indices.dtype() == DType::i32)
        launch.template operator()<int32_t>();
      else
        launch.template operator()<int64_t>();
    });
  });
}

void max_pool2d_backward_cuda(const Tensor& dx, const Tensor& dy, const Tensor& indices) {
  DeviceGuard guard(dx.device(), "max_pool2d_backward");
  MP_ASSERT(indices.is_contiguous() && indices.sizes() == dy.sizes(), "max_pool2d backward kernel: bad indices");
  const int64_t planes = dx.size(0) * dx.size(1), in_plane = dx.size(2) * dx.size(3);
  const int64_t out_plane = dy.size(2) * dy.size(3);
  if (planes * in_plane == 0) return;
  const int dev = dx.device().index;
  with_common_dtype(dx, dy, compute_dtype(dx.dtype()), [&](const Tensor& o, const Tensor& gi) {
    visit_floating(o.dtype(), "max_pool2d_backward", [&]<class T>() {
      using A = acc_t<T>;
      Tensor scratch;
      if constexpr (!std::is_same_v<T, A>) scratch = empty(o.sizes(), {.dtype = DType::f32, .device = o.device()});
      const unsigned grid = blocks_for(planes * kWarpSize, kPlaneWarps * kWarpSize, dev);
      auto launch = [&]<class I>() {
        max_pool_backward_kernel<T, I><<<grid, kPlaneWarps * kWarpSize, 0, stream_of(o)>>>(
            static_cast<T*>(o.raw_data()), static_cast<const T*>(gi.raw_data()), indices.data_ptr<I>(),
            scratch.defined() ? scratch.data_ptr<A>() : nullptr, planes, in_plane, out_plane);
        MP_CUDA_CHECK_LAUNCH();
      };
      if (indices.dtype() == DType::i32)
        launch.template operator()<int32_t>();
      else
        launch.template operator()<int64_t>();
    });
  });
}

void avg_pool2d_forward_cuda(const Tensor& out, const Tensor& x, const Pool2dWindow& w, bool count_include_pad) {
  DeviceGuard guard(out.device(), "avg_pool2d");
  const int64_t numel = out.numel();
  if (numel == 0) return;
  const Geom g = geom(x.size(2), x.size(3), out.size(2), out.size(3), w);
  const Decomp d = decomp(numel, g.OH, g.OW);
  const int dev = out.device().index;
  with_common_dtype(out, x, compute_dtype(x.dtype()), [&](const Tensor& o, const Tensor& xi) {
    visit_floating(xi.dtype(), "avg_pool2d", [&]<class T>() {
      avg_pool_forward_kernel<T><<<blocks_for(numel, kPoolThreads, dev), kPoolThreads, 0, stream_of(o)>>>(
          static_cast<T*>(o.raw_data()), static_cast<const T*>(xi.raw_data()), g, count_include_pad, numel, d);
      MP_CUDA_CHECK_LAUNCH();
    });
  });
}

void avg_pool2d_backward_cuda(const Tensor& dx, const Tensor& dy, const Pool2dWindow& w, bool count_include_pad) {
  DeviceGuard guard(dx.device(), "avg_pool2d_backward");
  const int64_t numel = dx.numel();
  if (numel == 0) return;
  const Geom g = geom(dx.size(2), dx.size(3), dy.size(2), dy.size(3), w);
  const Decomp d = decomp(numel, g.H, g.W);
  const int dev = dx.device().index;
  with_common_dtype(dx, dy, compute_dtype(dx.dtype()), [&](const Tensor& o, const Tensor& gi) {
    visit_floating(o.dtype(), "avg_pool2d_backward", [&]<class T>() {
      avg_pool_backward_kernel<T><<<blocks_for(numel, kPoolThreads, dev), kPoolThreads, 0, stream_of(o)>>>(
          static_cast<T*>(o.raw_data()), static_cast<const T*>(gi.raw_data()), g, count_include_pad, numel, d);
      MP_CUDA_CHECK_LAUNCH();
    });
  });
}

void adaptive_avg_pool2d_forward_cuda(const Tensor& out, const Tensor& x) {
  DeviceGuard guard(out.device(), "adaptive_avg_pool2d");
  const int64_t numel = out.numel();
  if (numel == 0) return;
  const Geom g{x.size(2), x.size(3), out.size(2), out.size(3), 1, 1, 1, 1, 0, 0};
  const int dev = out.device().index;
  with_common_dtype(out, x, compute_dtype(x.dtype()), [&](const Tensor& o, const Tensor& xi) {
    visit_floating(xi.dtype(), "adaptive_avg_pool2d", [&]<class T>() {
      T* op = static_cast<T*>(o.raw_data());
      const T* xp = static_cast<const T*>(xi.raw_data());
      if (g.OH == 1 && g.OW == 1) {
        const unsigned grid = blocks_for(numel * kWarpSize, kPlaneWarps * kWarpSize, dev);
        global_avg_forward_kernel<T><<<grid, kPlaneWarps * kWarpSize, 0, stream_of(o)>>>(op, xp, numel, g.H * g.W);
      } else {
        adaptive_avg_forward_kernel<T><<<blocks_for(numel, kPoolThreads, dev), kPoolThreads, 0, stream_of(o)>>>(
            op, xp, g, numel, decomp(numel, g.OH, g.OW));
      }
      MP_CUDA_CHECK_LAUNCH();
    });
  });
}

void adaptive_avg_pool2d_backward_cuda(const Tensor& dx, const Tensor& dy) {
  DeviceGuard guard(dx.device(), "adaptive_avg_pool2d_backward");
  const int64_t numel = dx.numel();
  if (numel == 0) return;
  const Geom g{dx.size(2), dx.size(3), dy.size(2), dy.size(3), 1, 1, 1, 1, 0, 0};
  const int dev = dx.device().index;
  with_common_dtype(dx, dy, compute_dtype(dx.dtype()), [&](const Tensor& o, const Tensor& gi) {
    visit_floating(o.dtype(), "adaptive_avg_pool2d_backward", [&]<class T>() {
      adaptive_avg_backward_kernel<T><<<blocks_for(numel, kPoolThreads, dev), kPoolThreads, 0, stream_of(o)>>>(
          static_cast<T*>(o.raw_data()), static_cast<const T*>(gi.raw_data()), g, numel, decomp(numel, g.H, g.W));
      MP_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace

MP_REGISTER_KERNEL(max_pool2d_forward_kernel, DeviceType::cuda, &max_pool2d_forward_cuda);
MP_REGISTER_KERNEL(max_pool2d_backward_kernel, DeviceType::cuda, &max_pool2d_backward_cuda);
MP_REGISTER_KERNEL(avg_pool2d_forward_kernel, DeviceType::cuda, &avg_pool2d_forward_cuda);
MP_REGISTER_KERNEL(avg_pool2d_backward_kernel, DeviceType::cuda, &avg_pool2d_backward_cuda);
MP_REGISTER_KERNEL(adaptive_avg_pool2d_forward_kernel, DeviceType::cuda, &adaptive_avg_pool2d_forward_cuda);
MP_REGISTER_KERNEL(adaptive_avg_pool2d_backward_kernel, DeviceType::cuda, &adaptive_avg_pool2d_backward_cuda);

}  // namespace mp::backend::cuda

// CUDA reductions (the reduce and arg_reduce slots, reduce_kernels.hpp). Semantics as the CPU
// (cpu/reduce.cpp): accumulate in float for f32/f16/bf16, double for f64, int64 for integers and
// bool; max/min propagate NaN; sum of nothing is 0; the result is stored converted to out's dtype.
//
// Note [CUDA reduction shapes]
// The input arrives as [kept..., reduced...] (a strided view); each part is coalesced separately.
//  * Row kernel (the innermost reduced dim is unit-stride, or nothing is unit-stride): a group of
//    `gx` lanes reduces one output -- 1..32 lanes of a warp (warp shuffles) for short reductions,
//    the whole 256-thread block for long ones (>= 4096 elements). When the reduced elements of an
//    output are one contiguous run, lanes read it with 16-byte vectors (an unaligned head and the
//    tail element-wise).
//  * Column kernel (the innermost kept dim is unit-stride, e.g. bias gradients): 32 consecutive
//    outputs across threadIdx.x (coalesced), 8 threads in y share the reduced range, combined
//    through shared memory in a fixed order.
//  * Few outputs with long reductions (a full sum): the reduced range is split over gridDim.y so the
//    grid fills the device; each split writes a partial (in the accumulation type) and a second pass
//    (the column kernel over the [splits, nout] partials) combines them. Deterministic: the split
//    points, the lanes' element assignment and every combining order depend only on the shapes and
//    the device's multiprocessor count, never on timing; no atomics. The summation order differs
//    from the CPU's, so float sums agree with it to rounding, not bit for bit.

#include <algorithm>
#include <vector>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/loops.cuh"
#include "backend/reduce_acc.hpp"
#include "backend/reduce_kernels.hpp"

namespace mp::backend::cuda {
namespace {

// ---- accumulators: the CPU's (backend/reduce_acc.hpp) -------------------------------------------

template <class A>
using SumOp = SumAcc<A>;
template <class A>
using SumSqOp = SumSqAcc<A>;
template <class A>
using MaxOp = MaxAcc<A>;
template <class A>
using MinOp = MinAcc<A>;

// The accumulator that combines partials of Op (map already applied): sums of squares add up.
template <class Op, class A>
using FinalOp = std::conditional_t<std::is_same_v<Op, SumSqOp<A>>, SumOp<A>, Op>;

// Accumulation type of element type T.
template <class T>
using acc_of_t = std::conditional_t<std::is_same_v<T, double>, double,
                                    std::conditional_t<std::is_floating_point_v<acc_t<T>>, float, int64_t>>;

// Op::combine as a functor for the warp/block reductions.
template <class Op>
struct CombineWith {
  template <class A>
  __device__ MP_FORCE_INLINE A operator()(A a, A b) const {
    return Op::combine(a, b);
  }
};

// Where a kernel's results go: the output (converted to its dtype) or the partials of split y.
template <class A>
struct Sink {
  char* out;  // contiguous, nout elements of out_dt
  DType out_dt;
  int out_es;
  A* partial;  // null: write out; else [splits][nout]
  int64_t nout;
  __device__ MP_FORCE_INLINE void put(int64_t o, A v) const {
    if (partial != nullptr)
      partial[static_cast<int64_t>(blockIdx.y) * nout + o] = v;
    else
      store_as(out + o * out_es, out_dt, v);
  }
};

// Reduced range [r0, r1) of split blockIdx.y.
__device__ MP_FORCE_INLINE void split_range(int64_t R, int64_t split_len, int64_t& r0, int64_t& r1) {
  r0 = static_cast<int64_t>(blockIdx.y) * split_len;
  r1 = min(R, r0 + split_len);
}

// Accumulate the n contiguous elements at p, lane `lane` of `gx`: 16-byte vectors after an
// element-wise head up to 16-byte alignment, then the tail.
template <class Op, class T, class A>
__device__ MP_FORCE_INLINE A accumulate_contiguous(const T* p, int64_t n, int lane, int gx, A acc) {
  constexpr int V = kVecBytes / static_cast<int>(sizeof(T));
  const auto mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p) % kVecBytes);
  const int64_t head = min(n, ((kVecBytes - mis) % kVecBytes) / static_cast<int64_t>(sizeof(T)));
  for (int64_t i = lane; i < head; i += gx) acc = Op::combine(acc, Op::map(device_cast<A>(p[i])));
  const T* q = p + head;
  const int64_t nv = (n - head) / V;
#pragma unroll 4
  for (int64_t v = lane; v < nv; v += gx) {  // unrolled: several loads in flight per thread
    T x[V];
    load_vec<V>(q + v * V, x);
#pragma unroll
    for (int j = 0; j < V; ++j) acc = Op::combine(acc, Op::map(device_cast<A>(x[j])));
  }
  for (int64_t i = head + nv * V + lane; i < n; i += gx) acc = Op::combine(acc, Op::map(device_cast<A>(p[i])));
  return acc;
}

// Row kernel (Note [CUDA reduction shapes]): blockDim.x = kThreads, gx lanes per output (a power of
// two <= 32, or kThreads). kContig: the reduced elements of an output are one unit-stride run.
template <class T, class A, class Op, bool kContig>
__global__ void __launch_bounds__(kThreads) reduce_row_kernel(const T* in, Sink<A> sink, OffsetCalc<1> keep,
                                                              OffsetCalc<1> red, int64_t R, int64_t split_len, int gx) {
  __shared__ A smem[kWarpSize];
  const int per_block = kThreads / gx;
  const int group = static_cast<int>(threadIdx.x) / gx, lane = static_cast<int>(threadIdx.x) % gx;
  int64_t r0, r1;
  split_range(R, split_len, r0, r1);
  for (int64_t ob = static_cast<int64_t>(blockIdx.x) * per_block; ob < sink.nout;
       ob += static_cast<int64_t>(gridDim.x) * per_block) {
    const int64_t o = ob + group;
    A acc = Op::init();
    if (o < sink.nout) {
      int64_t ko[1];
      keep.get(o, ko);
      if constexpr (kContig) {
        if (r1 > r0) acc = accumulate_contiguous<Op>(in + ko[0] + r0, r1 - r0, lane, gx, acc);
      } else {
        for (int64_t r = r0 + lane; r < r1; r += gx) {
          int64_t ro[1];
          red.get(r, ro);
          acc = Op::combine(acc, Op::map(device_cast<A>(in[ko[0] + ro[0]])));
        }
      }
    }
    if (gx == kThreads) {
      acc = block_reduce(acc, CombineWith<Op>{}, Op::init(), smem);
    } else {
      acc = warp_reduce(acc, CombineWith<Op>{}, gx);
    }
    if (lane == 0 && o < sink.nout) sink.put(o, acc);
  }
}

// Column kernel (Note [CUDA reduction shapes]): blockDim (32, 8); outputs across x.
inline constexpr int kColX = 32, kColY = 8;

template <class T, class A, class Op>
__global__ void __launch_bounds__(kColX* kColY)
    reduce_col_kernel(const T* in, Sink<A> sink, OffsetCalc<1> keep, OffsetCalc<1> red, int64_t R, int64_t split_len) {
  __shared__ A smem[kColY][kColX + 1];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  int64_t r0, r1;
  split_range(R, split_len, r0, r1);
  for (int64_t ob = static_cast<int64_t>(blockIdx.x) * kColX; ob < sink.nout;
       ob += static_cast<int64_t>(gridDim.x) * kColX) {
    const int64_t o = ob + tx;
    A acc = Op::init();
    if (o < sink.nout) {
      int64_t ko[1];
      keep.get(o, ko);
      for (int64_t r = r0 + ty; r < r1; r += kColY) {
        int64_t ro[1];
        red.get(r, ro);
        acc = Op::combine(acc, Op::map(device_cast<A>(in[ko[0] + ro[0]])));
      }
    }
    __syncthreads();  // the previous iteration's readers are done
    smem[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && o < sink.nout) {
#pragma unroll
      for (int y = 1; y < kColY; ++y) acc = Op::combine(acc, smem[y][tx]);
      sink.put(o, acc);
    }
  }
}

// Coalesced sizes and element strides of dims [begin, end) of t (outermost first).
struct DimList {
  Shape sizes, strides;
  int64_t numel = 1;
};
DimList coalesce(const Tensor& t, size_t begin, size_t end) {
  DimList d;
  for (size_t i = begin; i < end; ++i) {
    d.numel *= t.sizes()[i];
    if (t.sizes()[i] == 1) continue;
    if (!d.sizes.empty() && d.strides.back() == t.strides()[i] * t.sizes()[i]) {
      d.sizes.back() *= t.sizes()[i];
      d.strides.back() = t.strides()[i];
    } else {
      d.sizes.push_back(t.sizes()[i]);
      d.strides.push_back(t.strides()[i]);
    }
  }
  return d;
}
OffsetCalc<1> calc_of(const DimList& d) { return make_offset_calc<1>(d.sizes, {std::span<const int64_t>(d.strides)}); }

// Blocks that fill the device once (8 blocks of 256 threads per multiprocessor).
int64_t device_wave(int dev) { return static_cast<int64_t>(device_properties(dev).multiprocessors) * 8; }

// Split length of R over enough splits to bring `blocks_x` blocks up to a wave, each split at least
// min_len long (a multiple of 16 elements); 0 splits length for R == 0.
int64_t choose_split(int64_t R, int64_t blocks_x, int64_t min_len, int dev) {
  if (R == 0) return 0;
  const int64_t want = std::max<int64_t>(1, device_wave(dev) / std::max<int64_t>(blocks_x, 1));
  const int64_t by_len = std::max<int64_t>(1, R / std::max<int64_t>(min_len, 1));
  const int64_t splits = std::clamp<int64_t>(std::min(want, by_len), 1, 65535);
  int64_t len = (R + splits - 1) / splits;
  len = (len + 15) / 16 * 16;
  return std::min(len, R);
}

template <class T, class A, class Op>
void reduce_typed(const Tensor& out, const Tensor& in, int64_t nreduce) {
  const size_t nd = in.sizes().size(), nk = nd - static_cast<size_t>(nreduce);
  const DimList keep = coalesce(in, 0, nk), red = coalesce(in, nk, nd);
  const int64_t nout = keep.numel, R = red.numel;
  if (nout == 0) return;
  const int dev = out.device().index;
  cudaStream_t stream = current_stream(dev);
  const auto* src = static_cast<const T*>(in.raw_data());
  Sink<A> sink{static_cast<char*>(out.raw_data()), out.dtype(), static_cast<int>(out.element_size()), nullptr, nout};
  const OffsetCalc<1> kc = calc_of(keep), rc = calc_of(red);
  const bool red_unit = !red.sizes.empty() && red.strides.back() == 1;
  const bool keep_unit = !keep.sizes.empty() && keep.strides.back() == 1;
  const int64_t wave = device_wave(dev);

  Tensor partial;  // kept alive until the second pass is queued (stream order protects its memory)
  int64_t split_len = R, splits = 1;
  auto use_partials = [&] {
    splits = split_len > 0 ? (R + split_len - 1) / split_len : 1;
    if (splits > 1) {
      partial = mp::empty({splits * nout}, {.dtype = dtype_of<A>(), .device = out.device()});
      sink.partial = partial.data_ptr<A>();
    }
  };

  if (red_unit || !keep_unit) {
    // Row kernel. A short reduction gets a warp segment of next_pow2(R) <= 32 lanes per output.
    int gx = kThreads;
    if (R < 4096) {
      gx = 1;
      while (gx < 32 && gx < R) gx *= 2;
    }
    const int64_t per_block = kThreads / gx;
    const int64_t blocks_x = std::min((nout + per_block - 1) / per_block, wave);
    split_len = choose_split(R, blocks_x, static_cast<int64_t>(gx) * 64, dev);
    use_partials();
    const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(splits));
    if (red.sizes.size() <= 1 && (red.sizes.empty() || red.strides[0] == 1)) {
      reduce_row_kernel<T, A, Op, true><<<grid, kThreads, 0, stream>>>(src, sink, kc, rc, R, split_len, gx);
    } else {
      reduce_row_kernel<T, A, Op, false><<<grid, kThreads, 0, stream>>>(src, sink, kc, rc, R, split_len, gx);
    }
    MP_CUDA_CHECK_LAUNCH();
  } else {
    const int64_t blocks_x = std::min((nout + kColX - 1) / kColX, wave);
    split_len = choose_split(R, blocks_x, kColY * 32, dev);
    use_partials();
    const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(splits));
    reduce_col_kernel<T, A, Op><<<grid, dim3(kColX, kColY), 0, stream>>>(src, sink, kc, rc, R, split_len);
    MP_CUDA_CHECK_LAUNCH();
  }
  if (splits > 1) {  // second pass: combine the [splits, nout] partials column-wise into out
    sink.partial = nullptr;
    const DimList pk{{nout}, {1}, nout}, pr{{splits}, {nout}, splits};
    const int64_t blocks_x = std::min((nout + kColX - 1) / kColX, wave);
    reduce_col_kernel<A, A, FinalOp<Op, A>><<<dim3(static_cast<unsigned>(blocks_x)), dim3(kColX, kColY), 0, stream>>>(
        partial.data_ptr<A>(), sink, calc_of(pk), calc_of(pr), splits, splits);
    MP_CUDA_CHECK_LAUNCH();
  }
}

void reduce_cuda(ReduceOp op, const Tensor& out, const Tensor& in, int64_t nreduce) {
  DeviceGuard guard(out.device(), "reduce");
  MP_CHECK(op == ReduceOp::sum || op == ReduceOp::sum_squares || in.numel() > 0 || nreduce == 0,
           "max/min: cannot reduce an empty dimension (input ", in.describe(), ")");
  MP_CHECK(in.device() == out.device() && out.is_contiguous(), "reduce: expected a contiguous output on ",
           in.device().str(), ", got ", out.describe());
  if (in.dtype() == DType::i32 || in.dtype() == DType::u8 || in.dtype() == DType::b8) {
    // Narrow integers accumulate in int64 like the CPU; widening them first (one cast pass; these
    // reductions are rare) saves compiling every reduction kernel for three more input types.
    const Tensor wide = in.detach().to(DType::i64);
    return reduce_cuda(op, out, wide, nreduce);
  }
  visit_dtype(in.dtype(), [&]<class T>() {
    using A = acc_of_t<T>;
    if constexpr (std::is_same_v<T, int64_t> || !std::is_same_v<A, int64_t>) {  // the rest was widened above
      switch (op) {
        case ReduceOp::sum: return reduce_typed<T, A, SumOp<A>>(out, in, nreduce);
        case ReduceOp::max: return reduce_typed<T, A, MaxOp<A>>(out, in, nreduce);
        case ReduceOp::min: return reduce_typed<T, A, MinOp<A>>(out, in, nreduce);
        case ReduceOp::sum_squares: return reduce_typed<T, A, SumSqOp<A>>(out, in, nreduce);
      }
    }
  });
}

// ---- arg max / arg min over the last dim ----------------------------------------------------

template <class A>
struct ValIdx {
  A v;
  int64_t i;  // -1: no element seen
};

// The CPU's scan rule in any order: the first NaN if there is one, else the first extreme.
template <class A>
struct ArgCombine {
  bool is_max;
  __device__ MP_FORCE_INLINE ValIdx<A> operator()(ValIdx<A> a, ValIdx<A> b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool an = a.v != a.v, bn = b.v != b.v;
    if (an || bn) {
      if (an && bn) return a.i < b.i ? a : b;
      return an ? a : b;
    }
    if (is_max ? a.v > b.v : a.v < b.v) return a;
    if (is_max ? b.v > a.v : b.v < a.v) return b;
    return a.i < b.i ? a : b;
  }
};

template <class T, class A>
__global__ void __launch_bounds__(kThreads)
    arg_reduce_kernel_impl(const T* in, OffsetCalc<1> keep, int64_t nout, int64_t n, int64_t stride, bool is_max,
                           char* values, DType values_dt, int values_es, int64_t* indices, int gx) {
  __shared__ ValIdx<A> smem[kWarpSize];
  const ArgCombine<A> combine{is_max};
  const int per_block = kThreads / gx;
  const int group = static_cast<int>(threadIdx.x) / gx, lane = static_cast<int>(threadIdx.x) % gx;
  for (int64_t ob = static_cast<int64_t>(blockIdx.x) * per_block; ob < nout;
       ob += static_cast<int64_t>(gridDim.x) * per_block) {
    const int64_t o = ob + group;
    ValIdx<A> best{A(0), -1};
    if (o < nout) {
      int64_t ko[1];
      keep.get(o, ko);
      const T* p = in + ko[0];
      for (int64_t j = lane; j < n; j += gx) {  // increasing j: a lane keeps its first NaN / first extreme
        const A v = device_cast<A>(p[j * stride]);
        const bool replace = best.i < 0 || (best.v == best.v && (v != v || (is_max ? v > best.v : v < best.v)));
        if (replace) best = {v, j};
      }
    }
    if (gx == kThreads) {
      best = block_reduce(best, combine, ValIdx<A>{A(0), -1}, smem);
    } else {
      best = warp_reduce(best, combine, gx);
    }
    if (lane == 0 && o < nout) {
      store_as(values + o * values_es, values_dt, best.v);
      indices[o] = best.i;
    }
  }
}

void arg_reduce_cuda(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in) {
  DeviceGuard guard(in.device(), is_max ? "max" : "min");
  const int64_t n = in.sizes().back();
  MP_CHECK(n > 0, is_max ? "max" : "min", ": cannot reduce an empty dimension (input ", in.describe(), ")");
  MP_CHECK(values.device() == in.device() && indices.device() == in.device() && values.is_contiguous() &&
               indices.is_contiguous() && indices.dtype() == DType::i64,
           is_max ? "max" : "min", ": expected contiguous values and i64 indices on ", in.device().str(), ", got ",
           values.describe(), " and ", indices.describe());
  const size_t nd = in.sizes().size();
  const DimList keep = coalesce(in, 0, nd - 1);
  if (keep.numel == 0) return;
  int gx = kThreads;
  if (n < 4096) {
    gx = 1;
    while (gx < 32 && gx < n) gx *= 2;
  }
  const int dev = in.device().index;
  const int64_t per_block = kThreads / gx;
  const auto blocks = static_cast<unsigned>(std::min((keep.numel + per_block - 1) / per_block, device_wave(dev)));
  visit_dtype(in.dtype(), [&]<class T>() {
    using A = acc_of_t<T>;
    arg_reduce_kernel_impl<T, A><<<blocks, kThreads, 0, current_stream(dev)>>>(
        static_cast<const T*>(in.raw_data()), calc_of(keep), keep.numel, n, in.strides().back(), is_max,
        static_cast<char*>(values.raw_data()), values.dtype(), static_cast<int>(values.element_size()),
        indices.data_ptr<int64_t>(), gx);
    MP_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

MP_REGISTER_KERNEL(reduce_kernel, DeviceType::cuda, &reduce_cuda);
MP_REGISTER_KERNEL(arg_reduce_kernel, DeviceType::cuda, &arg_reduce_cuda);

}  // namespace mp::backend::cuda

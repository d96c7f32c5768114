// CUDA kernels of loss scaling (amp_kernels.hpp): multi-tensor unscale + finite check, and the
// underflow statistics. CPU reference: cpu/amp.cpp.
//
// Note [CUDA multi-tensor launch]
// One launch covers every tensor of the list, as Apex's multi_tensor_apply: the host uploads a
// table with one entry per non-empty tensor (pointer, numel, dtype, index of its first chunk) in a
// single small host->device copy; the work is cut into chunks of kChunk elements and each block of a
// grid-stride loop takes chunk c, finds its tensor by binary search over the entries' first chunks,
// and runs the dtype's loop (16-byte vectors when the chunk is aligned). The kernel leaves its
// answer in device memory (a found-inf flag, or four int64 counters added with integer atomics, which
// are exact and order-independent), and the host reads it back once, synchronising with the stream:
// these slots return host values.
#include <algorithm>
#include <vector>

#include "backend/amp_kernels.hpp"
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/loops.cuh"
#include "backend/cuda/multi_tensor.cuh"

namespace mp::backend::cuda {
namespace {

struct TensorEntry {
  char* ptr;
  int64_t numel;
  int64_t first_chunk;
  DType dtype;
};

// The table of Note [CUDA multi-tensor launch], on the host and on the device.
struct ChunkTable {
  Tensor device_table;  // u8 bytes of the entries
  int ntensors = 0;
  int64_t nchunks = 0;
};

ChunkTable make_table(std::span<const Tensor> ts, const char* op) {
  std::vector<TensorEntry> entries;
  int64_t nchunks = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    MP_CHECK(t.device() == ts[0].device(), op, ": expected every tensor on ", ts[0].device().str(), ", tensor ", i,
             " is ", t.describe());
    MP_CHECK(t.is_contiguous() && is_floating(t.dtype()), op, ": expected contiguous floating tensors, tensor ", i,
             " is ", t.describe());
    if (t.numel() == 0) continue;
    entries.push_back({static_cast<char*>(t.raw_data()), t.numel(), nchunks, t.dtype()});
    nchunks += chunks_of(t.numel());
  }
  ChunkTable table;
  table.ntensors = static_cast<int>(entries.size());
  table.nchunks = nchunks;
  if (nchunks > 0) table.device_table = upload(entries.data(), entries.size() * sizeof(TensorEntry), ts[0].device());
  return table;
}

// Unscale the len elements at p (a chunk) for thread threadIdx.x of the block: v * inv in compute
// type C, stored back rounded when `write`; returns whether all of the thread's elements were finite.
// 16-byte vectors when p is aligned, else one element at a time.
template <class T, class C>
__device__ MP_FORCE_INLINE bool unscale_chunk(T* p, int64_t len, C inv, bool write) {
  constexpr int V = kVecBytes / static_cast<int>(sizeof(T));
  bool finite = true;
  int64_t done = 0;
  if (reinterpret_cast<uintptr_t>(p) % kVecBytes == 0) {
    const int64_t nv = len / V;
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
      T x[V];
      load_vec<V>(p + v * V, x);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const C c = device_cast<C>(x[j]);
        finite &= is_finite_value(c);
        x[j] = device_cast<T>(c * inv);
      }
      if (write) store_vec<V>(p + v * V, x);
    }
    done = nv * V;
  }
  for (int64_t i = done + threadIdx.x; i < len; i += blockDim.x) {
    const C c = device_cast<C>(p[i]);
    finite &= is_finite_value(c);
    if (write) p[i] = device_cast<T>(c * inv);
  }
  return finite;
}

// Note [CUDA multi-tensor launch]; found_inf is set to 1 when any element is inf or NaN.
__global__ void __launch_bounds__(kThreads) unscale_kernel_impl(const TensorEntry* table, int ntensors, int64_t nchunks,
                                                                float inv_f, double inv_d, bool write, int* found_inf) {
  bool finite = true;
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const TensorEntry e = table[find_chunk_entry(table, ntensors, c)];
    const int64_t start = (c - e.first_chunk) * kChunk, len = min(kChunk, e.numel - start);
    switch (e.dtype) {
      case DType::f64:
        finite &= unscale_chunk<double, double>(reinterpret_cast<double*>(e.ptr) + start, len, inv_d, write);
        break;
      case DType::f16:
        finite &= unscale_chunk<Half, float>(reinterpret_cast<Half*>(e.ptr) + start, len, inv_f, write);
        break;
      case DType::bf16:
        finite &= unscale_chunk<BFloat16, float>(reinterpret_cast<BFloat16*>(e.ptr) + start, len, inv_f, write);
        break;
      default: finite &= unscale_chunk<float, float>(reinterpret_cast<float*>(e.ptr) + start, len, inv_f, write); break;
    }
  }
  if (__syncthreads_or(!finite) && threadIdx.x == 0) *found_inf = 1;  // every writer writes 1
}

bool unscale_cuda(std::span<const Tensor> ts, double inv_scale, bool write) {
  if (ts.empty()) return false;
  DeviceGuard guard(ts[0].device(), "unscale");
  const ChunkTable table = make_table(ts, "unscale");
  if (table.nchunks == 0) return false;
  const int dev = ts[0].device().index;
  cudaStream_t stream = current_stream(dev);
  Tensor flag = mp::empty({1}, {.dtype = DType::i32, .device = ts[0].device()});
  MP_CUDA_CHECK(cudaMemsetAsync(flag.raw_data(), 0, sizeof(int), stream));
  unscale_kernel_impl<<<blocks_for(table.nchunks * kThreads, kThreads, dev), kThreads, 0, stream>>>(
      static_cast<const TensorEntry*>(table.device_table.raw_data()), table.ntensors, table.nchunks,
      static_cast<float>(inv_scale), inv_scale, write, flag.data_ptr<int>());
  MP_CUDA_CHECK_LAUNCH();
  int found = 0;
  read_to_host(&found, flag.raw_data(), sizeof(int), stream);
  return found != 0;
}

// ---- underflow statistics -----------------------------------------------------------------------

struct Counts {
  long long nonzero, flushed, subnormal, nonfinite;
};

struct AddCounts {
  __device__ MP_FORCE_INLINE Counts operator()(const Counts& a, const Counts& b) const {
    return {a.nonzero + b.nonzero, a.flushed + b.flushed, a.subnormal + b.subnormal, a.nonfinite + b.nonfinite};
  }
};

// Classify one value as the CPU does: in float (f64 rounded first), is_finite_value and f16_range_class.
__device__ MP_FORCE_INLINE void classify(float v, float scale, Counts& n) {
  if (!is_finite_value(v)) {
    ++n.nonfinite;
    return;
  }
  const int cls = f16_range_class(v, scale);
  n.nonzero += cls > 0;
  n.flushed += cls == 1;
  n.subnormal += cls == 2;
}

template <class T>
__device__ MP_FORCE_INLINE void underflow_chunk(const T* p, int64_t len, float scale, Counts& n) {
  constexpr int V = kVecBytes / static_cast<int>(sizeof(T));
  int64_t done = 0;
  if (reinterpret_cast<uintptr_t>(p) % kVecBytes == 0) {
    const int64_t nv = len / V;
    for (int64_t v = threadIdx.x; v < nv; v += blockDim.x) {
      T x[V];
      load_vec<V>(p + v * V, x);
#pragma unroll
      for (int j = 0; j < V; ++j) classify(device_cast<float>(x[j]), scale, n);
    }
    done = nv * V;
  }
  for (int64_t i = done + threadIdx.x; i < len; i += blockDim.x) classify(device_cast<float>(p[i]), scale, n);
}

// Note [CUDA multi-tensor launch]; adds this launch's counts to counts[0..4).
__global__ void __launch_bounds__(kThreads)
    underflow_kernel_impl(const TensorEntry* table, int ntensors, int64_t nchunks, float scale,
                          unsigned long long* counts) {
  __shared__ Counts smem[kWarpSize];
  Counts n{0, 0, 0, 0};
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const TensorEntry e = table[find_chunk_entry(table, ntensors, c)];
    const int64_t start = (c - e.first_chunk) * kChunk, len = min(kChunk, e.numel - start);
    switch (e.dtype) {
      case DType::f64: underflow_chunk(reinterpret_cast<const double*>(e.ptr) + start, len, scale, n); break;
      case DType::f16: underflow_chunk(reinterpret_cast<const Half*>(e.ptr) + start, len, scale, n); break;
      case DType::bf16: underflow_chunk(reinterpret_cast<const BFloat16*>(e.ptr) + start, len, scale, n); break;
      default: underflow_chunk(reinterpret_cast<const float*>(e.ptr) + start, len, scale, n); break;
    }
  }
  n = block_reduce(n, AddCounts{}, Counts{0, 0, 0, 0}, smem);
  if (threadIdx.x == 0) {
    atomicAdd(&counts[0], static_cast<unsigned long long>(n.nonzero));
    atomicAdd(&counts[1], static_cast<unsigned long long>(n.flushed));
    atomicAdd(&counts[2], static_cast<unsigned long long>(n.subnormal));
    atomicAdd(&counts[3], static_cast<unsigned long long>(n.nonfinite));
  }
}

UnderflowCounts underflow_cuda(std::span<const Tensor> ts, double scale) {
  if (ts.empty()) return {};
  DeviceGuard guard(ts[0].device(), "underflow_stats");
  const ChunkTable table = make_table(ts, "underflow_stats");
  if (table.nchunks == 0) return {};
  const int dev = ts[0].device().index;
  cudaStream_t stream = current_stream(dev);
  Tensor counts = mp::empty({4}, {.dtype = DType::i64, .device = ts[0].device()});
  MP_CUDA_CHECK(cudaMemsetAsync(counts.raw_data(), 0, 4 * sizeof(int64_t), stream));
  underflow_kernel_impl<<<blocks_for(table.nchunks * kThreads, kThreads, dev), kThreads, 0, stream>>>(
      static_cast<const TensorEntry*>(table.device_table.raw_data()), table.ntensors, table.nchunks,
      static_cast<float>(scale), static_cast<unsigned long long*>(counts.raw_data()));
  MP_CUDA_CHECK_LAUNCH();
  int64_t host[4] = {0, 0, 0, 0};
  read_to_host(host, counts.raw_data(), sizeof(host), stream);
  return {host[0], host[1], host[2], host[3]};
}

}  // namespace

MP_REGISTER_KERNEL(unscale_kernel, DeviceType::cuda, &unscale_cuda);
MP_REGISTER_KERNEL(underflow_kernel, DeviceType::cuda, &underflow_cuda);

}  // namespace mp::backend::cuda

// CUDA index kernels (the slots of index_kernels.hpp): embedding gather and its deterministic scatter-add
// backward, and dropout with the CPU's Philox mask.
//
// Note [CUDA embedding errors]: an out-of-range index must throw the CPU's mp::Error (naming the first bad
// flat position and its value). The gather kernel checks every index it uses and records the smallest bad
// position with an integer atomicMin in a device word, which the next host synchronisation reads (Note
// [deferred device checks] in runtime.hpp): on a hit it fetches the index value and throws.
//
// Note [CUDA embedding backward]: deterministic and bit-identical to the single-threaded CPU order. The
// indices are stably sorted with their positions as values (CUB's LSD radix sort, only as many bits as V
// needs), which groups equal indices while keeping their positions ascending. Then one warp per run start
// and column chunk sums the run's grad_out rows in that order onto the weight row's old value: the CPU's
// `row += g` sequence for that row. No float atomics, so every run gives the same bits.
//
// Note [CUDA dropout]: element i keeps its value when dropout_keep(seed, offset, i, p) holds, computed from
// the same philox_block / philox_to_uniform (mp/core/philox.hpp, MP_HD) as the CPU, so the masks are equal
// bit for bit for every seed and offset. A thread takes 4 consecutive elements: one Philox call when the
// stream offset is a multiple of 4 (it always is: Generator::advance rounds reservations up to 4), at most
// two otherwise; 16-byte (or 8-byte) vector loads and stores when the pointers allow.
#include <cub/device/device_radix_sort.cuh>
#include <cuda_runtime_api.h>

#include <climits>
#include <type_traits>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/loops.cuh"
#include "backend/cuda/runtime.hpp"
#include "backend/index_kernels.hpp"

namespace mp::backend::cuda {
namespace {

#define MP_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Call f.template operator()<I>() with I the C++ type of an index tensor (i64 or i32); the CPU's message
// otherwise.
template <class F>
void visit_index(const Tensor& indices, const char* op, F&& f) {
  if (indices.dtype() == DType::i64) return f.template operator()<int64_t>();
  if (indices.dtype() == DType::i32) return f.template operator()<int32_t>();
  MP_FAIL(op, ": expected i64 or i32 indices, got ", indices.describe(), "; convert with .to(mp::DType::i64)");
}

// ---------------------------------------------------------------- embedding forward

// out row m = weight row idx[m], copied in units U (16, 8, 4 or 2 bytes) of which a row has `units`.
// Bad indices record their position (Note [CUDA embedding errors]) and copy nothing.
template <class U, class I>
__global__ void embedding_gather_kernel(U* __restrict__ out, const U* __restrict__ w, const I* __restrict__ idx,
                                        int64_t M, int64_t V, int64_t units, IntDivider units_div, bool use32,
                                        unsigned long long* bad) {
  const int64_t total = M * units;
  MP_GRID_STRIDE(e, total) {
    const int64_t m = use32 ? static_cast<int64_t>(units_div.div32(static_cast<uint32_t>(e))) : e / units;
    const int64_t k = static_cast<int64_t>(idx[m]);
    if (k < 0 || k >= V) {
      if (e == m * units) atomicMin(bad, static_cast<unsigned long long>(m));
      continue;
    }
    out[e] = w[k * units + (e - m * units)];
  }
}

// Index check alone (rows of zero width: nothing to copy, the indices are still validated).
template <class I>
__global__ void embedding_check_kernel(const I* __restrict__ idx, int64_t M, int64_t V, unsigned long long* bad) {
  MP_GRID_STRIDE(m, M) {
    const int64_t k = static_cast<int64_t>(idx[m]);
    if (k < 0 || k >= V) atomicMin(bad, static_cast<unsigned long long>(m));
  }
}

// The largest copy unit (bytes) dividing the row size and aligning both base pointers.
int copy_unit(size_t row_bytes, const void* a, const void* b) {
  for (int u : {16, 8, 4, 2})
    if (row_bytes % static_cast<size_t>(u) == 0 && is_aligned(a, static_cast<size_t>(u)) &&
        is_aligned(b, static_cast<size_t>(u)))
      return u;
  return 1;
}

void embedding_cuda(const Tensor& out, const Tensor& weight, const Tensor& indices) {
  DeviceGuard guard(out.device(), "embedding");
  const int64_t M = indices.numel(), V = weight.sizes()[0], D = weight.sizes()[1];
  const int dev = out.device().index;
  cudaStream_t stream = stream_of(out);
  visit_index(indices, "embedding", [&]<class I>() {
    if (M == 0) return;
    const I* idx = indices.data_ptr<I>();
    Tensor bad_t = empty({1}, {.dtype = DType::i64, .device = out.device()});
    auto* bad = static_cast<unsigned long long*>(bad_t.raw_data());
    MP_CUDA_CHECK(cudaMemsetAsync(bad, 0xff, sizeof(unsigned long long), stream));
    const size_t row_bytes = static_cast<size_t>(D) * weight.element_size();
    if (row_bytes == 0) {
      embedding_check_kernel<I><<<blocks_for(M, kThreads, dev), kThreads, 0, stream>>>(idx, M, V, bad);
      MP_CUDA_CHECK_LAUNCH();
    } else {
      const int u = copy_unit(row_bytes, out.raw_data(), weight.raw_data());
      const int64_t units = static_cast<int64_t>(row_bytes) / u;
      const bool use32 = M * units <= INT32_MAX;
      const unsigned grid = blocks_for(M * units, kThreads, dev);
      auto launch = [&]<class U>() {
        embedding_gather_kernel<U, I><<<grid, kThreads, 0, stream>>>(static_cast<U*>(out.raw_data()),
                                                                     static_cast<const U*>(weight.raw_data()), idx, M,
                                                                     V, units, IntDivider(units), use32, bad);
        MP_CUDA_CHECK_LAUNCH();
      };
      switch (u) {
        case 16: launch.template operator()<uint4>(); break;
        case 8: launch.template operator()<uint2>(); break;
        case 4: launch.template operator()<uint32_t>(); break;
        case 2: launch.template operator()<uint16_t>(); break;
        default: launch.template operator()<uint8_t>(); break;
      }
    }
    defer_device_check(dev, bad, [bad_t, indices, idx, V, stream](unsigned long long first_bad) {
      I value{};
      copy_to_host_now(&value, idx + first_bad, sizeof(I), stream);
      MP_FAIL("embedding: index ", static_cast<int64_t>(value), " (at flat position ", static_cast<int64_t>(first_bad),
              ") is out of range for a weight with V = ", V, " rows; expected 0 <= index < ", V);
    });
  });
}

// ---------------------------------------------------------------- embedding backward

// Sort keys: the index where 0 <= index < V, else V (a run that is skipped); values: the positions.
template <class I>
__global__ void embedding_keys_kernel(const I* __restrict__ idx, uint32_t* __restrict__ keys, int32_t* __restrict__ pos,
                                      int64_t M, int64_t V) {
  MP_GRID_STRIDE(m, M) {
    const int64_t k = static_cast<int64_t>(idx[m]);
    keys[m] = static_cast<uint32_t>(k >= 0 && k < V ? k : V);
    pos[m] = static_cast<int32_t>(m);
  }
}

// Columns per lane of the run-sum kernel; a warp covers kRunCols * 32 columns of a row.
constexpr int kRunCols = 4;
constexpr int kRunWarps = 4;

// Note [CUDA embedding backward]: warp w takes sorted position k; when k starts a run of equal keys (and the
// key is a real row other than padding_idx), it adds the run's grad_out rows, in position order, onto that
// weight row's current value, for the column chunks blockIdx.y, blockIdx.y + gridDim.y, ...
// G: grad_out's element type, or void for a run-time dtype (gdt, gsize).
template <class G, class A>
__global__ void embedding_run_sum_kernel(A* __restrict__ gw, const void* __restrict__ go, DType gdt, int gsize,
                                         const uint32_t* __restrict__ keys, const int32_t* __restrict__ pos, int64_t M,
                                         int64_t V, int64_t D, int64_t pad) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t chunk_cols = int64_t{kRunCols} * kWarpSize;
  const int64_t chunks = (D + chunk_cols - 1) / chunk_cols;
  const int64_t warp0 = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (int64_t k = warp0; k < M; k += nwarps) {
    const uint32_t key = keys[k];
    if ((k > 0 && keys[k - 1] == key) || key >= V || static_cast<int64_t>(key) == pad) continue;
    for (int64_t ch = blockIdx.y; ch < chunks; ch += gridDim.y) {
      const int64_t c0 = ch * chunk_cols + lane;
      A* row = gw + static_cast<int64_t>(key) * D;
      A acc[kRunCols];
#pragma unroll
      for (int t = 0; t < kRunCols; ++t) {
        const int64_t c = c0 + t * kWarpSize;
        acc[t] = c < D ? row[c] : A(0);
      }
      for (int64_t k2 = k; k2 < M && keys[k2] == key; ++k2) {
        const int64_t base = static_cast<int64_t>(pos[k2]) * D;
#pragma unroll
        for (int t = 0; t < kRunCols; ++t) {
          const int64_t c = c0 + t * kWarpSize;
          if (c >= D) continue;
          if constexpr (std::is_void_v<G>) {
            acc[t] += load_as<A>(static_cast<const char*>(go) + (base + c) * gsize, gdt);
          } else {
            acc[t] += device_cast<A>(static_cast<const G*>(go)[base + c]);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kRunCols; ++t) {
        const int64_t c = c0 + t * kWarpSize;
        if (c < D) row[c] = acc[t];
      }
    }
  }
}

// Bits of the sort keys: enough for the values 0 .. V (V marks out-of-range indices).
int key_bits(int64_t V) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) <= static_cast<uint64_t>(V)) ++bits;
  return bits;
}

template <class A>
void launch_run_sum(const Tensor& gw, const Tensor& go, const uint32_t* keys, const int32_t* pos, int64_t M, int64_t V,
                    int64_t D, int64_t pad, cudaStream_t stream, int dev) {
  const int64_t chunks = (D + int64_t{kRunCols} * kWarpSize - 1) / (int64_t{kRunCols} * kWarpSize);
  const dim3 grid(blocks_for(M * kWarpSize, kRunWarps * kWarpSize, dev),
                  static_cast<unsigned>(std::min<int64_t>(chunks, 65535)));
  A* out = gw.data_ptr<A>();
  const void* g = go.raw_data();
  const int gsize = static_cast<int>(go.element_size());
  auto launch = [&]<class G>() {
    embedding_run_sum_kernel<G, A>
        <<<grid, kRunWarps * kWarpSize, 0, stream>>>(out, g, go.dtype(), gsize, keys, pos, M, V, D, pad);
    MP_CUDA_CHECK_LAUNCH();
  };
  if (go.dtype() == dtype_of<A>()) return launch.template operator()<A>();
  if constexpr (std::is_same_v<A, float>) {
    if (go.dtype() == DType::f16) return launch.template operator()<Half>();
    if (go.dtype() == DType::bf16) return launch.template operator()<BFloat16>();
  }
  launch.template operator()<void>();
}

void embedding_backward_cuda(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& indices,
                             int64_t padding_idx) {
  DeviceGuard guard(grad_weight.device(), "embedding_backward");
  visit_index(indices, "embedding_backward", [&]<class I>() {
    const int64_t V = grad_weight.sizes()[0], D = grad_weight.sizes()[1], M = indices.numel();
    if (M == 0 || D == 0 || V == 0) return;
    MP_CHECK(M <= INT32_MAX && V < UINT32_MAX, "embedding_backward: the CUDA kernel supports at most 2^31 - 1 ",
             "indices and 2^32 - 2 rows, got ", M, " indices and V = ", V, "; split the batch");
    MP_CHECK(grad_out.numel() == M * D, "embedding_backward: grad_out ", grad_out.describe(), " does not have ", M,
             " rows of ", D);
    const int dev = grad_weight.device().index;
    cudaStream_t stream = stream_of(grad_weight);
    const TensorOptions i32{.dtype = DType::i32, .device = grad_weight.device()};
    Tensor keys_in = empty({M}, i32), keys_out = empty({M}, i32), pos_in = empty({M}, i32), pos_out = empty({M}, i32);
    auto* kin = static_cast<uint32_t*>(keys_in.raw_data());
    auto* kout = static_cast<uint32_t*>(keys_out.raw_data());
    auto* pin = pos_in.data_ptr<int32_t>();
    auto* pout = pos_out.data_ptr<int32_t>();
    embedding_keys_kernel<I>
        <<<blocks_for(M, kThreads, dev), kThreads, 0, stream>>>(indices.data_ptr<I>(), kin, pin, M, V);
    MP_CUDA_CHECK_LAUNCH();
    const int bits = key_bits(V);
    const int n = static_cast<int>(M);
    size_t temp_bytes = 0;
    MP_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, kin, kout, pin, pout, n, 0, bits, stream));
    Tensor temp = empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))},
                        {.dtype = DType::u8, .device = grad_weight.device()});
    MP_CUDA_CHECK(
        cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, kin, kout, pin, pout, n, 0, bits, stream));
    if (grad_weight.dtype() == DType::f64)
      launch_run_sum<double>(grad_weight, grad_out, kout, pout, M, V, D, padding_idx, stream, dev);
    else
      launch_run_sum<float>(grad_weight, grad_out, kout, pout, M, V, D, padding_idx, stream, dev);
  });
}

// ---------------------------------------------------------------- dropout

// Elements per thread of the dropout kernels (one Philox block of draws).
constexpr int kDropVec = 4;

// Note [CUDA dropout]. All-aligned threads (vec) use vector accesses for their 4 elements.
template <class T>
__global__ void dropout_kernel_impl(T* __restrict__ out, uint8_t* __restrict__ mask, const T* __restrict__ in,
                                    int64_t n, float p, acc_t<T> scale, uint64_t seed, uint64_t offset, bool vec) {
  using A = acc_t<T>;
  const int64_t groups = (n + kDropVec - 1) / kDropVec;
  MP_GRID_STRIDE(gi, groups) {
    const int64_t i0 = gi * kDropVec;
    const bool full = vec && i0 + kDropVec <= n;
    T x[kDropVec], y[kDropVec];
    uint8_t mk[kDropVec];
    if (full) {
      load_vec<kDropVec>(in + i0, x);
    } else {
#pragma unroll
      for (int j = 0; j < kDropVec; ++j)
        if (i0 + j < n) x[j] = in[i0 + j];
    }
    uint64_t cur = ~uint64_t{0};
    U32x4 blk{};
#pragma unroll
    for (int j = 0; j < kDropVec; ++j) {
      const uint64_t d = offset + static_cast<uint64_t>(i0 + j);
      if ((d >> 2) != cur) {
        cur = d >> 2;
        blk = philox_block(seed, cur);
      }
      const bool keep = dropout_keeps(philox_to_uniform(blk.v[d & 3]), p);
      mk[j] = keep ? 1 : 0;
      y[j] = device_cast<T>(keep ? device_cast<A>(x[j]) * scale : A(0));
    }
    if (full) {
      store_vec<kDropVec>(out + i0, y);
      store_vec<kDropVec>(mask + i0, mk);
    } else {
#pragma unroll
      for (int j = 0; j < kDropVec; ++j)
        if (i0 + j < n) {
          out[i0 + j] = y[j];
          mask[i0 + j] = mk[j];
        }
    }
  }
}

template <class T>
__global__ void dropout_backward_kernel_impl(T* __restrict__ gi, const T* __restrict__ go,
                                             const uint8_t* __restrict__ mask, int64_t n, acc_t<T> scale, bool vec) {
  using A = acc_t<T>;
  const int64_t groups = (n + kDropVec - 1) / kDropVec;
  MP_GRID_STRIDE(g, groups) {
    const int64_t i0 = g * kDropVec;
    const bool full = vec && i0 + kDropVec <= n;
    T x[kDropVec], y[kDropVec];
    uint8_t mk[kDropVec];
    if (full) {
      load_vec<kDropVec>(go + i0, x);
      load_vec<kDropVec>(mask + i0, mk);
    } else {
#pragma unroll
      for (int j = 0; j < kDropVec; ++j)
        if (i0 + j < n) {
          x[j] = go[i0 + j];
          mk[j] = mask[i0 + j];
        } else {
          mk[j] = 0;
        }
    }
#pragma unroll
    for (int j = 0; j < kDropVec; ++j) y[j] = device_cast<T>(mk[j] ? device_cast<A>(x[j]) * scale : A(0));
    if (full) {
      store_vec<kDropVec>(gi + i0, y);
    } else {
#pragma unroll
      for (int j = 0; j < kDropVec; ++j)
        if (i0 + j < n) gi[i0 + j] = y[j];
    }
  }
}

// Whether every pointer is aligned for the 4-element vector accesses of T (mask: 4 bytes).
template <class T>
bool drop_vec_ok(const void* a, const void* b, const void* mask) {
  return is_aligned(a, kDropVec * sizeof(T)) && is_aligned(b, kDropVec * sizeof(T)) && is_aligned(mask, kDropVec);
}

// The compute dtype of the dropout kernels for a floating dtype: f64 for f64, else f32.
DType drop_compute(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

void dropout_cuda(const Tensor& out, const Tensor& mask, const Tensor& in, float p, double scale, PhiloxState st) {
  DeviceGuard guard(out.device(), "dropout");
  const int64_t n = in.numel();
  if (n == 0) return;
  // Mixed dtypes (the op never passes them): compute in the CPU's compute type and round once into out.
  if (out.dtype() != in.dtype()) {
    const DType cd = drop_compute(in.dtype());
    Tensor out2 = out.dtype() == cd ? out : empty(out.sizes(), {.dtype = cd, .device = out.device()});
    dropout_cuda(out2, mask, in.dtype() == cd ? in : in.to(cd), p, scale, st);
    if (!out2.is_alias_of(out)) {
      Tensor o = out;
      o.copy_(out2);
    }
    return;
  }
  const int dev = out.device().index;
  visit_floating(in.dtype(), "dropout", [&]<class T>() {
    using A = acc_t<T>;
    T* op = static_cast<T*>(out.raw_data());
    const T* ip = static_cast<const T*>(in.raw_data());
    uint8_t* mp = mask.data_ptr<uint8_t>();
    const bool vec = drop_vec_ok<T>(op, ip, mp);
    dropout_kernel_impl<T><<<blocks_for((n + kDropVec - 1) / kDropVec, kThreads, dev), kThreads, 0, stream_of(out)>>>(
        op, mp, ip, n, p, static_cast<A>(scale), st.seed, st.offset, vec);
    MP_CUDA_CHECK_LAUNCH();
  });
}

void dropout_backward_cuda(const Tensor& grad_in, const Tensor& grad_out, const Tensor& mask, double scale) {
  DeviceGuard guard(grad_in.device(), "dropout_backward");
  const int64_t n = grad_out.numel();
  if (n == 0) return;
  if (grad_in.dtype() != grad_out.dtype()) {
    const bool f64 = grad_in.dtype() == DType::f64 || grad_out.dtype() == DType::f64;
    const DType cd = f64 ? DType::f64 : DType::f32;
    Tensor gi2 = grad_in.dtype() == cd ? grad_in : empty(grad_in.sizes(), {.dtype = cd, .device = grad_in.device()});
    dropout_backward_cuda(gi2, grad_out.dtype() == cd ? grad_out : grad_out.to(cd), mask, scale);
    if (!gi2.is_alias_of(grad_in)) {
      Tensor o = grad_in;
      o.copy_(gi2);
    }
    return;
  }
  const int dev = grad_in.device().index;
  visit_floating(grad_in.dtype(), "dropout_backward", [&]<class T>() {
    using A = acc_t<T>;
    T* gp = static_cast<T*>(grad_in.raw_data());
    const T* op = static_cast<const T*>(grad_out.raw_data());
    const uint8_t* mp = mask.data_ptr<uint8_t>();
    const bool vec = drop_vec_ok<T>(gp, op, mp);
    dropout_backward_kernel_impl<T>
        <<<blocks_for((n + kDropVec - 1) / kDropVec, kThreads, dev), kThreads, 0, stream_of(grad_in)>>>(
            gp, op, mp, n, static_cast<A>(scale), vec);
    MP_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

MP_REGISTER_KERNEL(embedding_kernel, DeviceType::cuda, &embedding_cuda);
MP_REGISTER_KERNEL(embedding_backward_kernel, DeviceType::cuda, &embedding_backward_cuda);
MP_REGISTER_KERNEL(dropout_kernel, DeviceType::cuda, &dropout_cuda);
MP_REGISTER_KERNEL(dropout_backward_kernel, DeviceType::cuda, &dropout_backward_cuda);

}  // namespace mp::backend::cuda

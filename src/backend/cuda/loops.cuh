// Shared helpers of the CUDA kernels (nvcc only): element types and exact conversions, run-time
// dtype loads/stores, 16-byte vector loads/stores, a strided offset calculator with fast integer
// division, launch sizing, and uploading small host tables to the device.
//
// Note [CUDA 16-bit conversions]: device code converts exactly like the CPU (mp::scalar_cast and the
// half.hpp reference functions, Note [16-bit conversions and the hardware]), bit for bit, NaNs
// included. f16 uses the hardware instructions (cvt.f32.f16 is exact; cvt.rn.f16.f32 rounds to
// nearest even with subnormals and overflow to inf, like VCVTPS2PH), except for NaN, where the
// hardware returns a canonical NaN and the CPU keeps sign and payload: NaNs take the half.hpp path.
// bf16 uses the half.hpp bit manipulation (a shift; an add-and-shift rounding), which is as fast.
//
// API summary (keep names stable; other .cu files use them):
//   device_cast<To>(v)            scalar_cast for device code (exact, fast f16)
//   half_to_float(h), float_to_half(f)       the f16 conversions it uses
//   load_as<C>(p, dt) / store_as(p, dt, v)   element of run-time dtype dt at byte pointer p
//   visit_dtype_nothrow(dt, f)    host-side dtype visitor for launch code (no throwing default)
//   VecN<T, N>, load_vec<N>(p, out), store_vec<N>(p, in), vec_width<Ts...>(), is_aligned(p, bytes)
//   same_dense_layout(a, b)       one shape and one dense layout (a flat loop pairs their elements)
//   IntDivider, OffsetCalc<N>, make_offset_calc<N>(sizes, strides)
//   kThreads, blocks_for(work, threads, device), MP_CUDA_CHECK_LAUNCH() (runtime.hpp), stream_of(t), upload(host,
//   bytes, dev)
#pragma once
#if !defined(__CUDACC__)
#error "loops.cuh is for CUDA sources (.cu) only"
#endif
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "backend/cuda/runtime.hpp"
#include "mp/core/dtype.hpp"
#include "mp/core/half.hpp"
#include "mp/core/macros.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend::cuda {

// ================================================================ element types and conversions

/// float value of a Half, exactly as float(Half) on the CPU (hardware conversion; NaN keeps its payload).
__device__ MP_FORCE_INLINE float half_to_float(Half h) {
  const float f = __half2float(__ushort_as_half(h.x));
  return f != f ? mp::detail::half_bits_to_float(h.x) : f;
}

/// Half(f) exactly as on the CPU: round to nearest even, subnormals, overflow to inf, NaN payload kept.
__device__ MP_FORCE_INLINE Half float_to_half(float f) {
  if (f != f) return Half::from_bits(mp::detail::float_to_half_bits(f));
  return Half::from_bits(__half_as_ushort(__float2half_rn(f)));
}

/// mp::scalar_cast for device code: converts through float for the 16-bit types, static_cast
/// otherwise; the same bits as the CPU for every input (Note [CUDA 16-bit conversions]).
template <class To, class From>
__device__ MP_FORCE_INLINE To device_cast(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, Half>) {
    return device_cast<To>(half_to_float(v));
  } else if constexpr (std::is_same_v<From, BFloat16>) {
    return device_cast<To>(mp::detail::bf16_bits_to_float(v.x));
  } else if constexpr (std::is_same_v<To, Half>) {
    return float_to_half(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    return BFloat16::from_bits(mp::detail::float_to_bf16_bits(static_cast<float>(v)));
  } else {
    return static_cast<To>(v);
  }
}

/// The element of run-time dtype `dt` at byte address p, converted to C (a switch per call: for
/// general paths; fast paths template on the element type instead).
template <class C>
__device__ MP_FORCE_INLINE C load_as(const void* p, DType dt) {
  switch (dt) {
    case DType::f32: return device_cast<C>(*static_cast<const float*>(p));
    case DType::f64: return device_cast<C>(*static_cast<const double*>(p));
    case DType::f16: return device_cast<C>(*static_cast<const Half*>(p));
    case DType::bf16: return device_cast<C>(*static_cast<const BFloat16*>(p));
    case DType::i64: return device_cast<C>(*static_cast<const int64_t*>(p));
    case DType::i32: return device_cast<C>(*static_cast<const int32_t*>(p));
    case DType::u8: return device_cast<C>(*static_cast<const uint8_t*>(p));
    case DType::b8: return device_cast<C>(*static_cast<const bool*>(p));
  }
  return C{};
}

/// Store v converted to run-time dtype `dt` at byte address p.
template <class V>
__device__ MP_FORCE_INLINE void store_as(void* p, DType dt, V v) {
  switch (dt) {
    case DType::f32: *static_cast<float*>(p) = device_cast<float>(v); return;
    case DType::f64: *static_cast<double*>(p) = device_cast<double>(v); return;
    case DType::f16: *static_cast<Half*>(p) = device_cast<Half>(v); return;
    case DType::bf16: *static_cast<BFloat16*>(p) = device_cast<BFloat16>(v); return;
    case DType::i64: *static_cast<int64_t*>(p) = device_cast<int64_t>(v); return;
    case DType::i32: *static_cast<int32_t*>(p) = device_cast<int32_t>(v); return;
    case DType::u8: *static_cast<uint8_t*>(p) = device_cast<uint8_t>(v); return;
    case DType::b8: *static_cast<bool*>(p) = device_cast<bool>(v); return;
  }
}

/// Call f.template operator()<T>() for the element type T of dtype t (host code; never throws).
template <class F>
decltype(auto) visit_dtype_nothrow(DType t, F&& f) {
  switch (t) {
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::i32: return f.template operator()<int32_t>();
    case DType::u8: return f.template operator()<uint8_t>();
    case DType::b8: return f.template operator()<bool>();
    default: return f.template operator()<float>();
  }
}

// ================================================================ vector loads and stores

/// Bytes of one vector access (LDG.128 / STG.128).
inline constexpr int kVecBytes = 16;

/// N elements of T as one aligned unit: loads and stores of it compile to vector instructions
/// (several 16-byte ones when N * sizeof(T) > 16).
template <class T, int N>
struct alignas(sizeof(T) * N) VecN {
  T v[N];
};

/// Elements per thread for a vectorised loop over operands of types Ts: 16 bytes of the widest type, so
/// every operand's access is one instruction of at most 16 bytes and a warp's accesses are contiguous.
/// (32 bytes of f32 per thread, two 16-byte loads at a 32-byte stride, ran the f32 <-> bf16 casts at half
/// the copy rate on an H200: bench/RESULTS.md.)
template <class... Ts>
constexpr int vec_width() {
  constexpr size_t hi = std::max({sizeof(Ts)...});
  return static_cast<int>(kVecBytes / hi);
}

/// Load N elements from p, which must be aligned to N * sizeof(T) bytes.
template <int N, class T>
__device__ MP_FORCE_INLINE void load_vec(const T* p, T (&out)[N]) {
  const VecN<T, N> v = *reinterpret_cast<const VecN<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = v.v[i];
}

/// Store N elements to p, which must be aligned to N * sizeof(T) bytes.
template <int N, class T>
__device__ MP_FORCE_INLINE void store_vec(T* p, const T (&in)[N]) {
  VecN<T, N> v;
#pragma unroll
  for (int i = 0; i < N; ++i) v.v[i] = in[i];
  *reinterpret_cast<VecN<T, N>*>(p) = v;
}

/// Whether p is a multiple of `bytes` (a power of two).
inline bool is_aligned(const void* p, size_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

/// Whether a and b have one shape and one dense layout (identical strides over the dims of size > 1,
/// which tile the storage without gaps or overlap): element i in memory order of one sits at the same
/// offset as in the other, so a flat loop over the storage pairs them (contiguous or channels-last
/// alike). Contiguous tensors always qualify.
inline bool same_dense_layout(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes()) return false;
  if (a.is_contiguous() && b.is_contiguous()) return true;
  std::array<int64_t, 16> dims{};
  int n = 0;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1) {
      if (a.stride(d) != b.stride(d) || n == static_cast<int>(dims.size())) return false;
      dims[static_cast<size_t>(n++)] = d;
    }
  std::sort(dims.begin(), dims.begin() + n, [&](int64_t x, int64_t y) { return a.stride(x) < a.stride(y); });
  int64_t expected = 1;
  for (int i = 0; i < n; ++i) {
    if (a.stride(dims[static_cast<size_t>(i)]) != expected) return false;
    expected *= a.size(dims[static_cast<size_t>(i)]);
  }
  return true;
}

// ================================================================ strided offsets

/// Division by a fixed positive divisor d. When both d and the dividend are below 2^31 it is a
/// multiply-high and a shift (the round-up method of Granlund & Montgomery, as PyTorch's IntDivider);
/// otherwise a 64-bit division. Built on the host.
struct IntDivider {
  int64_t d64 = 1;
  uint32_t magic = 1, shift = 0;
  IntDivider() = default;
  /// d >= 1.
  explicit IntDivider(int64_t d) : d64(d) {
    if (d <= INT32_MAX) {
      while ((uint64_t{1} << shift) < static_cast<uint64_t>(d)) ++shift;
      magic = static_cast<uint32_t>(
          ((uint64_t{1} << 32) * ((uint64_t{1} << shift) - static_cast<uint64_t>(d))) / static_cast<uint64_t>(d) + 1);
    }
  }
  /// n / d for 0 <= n < 2^31 (and d < 2^31). Host and device (the host form is for tests).
  MP_HD MP_FORCE_INLINE uint32_t div32(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, magic);
#else
    const auto hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
    return (hi + n) >> shift;
  }
};

/// Maximum dims of an offset calculator after coalescing.
inline constexpr int kMaxDims = 12;

/// Element offsets of N operands of one iteration shape at a linear (row-major) index. Dims are
/// stored innermost first, already coalesced; strides are in elements (0 for broadcast dims).
template <int N>
struct OffsetCalc {
  int ndim = 1;       ///< >= 1
  bool use32 = true;  ///< numel < 2^31 and every size < 2^31: 32-bit division
  int64_t numel = 0;  ///< product of the sizes
  IntDivider sizes[kMaxDims];
  int64_t strides[kMaxDims][N];

  /// off[k] = element offset of operand k at linear index i (0 <= i < numel). Host and device.
  /// The dim loops are unrolled to kMaxDims with an early exit, so every array index is a
  /// compile-time constant: a run-time index into a kernel parameter would copy it to local memory.
  MP_HD MP_FORCE_INLINE void get(int64_t i, int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    if (use32) {
      uint32_t r = static_cast<uint32_t>(i);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int d = 0; d < kMaxDims; ++d) {
        if (d == ndim) break;
        uint32_t idx = r;
        if (d < ndim - 1) {
          const uint32_t q = sizes[d].div32(r);
          idx = r - q * static_cast<uint32_t>(sizes[d].d64);
          r = q;
        }
        for (int k = 0; k < N; ++k) off[k] += static_cast<int64_t>(idx) * strides[d][k];
      }
    } else {
      int64_t r = i;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
      for (int d = 0; d < kMaxDims; ++d) {
        if (d == ndim) break;
        int64_t idx = r;
        if (d < ndim - 1) {
          const int64_t q = r / sizes[d].d64;
          idx = r - q * sizes[d].d64;
          r = q;
        }
        for (int k = 0; k < N; ++k) off[k] += idx * strides[d][k];
      }
    }
  }
};

/// Build an OffsetCalc for one iteration shape `sizes` (outermost first) and the element strides of
/// N operands over it: size-1 dims are dropped and neighbours merged where every operand is
/// contiguous across them. Throws when more than kMaxDims dims remain.
template <int N>
OffsetCalc<N> make_offset_calc(std::span<const int64_t> sizes, const std::array<std::span<const int64_t>, N>& strides) {
  // Coalesce outermost first (as the CPU loops do), then store innermost first.
  int64_t cs[64], cst[64][N];
  int nd = 0;
  int64_t numel = 1;
  MP_CHECK(sizes.size() <= 64, "cuda kernels: at most 64 dims, got ", sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    numel *= sizes[d];
    if (sizes[d] == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; k < N && merge; ++k) merge = cst[nd - 1][k] == strides[k][d] * sizes[d];
    if (merge) {
      cs[nd - 1] *= sizes[d];
      for (int k = 0; k < N; ++k) cst[nd - 1][k] = strides[k][d];
    } else {
      cs[nd] = sizes[d];
      for (int k = 0; k < N; ++k) cst[nd][k] = strides[k][d];
      ++nd;
    }
  }
  OffsetCalc<N> c;
  c.numel = numel;
  if (nd == 0) {  // a scalar, or all sizes 1
    c.ndim = 1;
    c.sizes[0] = IntDivider(1);
    for (int k = 0; k < N; ++k) c.strides[0][k] = 0;
    return c;
  }
  MP_CHECK(nd <= kMaxDims, "cuda kernels: at most ", kMaxDims, " dims after merging contiguous ones, got ", nd,
           "; make the operands contiguous first");
  c.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    c.sizes[d] = IntDivider(std::max<int64_t>(cs[nd - 1 - d], 1));
    for (int k = 0; k < N; ++k) c.strides[d][k] = cst[nd - 1 - d][k];
    if (cs[nd - 1 - d] > INT32_MAX) c.use32 = false;
  }
  if (numel > INT32_MAX) c.use32 = false;
  return c;
}

// ================================================================ special values

/// -inf in A (float or double), without host-only numeric_limits in device code.
template <class A>
__device__ MP_FORCE_INLINE A neg_inf() {
  if constexpr (std::is_same_v<A, float>)
    return __int_as_float(static_cast<int>(0xff800000u));
  else
    return __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));
}

// ================================================================ launching

/// Threads per block of the element-wise and reduction kernels.
inline constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over `work` items of one thread each: ceil(work / threads), capped at
/// one full wave of the device (multiprocessors * 2048 / threads); at least 1.
inline unsigned blocks_for(int64_t work, int threads, int device) {
  const int64_t wave = static_cast<int64_t>(device_properties(device).multiprocessors) * std::max(1, 2048 / threads);
  const int64_t need = (work + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(std::min(need, wave), 1, INT32_MAX));
}

/// The stream of the device that holds t (Note [one stream per device]).
inline cudaStream_t stream_of(const Tensor& t) { return current_stream(t.device().index); }

/// A device copy of `bytes` bytes of host memory (u8 tensor on dev), queued on dev's stream: for the
/// small tables of multi-tensor kernels. The host memory may be freed when this returns.
inline Tensor upload(const void* host, size_t bytes, Device dev) {
  Tensor h = mp::empty({static_cast<int64_t>(bytes)}, {.dtype = DType::u8});
  if (bytes > 0) std::memcpy(h.raw_data(), host, bytes);
  return h.to(dev);
}

}  // namespace mp::backend::cuda

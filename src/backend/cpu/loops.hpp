#pragma once
// The CPU element-wise loop: operands of one shape (broadcast inputs carry stride 0), any dtypes.
// Dims are coalesced, the work is cut into blocks of kBlock elements along the innermost dim and
// spread over OpenMP threads. Per block each input is brought into a compute-type buffer (directly
// addressed when it already is the compute type and unit-stride; bulk-converted when f16/bf16),
// the functor runs over plain arrays (vectorisable, no per-element dispatch), and the result is
// stored (converted when the output is not the compute type).
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "mp/core/convert.hpp"
#include "mp/core/dtype.hpp"
#include "mp/core/macros.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend::cpu {

/// Elements per block of the element-wise loop.
inline constexpr int64_t kBlock = 512;
/// Below this many elements a loop runs on one thread.
inline constexpr int64_t kParallelGrain = 32768;
/// Maximum dims after coalescing.
inline constexpr int kMaxLoopDims = 12;

/// Coalesced iteration space of N operands (operand 0 is the output).
template <int N>
struct LoopPlan {
  int ndim = 0;
  std::array<int64_t, kMaxLoopDims> sizes{};
  std::array<std::array<int64_t, kMaxLoopDims>, N> strides{};  // elements
  std::array<char*, N> base{};
  std::array<DType, N> dtypes{};
  int64_t numel = 1;
};

/// Build the plan: visit the dims in the output's memory order (outermost first: a channels-last output
/// is walked N, H, W, C, so its innermost loop is unit-stride), drop size-1 dims and merge dims that are
/// contiguous for every operand. Operands sharing the output's layout coalesce to one dim.
template <int N>
LoopPlan<N> make_plan(const std::array<const Tensor*, N>& ops) {
  LoopPlan<N> p;
  const Shape& shape = ops[0]->sizes();
  for (int k = 0; k < N; ++k) {
    p.base[k] = static_cast<char*>(ops[k]->raw_data());
    p.dtypes[k] = ops[k]->dtype();
  }
  std::array<size_t, kMaxLoopDims + 4> order{};
  MP_ASSERT(shape.size() <= order.size(), "too many dims for the element-wise loop");
  for (size_t d = 0; d < shape.size(); ++d) order[d] = d;
  const Shape& out_strides = ops[0]->strides();
  std::stable_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(shape.size()),
                   [&](size_t a, size_t b) { return out_strides[a] > out_strides[b]; });
  for (size_t i = 0; i < shape.size(); ++i) {
    const size_t d = order[i];
    if (shape[d] == 1) continue;
    p.numel *= shape[d];
    const int nd = p.ndim;
    bool merge = nd > 0;
    for (int k = 0; k < N && merge; ++k) merge = p.strides[k][nd - 1] == ops[k]->strides()[d] * shape[d];
    if (merge) {
      p.sizes[nd - 1] *= shape[d];
      for (int k = 0; k < N; ++k) p.strides[k][nd - 1] = ops[k]->strides()[d];
    } else {
      MP_ASSERT(nd < kMaxLoopDims, "too many dims for the element-wise loop");
      p.sizes[nd] = shape[d];
      for (int k = 0; k < N; ++k) p.strides[k][nd] = ops[k]->strides()[d];
      p.ndim = nd + 1;
    }
  }
  for (int64_t s : shape)
    if (s == 0) p.numel = 0;
  if (p.ndim == 0) {  // scalar or all size-1
    p.ndim = 1;
    p.sizes[0] = 1;
    for (int k = 0; k < N; ++k) p.strides[k][0] = 0;
  }
  return p;
}

/// Bring n elements of dtype `dt` at `ptr` (stride in elements) into compute type C. Returns a pointer
/// to C values: `ptr` itself when no conversion is needed, else `buf`.
template <class C>
const C* load_block(const char* ptr, int64_t stride, DType dt, int64_t n, C* buf) {
  if (dt == dtype_of<C>() && stride == 1) return reinterpret_cast<const C*>(ptr);
  if constexpr (std::is_same_v<C, float>) {
    if (stride == 1 && dt == DType::bf16) {
      detail::block_converters().bf16_to_f32(reinterpret_cast<const uint16_t*>(ptr), buf, static_cast<size_t>(n));
      return buf;
    }
    if (stride == 1 && dt == DType::f16) {
      detail::block_converters().f16_to_f32(reinterpret_cast<const uint16_t*>(ptr), buf, static_cast<size_t>(n));
      return buf;
    }
  }
  visit_dtype(dt, [&]<class T>() {
    const T* src = reinterpret_cast<const T*>(ptr);
    if (stride == 0) {
      std::fill(buf, buf + n, scalar_cast<C>(src[0]));
    } else {
      for (int64_t j = 0; j < n; ++j) buf[j] = scalar_cast<C>(src[j * stride]);
    }
  });
  return buf;
}

/// Store n compute-type values to `ptr` of dtype `dt` with a stride.
template <class R>
void store_block(char* ptr, int64_t stride, DType dt, int64_t n, const R* vals) {
  if constexpr (std::is_same_v<R, float>) {
    if (stride == 1 && dt == DType::bf16) {
      detail::block_converters().f32_to_bf16(vals, reinterpret_cast<uint16_t*>(ptr), static_cast<size_t>(n));
      return;
    }
    if (stride == 1 && dt == DType::f16) {
      detail::block_converters().f32_to_f16(vals, reinterpret_cast<uint16_t*>(ptr), static_cast<size_t>(n));
      return;
    }
  }
  visit_dtype(dt, [&]<class T>() {
    T* dst = reinterpret_cast<T*>(ptr);
    for (int64_t j = 0; j < n; ++j) dst[j * stride] = scalar_cast<T>(vals[j]);
  });
}

/// Run `body(offsets, j0, n)` over the plan's blocks in parallel; offsets are byte offsets of each
/// operand at inner index j0.
template <int N, class Body>
void for_each_block(const LoopPlan<N>& p, Body&& body) {
  const int64_t inner = p.sizes[p.ndim - 1];
  if (p.numel == 0) return;
  const int64_t blocks_per_row = (inner + kBlock - 1) / kBlock;
  const int64_t outer = p.numel / inner;
  const int64_t work = outer * blocks_per_row;
  std::array<int64_t, N> esize{};
  for (int k = 0; k < N; ++k) esize[k] = static_cast<int64_t>(dtype_size(p.dtypes[k]));
  auto run = [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t row = w / blocks_per_row;
      const int64_t j0 = (w % blocks_per_row) * kBlock;
      std::array<int64_t, N> off{};
      int64_t r = row;
      for (int d = p.ndim - 2; d >= 0; --d) {
        const int64_t idx = r % p.sizes[d];
        r /= p.sizes[d];
        for (int k = 0; k < N; ++k) off[k] += idx * p.strides[k][d];
      }
      for (int k = 0; k < N; ++k) off[k] = (off[k] + j0 * p.strides[k][p.ndim - 1]) * esize[k];
      body(off, std::min(kBlock, inner - j0));
    }
  };
  if (p.numel < kParallelGrain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    run(0, work);
    return;
  }
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t chunk = (work + nt - 1) / nt;
    run(std::min(work, t * chunk), std::min(work, (t + 1) * chunk));
  }
}

/// Whether pointwise_loop also compiles its inner loop for the vector ISAs (call_isa).
enum class LoopIsa : uint8_t {
  baseline,  ///< the library's build flags only (x86-64: SSE2): memory-bound loops
  widest,    ///< also AVX2 + FMA and AVX-512 copies, the widest this CPU runs picked per call (compute-bound loops)
};

// Note [AVX-512 element-wise loops]
// The library is built without -march flags, so its loops are SSE2 code. For compute-bound loops
// (the fast_math.hpp transcendentals: exp/log/tanh/sigmoid/gelu, softmax, the LSTM gates, the fused attention's
// tiles) a kernel also compiles the same inner loop for AVX-512 and for AVX2 + FMA through target attributes
// (MP_AVX512_LOOP_TARGET, MP_AVX2_LOOP_TARGET) and call_isa() runs the widest copy this CPU has while
// vector_loops_enabled(): the loop body is a force-inlined functor (SimdBlock, or a kernel's own *Lanes functor)
// that call_avx512() / call_avx2() inline into a function compiled for that ISA, so the float math is vectorised
// with 16 or 8 lanes and FMA. Measured 3.5-5.5x per core over the SSE2 loop for the transcendentals
// (bench/bench_fast_math.cpp) on AVX-512; the AVX2 copy exists because CPUs without AVX-512 are common (AMD Zen 3:
// the fused attention ran 30x slower than on Zen 4 on the SSE2 copy, bench/RESULTS.md); memory-bound loops gain
// nothing and stay baseline. With FMA, GCC contracts a*b+c, so results may differ from the baseline
// path in the last bit (both stay within the bounds of Note [fast float transcendentals]; the tests
// compare the two paths, switching with set_avx512_loops(), which turns both vector copies off). Only code
// inlined into call_avx512 / call_avx2 uses their ISA: functions it calls out of line keep their own (baseline)
// target.
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define MP_HAVE_AVX512_LOOPS 1
/// Compiles a function for AVX-512 F/BW/VL (with AVX2 and FMA) and 512-bit vectors; call it only
/// when avx512_loops_enabled().
#if defined(__clang__)
#define MP_AVX512_LOOP_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
#else
#define MP_AVX512_LOOP_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,prefer-vector-width=512")))
#endif
/// Compiles a function for AVX2 + FMA (and F16C) with 256-bit vectors; call it only where the CPU has them.
#define MP_AVX2_LOOP_TARGET __attribute__((target("avx2,fma,f16c")))
#endif

/// Whether kernels run their AVX-512 inner loops: the CPU (and OS) support AVX-512 F/BW/VL and FMA,
/// and set_avx512_loops(false) is not in effect. Cheap (a relaxed atomic load and a cached flag).
bool avx512_loops_enabled();

/// Whether call_isa(true, ...) runs a vector copy: AVX-512 as avx512_loops_enabled(), else AVX2 + FMA where the CPU
/// has them (AMD Zen 3, Intel before Skylake-SP), and set_avx512_loops(false) is not in effect.
bool vector_loops_enabled();

/// Allows (true: where the CPU has AVX-512) or forbids (false) the AVX-512 inner loops for the whole
/// process and returns the previous setting; for tests and benchmarks that compare the two paths.
bool set_avx512_loops(bool allowed);

#if defined(MP_HAVE_AVX512_LOOPS)
/// f(args...) compiled for AVX-512: f's call operator must be MP_FORCE_INLINE (so it is inlined and
/// vectorised here). Only call when avx512_loops_enabled().
template <class F, class... Args>
MP_AVX512_LOOP_TARGET void call_avx512(const F& f, Args... args) {
  f(args...);
}
#endif

#if defined(MP_HAVE_AVX512_LOOPS)
/// f(args...) compiled for AVX2 + FMA (as call_avx512). Only call where the CPU has them.
template <class F, class... Args>
MP_AVX2_LOOP_TARGET void call_avx2(const F& f, Args... args) {
  f(args...);
}
#endif

/// f(args...), compiled for the widest vector ISA this CPU runs when `vector` (callers pass
/// vector_loops_enabled(), or false for an input the baseline handles better), else for the baseline.
template <class F, class... Args>
MP_FORCE_INLINE void call_isa(bool vector, const F& f, Args... args) {
#if defined(MP_HAVE_AVX512_LOOPS)
  if (vector) {
    if (avx512_loops_enabled()) return call_avx512(f, args...);
    return call_avx2(f, args...);  // vector_loops_enabled() without AVX-512: AVX2 + FMA
  }
#endif
  f(args...);
}

/// o[j] = f(in[0][j], ...) for j < n: the vectorised inner loop of pointwise_loop.
template <int NIn, class F>
struct SimdBlock {
  F f;
  template <class C, class R>
  MP_FORCE_INLINE void operator()(R* o, const C* const* in, int64_t n) const {
    if constexpr (NIn == 1) {
      const C* a = in[0];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) o[j] = f(a[j]);
    } else if constexpr (NIn == 2) {
      const C *a = in[0], *b = in[1];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) o[j] = f(a[j], b[j]);
    } else {
      const C *a = in[0], *b = in[1], *c = in[2];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) o[j] = f(a[j], b[j], c[j]);
    }
  }
};

/// out = f(ins...) element-wise with compute type C; f takes NIn values of C and returns C or bool.
/// Isa = LoopIsa::widest also compiles the inner loop for AVX2 and AVX-512 and runs the widest copy the CPU has
/// while vector_loops_enabled() (Note [AVX-512 element-wise loops]).
template <class C, int NIn, LoopIsa Isa = LoopIsa::baseline, class F>
void pointwise_loop(const Tensor& out, std::span<const Tensor> ins, F f) {
  constexpr int N = NIn + 1;
  std::array<const Tensor*, N> ops{};
  ops[0] = &out;
  for (int k = 0; k < NIn; ++k) ops[k + 1] = &ins[k];
  const LoopPlan<N> p = make_plan<N>(ops);
  const int last = p.ndim - 1;
  using R = decltype([&]<size_t... I>(std::index_sequence<I...>) {
    return f((static_cast<void>(I), C{})...);
  }(std::make_index_sequence<NIn>{}));
  const bool vector = Isa == LoopIsa::widest && vector_loops_enabled();
  for_each_block<N>(p, [&](const std::array<int64_t, N>& off, int64_t n) {
    alignas(64) C buf[NIn][kBlock];
    alignas(64) R obuf[kBlock];
    const C* in[NIn];
    for (int k = 0; k < NIn; ++k)
      in[k] = load_block<C>(p.base[k + 1] + off[k + 1], p.strides[k + 1][last], p.dtypes[k + 1], n, buf[k]);
    const bool direct = p.dtypes[0] == dtype_of<R>() && p.strides[0][last] == 1;
    R* o = direct ? reinterpret_cast<R*>(p.base[0] + off[0]) : obuf;
    const SimdBlock<NIn, F> block{f};
    if constexpr (Isa == LoopIsa::widest) {
      call_isa(vector, block, o, static_cast<const C* const*>(in), n);
    } else {
      block(o, static_cast<const C* const*>(in), n);
    }
    if (!direct) store_block<R>(p.base[0] + off[0], p.strides[0][last], p.dtypes[0], n, o);
  });
}

/// n values of contiguous tensor t from element `off`, as A (a pointer into t when no conversion is needed).
template <class A>
const A* load_at(const Tensor& t, int64_t off, int64_t n, A* buf) {
  return load_block<A>(static_cast<const char*>(t.raw_data()) + off * static_cast<int64_t>(t.element_size()), 1,
                       t.dtype(), n, buf);
}

/// Where to write n results for contiguous t at `off`: straight into t when it holds A, else into buf
/// (then flush_at()).
template <class A>
A* dest_at(const Tensor& t, int64_t off, A* buf) {
  return t.dtype() == dtype_of<A>() ? static_cast<A*>(t.raw_data()) + off : buf;
}

/// Store n values written to dest_at()'s buffer into t at `off` (a no-op when they went straight to t).
template <class A>
void flush_at(const Tensor& t, int64_t off, int64_t n, const A* vals) {
  if (t.dtype() != dtype_of<A>())
    store_block<A>(static_cast<char*>(t.raw_data()) + off * static_cast<int64_t>(t.element_size()), 1, t.dtype(), n,
                   vals);
}

/// Whether `work` elements justify an OpenMP parallel region here.
inline bool should_parallelize(int64_t work) {
  return work >= kParallelGrain && omp_get_max_threads() > 1 && !omp_in_parallel();
}

}  // namespace mp::backend::cpu

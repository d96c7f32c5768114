#pragma once
// Helpers shared by the CPU normalisation kernels (batch_norm.cpp: batch norm over [N, C, S] with S > 1 in NCHW;
// layer_norm.cpp; batch_norm_rows.cpp: batch norm over rows of contiguous channels, i.e. [N, C] and channels-last
// [N, C, S]): typed operand access, the in-loop bf16 conversion, the per-ISA compilation of the hot loops.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/pointwise.hpp"
#include "mp/core/cpu_features.hpp"
#include "mp/core/half.hpp"
#include "mp/tensor/tensor.hpp"

// Note [ISA variants of the batch-norm loops]
// The library is built for the baseline ISA (x86-64: SSE2). The hot per-group (NCHW) and per-chunk (rows)
// bodies of the batch-norm kernels are always-inline templates instantiated in three functions: baseline, AVX2
// and AVX-512 (function target attributes), and the widest one this CPU runs is picked per call (norm_isa():
// AVX-512 only while avx512_loops_enabled(), so set_avx512_loops(false) selects AVX2). Results are
// bit-identical across the variants: the variants compile with fp-contract=off (no FMA contraction; the
// baseline has no FMA), and every reduction adds into partial sums chosen by the source, not by the vector
// width (NCHW: kLanes partial sums per channel; rows: one partial sum per channel and step position, the
// vector running across channels). Other compilers and CPUs get the baseline function only.
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define MP_NORM_ISA_VARIANTS 1
#define MP_LOOP_INLINE [[gnu::always_inline]] inline
#define MP_LAMBDA_INLINE __attribute__((always_inline))
#define MP_TARGET_AVX2 [[gnu::target("avx2"), gnu::optimize("fp-contract=off")]]
#define MP_TARGET_AVX512 \
  [[gnu::target("avx512f,avx512bw,avx512vl,prefer-vector-width=512"), gnu::optimize("fp-contract=off")]]
#else
#define MP_NORM_ISA_VARIANTS 0
#define MP_LOOP_INLINE inline
#define MP_LAMBDA_INLINE
#endif

namespace mp::backend::cpu::norm_detail {

/// Typed access to one dense operand: element i lives at base + i * esize.
struct Operand {
  char* base = nullptr;
  DType dtype = DType::f32;
  int64_t esize = 0;
  Operand() = default;
  /// The operand of t (undefined t gives an undefined operand).
  explicit Operand(const Tensor& t) {
    if (!t.defined()) return;
    base = static_cast<char*>(t.raw_data());
    dtype = t.dtype();
    esize = static_cast<int64_t>(t.element_size());
  }
  /// Whether it refers to a tensor.
  bool defined() const { return base != nullptr; }
  /// Address of element i.
  MP_LOOP_INLINE char* at(int64_t i) const { return base + i * esize; }
  /// n values from element i as S (a pointer into the tensor when it already is S, else into buf).
  template <class S>
  MP_LOOP_INLINE const S* load(int64_t i, int64_t n, S* buf) const {
    return load_block<S>(at(i), 1, dtype, n, buf);
  }
  /// Destination for n results of type S at element i: the tensor itself when it has type S, else buf.
  template <class S>
  MP_LOOP_INLINE S* dest(int64_t i, S* buf) const {
    return dtype == dtype_of<S>() ? reinterpret_cast<S*>(at(i)) : buf;
  }
  /// Store what dest() handed out (a no-op when it wrote in place).
  template <class S>
  MP_LOOP_INLINE void commit(int64_t i, int64_t n, const S* vals) const {
    if (dtype != dtype_of<S>()) store_block<S>(at(i), 1, dtype, n, vals);
  }
};

/// A contiguous 1-D tensor of n values converted to S; `fill` everywhere when undefined.
template <class S>
std::vector<S> load_vector(const Tensor& t, int64_t n, S fill) {
  std::vector<S> v(static_cast<size_t>(n), fill);
  if (t.defined() && n > 0) {
    const S* p = load_block<S>(static_cast<const char*>(t.raw_data()), 1, t.dtype(), n, v.data());
    if (p != v.data()) std::copy(p, p + n, v.data());
  }
  return v;
}

/// Whether `work` elements justify a parallel region here.
inline bool go_parallel(int64_t work) { return work >= kParallelGrain && !omp_in_parallel(); }

/// Element access of the batch-norm loops with statistics type S, for operands stored as T: T = S (read and
/// written in place), T = uint16_t (bf16 bits, converted inside the loops: a shift in, round to nearest even
/// out, as BFloat16(float)), or T = void (any other dtype, or operands of different dtypes: pieces go through
/// S buffers with the bulk converters). E is what the loops read and write.
template <class S, class T>
struct Access {
  using E = std::conditional_t<std::is_void_v<T>, S, T>;
  /// A stored value as S.
  MP_LOOP_INLINE static S in(E v) {
    if constexpr (std::is_same_v<E, uint16_t>)
      return detail::bf16_bits_to_float(v);
    else
      return v;
  }
  /// An S result as stored (rounded once).
  MP_LOOP_INLINE static E out(S v) {
    if constexpr (std::is_same_v<E, uint16_t>)
      return detail::float_to_bf16_bits(v);
    else
      return v;
  }
  /// n values of o from element i (converted into buf when T is void and o is not S).
  MP_LOOP_INLINE static const E* src(const Operand& o, int64_t i, int64_t n, S* buf) {
    if constexpr (std::is_void_v<T>)
      return o.load<S>(i, n, buf);
    else
      return reinterpret_cast<const E*>(o.at(i));
  }
  /// Where to write values of o from element i (buf when T is void and o is not S; then commit()).
  MP_LOOP_INLINE static E* dst(const Operand& o, int64_t i, S* buf) {
    if constexpr (std::is_void_v<T>)
      return o.dest<S>(i, buf);
    else
      return reinterpret_cast<E*>(o.at(i));
  }
  /// Store n values written to what dst() returned.
  MP_LOOP_INLINE static void commit(const Operand& o, int64_t i, int64_t n, const E* v) {
    if constexpr (std::is_void_v<T>) o.commit<S>(i, n, v);
  }
};

/// Calls f.template operator()<T>() with T the storage type of the fused loops for operands of dtype dt
/// (all of them; `same` is false when their dtypes differ): S, bf16 bits (S = f32), or void.
template <class S, class F>
void visit_storage(DType dt, bool same, F&& f) {
  if (same && dt == dtype_of<S>()) return f.template operator()<S>();
  if constexpr (std::is_same_v<S, float>)
    if (same && dt == DType::bf16) return f.template operator()<uint16_t>();
  f.template operator()<void>();
}

#if MP_NORM_ISA_VARIANTS
/// The instruction sets the batch-norm loops are compiled for.
enum class NormIsa { base, avx2, avx512 };

/// The widest variant to run now (Note [ISA variants of the batch-norm loops]).
inline NormIsa norm_isa() {
  static const bool avx2 = cpu_features().avx2;
  if (avx512_loops_enabled()) return NormIsa::avx512;
  return avx2 ? NormIsa::avx2 : NormIsa::base;
}
#endif

// Defines name_base, name_avx2, name_avx512 (the always-inline template `name` compiled for each ISA, for
// statistics type S and storage T; signature (const Args<S>&, int64_t, S* const* buffers: kScratchBuffers
// scratch buffers)) and name_fn<S, T>()
// returning the one for this CPU (f64 statistics always take the baseline: f64 batch norm is for gradient
// checks, not speed).
#if MP_NORM_ISA_VARIANTS
#define MP_NORM_VARIANTS(name, Args)                                                          \
  template <class S, class T>                                                                 \
  void name##_base(const Args<S>& a, int64_t grp, S* const* b) {                              \
    name<S, T>(a, grp, b);                                                                    \
  }                                                                                           \
  template <class S, class T>                                                                 \
  MP_TARGET_AVX2 void name##_avx2(const Args<S>& a, int64_t grp, S* const* b) {               \
    name<S, T>(a, grp, b);                                                                    \
  }                                                                                           \
  template <class S, class T>                                                                 \
  MP_TARGET_AVX512 void name##_avx512(const Args<S>& a, int64_t grp, S* const* b) {           \
    name<S, T>(a, grp, b);                                                                    \
  }                                                                                           \
  template <class S, class T>                                                                 \
  auto name##_fn() {                                                                          \
    if constexpr (std::is_same_v<S, double>) {                                                \
      return &name##_base<S, T>;                                                              \
    } else {                                                                                  \
      const norm_detail::NormIsa isa = norm_detail::norm_isa();                               \
      if (isa == norm_detail::NormIsa::base) return &name##_base<S, T>;                       \
      return isa == norm_detail::NormIsa::avx512 ? &name##_avx512<S, T> : &name##_avx2<S, T>; \
    }                                                                                         \
  }
#else
#define MP_NORM_VARIANTS(name, Args)                             \
  template <class S, class T>                                    \
  void name##_base(const Args<S>& a, int64_t grp, S* const* b) { \
    name<S, T>(a, grp, b);                                       \
  }                                                              \
  template <class S, class T>                                    \
  auto name##_fn() {                                             \
    return &name##_base<S, T>;                                   \
  }
#endif

/// Scratch buffers handed to each per-ISA loop body (MP_NORM_VARIANTS).
inline constexpr int kScratchBuffers = 5;

/// The fused epilogue of the batch-norm forward over the nv values of y from element i, after the normalised
/// values were stored (Note [batch norm + add + ReLU] in norm_kernels.hpp): y = relu?(y + residual?) with the
/// stored (rounded) y read back, the sum in S, rounded once. o: what Access::dst handed out for the block (the
/// tensor itself when T is not void). rbuf, ybuf: scratch for the residual and y as S when T is void.
template <class S, class T>
MP_LOOP_INLINE void bn_epilogue_block(const Operand& yo, const Operand& ro, bool relu, int64_t i, int64_t nv,
                                      typename Access<S, T>::E* o, S* rbuf, S* ybuf) {
  using A = Access<S, T>;
  using E = typename A::E;
  const E* r = ro.defined() ? A::src(ro, i, nv, rbuf) : nullptr;
  const E* yv = o;
  E* d = o;
  if constexpr (std::is_void_v<T>) {  // o held unrounded values: read y back as stored
    yv = yo.load<S>(i, nv, ybuf);
    d = yo.dest<S>(i, ybuf);
  }
  const ReluFn<S> rl{};
  if (r != nullptr && relu) {
#pragma omp simd
    for (int64_t w = 0; w < nv; ++w) d[w] = A::out(rl(A::in(yv[w]) + A::in(r[w])));
  } else if (r != nullptr) {
#pragma omp simd
    for (int64_t w = 0; w < nv; ++w) d[w] = A::out(A::in(yv[w]) + A::in(r[w]));
  } else if (relu) {
#pragma omp simd
    for (int64_t w = 0; w < nv; ++w) d[w] = A::out(rl(A::in(yv[w])));
  }
  if constexpr (std::is_void_v<T>) yo.commit<S>(i, nv, d);
}

/// The ReLU mask of the fused batch-norm backward over n values from element i: dz = y > 0 ? dy : 0 (exact in
/// any dtype; NaN y gives 0, as ReluBackwardFn). Writes dz into zo when defined (else into zbuf) and returns
/// the masked values as the loops read them. gbuf, ybuf: scratch for dy and y as S when T is void.
template <class S, class T>
MP_LOOP_INLINE const typename Access<S, T>::E* bn_relu_mask_block(const Operand& dyo, const Operand& yo,
                                                                  const Operand& zo, int64_t i, int64_t n, S* gbuf,
                                                                  S* ybuf, S* zbuf) {
  using A = Access<S, T>;
  using E = typename A::E;
  const E* g = A::src(dyo, i, n, gbuf);
  const E* yv = A::src(yo, i, n, ybuf);
  E* z = zo.defined() ? A::dst(zo, i, zbuf) : reinterpret_cast<E*>(zbuf);
#pragma omp simd
  for (int64_t w = 0; w < n; ++w) z[w] = A::in(yv[w]) > S(0) ? g[w] : A::out(S(0));
  if (zo.defined()) A::commit(zo, i, n, z);
  return z;
}

/// Whether x [N, C, S] is channels-last: strides {S C, 1, C} with S > 1 and C > 1 (where the two layouts
/// differ); a size-1 batch dim may have any stride.
inline bool bn_channels_last(const Tensor& x) {
  const int64_t N = x.size(0), C = x.size(1), S = x.size(2);
  return S > 1 && C > 1 && x.stride(1) == 1 && x.stride(2) == C && (N == 1 || x.stride(0) == S * C);
}

/// Batch norm forward over R = N S rows of C contiguous channels: x [N, C, 1] contiguous or x [N, C, S]
/// channels-last, y in the same layout (batch_norm_rows.cpp; arguments as BatchNormForwardKernel with the
/// weight and bias converted to S, ones/zeros when absent).
template <class S>
void bn_forward_rows(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd, const Tensor& x,
                     const std::vector<S>& w, const std::vector<S>& b, bool training, double eps,
                     const Tensor& residual, bool relu);

/// Batch norm backward over R = N S rows of C contiguous channels (layouts as bn_forward_rows; arguments as
/// BatchNormBackwardKernel with mean, invstd and weight converted to S).
template <class S>
void bn_backward_rows(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                      const std::vector<S>& mean, const std::vector<S>& invstd, const std::vector<S>& w, bool training,
                      const Tensor& y, const Tensor& dz);

}  // namespace mp::backend::cpu::norm_detail

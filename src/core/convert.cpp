#include "mp/core/convert.hpp"

#include <algorithm>
#include <cstdint>

#include "mp/core/cpu_features.hpp"
#include "mp/core/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#define MP_CONVERT_X86 1
// GCC 12's AVX-512 headers build "undefined" vectors as `__m512 __Y = __Y;`, which -Wuninitialized
// reports at the header's lines once inlined (GCC bug 105593, fixed in 12.3/13). Diagnostic pragmas
// apply by source location, so ignoring the warning around the include silences only the headers.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// The SIMD kernels live in functions with __attribute__((target(...))) so the library builds
// without -march flags; which one runs is decided per call from cpu_features(). All work on raw
// 16-bit patterns (Half and BFloat16 are standard-layout wrappers of one uint16_t).
//
// Exactness (tests/core/test_convert.cpp checks every path against the scalar functions):
//  * f32 <-> f16 use VCVTPS2PH (round to nearest even) / VCVTPH2PS, which equal the scalar
//    functions for all inputs (tests/core/test_half.cpp checks all 2^32 / 2^16 patterns).
//  * bf16 -> f32 is a 16-bit left shift, exactly the scalar definition.
//  * f32 -> bf16 does NOT use AVX512-BF16's VCVTNEPS2BF16, which flushes FP32 subnormal inputs to
//    zero (Note [bf16 subnormals on AVX512-BF16] in half.hpp). It uses the integer RNE sequence of
//    the scalar function instead: r = x + 0x7fff + ((x >> 16) & 1), NaN lanes -> x | 0x00400000,
//    result = r >> 16. Measured on Sapphire Rapids (1 core, 8K elements in L1): this sequence with
//    32 lanes per iteration packed by one VPERMT2W runs at ~0.10 ns/element, the same as
//    VCVTNE2PS2BF16 plus a subnormal check and fix-up branch (~0.10) and faster than VPMOVDW
//    packing (~0.15-0.20); at 16M elements all are memory-bound (~12 GB/s per core). So the
//    integer sequence is as fast, exact without a data-dependent branch, and needs only
//    AVX-512F/BW (it also runs on CPUs without AVX512-BF16).

namespace mp {
namespace {

// Below this many elements one thread does the whole conversion (OpenMP start-up costs more).
constexpr size_t kParallelMin = size_t{1} << 16;
// Elements per parallel chunk: 64 KiB of float, 32 KiB of 16-bit values.
constexpr size_t kChunk = 16384;

using U16 = uint16_t;

// ---- scalar reference path ------------------------------------------------------------------

void f32_to_f16_scalar(const float* s, U16* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = detail::float_to_half_bits(s[i]);
}
void f16_to_f32_scalar(const U16* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = detail::half_bits_to_float(s[i]);
}
void f32_to_bf16_scalar(const float* s, U16* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = detail::float_to_bf16_bits(s[i]);
}
void bf16_to_f32_scalar(const U16* s, float* d, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = detail::bf16_bits_to_float(s[i]);
}

#if defined(MP_CONVERT_X86)
constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// ---- AVX2 + F16C path (8 lanes; tails go to the scalar functions, which are bit-identical) ---

// Note [clean upper state before the scalar tail]
// GCC 12 compiles the f16 kernels' tail (a call to the scalar function, not inlined) as a sibling call without the
// vzeroupper it puts before a return, so the caller went on with dirty upper ymm halves: the element-wise loop's
// SSE code after each block's conversion then ran 1.8x slower on Zen 3 (an f16 add 0.74 ms where bf16 took 0.42,
// for 2^20 elements on one thread; perf: its plain SSE loads and stores stalled). The kernels clear the state first.

#define MP_TARGET_AVX2 __attribute__((target("avx2,f16c")))

MP_TARGET_AVX2 void f32_to_f16_avx2(const float* s, U16* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), kRne);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  _mm256_zeroupper();  // Note [clean upper state before the scalar tail]
  f32_to_f16_scalar(s + i, d + i, n - i);
}

MP_TARGET_AVX2 void f16_to_f32_avx2(const U16* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  }
  _mm256_zeroupper();  // Note [clean upper state before the scalar tail]
  f16_to_f32_scalar(s + i, d + i, n - i);
}

// bf16 patterns of 8 floats in the low 16 bits of each 32-bit lane.
MP_TARGET_AVX2 inline __m256i bf16_rne_avx2(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb);
  const __m256i quiet_nan = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
  return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet_nan, nan), 16);
}

MP_TARGET_AVX2 void f32_to_bf16_avx2(const float* s, U16* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i r0 = bf16_rne_avx2(_mm256_loadu_ps(s + i));
    const __m256i r1 = bf16_rne_avx2(_mm256_loadu_ps(s + i + 8));
    // packus works per 128-bit half: [r0 lo, r1 lo, r0 hi, r1 hi]; reorder the 64-bit quarters.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), packed);
  }
  f32_to_bf16_scalar(s + i, d + i, n - i);
}

MP_TARGET_AVX2 void bf16_to_f32_avx2(const U16* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_slli_epi32(w, 16));
  }
  bf16_to_f32_scalar(s + i, d + i, n - i);
}

// ---- AVX-512 path (16 lanes; tails with masked loads/stores) ---------------------------------

#define MP_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))

MP_TARGET_AVX512 inline __mmask16 tail_mask(size_t rest) {
  return static_cast<__mmask16>((1u << rest) - 1u);  // rest < 16
}

MP_TARGET_AVX512 void f32_to_f16_avx512(const float* s, U16* d, size_t n) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i h0 = _mm512_cvtps_ph(_mm512_loadu_ps(s + i), kRne);
    const __m256i h1 = _mm512_cvtps_ph(_mm512_loadu_ps(s + i + 16), kRne);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), h0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 16), h1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : tail_mask(n - i);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, s + i), kRne);
    _mm256_mask_storeu_epi16(d + i, m, h);
  }
}

MP_TARGET_AVX512 void f16_to_f32_avx512(const U16* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    _mm512_mask_storeu_ps(d + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, s + i)));
  }
}

// Per 32-bit lane: the bf16 pattern of the float in the HIGH 16 bits (low bits are garbage).
MP_TARGET_AVX512 inline __m512i bf16_rne_high_avx512(__m512 f) {
  const __m512i x = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb);
  const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, nan, x, _mm512_set1_epi32(0x00400000));
}

MP_TARGET_AVX512 void f32_to_bf16_avx512(const float* s, U16* d, size_t n) {
  // Word indices of the high halves: 1, 3, ..., 31 from the first operand, 33, ..., 63 from the second.
  alignas(64) static constexpr U16 kHighWords[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                                     33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  const __m512i high_words = _mm512_load_si512(kHighWords);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512i r0 = bf16_rne_high_avx512(_mm512_loadu_ps(s + i));
    const __m512i r1 = bf16_rne_high_avx512(_mm512_loadu_ps(s + i + 16));
    _mm512_storeu_si512(d + i, _mm512_permutex2var_epi16(r0, high_words, r1));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : tail_mask(n - i);
    const __m512i r = _mm512_srli_epi32(bf16_rne_high_avx512(_mm512_maskz_loadu_ps(m, s + i)), 16);
    _mm512_mask_cvtepi32_storeu_epi16(d + i, m, r);
  }
}

MP_TARGET_AVX512 void bf16_to_f32_avx512(const U16* s, float* d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm512_storeu_si512(d + i, _mm512_slli_epi32(w, 16));
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + i));
    _mm512_mask_storeu_epi32(d + i, m, _mm512_slli_epi32(w, 16));
  }
}
#endif  // MP_CONVERT_X86

// ---- dispatch -------------------------------------------------------------------------------

template <class Src, class Dst>
using Kernel = void (*)(const Src*, Dst*, size_t);

// Runs kernel over [0, n), in OpenMP-parallel chunks of kChunk elements when n is large.
template <class Src, class Dst>
void run(Kernel<Src, Dst> kernel, const Src* s, Dst* d, size_t n) {
  if (n < kParallelMin) {
    if (n > 0) kernel(s, d, n);
    return;
  }
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kChunk;
    kernel(s + begin, d + begin, std::min(kChunk, n - begin));
  }
}

// Picks the kernel of `path` (already checked to be supported) and runs it.
template <class Src, class Dst>
void dispatch(ConvertPath path, Kernel<Src, Dst> scalar, Kernel<Src, Dst> avx2, Kernel<Src, Dst> avx512, const Src* s,
              Dst* d, size_t n) {
  Kernel<Src, Dst> kernel = scalar;
  if (path == ConvertPath::avx2) kernel = avx2;
  if (path == ConvertPath::avx512) kernel = avx512;
  run(kernel, s, d, n);
}

#if defined(MP_CONVERT_X86)
#define MP_KERNELS(name) name##_scalar, name##_avx2, name##_avx512
#else
#define MP_KERNELS(name) name##_scalar, name##_scalar, name##_scalar
#endif

void check_args(ConvertPath path, const void* src, const void* dst, size_t n, const char* op) {
  MP_CHECK(convert_path_supported(path), op, ": conversion path '", convert_path_name(path),
           "' is not supported by this CPU (features: '", cpu_features_string(),
           "'); use mp::best_convert_path() or the mp::convert_* functions");
  MP_CHECK(n == 0 || (src != nullptr && dst != nullptr), op, ": expected non-null src and dst for n = ", n,
           ", got src = ", src, ", dst = ", dst);
}

const U16* bits(const Half* p) { return reinterpret_cast<const U16*>(p); }
const U16* bits(const BFloat16* p) { return reinterpret_cast<const U16*>(p); }
U16* bits(Half* p) { return reinterpret_cast<U16*>(p); }
U16* bits(BFloat16* p) { return reinterpret_cast<U16*>(p); }

}  // namespace

const char* convert_path_name(ConvertPath path) {
  switch (path) {
    case ConvertPath::scalar: return "scalar";
    case ConvertPath::avx2: return "avx2";
    case ConvertPath::avx512: return "avx512";
  }
  return "unknown";
}

bool convert_path_supported(ConvertPath path) {
  const CpuFeatures& f = cpu_features();
  switch (path) {
    case ConvertPath::scalar: return true;
#if defined(MP_CONVERT_X86)
    case ConvertPath::avx2: return f.avx2 && f.f16c;
    case ConvertPath::avx512: return f.avx512f && f.avx512bw && f.avx512vl;
#else
    default: (void)f; return false;
#endif
  }
  return false;
}

ConvertPath best_convert_path() {
  static const ConvertPath best = convert_path_supported(ConvertPath::avx512) ? ConvertPath::avx512
                                  : convert_path_supported(ConvertPath::avx2) ? ConvertPath::avx2
                                                                              : ConvertPath::scalar;
  return best;
}

namespace detail {

void convert_f32_to_f16(ConvertPath path, const float* src, Half* dst, size_t n) {
  check_args(path, src, dst, n, "convert_f32_to_f16");
  dispatch<float, U16>(path, MP_KERNELS(f32_to_f16), src, bits(dst), n);
}

void convert_f16_to_f32(ConvertPath path, const Half* src, float* dst, size_t n) {
  check_args(path, src, dst, n, "convert_f16_to_f32");
  dispatch<U16, float>(path, MP_KERNELS(f16_to_f32), bits(src), dst, n);
}

void convert_f32_to_bf16(ConvertPath path, const float* src, BFloat16* dst, size_t n) {
  check_args(path, src, dst, n, "convert_f32_to_bf16");
  dispatch<float, U16>(path, MP_KERNELS(f32_to_bf16), src, bits(dst), n);
}

void convert_bf16_to_f32(ConvertPath path, const BFloat16* src, float* dst, size_t n) {
  check_args(path, src, dst, n, "convert_bf16_to_f32");
  dispatch<U16, float>(path, MP_KERNELS(bf16_to_f32), bits(src), dst, n);
}

const BlockConverters& block_converters() {
  static const BlockConverters k = [] {
    const ConvertPath p = best_convert_path();
    auto pick = [p](auto scalar, auto avx2, auto avx512) {
      return p == ConvertPath::avx512 ? avx512 : p == ConvertPath::avx2 ? avx2 : scalar;
    };
    return BlockConverters{pick(MP_KERNELS(f32_to_f16)), pick(MP_KERNELS(f16_to_f32)), pick(MP_KERNELS(f32_to_bf16)),
                           pick(MP_KERNELS(bf16_to_f32))};
  }();
  return k;
}

}  // namespace detail

void convert_f32_to_f16(const float* src, Half* dst, size_t n) {
  detail::convert_f32_to_f16(best_convert_path(), src, dst, n);
}
void convert_f16_to_f32(const Half* src, float* dst, size_t n) {
  detail::convert_f16_to_f32(best_convert_path(), src, dst, n);
}
void convert_f32_to_bf16(const float* src, BFloat16* dst, size_t n) {
  detail::convert_f32_to_bf16(best_convert_path(), src, dst, n);
}
void convert_bf16_to_f32(const BFloat16* src, float* dst, size_t n) {
  detail::convert_bf16_to_f32(best_convert_path(), src, dst, n);
}

}  // namespace mp

// The bf16 tile products of the fused CPU attention: see attention_bf16.hpp and Note [fused attention].
#include "backend/cpu/attention_bf16.hpp"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "backend/cpu/loops.hpp"
#include "mp/core/cpu_features.hpp"
#include "mp/core/error.hpp"

namespace mp::backend::cpu::attn_bf16 {

bool bf16_tiles_available() {
#if defined(MP_HAVE_AVX512_LOOPS)
  return cpu_features().avx512_bf16 && avx512_loops_enabled();
#else
  return false;
#endif
}

void pack_rows(const uint16_t* src, int64_t n, int64_t D, int64_t D2, uint16_t* dst) {
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(dst + r * D2, src + r * D, static_cast<size_t>(D) * sizeof(uint16_t));
    if (D2 > D) dst[r * D2 + D] = 0;
  }
}

void pack_transposed_vnni(const uint16_t* src, int64_t n, int64_t D, int64_t D2, int64_t cols, uint16_t* dst) {
  // A transpose of 32-bit words: word p of row j (elements 2p, 2p + 1) goes to word (p, j).
  const int64_t P = D2 / 2, full = D / 2;
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t* row = src + j * D;
    for (int64_t p = 0; p < full; ++p) {
      uint32_t w;
      std::memcpy(&w, row + 2 * p, sizeof w);
      out[p * cols + j] = w;
    }
    if (P > full) out[full * cols + j] = row[D - 1];  // odd D: the last pair is (x, 0)
  }
  for (int64_t p = 0; p < P; ++p) std::fill(out + p * cols + n, out + (p + 1) * cols, 0u);
}

void pack_transposed_rows(const uint16_t* src, int64_t n, int64_t D, int64_t ld, uint16_t* dst) {
  for (int64_t d = 0; d < D; ++d) {
    uint16_t* o = dst + d * ld;
    for (int64_t r = 0; r < n; ++r) o[r] = src[r * D + d];
    std::fill(o + n, o + ld, uint16_t{0});
  }
}

#if defined(MP_HAVE_AVX512_LOOPS)
#define MP_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

// Interleaves the low (a) and high (b) 16 halves of x: out[2j] = x[j], out[2j + 1] = x[16 + j].
MP_BF16_TARGET inline __m512i interleave_halves(__m512i x) {
  alignas(64) static constexpr uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), x);
}

// out[2j] = x0[j], out[2j + 1] = x1[j] for j < 16.
MP_BF16_TARGET inline __m512i interleave_rows(__m512i x0, __m512i x1) {
  alignas(64) static constexpr uint16_t kIdx[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  return _mm512_permutex2var_epi16(x0, _mm512_load_si512(kIdx), x1);
}

// The first min(max(left, 0), 16) lanes.
MP_BF16_TARGET inline __mmask16 tail_mask(int64_t left) {
  if (left <= 0) return 0;
  return left >= 16 ? __mmask16(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

// R rows x NV vectors of 16 columns of gemm.
template <int R, int NV>
MP_BF16_TARGET inline __attribute__((always_inline)) void gemm_block(const uint16_t* a, int64_t lda, const uint16_t* b,
                                                                     int64_t N, float* c, int64_t ldc, int64_t Kp,
                                                                     bool accumulate, __m512 sc) {
  __m512 acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) acc[r][u] = _mm512_setzero_ps();
  for (int64_t p = 0; p < Kp; ++p) {
    __m512bh bv[NV];
    for (int u = 0; u < NV; ++u) bv[u] = (__m512bh)_mm512_loadu_si512(b + (p * N + u * 16) * 2);
    for (int r = 0; r < R; ++r) {
      uint32_t w;
      std::memcpy(&w, a + r * lda + 2 * p, sizeof w);
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(w));
      for (int u = 0; u < NV; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], x, bv[u]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int u = 0; u < NV; ++u) {
      float* o = c + r * ldc + u * 16;
      const __m512 v = _mm512_mul_ps(acc[r][u], sc);
      _mm512_storeu_ps(o, accumulate ? _mm512_add_ps(_mm512_loadu_ps(o), v) : v);
    }
}

template <int R>
MP_BF16_TARGET inline __attribute__((always_inline)) void gemm_rows(const uint16_t* a, int64_t lda, const uint16_t* b,
                                                                    int64_t N, float* c, int64_t ldc, int64_t Kp,
                                                                    bool accumulate, __m512 sc) {
  for (int64_t n0 = 0; n0 < N; n0 += 64) {
    const uint16_t* bn = b + n0 * 2;
    switch (std::min<int64_t>(4, (N - n0) / 16)) {
      case 4: gemm_block<R, 4>(a, lda, bn, N, c + n0, ldc, Kp, accumulate, sc); break;
      case 3: gemm_block<R, 3>(a, lda, bn, N, c + n0, ldc, Kp, accumulate, sc); break;
      case 2: gemm_block<R, 2>(a, lda, bn, N, c + n0, ldc, Kp, accumulate, sc); break;
      default: gemm_block<R, 1>(a, lda, bn, N, c + n0, ldc, Kp, accumulate, sc); break;
    }
  }
}

}  // namespace

MP_BF16_TARGET void gemm(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t N, float* c, int64_t ldc,
                         int64_t M, int64_t Kp, bool accumulate, float scale) {
  const __m512 sc = _mm512_set1_ps(scale);
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) gemm_rows<4>(a + m * lda, lda, b, N, c + m * ldc, ldc, Kp, accumulate, sc);
  for (; m < M; ++m) gemm_rows<1>(a + m * lda, lda, b, N, c + m * ldc, ldc, Kp, accumulate, sc);
}

MP_BF16_TARGET void f32_rows_to_bf16(const float* src, int64_t lds, int64_t rows, int64_t n, int64_t n2,
                                     uint16_t* dst, int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n2; j += 16) {
      const __mmask16 m = tail_mask(n - j), out = tail_mask(n2 - j);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + r * lds + j));
      _mm256_mask_storeu_epi16(dst + r * ldd + j, out, (__m256i)h);
    }
  }
}

MP_BF16_TARGET void f32_rows_to_vnni(const float* src, int64_t lds, int64_t rows, int64_t rows2, int64_t n,
                                     int64_t N, uint16_t* dst) {
  for (int64_t r = 0; r < rows2; r += 2) {
    const float* s0 = src + r * lds;
    const float* s1 = s0 + lds;
    const bool has0 = r < rows, has1 = r + 1 < rows;
    for (int64_t j = 0; j < N; j += 16) {
      const __mmask16 m = tail_mask(n - j);
      const __m512 x0 = has0 ? _mm512_maskz_loadu_ps(m, s0 + j) : _mm512_setzero_ps();
      const __m512 x1 = has1 ? _mm512_maskz_loadu_ps(m, s1 + j) : _mm512_setzero_ps();
      _mm512_storeu_si512(dst + (r / 2 * N + j) * 2, interleave_halves((__m512i)_mm512_cvtne2ps_pbh(x1, x0)));
    }
  }
}

MP_BF16_TARGET void pack_vnni(const uint16_t* src, int64_t n, int64_t rows2, int64_t D, int64_t Dp, uint16_t* dst) {
  for (int64_t r = 0; r < rows2; r += 2) {
    for (int64_t d = 0; d < Dp; d += 16) {
      const __mmask32 m = static_cast<__mmask32>(tail_mask(D - d));
      const __m512i x0 = r < n ? _mm512_maskz_loadu_epi16(m, src + r * D + d) : _mm512_setzero_si512();
      const __m512i x1 = r + 1 < n ? _mm512_maskz_loadu_epi16(m, src + (r + 1) * D + d) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + (r / 2 * Dp + d) * 2, interleave_rows(x0, x1));
    }
  }
}

#else

void gemm(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t, int64_t, int64_t, bool, float) {
  MP_ASSERT(false, "attn_bf16::gemm without AVX512-BF16");
}
void f32_rows_to_bf16(const float*, int64_t, int64_t, int64_t, int64_t, uint16_t*, int64_t) {
  MP_ASSERT(false, "attn_bf16::f32_rows_to_bf16 without AVX512-BF16");
}
void f32_rows_to_vnni(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, uint16_t*) {
  MP_ASSERT(false, "attn_bf16::f32_rows_to_vnni without AVX512-BF16");
}
void pack_vnni(const uint16_t*, int64_t, int64_t, int64_t, int64_t, uint16_t*) {
  MP_ASSERT(false, "attn_bf16::pack_vnni without AVX512-BF16");
}

#endif

}  // namespace mp::backend::cpu::attn_bf16

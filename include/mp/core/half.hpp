#pragma once
#include <cstdint>
#include <cstring>

#include "mp/core/macros.hpp"

namespace mp {

namespace detail {

/// Reinterpret the bits of a float as uint32 (host and device).
MP_HD MP_FORCE_INLINE uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

/// Reinterpret uint32 bits as a float (host and device).
MP_HD MP_FORCE_INLINE float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Note [16-bit conversions and the hardware]
// The scalar conversions below are the reference for every bulk/SIMD path (mp/core/convert.hpp);
// tests/core/test_half.cpp compares them with the x86 instructions over all inputs:
//  * half -> float equals F16C/AVX-512 VCVTPH2PS bit for bit, NaNs included: the instruction
//    quiets a signalling NaN (sets float bit 22) and keeps the 10 payload bits, so we do the same.
//    MXCSR.DAZ does not affect it (half subnormals become float normals exactly).
//  * float -> half equals VCVTPS2PH with imm8 = _MM_FROUND_TO_NEAREST_INT for all 2^32 inputs:
//    NaN -> quiet NaN keeping sign and the top 9 payload bits, float subnormals -> +-0.
//  * bfloat16 -> float is a 16-bit left shift (VCVTPBH2PS / _mm512_cvtpbh_ps is defined that way):
//    NaNs are not quieted, the bits are simply widened.
//  * float -> bfloat16: see Note [bf16 subnormals on AVX512-BF16].
// CUDA's intrinsics may canonicalise NaN payloads; device code using these functions does not.

// Note [bf16 subnormals on AVX512-BF16]
// float_to_bf16_bits rounds to nearest even on the full 32-bit pattern, so FP32 subnormal inputs
// give bf16 subnormals (e.g. 0x007fffff -> 0x0080, 0x00400000 -> 0x0040), exactly like CUDA's
// __float2bfloat16_rn and PyTorch's c10::BFloat16 round_to_nearest_even. The AVX512-BF16
// instruction VCVTNEPS2BF16 (_mm512_cvtneps_pbh) instead treats FP32 subnormal inputs as zero
// (result +-0 with the input's sign), always: measured on Sapphire Rapids it ignores MXCSR.DAZ/FTZ
// (flushes with them off too), as Intel documents. Every other input agrees bit for bit (measured
// over all 2^32 patterns): NaN -> (bits >> 16) | 0x0040 (quiet, sign and top payload kept),
// overflow past bf16 max rounds to inf, no bf16 subnormal can come from a normal float.
// So a SIMD path that uses the instruction must redo subnormal lanes (mp/core/convert.cpp does).

/// IEEE binary16 bits -> float, exact (subnormals, inf; NaN keeps sign and payload and is made
/// quiet, like VCVTPH2PS: see Note [16-bit conversions and the hardware]).
MP_HD inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // inf, or NaN made quiet (bit 22) with its payload kept
    return f32_from_bits(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  }
  if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return f32_from_bits(sign);  // +-0
  // Subnormal: value = mant * 2^-24; normalise.
  int e = -1;
  do {
    mant <<= 1;
    ++e;
  } while ((mant & 0x400u) == 0);
  mant &= 0x3ffu;
  return f32_from_bits(sign | (static_cast<uint32_t>(113 - 1 - e) << 23) | (mant << 13));
}

/// float -> IEEE binary16 bits, round to nearest even; subnormals produced, overflow -> inf,
/// NaN stays NaN (quiet bit set), exactly as F16C's VCVTPS2PH with RNE.
MP_HD inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN
    if (ax == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // quiet NaN, payload top bits
  }
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520 -> inf
  if (ax >= 0x38800000u) {                       // normal half range (>= 2^-14)
    const uint32_t mant_odd = (ax >> 13) & 1u;
    const uint32_t rounded = ax + 0xfffu + mant_odd;  // RNE on the 13 dropped bits
    return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
  }
  if (ax < 0x33000001u) return sign;  // < or == 2^-25 (tie to even -> 0)
  // Subnormal result: shift the full significand right, round to nearest even.
  const uint32_t e = ax >> 23;
  const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14 + (113 - e) - 1 ... places so that result unit = 2^-24
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  const uint32_t r = q + ((rem > halfway || (rem == halfway && (q & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | r);
}

/// bfloat16 bits -> float, exact.
MP_HD MP_FORCE_INLINE float bf16_bits_to_float(uint16_t b) { return f32_from_bits(static_cast<uint32_t>(b) << 16); }

/// float -> bfloat16 bits, round to nearest even, subnormals kept, NaN stays (quiet) NaN.
/// See Note [bf16 subnormals on AVX512-BF16] for how this differs from VCVTNEPS2BF16.
MP_HD MP_FORCE_INLINE uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace detail

/// IEEE 754 binary16 (1 sign, 5 exponent, 10 mantissa bits). Storage type; arithmetic goes through float.
struct Half {
  uint16_t x = 0;
  Half() = default;
  /// Round a float to the nearest half (ties to even).
  MP_HD explicit Half(float f) : x(detail::float_to_half_bits(f)) {}
  /// The exact float value.
  MP_HD explicit operator float() const { return detail::half_bits_to_float(x); }
  /// Build from a raw bit pattern.
  MP_HD static Half from_bits(uint16_t b) {
    Half h;
    h.x = b;
    return h;
  }
  /// The raw bit pattern.
  MP_HD uint16_t bits() const { return x; }
};

/// bfloat16 (1 sign, 8 exponent, 7 mantissa bits): FP32's range at 3 significant digits.
struct BFloat16 {
  uint16_t x = 0;
  BFloat16() = default;
  /// Round a float to the nearest bfloat16 (ties to even).
  MP_HD explicit BFloat16(float f) : x(detail::float_to_bf16_bits(f)) {}
  /// The exact float value.
  MP_HD explicit operator float() const { return detail::bf16_bits_to_float(x); }
  /// Build from a raw bit pattern.
  MP_HD static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.x = b;
    return h;
  }
  /// The raw bit pattern.
  MP_HD uint16_t bits() const { return x; }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

}  // namespace mp

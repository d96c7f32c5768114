// Scalar 16-bit conversions (mp/core/half.hpp) against the x86 conversion instructions, over every
// 16-bit pattern and every one of the 2^32 float patterns. See Note [16-bit conversions and the
// hardware] and Note [bf16 subnormals on AVX512-BF16] in half.hpp for what is expected.
#include "mp/core/half.hpp"

#include <gtest/gtest.h>

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

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include "mp/core/cpu_features.hpp"

namespace {

using mp::detail::bf16_bits_to_float;
using mp::detail::f32_bits;
using mp::detail::f32_from_bits;
using mp::detail::float_to_bf16_bits;
using mp::detail::float_to_half_bits;
using mp::detail::half_bits_to_float;

constexpr int kRoundNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

// The 2^32 sweeps visit blocks of 65536 patterns (hi << 16) | lo. Optimised builds visit every
// block (~6 s per sweep on 2 cores); unoptimised (Debug) builds, ~4x slower, every 7th block
// (7 is odd, so all signs and exponents are still visited, each block with all its low bits).
#if defined(__OPTIMIZE__)
constexpr int kBlockStride = 1;
#else
constexpr int kBlockStride = 7;
#endif

// Collects mismatches from many threads; keeps the first few for the failure message.
class Mismatches {
 public:
  void add(uint32_t input, uint32_t ours, uint32_t reference) {
    std::lock_guard<std::mutex> lock(mu_);
    if (++count_ <= 8) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "  input 0x%08x: ours 0x%08x, reference 0x%08x\n", input, ours, reference);
      text_ += buf;
    }
  }
  uint64_t count() const { return count_; }
  const std::string& text() const { return text_; }

 private:
  std::mutex mu_;
  uint64_t count_ = 0;
  std::string text_;
};

bool is_f32_subnormal(uint32_t x) { return (x & 0x7f800000u) == 0 && (x & 0x7fffffu) != 0; }

// ---- hardware references, each in a function compiled for its instruction set ----

__attribute__((target("avx512f"))) void hw_half_to_float_avx512(const uint16_t* in, uint32_t* out) {
  const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)));
  _mm512_storeu_si512(out, _mm512_castps_si512(f));
}

__attribute__((target("f16c"))) uint32_t hw_half_to_float_f16c(uint16_t h) { return f32_bits(_cvtsh_ss(h)); }

__attribute__((target("avx512f,avx512bf16"))) void hw_bf16_to_float_avx512(const uint16_t* in, uint32_t* out) {
  __m256bh v;
  std::memcpy(&v, in, sizeof(v));
  _mm512_storeu_si512(out, _mm512_castps_si512(_mm512_cvtpbh_ps(v)));
}

// Converts the 65536 float patterns (hi << 16) | lo, lo = 0..65535, to half with VCVTPS2PH.
__attribute__((target("avx512f"))) void hw_f32_block_to_half_avx512(uint32_t hi, uint16_t* out) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (uint32_t lo = 0; lo < 65536; lo += 16) {
    const __m512i bits = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>((hi << 16) | lo)), lane);
    const __m256i h = _mm512_cvtps_ph(_mm512_castsi512_ps(bits), kRoundNearest);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + lo), h);
  }
}

__attribute__((target("avx,f16c"))) void hw_f32_block_to_half_f16c(uint32_t hi, uint16_t* out) {
  for (uint32_t lo = 0; lo < 65536; lo += 8) {
    const int b = static_cast<int>((hi << 16) | lo);  // AVX1 has no 256-bit integer add
    const __m256i bits = _mm256_set_epi32(b + 7, b + 6, b + 5, b + 4, b + 3, b + 2, b + 1, b);
    const __m128i h = _mm256_cvtps_ph(_mm256_castsi256_ps(bits), kRoundNearest);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + lo), h);
  }
}

// Same block, to bfloat16 with VCVTNEPS2BF16.
__attribute__((target("avx512f,avx512bf16"))) void hw_f32_block_to_bf16(uint32_t hi, uint16_t* out) {
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (uint32_t lo = 0; lo < 65536; lo += 16) {
    const __m512i bits = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>((hi << 16) | lo)), lane);
    const __m256bh b = _mm512_cvtneps_pbh(_mm512_castsi512_ps(bits));
    std::memcpy(out + lo, &b, sizeof(b));
  }
}

// Independent RNE definition for an FP32 subnormal x: bf16's subnormal unit is 2^-133, and
// |x| * 2^133 is exact in double; nearbyint rounds it to nearest even (default rounding mode).
// The result (0..128) is the bf16 magnitude pattern; 128 = 0x0080 is the smallest normal.
uint16_t bf16_rne_of_subnormal(uint32_t x) {
  const double scaled = std::ldexp(static_cast<double>(std::fabs(f32_from_bits(x))), 133);
  return static_cast<uint16_t>(((x >> 16) & 0x8000u) | static_cast<uint32_t>(std::nearbyint(scaled)));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Spot checks that need no hardware: the boundaries named in docs/DESIGN.md section 1.1.

TEST(Half, Boundaries) {
  auto h = [](float f) { return float_to_half_bits(f); };
  EXPECT_EQ(h(0.0f), 0x0000);
  EXPECT_EQ(h(-0.0f), 0x8000);
  EXPECT_EQ(h(1.0f), 0x3c00);
  EXPECT_EQ(h(65504.0f), 0x7bff);                        // max half
  EXPECT_EQ(h(std::nextafter(65520.0f, 0.0f)), 0x7bff);  // just below the overflow midpoint
  EXPECT_EQ(h(65520.0f), 0x7c00);                        // midpoint, ties to even -> inf
  EXPECT_EQ(h(-65520.0f), 0xfc00);
  EXPECT_EQ(h(INFINITY), 0x7c00);
  EXPECT_EQ(h(-INFINITY), 0xfc00);
  EXPECT_EQ(h(std::ldexp(1.0f, -14)), 0x0400);  // min normal
  EXPECT_EQ(h(std::ldexp(1.0f, -24)), 0x0001);  // min subnormal
  EXPECT_EQ(h(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(h(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(h(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 units -> 2 (even)
  EXPECT_EQ(h(std::ldexp(5.0f, -25)), 0x0002);         // 2.5 units -> 2 (even)
  EXPECT_EQ(h(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even mantissa
  EXPECT_EQ(h(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie -> even mantissa (up)
  EXPECT_EQ(h(f32_from_bits(0x00000001u)), 0x0000);    // float subnormal -> 0
  EXPECT_EQ(h(f32_from_bits(0x7fc00000u)), 0x7e00);    // quiet NaN
  EXPECT_EQ(h(f32_from_bits(0x7f800001u)), 0x7e00);    // signalling NaN -> quiet
  EXPECT_EQ(h(f32_from_bits(0xff812345u)), 0xfe09);    // sign and top payload kept
  EXPECT_EQ(f32_bits(half_bits_to_float(0x0001)), f32_bits(std::ldexp(1.0f, -24)));
  EXPECT_EQ(f32_bits(half_bits_to_float(0x7bff)), f32_bits(65504.0f));
  EXPECT_EQ(f32_bits(half_bits_to_float(0x7c01)), 0x7fc02000u);  // sNaN -> qNaN, payload kept
  EXPECT_EQ(static_cast<float>(mp::Half(0.1f)), half_bits_to_float(0x2e66));
}

TEST(BFloat16, Boundaries) {
  auto b = [](uint32_t x) { return float_to_bf16_bits(f32_from_bits(x)); };
  EXPECT_EQ(b(0x3f800000u), 0x3f80);  // 1
  EXPECT_EQ(b(0x3f808000u), 0x3f80);  // tie -> even
  EXPECT_EQ(b(0x3f818000u), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(b(0x3f808001u), 0x3f81);
  EXPECT_EQ(b(0x7f7fffffu), 0x7f80);  // FLT_MAX rounds to inf
  EXPECT_EQ(b(0x7f7f7fffu), 0x7f7f);  // largest value that stays finite
  EXPECT_EQ(b(0xff7f8000u), 0xff80);  // tie at the top, odd mantissa -> -inf
  EXPECT_EQ(b(0x7f800000u), 0x7f80);
  EXPECT_EQ(b(0x007fffffu), 0x0080);  // subnormal kept (rounds up to min normal)
  EXPECT_EQ(b(0x00400000u), 0x0040);  // subnormal kept
  EXPECT_EQ(b(0x80008000u), 0x8000);  // subnormal tie -> even (0)
  EXPECT_EQ(b(0x00018000u), 0x0002);  // subnormal tie -> even (up)
  EXPECT_EQ(b(0x7f800001u), 0x7fc0);  // signalling NaN -> quiet
  EXPECT_EQ(b(0xffff0000u), 0xffff);  // NaN payload bits kept
  EXPECT_EQ(f32_bits(bf16_bits_to_float(0x0001)), 0x00010000u);
  EXPECT_EQ(f32_bits(bf16_bits_to_float(0x7f81)), 0x7f810000u);  // no quieting on widening
}

// ---------------------------------------------------------------------------------------------
// (a) every 16-bit pattern -> float.

TEST(HalfExhaustive, HalfToFloatMatchesVcvtph2ps) {
  const mp::CpuFeatures& cpu = mp::cpu_features();
  if (!cpu.avx512f && !cpu.f16c) GTEST_SKIP() << "needs F16C or AVX-512F";
  Mismatches bad;
  for (uint32_t base = 0; base < 65536; base += 16) {
    uint16_t in[16];
    uint32_t hw[16];
    for (uint32_t k = 0; k < 16; ++k) in[k] = static_cast<uint16_t>(base + k);
    if (cpu.avx512f) {
      hw_half_to_float_avx512(in, hw);
    } else {
      for (int k = 0; k < 16; ++k) hw[k] = hw_half_to_float_f16c(in[k]);
    }
    for (int k = 0; k < 16; ++k) {
      const uint32_t ours = f32_bits(half_bits_to_float(in[k]));
      // Both NaN payload and quiet bit are required to match (see the note in half.hpp).
      if (ours != hw[k]) bad.add(in[k], ours, hw[k]);
      if (cpu.f16c && hw_half_to_float_f16c(in[k]) != hw[k]) bad.add(in[k], hw_half_to_float_f16c(in[k]), hw[k]);
    }
  }
  EXPECT_EQ(bad.count(), 0u) << bad.text();
}

TEST(BFloat16Exhaustive, BFloat16ToFloatMatchesShiftAndVcvtpbh2ps) {
  const bool hw = mp::cpu_features().avx512_bf16;
  Mismatches bad;
  for (uint32_t base = 0; base < 65536; base += 16) {
    uint16_t in[16];
    uint32_t ref[16];
    for (uint32_t k = 0; k < 16; ++k) in[k] = static_cast<uint16_t>(base + k);
    if (hw) hw_bf16_to_float_avx512(in, ref);
    for (int k = 0; k < 16; ++k) {
      const uint32_t ours = f32_bits(bf16_bits_to_float(in[k]));
      if (ours != (static_cast<uint32_t>(in[k]) << 16)) bad.add(in[k], ours, static_cast<uint32_t>(in[k]) << 16);
      if (hw && ours != ref[k]) bad.add(in[k], ours, ref[k]);
    }
  }
  EXPECT_EQ(bad.count(), 0u) << bad.text();
  if (!hw) GTEST_SKIP() << "no AVX512-BF16: checked against the shift definition only";
}

// ---------------------------------------------------------------------------------------------
// (b) all 2^32 floats -> half against VCVTPS2PH (round to nearest even). ~4.3e9 scalar calls,
// OpenMP over blocks of 65536 patterns (see kBlockStride for unoptimised builds).

TEST(HalfExhaustive, FloatToHalfMatchesVcvtps2phForAll2To32Inputs) {
  const mp::CpuFeatures& cpu = mp::cpu_features();
  if (!cpu.avx512f && !cpu.f16c) GTEST_SKIP() << "needs F16C or AVX-512F";
  Mismatches bad;
#pragma omp parallel
  {
    std::vector<uint16_t> hw(65536);
#pragma omp for schedule(dynamic, 16)
    for (int hi = 0; hi < 65536; hi += kBlockStride) {
      const uint32_t h = static_cast<uint32_t>(hi);
      if (cpu.avx512f) {
        hw_f32_block_to_half_avx512(h, hw.data());
      } else {
        hw_f32_block_to_half_f16c(h, hw.data());
      }
      for (uint32_t lo = 0; lo < 65536; ++lo) {
        const uint32_t x = (h << 16) | lo;
        const uint16_t ours = float_to_half_bits(f32_from_bits(x));
        if (ours != hw[lo]) [[unlikely]]
          bad.add(x, ours, hw[lo]);
      }
    }
  }
  EXPECT_EQ(bad.count(), 0u) << bad.text();
}

// ---------------------------------------------------------------------------------------------
// (c) all 2^32 floats -> bf16 against VCVTNEPS2BF16 on every input except FP32 subnormals, which
// the instruction flushes to zero (Note [bf16 subnormals on AVX512-BF16]); those are checked
// against the RNE definition instead, and the flushing is counted and reported.

TEST(BFloat16Exhaustive, FloatToBf16MatchesVcvtneps2bf16ExceptSubnormals) {
  if (!mp::cpu_features().avx512_bf16) GTEST_SKIP() << "needs AVX512-BF16";
  Mismatches bad;
  uint64_t subnormals = 0, hw_flushed = 0;
#pragma omp parallel reduction(+ : subnormals, hw_flushed)
  {
    std::vector<uint16_t> hw(65536);
#pragma omp for schedule(dynamic, 16)
    for (int hi = 0; hi < 65536; hi += kBlockStride) {
      const uint32_t h = static_cast<uint32_t>(hi);
      hw_f32_block_to_bf16(h, hw.data());
      for (uint32_t lo = 0; lo < 65536; ++lo) {
        const uint32_t x = (h << 16) | lo;
        const uint16_t ours = float_to_bf16_bits(f32_from_bits(x));
        if (is_f32_subnormal(x)) [[unlikely]] {
          ++subnormals;
          hw_flushed += hw[lo] == static_cast<uint16_t>((x >> 16) & 0x8000u) ? 1 : 0;
          const uint16_t ref = bf16_rne_of_subnormal(x);
          if (ours != ref) bad.add(x, ours, ref);
        } else if (ours != hw[lo]) [[unlikely]] {
          bad.add(x, ours, hw[lo]);
        }
      }
    }
  }
  EXPECT_EQ(bad.count(), 0u) << bad.text();
  if (kBlockStride == 1) { EXPECT_EQ(subnormals, 2u * 0x7fffffu); }
  std::cout << "VCVTNEPS2BF16 flushed " << hw_flushed << " of " << subnormals
            << " FP32 subnormal inputs to signed zero (MXCSR.DAZ off)\n";
}

// The subnormal range against the RNE definition also where the instruction is absent.
TEST(BFloat16Exhaustive, SubnormalInputsRoundToNearestEven) {
  Mismatches bad;
  for (uint32_t m = 1; m <= 0x7fffffu; ++m) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t x = sign | m;
      const uint16_t ours = float_to_bf16_bits(f32_from_bits(x));
      const uint16_t ref = bf16_rne_of_subnormal(x);
      if (ours != ref) bad.add(x, ours, ref);
    }
  }
  EXPECT_EQ(bad.count(), 0u) << bad.text();
}

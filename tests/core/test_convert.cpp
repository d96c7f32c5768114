// Bulk conversions (mp/core/convert.hpp) on every instruction-set path against the scalar
// conversions of half.hpp, bit for bit (NaNs and subnormals included).
#include "mp/core/convert.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "mp/core/error.hpp"

namespace {

using mp::BFloat16;
using mp::ConvertPath;
using mp::Half;
using mp::detail::f32_bits;
using mp::detail::f32_from_bits;

// A test parameter: one explicit path, or the public mp::convert_* functions (automatic).
struct Path {
  bool automatic;
  ConvertPath path;
};

void PrintTo(const Path& p, std::ostream* os) { *os << (p.automatic ? "automatic" : mp::convert_path_name(p.path)); }

std::string path_label(const testing::TestParamInfo<Path>& info) {
  return info.param.automatic ? "automatic" : mp::convert_path_name(info.param.path);
}

void f32_to_f16(Path p, const float* s, Half* d, size_t n) {
  if (p.automatic) return mp::convert_f32_to_f16(s, d, n);
  mp::detail::convert_f32_to_f16(p.path, s, d, n);
}
void f16_to_f32(Path p, const Half* s, float* d, size_t n) {
  if (p.automatic) return mp::convert_f16_to_f32(s, d, n);
  mp::detail::convert_f16_to_f32(p.path, s, d, n);
}
void f32_to_bf16(Path p, const float* s, BFloat16* d, size_t n) {
  if (p.automatic) return mp::convert_f32_to_bf16(s, d, n);
  mp::detail::convert_f32_to_bf16(p.path, s, d, n);
}
void bf16_to_f32(Path p, const BFloat16* s, float* d, size_t n) {
  if (p.automatic) return mp::convert_bf16_to_f32(s, d, n);
  mp::detail::convert_bf16_to_f32(p.path, s, d, n);
}

// Float inputs for the to-16-bit conversions: every rounding boundary of half and bf16, specials,
// and tens of millions of random patterns. Built once for all tests (about 21M floats).
const std::vector<float>& float_inputs() {
  static const std::vector<float> inputs = [] {
    std::vector<uint32_t> bits;
    auto add_around = [&](float v) {  // v and its float neighbours
      bits.push_back(f32_bits(std::nextafter(v, -INFINITY)));
      bits.push_back(f32_bits(v));
      bits.push_back(f32_bits(std::nextafter(v, INFINITY)));
    };
    // Every finite half, its rounding midpoint to the next half (65504 -> 65520, the overflow
    // threshold) and one float ulp either side; both signs; includes the subnormal range and 2^-25.
    for (uint32_t h = 0; h < 0x7c00u; ++h) {
      const double v = mp::detail::half_bits_to_float(static_cast<uint16_t>(h));
      const double next = h == 0x7bffu ? 65536.0 : mp::detail::half_bits_to_float(static_cast<uint16_t>(h + 1));
      for (double sign : {1.0, -1.0}) {
        add_around(static_cast<float>(sign * v));
        add_around(static_cast<float>(sign * (v + next) / 2));  // exact: 12 significant bits
      }
    }
    // Every bf16 value's rounding midpoint (low half 0x8000) and its neighbours, all exponents.
    for (uint32_t b = 0; b < 0x10000u; ++b) {
      for (uint32_t low : {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) bits.push_back((b << 16) | low);
    }
    // Specials: zeros, infinities, float subnormal extremes, NaNs with payloads in every region.
    for (uint32_t s : {0u, 0x80000000u}) {
      for (uint32_t m : {0x0u, 0x1u, 0x2000u, 0x400000u, 0x7fffffu, 0x1fffu, 0x3fffffu, 0x7fe000u}) {
        bits.push_back(s | 0x7f800000u | m);  // inf (m = 0) and NaNs
        bits.push_back(s | m);                // zero and subnormals
      }
    }
    std::mt19937 gen(20240611);
    // Uniform random bit patterns: every class (NaN, inf, subnormal, normal) in proportion.
    for (int i = 0; i < (1 << 24); ++i) bits.push_back(static_cast<uint32_t>(gen()));
    // Values typical of training (weights, activations, gradients) across half's whole range.
    std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
    std::uniform_int_distribution<int> expo(-30, 17);
    for (int i = 0; i < (1 << 22); ++i) bits.push_back(f32_bits(std::ldexp(mant(gen), expo(gen))));
    std::vector<float> out(bits.size());
    std::memcpy(out.data(), bits.data(), bits.size() * sizeof(float));
    return out;
  }();
  return inputs;
}

// All 65,536 16-bit patterns.
std::vector<uint16_t> all_16bit_patterns() {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i);
  return v;
}

// Compares 16-bit results with the scalar reference; reports the first mismatches.
template <class T, class F>
void expect_same_16(const std::vector<float>& in, const T* got, F reference) {
  size_t bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t want = reference(in[i]);
    if (got[i].bits() != want && ++bad <= 5) {
      ADD_FAILURE() << "input 0x" << std::hex << f32_bits(in[i]) << ": got 0x" << got[i].bits() << ", want 0x" << want;
    }
  }
  EXPECT_EQ(bad, 0u) << "mismatches out of " << in.size();
}

class Convert : public testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    if (!GetParam().automatic && !mp::convert_path_supported(GetParam().path)) {
      GTEST_SKIP() << "path " << mp::convert_path_name(GetParam().path) << " not supported by this CPU";
    }
  }
};

TEST_P(Convert, AllHalfPatternsToFloat) {
  const std::vector<uint16_t> bits = all_16bit_patterns();
  std::vector<Half> in(bits.size() + 1);
  for (size_t i = 0; i < bits.size(); ++i) in[i + 1] = Half::from_bits(bits[i]);
  std::vector<float> out(bits.size() + 2);
  f16_to_f32(GetParam(), in.data() + 1, out.data() + 1, bits.size());  // unaligned source and destination
  for (size_t i = 0; i < bits.size(); ++i) {
    ASSERT_EQ(f32_bits(out[i + 1]), f32_bits(mp::detail::half_bits_to_float(bits[i])))
        << "half 0x" << std::hex << bits[i];
  }
}

TEST_P(Convert, AllBFloat16PatternsToFloat) {
  const std::vector<uint16_t> bits = all_16bit_patterns();
  std::vector<BFloat16> in(bits.size() + 1);
  for (size_t i = 0; i < bits.size(); ++i) in[i + 1] = BFloat16::from_bits(bits[i]);
  std::vector<float> out(bits.size() + 2);
  bf16_to_f32(GetParam(), in.data() + 1, out.data() + 1, bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    ASSERT_EQ(f32_bits(out[i + 1]), f32_bits(mp::detail::bf16_bits_to_float(bits[i])))
        << "bf16 0x" << std::hex << bits[i];
  }
}

TEST_P(Convert, FloatToHalfBoundariesAndRandom) {
  const std::vector<float>& in = float_inputs();
  std::vector<Half> out(in.size() + 3);
  f32_to_f16(GetParam(), in.data(), out.data() + 3, in.size());  // destination off a vector boundary
  expect_same_16(in, out.data() + 3, [](float f) { return mp::detail::float_to_half_bits(f); });
}

TEST_P(Convert, FloatToBFloat16BoundariesAndRandom) {
  const std::vector<float>& in = float_inputs();
  std::vector<BFloat16> out(in.size() + 3);
  f32_to_bf16(GetParam(), in.data(), out.data() + 3, in.size());
  expect_same_16(in, out.data() + 3, [](float f) { return mp::detail::float_to_bf16_bits(f); });
}

// Odd lengths at odd offsets: tails are exact and nothing outside [dst, dst + n) is written.
TEST_P(Convert, OddLengthsUnalignedNoOverrun) {
  const std::vector<float>& pool = float_inputs();
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{31}, size_t{33},
                   size_t{65537}, size_t{1000003}}) {
    for (size_t offset : {size_t{1}, size_t{5}}) {
      SCOPED_TRACE(testing::Message() << "n = " << n << ", offset = " << offset);
      const size_t start = 12345 + offset;  // mixes boundary and random inputs
      std::vector<float> src(pool.begin() + static_cast<std::ptrdiff_t>(start),
                             pool.begin() + static_cast<std::ptrdiff_t>(start + n + 2 * offset));
      const float* s = src.data() + offset;
      constexpr uint16_t kGuard = 0xabcd;
      std::vector<Half> h(n + 2 * offset, Half::from_bits(kGuard));
      std::vector<BFloat16> b(n + 2 * offset, BFloat16::from_bits(kGuard));
      f32_to_f16(GetParam(), s, h.data() + offset, n);
      f32_to_bf16(GetParam(), s, b.data() + offset, n);
      std::vector<float> back_h(n + 2 * offset, -7.0f), back_b(n + 2 * offset, -7.0f);
      f16_to_f32(GetParam(), h.data() + offset, back_h.data() + offset, n);
      bf16_to_f32(GetParam(), b.data() + offset, back_b.data() + offset, n);
      for (size_t i = 0; i < n + 2 * offset; ++i) {
        const bool inside = i >= offset && i < offset + n;
        const float x = src[i];
        ASSERT_EQ(h[i].bits(), inside ? mp::detail::float_to_half_bits(x) : kGuard) << "i = " << i;
        ASSERT_EQ(b[i].bits(), inside ? mp::detail::float_to_bf16_bits(x) : kGuard) << "i = " << i;
        const float want_h = inside ? mp::detail::half_bits_to_float(h[i].bits()) : -7.0f;
        const float want_b = inside ? mp::detail::bf16_bits_to_float(b[i].bits()) : -7.0f;
        ASSERT_EQ(f32_bits(back_h[i]), f32_bits(want_h)) << "i = " << i;
        ASSERT_EQ(f32_bits(back_b[i]), f32_bits(want_b)) << "i = " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Convert,
                         testing::Values(Path{false, ConvertPath::scalar}, Path{false, ConvertPath::avx2},
                                         Path{false, ConvertPath::avx512}, Path{true, ConvertPath::scalar}),
                         path_label);

TEST(ConvertPaths, BestIsSupportedAndNamed) {
  EXPECT_TRUE(mp::convert_path_supported(ConvertPath::scalar));
  EXPECT_TRUE(mp::convert_path_supported(mp::best_convert_path()));
  EXPECT_STREQ(mp::convert_path_name(ConvertPath::avx512), "avx512");
  if (mp::convert_path_supported(ConvertPath::avx512)) { EXPECT_EQ(mp::best_convert_path(), ConvertPath::avx512); }
  std::cout << "best conversion path: " << mp::convert_path_name(mp::best_convert_path()) << "\n";
}

TEST(ConvertPaths, UnsupportedPathThrows) {
  for (ConvertPath p : {ConvertPath::avx2, ConvertPath::avx512}) {
    if (mp::convert_path_supported(p)) continue;
    float x = 1.0f;
    Half h;
    EXPECT_THROW(mp::detail::convert_f32_to_f16(p, &x, &h, 1), mp::Error);
    return;
  }
  GTEST_SKIP() << "every path is supported here";
}

TEST(ConvertPaths, NullPointerWithElementsThrows) {
  Half h;
  EXPECT_THROW(mp::convert_f32_to_f16(nullptr, &h, 1), mp::Error);
  EXPECT_NO_THROW(mp::convert_f32_to_f16(nullptr, nullptr, 0));
}

}  // namespace

#pragma once
// Vectorisable float exp, log, tanh, sigmoid and erf for the point-wise functors, and the
// math_exp/math_log/... helpers every kernel uses to pick them (float) or std:: (double).
//
// Note [fast float transcendentals]
// libm's expf/logf/tanhf/erff are scalar calls that `#pragma omp simd` loops cannot vectorise (glibc
// declares its SIMD variants only under -ffast-math), so exp/tanh/sigmoid/gelu/softmax ran at 3-22 ns
// per element (bench/bench_fast_math.cpp). The functions below are straight-line float code (no
// branches, tables or calls) that GCC vectorises in any omp simd loop: SSE2 in the baseline build,
// 16 lanes with FMA in the kernels compiled for AVX-512 (Note [AVX-512 element-wise loops] in
// src/backend/cpu/loops.hpp).
//  * Accuracy. Max error in ulp of the exact result (|y - f(x)| / ulp(f(x)), ulp(v) = 2^(e - 23) for
//    2^e <= |v| < 2^(e+1), 2^-149 below 2^-126), measured against double-precision std:: over all
//    2^32 inputs, for the baseline (SSE2, no FMA) and the AVX-512 (FMA) builds (GCC 12):
//        exp 0.990 / 1.012   log 0.952 / 0.882   tanh 1.060 / 1.060
//        sigmoid 1.439 / 1.433   erf 0.986 / 0.964
//    The k...MaxUlp constants below add a margin of about 0.02 (another compiler may contract or
//    schedule differently); tests/backend/test_fast_math.cpp asserts them on a dense sweep (every
//    input with MP_FAST_MATH_EXHAUSTIVE=1). Correctly rounded would be 0.5; glibc's expf/logf are
//    ~0.5, the SLEEF "u10" functions behind PyTorch's vectorised CPU kernels promise 1.0.
//    exp, log, tanh and erf are monotone (non-decreasing) over all floats on both builds, so
//    softmax never reorders logits; sigmoid has 1-ulp reversals (about 1 adjacent pair in 6000).
//  * Special values as C's expf/logf/tanhf/erff: NaN -> NaN, exp(inf) = inf, exp(-inf) = 0,
//    exp(x) = inf from x = 88.72284 (where the rounded result overflows) and gradual underflow
//    (subnormal results below -87.33655, 0 below -103.97208: the correctly rounded cut-offs);
//    log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf, subnormal x fine; tanh, sigmoid and erf
//    are odd/symmetric as they should be, tanh(+-0) = +-0, and saturate to exactly +-1 (tanh beyond
//    |x| = 9.0109129, erf beyond 3.9190717), sigmoid to exactly 1 beyond 17.328678 and to 0
//    below -103.97208 (subnormal below -87.33655): the correctly rounded thresholds, except that
//    erf reaches 1 a few floats early (beyond 3.9190712 in the baseline build, 3.9190717 with FMA,
//    instead of 3.9192057: it returns 1 where 1 - 2^-24 is nearer, within the bound).
//  * Why this suffices for training. A 16-bit result is the f32 result rounded again: bf16 keeps
//    8 significant bits (one bf16 ulp = 2^16 f32 ulps), f16 11 bits (2^13), so a 1.5-ulp f32 error
//    changes the 16-bit result only when the exact value lies within 1.5 f32 ulp of a rounding
//    midpoint (at most about 3 inputs in 2^16 for bf16), and then by one 16-bit ulp -- as with
//    any f32 library that is not correctly rounded. In f32 a relative error of 1.5 * 2^-24 = 9e-8
//    is far below what training can see: the rounding of every f32 sum and product in the
//    surrounding kernels is 6e-8, gradient noise is orders of magnitude larger, and PyTorch's
//    vectorised CPU kernels accept a 1-ulp bound. What matters more for training is that nothing
//    overflows or NaNs where the true value is finite, that saturation is exact (sigmoid and tanh
//    gradients y(1 - y), 1 - y^2 become exactly 0, as with libm) and that exp is monotone:
//    all covered above and in the tests.
//  * Method: range reduction (exponent/mantissa split by bit manipulation, Cody-Waite reduction by
//    ln 2) and polynomials whose coefficients are minimax fits of the reduced function, rounded to
//    float. Each polynomial's fit error is given beside it (re-checked in 40-digit arithmetic);
//    float evaluation adds the rest.
//  * Selects are bit blends (blend()), not ?: -- with ?: GCC threads jumps through the special
//    cases, leaves trapping FP code in branches, and the SSE2 loop stays scalar.
//  * FMA: where the kernel is compiled with FMA (AVX-512), GCC contracts a*b+c, so the two builds
//    may differ in the last bit; no step needs an exactly rounded product (every product the
//    error-free transformations rely on is exact), so both keep the bounds, and both are tested.
//  * Device code (__CUDA_ARCH__) calls CUDA's own expf/logf/tanhf/erff instead (CUDA documents
//    2, 1, 2 and 2 ulp); the double versions are std:: everywhere, so f64 gradchecks stay exact.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "mp/core/half.hpp"
#include "mp/core/macros.hpp"

namespace mp::backend {

namespace fast_math_detail {

/// ln 2 split for Cody-Waite reduction: kLn2Hi has 9 significant bits, so n * kLn2Hi is exact for
/// |n| < 2^15, and kLn2Hi + kLn2Lo = ln 2 to ~2^-38 relative.
inline constexpr float kLn2Hi = 0x1.63p-1f;        // 0.693359375
inline constexpr float kLn2Lo = -0x1.bd0106p-13f;  // ln 2 - kLn2Hi
inline constexpr float kLog2e = 0x1.715476p+0f;    // 1 / ln 2
/// 1.5 * 2^23: adding it to |v| < 2^22 rounds v to an integer held in the low mantissa bits.
inline constexpr float kRoundShift = 0x1.8p23f;
inline constexpr float kInf = __builtin_huge_valf();

/// c ? a : b as a bit blend (see the Note: a plain ?: can keep the loop from vectorising).
MP_HD MP_FORCE_INLINE uint32_t blend_bits(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (a & m) | (b & ~m);
}
/// c ? a : b for floats, as a bit blend.
MP_HD MP_FORCE_INLINE float blend(bool c, float a, float b) {
  return mp::detail::f32_from_bits(blend_bits(c, mp::detail::f32_bits(a), mp::detail::f32_bits(b)));
}

/// |x| and the sign bit of x.
MP_HD MP_FORCE_INLINE float abs_and_sign(float x, uint32_t& sign) {
  const uint32_t b = mp::detail::f32_bits(x);
  sign = b & 0x80000000u;
  return mp::detail::f32_from_bits(b & 0x7fffffffu);
}

/// v with the sign bit `sign` OR-ed in (v >= 0 or NaN).
MP_HD MP_FORCE_INLINE float with_sign(float v, uint32_t sign) {
  return mp::detail::f32_from_bits(mp::detail::f32_bits(v) | sign);
}

/// 2^n as a float for n in [-126, 127] (n as uint32, two's complement).
MP_HD MP_FORCE_INLINE float pow2(uint32_t n) { return mp::detail::f32_from_bits((n + 127u) << 23); }

/// p * 2^n with a single rounding for every n in [-252, 254]: two exact power-of-two factors, the
/// first product stays normal, so results in the subnormal range round once and 2^128 overflows
/// to inf. n is two's complement; garbage n (only for NaN p) is harmless.
MP_HD MP_FORCE_INLINE float scale_by_pow2(float p, uint32_t n) {
  const uint32_t n1 = static_cast<uint32_t>(static_cast<int32_t>(n) >> 1);  // arithmetic shift (C++20)
  return p * pow2(n1) * pow2(n - n1);
}

/// Range reduction of e^x: returns n (two's complement) and sets s so that e^x = 2^n (1 + s),
/// |s| <= 0.42, for |x| <= 150 (callers clamp). Keeping 1 + s unrounded lets sigmoid, tanh and erf
/// avoid one rounding. NaN x gives NaN s.
MP_HD MP_FORCE_INLINE uint32_t exp_parts(float x, float& s) {
  // n = round(x / ln 2), r = x - n ln 2 in [-0.3466, 0.3466]; x - n * kLn2Hi is exact.
  const float t = x * kLog2e + kRoundShift;
  const float nf = t - kRoundShift;
  const float r = (x - nf * kLn2Hi) - nf * kLn2Lo;
  // e^r - 1 = r + r^2 q(r): minimax for the relative error of e^r on |r| <= 0.3466, fit error 3.1e-9.
  const float q =
      0x1.fffffcp-2f + r * (0x1.555492p-3f + r * (0x1.5558aap-5f + r * (0x1.12396cp-7f + r * 0x1.6a5234p-10f)));
  s = r + (r * r) * q;
  return mp::detail::f32_bits(t) - mp::detail::f32_bits(kRoundShift);
}

/// 1 / (1 + e^a) for a >= 0 (or NaN), gradual underflow to 0 for large a. With e^a = 2^n (1 + s)
/// it is 2^-n / ((1 + 2^-n) + s): the denominator's rounding error is recovered exactly and
/// corrected for, leaving the division's rounding (the scaling by 2^-n is exact for normal results).
MP_HD MP_FORCE_INLINE float sigmoid_of_neg(float a) {
  a = blend(a > 104.0f, 104.0f, a);  // beyond this the result is 0 (NaN passes)
  float s;
  const uint32_t n = exp_parts(a, s);                       // n in [0, 150]
  const float pw = pow2(0u - blend_bits(n > 64u, 64u, n));  // 2^-n; 2^-64 no longer matters next to 1 + s
  // d = b + c with b = 1 + 2^-n exact up to n = 23; beyond, 2^-n goes into c = s (that sum's
  // rounding is negligible). hi + lo = d exactly (Fast2Sum, b >= 1 > |c|), and
  // 1 / (hi + lo) = y (1 - y lo) to first order, y = 1 / hi.
  const bool small_n = n <= 23u;
  const float b = blend(small_n, 1.0f + pw, 1.0f);
  const float c = blend(small_n, s, s + pw);
  const float hi = b + c;
  const float lo = (b - hi) + c;
  const float y = 1.0f / hi;
  return scale_by_pow2(y - (y * lo) * y, 0u - n);
}

}  // namespace fast_math_detail

// Max error of each function below in ulp of the exact result, over every float input, for both
// the baseline and the AVX-512 builds (Note [fast float transcendentals]; the tests assert them).
/// Max error of fast_exp in ulp.
inline constexpr double kFastExpMaxUlp = 1.03;
/// Max error of fast_log in ulp.
inline constexpr double kFastLogMaxUlp = 0.97;
/// Max error of fast_tanh in ulp.
inline constexpr double kFastTanhMaxUlp = 1.08;
/// Max error of fast_sigmoid in ulp.
inline constexpr double kFastSigmoidMaxUlp = 1.46;
/// Max error of fast_erf in ulp.
inline constexpr double kFastErfMaxUlp = 1.0;

/// e^x for float, max error kFastExpMaxUlp; inf from 88.72284, subnormal below -87.33655, 0 below
/// -103.97208, NaN -> NaN (Note [fast float transcendentals]).
MP_HD MP_FORCE_INLINE float fast_exp(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  using namespace fast_math_detail;
  // Clamp to where the result is already inf / 0 (NaN passes: comparisons with it are false).
  x = blend(x > 88.8f, 88.8f, x);
  x = blend(x < -104.0f, -104.0f, x);
  float s;
  const uint32_t n = exp_parts(x, s);
  return scale_by_pow2(1.0f + s, n);
#endif
}

/// Natural log for float, max error kFastLogMaxUlp; log(+-0) = -inf, log(x < 0) = NaN,
/// log(inf) = inf, NaN -> NaN, subnormal x as accurate as normal x.
MP_HD MP_FORCE_INLINE float fast_log(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  using namespace fast_math_detail;
  // Subnormals (and, harmlessly, x <= 0, overridden below) are scaled by 2^23 first.
  const bool tiny = x < 0x1p-126f;
  const float xs = blend(tiny, x * 0x1p23f, x);
  // x = 2^e m with m in [2/3, 4/3): subtract the bits of 2/3, the exponent field is then e.
  const uint32_t u = mp::detail::f32_bits(xs) - 0x3f2aaaabu;
  const int32_t e = static_cast<int32_t>(u) >> 23;
  const float m = mp::detail::f32_from_bits((u & 0x7fffffu) + 0x3f2aaaabu);
  const float ef = static_cast<float>(e) - blend(tiny, 23.0f, 0.0f);
  const float f = m - 1.0f;  // exact, |f| <= 1/3
  // log1p(f) = f + f^2 p(f): minimax for relative error on [-1/3, 1/3], fit error 4.6e-9.
  const float p =
      -0x1p-1f +
      f * (0x1.555506p-2f +
           f * (-0x1.fffefcp-3f +
                f * (0x1.99d044p-3f +
                     f * (-0x1.559c46p-3f +
                          f * (0x1.1ed662p-3f + f * (-0x1.f332a6p-4f + f * (0x1.1e678cp-3f + f * -0x1.07c964p-3f)))))));
  const float tail = (f * f) * p;
  // e ln2 + f + tail: e * kLn2Hi is exact and at least as large as |f| unless e = 0, so the
  // rounding error of hi = e * kLn2Hi + f is recovered exactly (Fast2Sum) and added back.
  const float a = ef * kLn2Hi;
  const float hi = a + f;
  const float err = f - (hi - a);
  float r = hi + (err + (ef * kLn2Lo + tail));
  r = blend(x < 0.0f, __builtin_nanf(""), r);
  r = blend(x == 0.0f, -kInf, r);
  r = blend(x == kInf, kInf, r);
  return blend(x != x, x, r);
#endif
}

/// tanh for float, max error kFastTanhMaxUlp; odd (tanh(-0) = -0), exactly +-1 beyond |x| = 9.0109129,
/// NaN -> NaN.
MP_HD MP_FORCE_INLINE float fast_tanh(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  using namespace fast_math_detail;
  uint32_t sign;
  const float a = abs_and_sign(x, sign);
  // |x| < 0.625: tanh a = a + a^3 p(a^2), minimax for relative error, fit error 1.8e-10.
  const float a2 = a * a;
  const float p = -0x1.555554p-2f +
                  a2 * (0x1.11107ap-3f +
                        a2 * (-0x1.b9f188p-5f + a2 * (0x1.63a55p-6f + a2 * (-0x1.0c5edp-7f + a2 * 0x1.1a2816p-9f))));
  const float small = a + a * (a2 * p);
  // Otherwise tanh a = 1 - 2 / (1 + e^2a).
  const float large = 1.0f - 2.0f * sigmoid_of_neg(2.0f * a);
  return with_sign(blend(a < 0.625f, small, large), sign);
#endif
}

/// Logistic sigmoid 1 / (1 + e^-x) for float, max error kFastSigmoidMaxUlp; exactly 1 beyond
/// x = 17.328678, subnormal below -87.33655, 0 below -103.97208, never overflows, NaN -> NaN.
MP_HD MP_FORCE_INLINE float fast_sigmoid(float x) {
#if defined(__CUDA_ARCH__)
  const float e = expf(-fabsf(x));
  const float q = e / (1.0f + e);
  return x > 0.0f ? 1.0f - q : q;
#else
  using namespace fast_math_detail;
  uint32_t sign;
  const float q = sigmoid_of_neg(abs_and_sign(x, sign));  // sigmoid(-|x|), never overflows
  return blend(x > 0.0f, 1.0f - q, q);
#endif
}

/// erf for float, max error kFastErfMaxUlp; odd (erf(-0) = -0), exactly +-1 beyond |x| = 3.9190717,
/// NaN -> NaN.
MP_HD MP_FORCE_INLINE float fast_erf(float x) {
#if defined(__CUDA_ARCH__)
  return erff(x);
#else
  using namespace fast_math_detail;
  uint32_t sign;
  const float a = abs_and_sign(x, sign);
  // |x| < 0.9: erf a = a + a p(a^2), minimax for relative error, fit error 8.9e-10.
  const float a2 = a * a;
  const float p =
      0x1.06eba8p-3f +
      a2 * (-0x1.81274p-2f +
            a2 * (0x1.ce2d6p-4f +
                  a2 * (-0x1.b80062p-6f + a2 * (0x1.543f2ap-8f + a2 * (-0x1.a583bcp-11f + a2 * 0x1.4d2864p-14f)))));
  const float small = a + a * p;
  // Otherwise erf a = 1 - erfc a with erfc a = e^l(a), l a minimax fit of log erfc on [0.9, 3.92] in
  // powers of (a - 0.9), weighted by erfc a (the absolute error of erf is what counts), fit error
  // 2.0e-9; erf rounds to 1 beyond 3.92. With e^l = 2^n (1 + s), n in [-26, -2], 1 - 2^n is exact
  // for n >= -24, so (1 - 2^n) - 2^n s rounds once; below, 1 - 2^n (1 + s) is as good.
  const float v = blend(a > 3.92f, 3.92f, a) - 0.9f;
  const float l = -0x1.9816c2p+0f +
                  v * (-0x1.3c5e7ep+1f +
                       v * (-0x1.a8f86ep-1f +
                            v * (-0x1.76e36ep-5f +
                                 v * (0x1.698e54p-7f +
                                      v * (-0x1.146302p-9f +
                                           v * (0x1.02b45ap-12f + v * (-0x1.59a0f6p-21f + v * -0x1.969aeep-19f)))))));
  float s;
  const uint32_t n = exp_parts(l, s);
  const float p2 = pow2(n);
  const float large = blend(static_cast<int32_t>(n) >= -24, (1.0f - p2) - p2 * s, 1.0f - p2 * (1.0f + s));
  return with_sign(blend(a < 0.9f, small, large), sign);
#endif
}

/// c ? a : b for floats as a bit blend: no branch for GCC to sink the unused arm's loads into, so a
/// loop selecting with it still vectorises on SSE2 (Note [fast float transcendentals]).
MP_HD MP_FORCE_INLINE float blend_select(bool c, float a, float b) { return fast_math_detail::blend(c, a, b); }

// ---- the transcendentals in compute type T: fast_* for float, std:: for double ----

/// e^x in T: fast_exp for float, std::exp otherwise.
template <class T>
MP_HD MP_FORCE_INLINE T math_exp(T x) {
  if constexpr (std::is_same_v<T, float>)
    return fast_exp(x);
  else
    return std::exp(x);
}
/// ln x in T: fast_log for float, std::log otherwise.
template <class T>
MP_HD MP_FORCE_INLINE T math_log(T x) {
  if constexpr (std::is_same_v<T, float>)
    return fast_log(x);
  else
    return std::log(x);
}
/// tanh x in T: fast_tanh for float, std::tanh otherwise.
template <class T>
MP_HD MP_FORCE_INLINE T math_tanh(T x) {
  if constexpr (std::is_same_v<T, float>)
    return fast_tanh(x);
  else
    return std::tanh(x);
}
/// erf x in T: fast_erf for float, std::erf otherwise.
template <class T>
MP_HD MP_FORCE_INLINE T math_erf(T x) {
  if constexpr (std::is_same_v<T, float>)
    return fast_erf(x);
  else
    return std::erf(x);
}
/// 1 / (1 + e^-x) in T: fast_sigmoid for float, otherwise a form whose exp never overflows.
template <class T>
MP_HD MP_FORCE_INLINE T math_sigmoid(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return fast_sigmoid(x);
  } else {
    if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
    const T e = std::exp(x);
    return e / (T(1) + e);
  }
}

}  // namespace mp::backend

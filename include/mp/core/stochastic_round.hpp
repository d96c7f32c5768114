#pragma once
// Stochastic rounding of f32 values to f16/bf16, on the host and in CUDA kernels alike.
#include <cstdint>

#include "mp/core/half.hpp"
#include "mp/core/philox.hpp"

namespace mp {

// Note [stochastic rounding]
// A 16-bit weight updated without an f32 master (O3) loses every update smaller than half its ulp
// (2^-8 of the weight's power of two in bf16, 2^-11 in f16): rounding to nearest sends w + u back to w
// step after step, and training stalls once the updates are small (late in a schedule, or with a small
// learning rate).
// Stochastic rounding keeps such updates in expectation: x between the neighbouring 16-bit values
// lo < x < hi (by magnitude) becomes hi with probability (|x| - |lo|) / (|hi| - |lo|), else lo, so
// E[round(x)] = x and a long run of small updates moves the weight by their sum on average (Gupta et al.
// 2015, "Deep learning with limited numerical precision"; llm.c rounds its bf16 AdamW updates this way).
// It costs no memory, where a master costs 4 bytes per parameter.
//
// The probability test runs exactly: |x| - |lo| is exact in f32 (the two are within a factor of 2),
// |hi| - |lo| is a power of two, and u * (|hi| - |lo|) < |x| - |lo| is compared in double, where u (24
// random bits times 2^-24) times a power of two is exact even for bf16's subnormal gaps. So a host loop
// and a CUDA kernel round the same value with the same random bits to the same result. Exact values,
// NaN and inf (overflow included: x beyond the largest finite value rounds as nearest-even rounding
// does) are left to the nearest-even conversion; x between the largest finite value and the overflow
// threshold stays finite.
//
// The random bits: the optimizer update of tensor t at step s rounds its element i with draw i of the
// Philox stream `seed`, sub-stream (s, t) (counter words 2 and 3: Note [Philox stream convention]), so
// a result depends on (seed, step, tensor, i) only, not on threads, blocks or the device.

/// Where the random bits of one tensor's rounding come from (Note [stochastic rounding]).
struct RoundingStream {
  bool on = false;      ///< false: round to nearest even
  uint64_t seed = 0;    ///< Philox key
  uint32_t step = 0;    ///< sub-stream word 2: the update's step count
  uint32_t tensor = 0;  ///< sub-stream word 3: the tensor's index in its optimizer
};

/// Random words 4 b .. 4 b + 3 of a rounding stream (element i uses word i % 4 of block i / 4).
MP_HD MP_FORCE_INLINE U32x4 rounding_block(const RoundingStream& s, uint64_t b) {
  return philox4x32_10(U32x4{{static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), s.step, s.tensor}},
                       static_cast<uint32_t>(s.seed), static_cast<uint32_t>(s.seed >> 32));
}

/// x rounded to T (Half or BFloat16) stochastically with the random word r (its top 24 bits are used):
/// to the neighbour of larger magnitude with probability (|x| - |lo|) / (|hi| - |lo|). Exact values, NaN
/// and inf round as T(x) does (Note [stochastic rounding]).
template <class T>
MP_HD inline T stochastic_round(float x, uint32_t r) {
  const T n(x);  // nearest even
  const float fn = static_cast<float>(n);
  const float ax = x < 0 ? -x : x, an = fn < 0 ? -fn : fn;
  if (!(an <= 0x1.fffffep127f) || fn == x || ax != ax) return n;  // inf (overflow included), exact, NaN
  // The other neighbour of x: one step toward zero when n lies above |x|, else away from zero (T's bit
  // patterns are sign-magnitude: +-1 on the bits moves the magnitude by one ulp).
  const bool n_above = an > ax;
  const T other = T::from_bits(static_cast<uint16_t>(n_above ? n.x - 1u : n.x + 1u));
  const float fo = static_cast<float>(other), ao = fo < 0 ? -fo : fo;
  const float lo = n_above ? ao : an, hi = n_above ? an : ao;
  const double u = static_cast<double>(r >> 8) * 0x1p-24;
  const bool up = u * static_cast<double>(hi - lo) < static_cast<double>(ax - lo);
  return up == n_above ? n : other;
}

}  // namespace mp

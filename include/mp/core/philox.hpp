#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "mp/core/macros.hpp"

namespace mp {

// Note [Philox stream convention]
// Every random factory on every device draws from one counter-based stream per seed:
//   block b of stream `seed` = philox4x32_10(counter = {b low32, b high32, 0, 0},
//                                             key = {seed low32, seed high32});
//   draw  j of stream `seed` = word j % 4 of block j / 4.
// Element i of a tensor drawn at generator offset `offset` is draw j = offset + i. So element i
// depends only on (seed, offset, i): a CPU loop, an OpenMP partition and a CUDA grid of any
// shape give the same tensor, and two tensors drawn one after the other never share a draw
// (Generator::advance reserves the draws). advance() rounds each reservation up to a multiple
// of 4 so every tensor starts on a block boundary: a GPU thread making 4 consecutive elements
// needs exactly one Philox call. Counter words 2 and 3 stay 0 (reserved for sub-streams).
//  * uniform: the top 24 bits of the draw times 2^-24, a float in [0, 1) on a 2^-24 grid.
//    Bit-identical on every device (integer arithmetic only).
//  * normal: Box-Muller on draw pairs (j & ~1, j | 1) of the same block: u1 = (w0 + 1) * 2^-32
//    in (0, 1] (never log(0)), u2 = w1 * 2^-32 in [0, 1), r = sqrt(-2 ln u1), t = 2 pi u2; the
//    even draw gets r cos t, the odd one r sin t (independent standard normals, |z| <= 6.67).
//    Computed in double and rounded once to float, so host (glibc) and CUDA libm, both within
//    a couple of double ulps, give the same float except when a result lies within those ulps
//    of a float rounding boundary (probability ~1e-8 per element; then they differ by 1 ulp).

/// Four 32-bit words: a Philox counter or one output block.
struct U32x4 {
  uint32_t v[4];
};

namespace detail {
/// Full 32x32 -> 64-bit product split into high and low words.
MP_HD MP_FORCE_INLINE uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
#endif
}
}  // namespace detail

/// Philox4x32 with 10 rounds (Salmon et al., SC'11; Random123's philox4x32_10): a bijection of the
/// 128-bit counter under the 64-bit key {key0, key1}.
MP_HD inline U32x4 philox4x32_10(U32x4 ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key0 += kW0;
      key1 += kW1;
    }
    uint32_t hi0, hi1;
    const uint32_t lo0 = detail::mulhilo32(kM0, ctr.v[0], &hi0);
    const uint32_t lo1 = detail::mulhilo32(kM1, ctr.v[2], &hi1);
    ctr = U32x4{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
  }
  return ctr;
}

/// Blocks handled side by side by philox_blocks_soa (one vector of 32-bit lanes per counter word).
inline constexpr int kPhiloxLanes = 16;

/// out[4 k + w] = word w of block first_block + k of stream `seed`, for k < nblocks (host only): the
/// same words as philox4x32_10, with kPhiloxLanes blocks computed together in structure-of-arrays form
/// so that a compiler vectorises the rounds (a 32x32 -> 64-bit multiply per lane). Inlined into a
/// caller compiled for AVX-512 it runs 16 blocks per instruction.
MP_FORCE_INLINE void philox_blocks_soa(uint64_t seed, uint64_t first_block, int64_t nblocks, uint32_t* out) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  constexpr int L = kPhiloxLanes;
  for (int64_t k0 = 0; k0 < nblocks; k0 += L) {
    uint32_t c0[L], c1[L], c2[L], c3[L];
    for (int l = 0; l < L; ++l) {
      const uint64_t b = first_block + static_cast<uint64_t>(k0 + l);
      c0[l] = static_cast<uint32_t>(b);
      c1[l] = static_cast<uint32_t>(b >> 32);
      c2[l] = 0u;
      c3[l] = 0u;
    }
    uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      if (round > 0) {
        key0 += kW0;
        key1 += kW1;
      }
#if defined(_OPENMP)
#pragma omp simd
#endif
      for (int l = 0; l < L; ++l) {
        const uint64_t p0 = static_cast<uint64_t>(kM0) * c0[l];
        const uint64_t p1 = static_cast<uint64_t>(kM1) * c2[l];
        const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[l] ^ key0;
        const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[l] ^ key1;
        c1[l] = static_cast<uint32_t>(p1);
        c3[l] = static_cast<uint32_t>(p0);
        c0[l] = n0;
        c2[l] = n2;
      }
    }
    const int lanes = static_cast<int>(nblocks - k0 < L ? nblocks - k0 : L);
    for (int l = 0; l < lanes; ++l) {
      uint32_t* o = out + 4 * (k0 + l);
      o[0] = c0[l];
      o[1] = c1[l];
      o[2] = c2[l];
      o[3] = c3[l];
    }
  }
}

/// Block `block` of stream `seed` (4 draws): see Note [Philox stream convention].
MP_HD MP_FORCE_INLINE U32x4 philox_block(uint64_t seed, uint64_t block) {
  const U32x4 ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

/// Raw 32-bit draw offset + i of stream `seed`.
MP_HD MP_FORCE_INLINE uint32_t philox_u32(uint64_t seed, uint64_t offset, uint64_t i) {
  const uint64_t j = offset + i;
  return philox_block(seed, j >> 2).v[j & 3];
}

/// A 32-bit draw mapped to a float in [0, 1): top 24 bits times 2^-24 (exact).
MP_HD MP_FORCE_INLINE float philox_to_uniform(uint32_t w) {
  return static_cast<float>(w >> 8) * 5.9604644775390625e-8f;  // 2^-24
}

/// Box-Muller on one draw pair: `second` selects r sin t (odd draw) instead of r cos t (even draw).
MP_HD MP_FORCE_INLINE float philox_to_normal(uint32_t w0, uint32_t w1, bool second) {
  constexpr double kTwoPow32Inv = 2.3283064365386962890625e-10;  // 2^-32
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double u1 = (static_cast<double>(w0) + 1.0) * kTwoPow32Inv;  // (0, 1]
  const double u2 = static_cast<double>(w1) * kTwoPow32Inv;          // [0, 1)
  const double r = ::sqrt(-2.0 * ::log(u1));
  const double t = kTwoPi * u2;
  return static_cast<float>(second ? r * ::sin(t) : r * ::cos(t));
}

/// Element i of a uniform [0, 1) tensor drawn at (seed, offset); same value on every device.
MP_HD MP_FORCE_INLINE float philox_uniform(uint64_t seed, uint64_t offset, uint64_t i) {
  return philox_to_uniform(philox_u32(seed, offset, i));
}

/// Element i of a standard-normal tensor drawn at (seed, offset) (Box-Muller, no log(0)).
MP_HD MP_FORCE_INLINE float philox_normal(uint64_t seed, uint64_t offset, uint64_t i) {
  const uint64_t j = offset + i;
  const U32x4 b = philox_block(seed, j >> 2);
  const unsigned pair = static_cast<unsigned>(j & 2);
  return philox_to_normal(b.v[pair], b.v[pair + 1], (j & 1) != 0);
}

/// dst[i] = philox_uniform(seed, offset, i) for i < n; one Philox call per 4 elements, OpenMP for large n.
void philox_fill_uniform(uint64_t seed, uint64_t offset, float* dst, size_t n);
/// dst[i] = philox_normal(seed, offset, i) for i < n; one Philox call per 4 elements, OpenMP for large n.
void philox_fill_normal(uint64_t seed, uint64_t offset, float* dst, size_t n);

/// Seed and offset (in draws) of a Philox stream position.
struct PhiloxState {
  uint64_t seed = 0;    ///< Philox key.
  uint64_t offset = 0;  ///< First draw (Note [Philox stream convention]).
};

/// A random-number generator: a seed plus the offset of the next unused draw. Thread-safe.
/// Random factories reserve draws with reserve()/advance() and then compute element i as
/// philox_*(seed, old_offset, i) on any device.
class Generator {
 public:
  /// The seed of default_generator() before any manual_seed() (PyTorch's default, 67280421310721).
  static constexpr uint64_t kDefaultSeed = 67280421310721ull;

  /// A generator at offset 0 of stream `seed`.
  explicit Generator(uint64_t seed);
  /// Copies the other generator's state (seed and offset).
  Generator(const Generator& other);
  /// Copies the other generator's state (seed and offset).
  Generator& operator=(const Generator& other);

  /// The seed (Philox key).
  uint64_t seed() const;
  /// The next unused draw.
  uint64_t offset() const;
  /// Seed and offset read together.
  PhiloxState state() const;
  /// Reserves n draws and returns the old offset; the offset grows by n rounded up to a multiple of 4.
  uint64_t advance(uint64_t n);
  /// Like advance(n), but returns the seed with the old offset, read atomically with the reservation.
  PhiloxState reserve(uint64_t n);
  /// Sets seed and offset (e.g. to replay a draw, or to restore a checkpoint).
  void set_state(uint64_t seed, uint64_t offset);

  /// Note [draws keyed by the global batch]: this process holds part `index` of `count` equal parts of every batch
  /// (a data-parallel rank: set_batch_shard(rank, ranks)); (0, 1) by default.
  void set_batch_shard(int index, int count);
  /// Draws for a tensor of n elements whose first dimension is this process's part of a global batch: the stream
  /// advances by the whole global tensor's draws (n x count) and the tensor gets its part's (offset + index x n), so
  /// element i is the draw element index x n + i of the global tensor gets in one process. Without a shard, reserve(n).
  PhiloxState reserve_batch(uint64_t n);

 private:
  mutable std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
  int shard_index_ = 0, shard_count_ = 1;
};

/// The process-wide generator used by random factories when none is given.
Generator& default_generator();

/// Reseeds default_generator(): seed `seed`, offset 0 (like torch.manual_seed).
void manual_seed(uint64_t seed);

}  // namespace mp

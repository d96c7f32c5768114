#pragma once
// Point-wise math of loss scaling and its diagnostics, shared by the CPU and CUDA kernels.
#include <cstdint>

#include "mp/core/macros.hpp"

namespace mp::backend {

/// Whether x is neither inf nor NaN (x - x is 0 exactly for finite x, NaN otherwise).
template <class T>
MP_HD MP_FORCE_INLINE bool is_finite_value(T x) {
  return (x - x) == T(0);
}

/// The smallest positive f16 subnormal (2^-24) and normal (2^-14): below the first a gradient is
/// lost in f16, below the second it loses precision.
inline constexpr double kF16MinSubnormal = 5.9604644775390625e-08;
inline constexpr double kF16MinNormal = 6.103515625e-05;

/// Classify |x * scale| for the underflow statistics: 0 = zero (not counted), 1 = below the smallest
/// f16 subnormal 2^-24 (flushed to 0 below 2^-25, otherwise rounded up to 2^-24: the value is lost
/// either way), 2 = an f16 subnormal (below 2^-14: fewer than 11 significant bits), 3 = an f16 normal
/// or larger.
template <class T>
MP_HD MP_FORCE_INLINE int f16_range_class(T x, T scale) {
  const T a = (x < T(0) ? -x : x) * scale;
  if (a == T(0)) return 0;
  if (a < T(kF16MinSubnormal)) return 1;
  if (a < T(kF16MinNormal)) return 2;
  return 3;
}

}  // namespace mp::backend

#pragma once
// The accumulators of the reductions, shared by the CPU loops (cpu/reduce.cpp) and the CUDA kernels
// (cuda/reduce.cu): init (the identity), combine (two partials) and map (applied once to each loaded
// element). A is the accumulation type: float (f32/f16/bf16 inputs), double (f64) or int64_t (integers).
#include <cstdint>
#include <type_traits>

#include "mp/core/half.hpp"
#include "mp/core/macros.hpp"

namespace mp::backend {

/// +infinity for floating A, the largest value for int64_t.
template <class A>
MP_HD MP_FORCE_INLINE A reduce_highest() {
  if constexpr (std::is_floating_point_v<A>)
    return static_cast<A>(detail::f32_from_bits(0x7f800000u));
  else
    return A(INT64_MAX);
}
/// -infinity for floating A, the smallest value for int64_t.
template <class A>
MP_HD MP_FORCE_INLINE A reduce_lowest() {
  if constexpr (std::is_floating_point_v<A>)
    return -reduce_highest<A>();
  else
    return A(INT64_MIN);
}

/// Sum.
template <class A>
struct SumAcc {
  MP_HD static A init() { return A(0); }
  MP_HD static A combine(A a, A b) { return a + b; }
  MP_HD static A map(A v) { return v; }
};
/// Sum of squares in one pass (the gradient norm of clip_grad_norm_: no squared temporary, and a
/// 16-bit input is squared after conversion to float).
template <class A>
struct SumSqAcc {
  MP_HD static A init() { return A(0); }
  MP_HD static A combine(A a, A b) { return a + b; }
  MP_HD static A map(A v) { return v * v; }
};
/// Maximum; NaN propagates.
template <class A>
struct MaxAcc {
  MP_HD static A init() { return reduce_lowest<A>(); }
  MP_HD static A combine(A a, A b) { return (a != a || a > b) ? a : b; }
  MP_HD static A map(A v) { return v; }
};
/// Minimum; NaN propagates.
template <class A>
struct MinAcc {
  MP_HD static A init() { return reduce_highest<A>(); }
  MP_HD static A combine(A a, A b) { return (a != a || a < b) ? a : b; }
  MP_HD static A map(A v) { return v; }
};

}  // namespace mp::backend

#pragma once
// Point-wise math shared by the CPU loops and the CUDA kernels: every functor is MP_HD and
// computes in the accumulation type (float for f32/f16/bf16, double for f64), so the CPU tests
// check exactly the formulas the GPU runs.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/fast_math.hpp"
#include "mp/core/error.hpp"
#include "mp/core/macros.hpp"

namespace mp::backend {

/// Every element-wise operation the kernels know. Arity: U = unary, B = binary, T = ternary.
enum class PointwiseOp : uint8_t {
  // unary (x)
  copy,
  neg,
  exp,
  log,
  sqrt,
  rsqrt,
  relu,
  gelu,
  gelu_tanh,  // GELU's tanh approximation (GPT-2's)
  tanh,
  sigmoid,
  abs,
  square,
  sign,
  pow_scalar,  // x ^ p.scalar0
  add_scalar,  // x + p.scalar0
  mul_scalar,  // x * p.scalar0
  clamp,       // min(max(x, p.scalar0), p.scalar1) (NaN propagates)
  // binary (a, b)
  add,
  sub,
  mul,
  div,
  pow,
  maximum,
  minimum,
  add_scaled,  // a + p.scalar0 * b (PyTorch's alpha)
  axpby,       // p.scalar0 * a + p.scalar1 * b (running averages in one pass)
  eq,
  ne,
  lt,
  le,
  gt,
  ge,
  relu_backward,       // (grad, x): grad where x > 0
  gelu_backward,       // (grad, x)
  gelu_tanh_backward,  // (grad, x)
  tanh_backward,       // (grad, y=tanh(x)): grad * (1 - y^2)
  sigmoid_backward,    // (grad, y=sigmoid(x)): grad * y * (1 - y)
  clamp_backward,      // (grad, x): grad where p.scalar0 <= x <= p.scalar1
  // ternary
  where,  // (cond, a, b)
};

/// Scalars some ops take.
struct PointwiseParams {
  double scalar0 = 0.0;
  double scalar1 = 0.0;
};

// ---- functors (T is the accumulation type) ----

template <class T>
struct CopyFn {
  MP_HD T operator()(T x) const { return x; }
};
template <class T>
struct NegFn {
  MP_HD T operator()(T x) const { return -x; }
};
// The transcendental functors compute through math_exp/math_log/... (fast_math.hpp): the
// vectorisable fast_* functions for float (Note [fast float transcendentals]), std:: for double, so
// f64 gradchecks stay exact. They are force-inlined: a call left in the omp simd loop keeps it scalar.
template <class T>
struct ExpFn {
  MP_HD MP_FORCE_INLINE T operator()(T x) const { return math_exp(x); }
};
template <class T>
struct LogFn {
  MP_HD MP_FORCE_INLINE T operator()(T x) const { return math_log(x); }
};
template <class T>
struct SqrtFn {
  MP_HD T operator()(T x) const { return std::sqrt(x); }
};
template <class T>
struct RsqrtFn {
  MP_HD T operator()(T x) const { return T(1) / std::sqrt(x); }
};
template <class T>
struct ReluFn {
  MP_HD T operator()(T x) const { return x > T(0) ? x : (x != x ? x : T(0)); }  // NaN propagates
};
/// Exact GELU: x * Phi(x) with the Gaussian CDF via erf (PyTorch's default approximate='none').
template <class T>
struct GeluFn {
  MP_HD MP_FORCE_INLINE T operator()(T x) const {
    return T(0.5) * x * (T(1) + math_erf(x * T(0.70710678118654752440)));
  }
};
/// GELU's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (PyTorch's approximate='tanh').
template <class T>
struct GeluTanhFn {
  MP_HD MP_FORCE_INLINE T operator()(T x) const {
    return T(0.5) * x * (T(1) + math_tanh(T(0.79788456080286535588) * (x + T(0.044715) * x * x * x)));
  }
};
template <class T>
struct TanhFn {
  MP_HD MP_FORCE_INLINE T operator()(T x) const { return math_tanh(x); }
};
/// Sigmoid written to avoid overflow of exp for large |x| (math_sigmoid).
template <class T>
struct SigmoidFn {
  MP_HD MP_FORCE_INLINE T operator()(T x) const { return math_sigmoid(x); }
};
template <class T>
struct AbsFn {
  MP_HD T operator()(T x) const { return x < T(0) ? -x : x; }
};
template <class T>
struct SquareFn {
  MP_HD T operator()(T x) const { return x * x; }
};
template <class T>
struct SignFn {
  MP_HD T operator()(T x) const { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x); }
};
template <class T>
struct PowScalarFn {
  T p;
  MP_HD T operator()(T x) const {
    if (p == T(2)) return x * x;
    if (p == T(1)) return x;
    if (p == T(0.5)) return std::sqrt(x);
    return std::pow(x, p);
  }
};
template <class T>
struct AddScalarFn {
  T s;
  MP_HD T operator()(T x) const { return x + s; }
};
template <class T>
struct MulScalarFn {
  T s;
  MP_HD T operator()(T x) const { return x * s; }
};
template <class T>
struct ClampFn {
  T lo, hi;
  MP_HD T operator()(T x) const { return x != x ? x : (x < lo ? lo : (x > hi ? hi : x)); }
};

template <class T>
struct AddFn {
  MP_HD T operator()(T a, T b) const { return a + b; }
};
template <class T>
struct SubFn {
  MP_HD T operator()(T a, T b) const { return a - b; }
};
template <class T>
struct MulFn {
  MP_HD T operator()(T a, T b) const { return a * b; }
};
template <class T>
struct DivFn {
  MP_HD T operator()(T a, T b) const { return a / b; }
};
template <class T>
struct PowFn {
  MP_HD T operator()(T a, T b) const { return std::pow(a, b); }
};
template <class T>
struct MaximumFn {
  MP_HD T operator()(T a, T b) const { return (a != a || a > b) ? a : b; }  // NaN propagates
};
template <class T>
struct MinimumFn {
  MP_HD T operator()(T a, T b) const { return (a != a || a < b) ? a : b; }
};
template <class T>
struct AddScaledFn {
  T alpha;
  MP_HD T operator()(T a, T b) const { return a + alpha * b; }
};
template <class T>
struct AxpbyFn {
  T sa, sb;
  MP_HD T operator()(T a, T b) const { return sa * a + sb * b; }
};
template <class T>
struct EqFn {
  MP_HD bool operator()(T a, T b) const { return a == b; }
};
template <class T>
struct NeFn {
  MP_HD bool operator()(T a, T b) const { return a != b; }
};
template <class T>
struct LtFn {
  MP_HD bool operator()(T a, T b) const { return a < b; }
};
template <class T>
struct LeFn {
  MP_HD bool operator()(T a, T b) const { return a <= b; }
};
template <class T>
struct GtFn {
  MP_HD bool operator()(T a, T b) const { return a > b; }
};
template <class T>
struct GeFn {
  MP_HD bool operator()(T a, T b) const { return a >= b; }
};

template <class T>
struct ReluBackwardFn {
  MP_HD T operator()(T g, T x) const { return x > T(0) ? g : T(0); }
};
/// d/dx [x Phi(x)] = Phi(x) + x phi(x).
template <class T>
struct GeluBackwardFn {
  MP_HD MP_FORCE_INLINE T operator()(T g, T x) const {
    const T cdf = T(0.5) * (T(1) + math_erf(x * T(0.70710678118654752440)));
    const T pdf = T(0.39894228040143267794) * math_exp(T(-0.5) * x * x);
    return g * (cdf + x * pdf);
  }
};
template <class T>
struct GeluTanhBackwardFn {
  MP_HD MP_FORCE_INLINE T operator()(T g, T x) const {
    const T k = T(0.79788456080286535588), a = T(0.044715);
    const T t = math_tanh(k * (x + a * x * x * x));
    return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3) * a * x * x));
  }
};
template <class T>
struct TanhBackwardFn {
  MP_HD T operator()(T g, T y) const { return g * (T(1) - y * y); }
};
template <class T>
struct SigmoidBackwardFn {
  MP_HD T operator()(T g, T y) const { return g * y * (T(1) - y); }
};
template <class T>
struct ClampBackwardFn {
  T lo, hi;
  MP_HD T operator()(T g, T x) const { return (x >= lo && x <= hi) ? g : T(0); }
};
template <class T>
struct WhereFn {
  MP_HD T operator()(T c, T a, T b) const { return c != T(0) ? a : b; }
};

/// Number of inputs of an op.
constexpr int pointwise_arity(PointwiseOp op) {
  if (op <= PointwiseOp::clamp) return 1;
  if (op <= PointwiseOp::clamp_backward) return 2;
  return 3;
}

/// Whether the op produces bool.
constexpr bool pointwise_is_comparison(PointwiseOp op) { return op >= PointwiseOp::eq && op <= PointwiseOp::ge; }

/// Number of inputs as a type (the first argument visit_pointwise_functor passes).
template <int N>
using PointwiseArity = std::integral_constant<int, N>;

/// Whether functor F is compute-bound float math (exp, log, erf, tanh, sigmoid): the CPU gives its
/// loops an AVX-512 copy (Note [AVX-512 element-wise loops] in cpu/loops.hpp).
template <class F>
inline constexpr bool kTranscendentalFn = false;
template <class T>
inline constexpr bool kTranscendentalFn<ExpFn<T>> = true;
template <class T>
inline constexpr bool kTranscendentalFn<LogFn<T>> = true;
template <class T>
inline constexpr bool kTranscendentalFn<GeluFn<T>> = true;
template <class T>
inline constexpr bool kTranscendentalFn<GeluTanhFn<T>> = true;
template <class T>
inline constexpr bool kTranscendentalFn<TanhFn<T>> = true;
template <class T>
inline constexpr bool kTranscendentalFn<SigmoidFn<T>> = true;
template <class T>
inline constexpr bool kTranscendentalFn<GeluBackwardFn<T>> = true;
template <class T>
inline constexpr bool kTranscendentalFn<GeluTanhBackwardFn<T>> = true;

/// Call v(PointwiseArity<N>{}, functor) with op's functor in compute type C (float, double or
/// int64_t): the one mapping from PointwiseOp to its functor, shared by the CPU loops and the CUDA
/// kernels. Ops that need a floating C (exp, sqrt, pow...) throw for integer C; div is defined on
/// integers (C++ division).
template <class C, class V>
void visit_pointwise_functor(PointwiseOp op, const PointwiseParams& p, V&& v) {
  using A1 = PointwiseArity<1>;
  using A2 = PointwiseArity<2>;
  const C s0 = static_cast<C>(p.scalar0), s1 = static_cast<C>(p.scalar1);
  switch (op) {
    case PointwiseOp::copy: return v(A1{}, CopyFn<C>{});
    case PointwiseOp::neg: return v(A1{}, NegFn<C>{});
    case PointwiseOp::abs: return v(A1{}, AbsFn<C>{});
    case PointwiseOp::square: return v(A1{}, SquareFn<C>{});
    case PointwiseOp::sign: return v(A1{}, SignFn<C>{});
    case PointwiseOp::relu: return v(A1{}, ReluFn<C>{});
    case PointwiseOp::add_scalar: return v(A1{}, AddScalarFn<C>{s0});
    case PointwiseOp::mul_scalar: return v(A1{}, MulScalarFn<C>{s0});
    case PointwiseOp::clamp: return v(A1{}, ClampFn<C>{s0, s1});
    case PointwiseOp::add: return v(A2{}, AddFn<C>{});
    case PointwiseOp::sub: return v(A2{}, SubFn<C>{});
    case PointwiseOp::mul: return v(A2{}, MulFn<C>{});
    case PointwiseOp::div: return v(A2{}, DivFn<C>{});
    case PointwiseOp::maximum: return v(A2{}, MaximumFn<C>{});
    case PointwiseOp::minimum: return v(A2{}, MinimumFn<C>{});
    case PointwiseOp::add_scaled: return v(A2{}, AddScaledFn<C>{s0});
    case PointwiseOp::axpby: return v(A2{}, AxpbyFn<C>{s0, s1});
    case PointwiseOp::eq: return v(A2{}, EqFn<C>{});
    case PointwiseOp::ne: return v(A2{}, NeFn<C>{});
    case PointwiseOp::lt: return v(A2{}, LtFn<C>{});
    case PointwiseOp::le: return v(A2{}, LeFn<C>{});
    case PointwiseOp::gt: return v(A2{}, GtFn<C>{});
    case PointwiseOp::ge: return v(A2{}, GeFn<C>{});
    case PointwiseOp::relu_backward: return v(A2{}, ReluBackwardFn<C>{});
    case PointwiseOp::clamp_backward: return v(A2{}, ClampBackwardFn<C>{s0, s1});
    case PointwiseOp::where: return v(PointwiseArity<3>{}, WhereFn<C>{});
    default: break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case PointwiseOp::exp: return v(A1{}, ExpFn<C>{});
      case PointwiseOp::log: return v(A1{}, LogFn<C>{});
      case PointwiseOp::sqrt: return v(A1{}, SqrtFn<C>{});
      case PointwiseOp::rsqrt: return v(A1{}, RsqrtFn<C>{});
      case PointwiseOp::gelu: return v(A1{}, GeluFn<C>{});
      case PointwiseOp::gelu_tanh: return v(A1{}, GeluTanhFn<C>{});
      case PointwiseOp::tanh: return v(A1{}, TanhFn<C>{});
      case PointwiseOp::sigmoid: return v(A1{}, SigmoidFn<C>{});
      case PointwiseOp::pow_scalar: return v(A1{}, PowScalarFn<C>{s0});
      case PointwiseOp::pow: return v(A2{}, PowFn<C>{});
      case PointwiseOp::gelu_backward: return v(A2{}, GeluBackwardFn<C>{});
      case PointwiseOp::gelu_tanh_backward: return v(A2{}, GeluTanhBackwardFn<C>{});
      case PointwiseOp::tanh_backward: return v(A2{}, TanhBackwardFn<C>{});
      case PointwiseOp::sigmoid_backward: return v(A2{}, SigmoidBackwardFn<C>{});
      default: break;
    }
  }
  MP_FAIL("pointwise op ", static_cast<int>(op), " is not defined for integer tensors; convert to a floating dtype");
}

}  // namespace mp::backend

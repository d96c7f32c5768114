#pragma once
#include "mp/tensor/tensor.hpp"

namespace mp {

/// a + alpha * b with broadcasting and type promotion.
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);
/// a - b.
Tensor sub(const Tensor& a, const Tensor& b);
/// a * b.
Tensor mul(const Tensor& a, const Tensor& b);
/// a / b (true division; integers promote to f32).
Tensor div(const Tensor& a, const Tensor& b);
/// a ^ b element-wise.
Tensor pow(const Tensor& a, const Tensor& b);
/// a ^ exponent.
Tensor pow(const Tensor& a, double exponent);
/// a + s.
Tensor add(const Tensor& a, double s);
/// a * s.
Tensor mul(const Tensor& a, double s);
/// Element-wise max (gradient goes to the larger; ties split evenly).
Tensor maximum(const Tensor& a, const Tensor& b);
/// Element-wise min.
Tensor minimum(const Tensor& a, const Tensor& b);
/// -x.
Tensor neg(const Tensor& x);
/// e^x (autocast: fp32).
Tensor exp(const Tensor& x);
/// ln x (autocast: fp32).
Tensor log(const Tensor& x);
/// sqrt x.
Tensor sqrt(const Tensor& x);
/// 1 / sqrt x.
Tensor rsqrt(const Tensor& x);
/// max(x, 0).
Tensor relu(const Tensor& x);
/// How gelu computes (PyTorch's `approximate` argument).
enum class GeluApproximate {
  none,  ///< exact: x * Phi(x), with erf
  tanh,  ///< 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GPT-2's
};
/// GELU x * Phi(x), exact or in GPT-2's tanh form.
Tensor gelu(const Tensor& x, GeluApproximate approximate = GeluApproximate::none);
/// tanh x.
Tensor tanh(const Tensor& x);
/// 1 / (1 + e^-x).
Tensor sigmoid(const Tensor& x);
/// |x|.
Tensor abs(const Tensor& x);
/// x^2.
Tensor square(const Tensor& x);
/// Clamp into [lo, hi] (gradient 0 outside).
Tensor clamp(const Tensor& x, double lo, double hi);
/// cond ? a : b with broadcasting (cond any dtype, nonzero = true).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// Comparisons giving bool tensors (not differentiable).
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

/// In place: self += alpha * other (not differentiable; optimizers and gradient accumulation).
Tensor& add_(Tensor& self, const Tensor& other, double alpha = 1.0);
/// In place: self *= s.
Tensor& mul_(Tensor& self, double s);
/// In place, in one pass: self = self_scale * self + other_scale * other (other broadcast to self's shape),
/// computed in the promoted type and rounded once (a running average, e.g. batch norm's statistics). No autograd.
Tensor& axpby_(Tensor& self, double self_scale, const Tensor& other, double other_scale);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);

}  // namespace mp

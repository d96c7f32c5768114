#pragma once
// Per-element math of the optimizer updates, shared by the CPU loop (src/backend/cpu/optim.cpp) and
// the CUDA kernels (src/backend/cuda/optim.cu). C is the compute type: float for f32/f16/bf16 parameters (state in
// f32), double for f64 parameters.
//
// Note [fused optimizer step]
// One call updates one parameter tensor in a single pass: per element it reads the weight w
// (converted to C), the gradient g and the state, and writes back w (rounded to the parameter's
// dtype) and the state. The functors take the weight by value and return the new weight, so the
// caller decides where w comes from and where it goes. Issue 3 (master weights, loss scaling)
// extends this without touching the formulas:
//   * loss-scale unscaling is already here: g is multiplied by grad_scale_inv first (1 = none);
//   * an FP32 master copy is a second source/destination of w in the loop: load w from the master
//     instead of the parameter, store the result to the master and (rounded) to the parameter;
//   * a 16-bit parameter without a master may be rounded stochastically when stored (`rounding`,
//     Note [stochastic rounding] in mp/core/stochastic_round.hpp); the formulas do not change.
// Formulas and their order follow PyTorch's single-tensor (foreach=False) implementations, so a
// step in f32 matches torch.optim to f32 rounding.
#include <cmath>
#include <cstdint>

#include "mp/core/macros.hpp"
#include "mp/core/stochastic_round.hpp"

namespace mp::backend {

/// Hyper-parameters of one SGD update (PyTorch's torch.optim.SGD).
struct SgdStepParams {
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = false;      ///< the momentum buffer is new: buf = g (PyTorch clones the gradient)
  double grad_scale_inv = 1.0;  ///< g *= grad_scale_inv before anything else (loss-scale unscaling)
  RoundingStream rounding;      ///< on: a 16-bit parameter without master is rounded stochastically
};

/// Hyper-parameters of one Adam/AdamW update (PyTorch's torch.optim.Adam / AdamW).
struct AdamStepParams {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  ///< AdamW: w *= 1 - lr * wd; Adam: g += wd * w
  bool amsgrad = false;
  int64_t step = 1;             ///< step count after this update (for bias correction)
  double grad_scale_inv = 1.0;  ///< g *= grad_scale_inv before anything else
  RoundingStream rounding;      ///< on: a 16-bit parameter without master is rounded stochastically
};

/// SGD with momentum/dampening/nesterov/weight decay:
///   g += wd * w;  buf = first ? g : momentum * buf + (1 - dampening) * g;
///   g = nesterov ? g + momentum * buf : buf;  w -= lr * g.
template <class C>
struct SgdStepFn {
  C lr, momentum, one_minus_dampening, weight_decay, grad_scale_inv;
  bool use_momentum, nesterov, first_step;
  explicit SgdStepFn(const SgdStepParams& p)
      : lr(static_cast<C>(p.lr)),
        momentum(static_cast<C>(p.momentum)),
        one_minus_dampening(static_cast<C>(1.0 - p.dampening)),
        weight_decay(static_cast<C>(p.weight_decay)),
        grad_scale_inv(static_cast<C>(p.grad_scale_inv)),
        use_momentum(p.momentum != 0.0),
        nesterov(p.nesterov),
        first_step(p.first_step) {}
  /// New weight from weight w and gradient g; updates the momentum buffer `buf` in place.
  MP_HD C operator()(C w, C g, C& buf) const {
    g = g * grad_scale_inv;
    if (weight_decay != C(0)) g = g + weight_decay * w;
    if (use_momentum) {
      buf = first_step ? g : momentum * buf + one_minus_dampening * g;
      g = nesterov ? g + momentum * buf : buf;
    }
    return w - lr * g;
  }
};

/// Adam / AdamW (bias-corrected moments, optional AMSGrad):
///   (AdamW) w *= 1 - lr * wd  |  (Adam) g += wd * w
///   m += (1 - beta1) (g - m);  v = beta2 v + (1 - beta2) g^2;  vmax = max(vmax, v) (amsgrad)
///   w -= (lr / (1 - beta1^t)) * m / (sqrt(v or vmax) / sqrt(1 - beta2^t) + eps).
template <class C>
struct AdamStepFn {
  C lr, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decay_factor, step_size, bc2_sqrt, grad_scale_inv;
  bool decoupled, amsgrad;
  explicit AdamStepFn(const AdamStepParams& p)
      : lr(static_cast<C>(p.lr)),
        one_minus_beta1(static_cast<C>(1.0 - p.beta1)),
        beta2(static_cast<C>(p.beta2)),
        one_minus_beta2(static_cast<C>(1.0 - p.beta2)),
        eps(static_cast<C>(p.eps)),
        weight_decay(static_cast<C>(p.weight_decay)),
        decay_factor(static_cast<C>(1.0 - p.lr * p.weight_decay)),
        step_size(static_cast<C>(p.lr / (1.0 - std::pow(p.beta1, static_cast<double>(p.step))))),
        bc2_sqrt(static_cast<C>(std::sqrt(1.0 - std::pow(p.beta2, static_cast<double>(p.step))))),
        grad_scale_inv(static_cast<C>(p.grad_scale_inv)),
        decoupled(p.decoupled_weight_decay),
        amsgrad(p.amsgrad) {}
  /// New weight from w and g; updates exp_avg m, exp_avg_sq v and (amsgrad) max_exp_avg_sq vmax.
  MP_HD C operator()(C w, C g, C& m, C& v, C& vmax) const {
    g = g * grad_scale_inv;
    if (weight_decay != C(0)) {
      if (decoupled) {
        w = w * decay_factor;
      } else {
        g = g + weight_decay * w;
      }
    }
    m = m + one_minus_beta1 * (g - m);
    v = beta2 * v + one_minus_beta2 * (g * g);
    C denom_v = v;
    if (amsgrad) {
      vmax = vmax > v ? vmax : v;
      denom_v = vmax;
    }
    const C denom = std::sqrt(denom_v) / bc2_sqrt + eps;
    return w - step_size * (m / denom);
  }
};

}  // namespace mp::backend

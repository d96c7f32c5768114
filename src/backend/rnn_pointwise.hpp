#pragma once
// Point-wise math of the recurrent cells, shared by the CPU loops and the CUDA kernels. Every functor
// is MP_HD and computes in the accumulation type T (float for f32/f16/bf16, double for f64), so the
// CPU tests check exactly the formulas the GPU runs. The activations are math_sigmoid/math_tanh
// (fast_math.hpp: vectorisable for float, Note [fast float transcendentals]; std:: for double).
#include "backend/fast_math.hpp"
#include "mp/core/macros.hpp"

namespace mp::backend {

/// LSTM gate arithmetic for one hidden unit, PyTorch's gate order (i, f, g, o):
///   c' = sigmoid(f) c + sigmoid(i) tanh(g);  h' = sigmoid(o) tanh(c').
/// Inputs are the pre-activation gates and the previous cell state.
template <class T>
struct LstmGatesForwardFn {
  MP_HD MP_FORCE_INLINE void operator()(T gi, T gf, T gg, T go, T c, T& h_out, T& c_out) const {
    const T i = math_sigmoid(gi), f = math_sigmoid(gf), g = math_tanh(gg), o = math_sigmoid(go);
    const T cn = f * c + i * g;
    c_out = cn;
    h_out = o * math_tanh(cn);
  }
};

/// Backward of LstmGatesForwardFn for one hidden unit. Recomputes the activations from the saved
/// pre-activation gates (see Note [lstm_gates saves pre-activations] in src/ops/rnn.cpp) and returns
/// the gradients of the four pre-activation gates and of the previous cell state, given dh = dL/dh'
/// and dcn = dL/dc' (the gradient reaching c' from later steps).
template <class T>
struct LstmGatesBackwardFn {
  MP_HD MP_FORCE_INLINE void operator()(T gi, T gf, T gg, T go, T c, T dh, T dcn, T& dgi, T& dgf, T& dgg, T& dgo,
                                        T& dc) const {
    const T i = math_sigmoid(gi), f = math_sigmoid(gf), g = math_tanh(gg), o = math_sigmoid(go);
    const T tc = math_tanh(f * c + i * g);
    // Total gradient of c': through h' = o tanh(c') and directly from the next step.
    const T dct = dcn + dh * o * (T(1) - tc * tc);
    dgo = dh * tc * o * (T(1) - o);
    dgi = dct * g * i * (T(1) - i);
    dgf = dct * c * f * (T(1) - f);
    dgg = dct * i * (T(1) - g * g);
    dc = dct * f;
  }
};

}  // namespace mp::backend

#pragma once
#include <tuple>
#include <utility>

#include "mp/tensor/tensor.hpp"

namespace mp {

/// One LSTM step with PyTorch's gate order (i, f, g, o) and layout:
///   gates = x W_ih^T + b_ih + h W_hh^T + b_hh   (x [B, I], h/c [B, H], W_ih [4H, I], W_hh [4H, H])
///   c' = sigmoid(f) c + sigmoid(i) tanh(g);  h' = sigmoid(o) tanh(c')
/// The two matmuls run on oneDNN (lower precision under autocast); the gate arithmetic is one fused
/// pass forward and one backward, in f32 for 16-bit inputs. Returns (h', c'). Biases may be undefined.
std::pair<Tensor, Tensor> lstm_cell(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& w_ih,
                                    const Tensor& w_hh, const Tensor& b_ih = Tensor(), const Tensor& b_hh = Tensor());

/// The fused gate arithmetic alone: from pre-activation gates [B, 4H] and c [B, H] to (h', c').
std::pair<Tensor, Tensor> lstm_gates(const Tensor& gates, const Tensor& c);

/// A whole LSTM layer over a sequence, as one autograd node (the "fused" path of nn::LSTM).
///   gx [T, B, 4H]: the input projection x W_ih^T + b_ih of every step (one big GEMM outside);
///   h0, c0 [B, H]; w_hh [4H, H]; b_hh [4H] or undefined.
/// Returns (y [T, B, H], h_T [B, H], c_T [B, H]). Per step: gates = gx_t + h W_hh^T + b_hh, then the
/// fused gate kernel. The cell state is carried in f32 (f64 for f64 inputs) whatever the GEMM dtype,
/// so c_T is f32; y and h_T have gx's dtype. Backward runs the recurrence once backward (one small
/// GEMM per step for dh) and then computes the weight gradient as ONE GEMM over all T*B rows
/// (dW_hh = dG^T [h0; y_0..y_{T-2}]) and db_hh as one reduction, instead of T small GEMMs and T
/// gradient accumulations. Under autocast gx, h0, w_hh, b_hh follow the "lower" policy; c0 keeps its
/// precision (a state, not a GEMM operand). Without autocast, gx, h0 and w_hh must share a dtype.
std::tuple<Tensor, Tensor, Tensor> lstm_layer(const Tensor& gx, const Tensor& h0, const Tensor& c0, const Tensor& w_hh,
                                              const Tensor& b_hh = Tensor());
/// One GRU step (PyTorch's r, z, n order and formula). Returns h'.
Tensor gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih = Tensor(),
                const Tensor& b_hh = Tensor());

/// One Elman RNN step: h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh).
Tensor rnn_tanh_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh,
                     const Tensor& b_ih = Tensor(), const Tensor& b_hh = Tensor());

}  // namespace mp

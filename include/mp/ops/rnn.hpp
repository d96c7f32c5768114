#pragma once
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

/// One GRU step (PyTorch's r, z, n order and formula). Returns h'.
Tensor gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih = Tensor(),
                const Tensor& b_hh = Tensor());

/// One Elman RNN step: h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh).
Tensor rnn_tanh_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh,
                     const Tensor& b_ih = Tensor(), const Tensor& b_hh = Tensor());

}  // namespace mp

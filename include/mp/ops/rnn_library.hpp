#pragma once
#include <tuple>

#include "mp/tensor/tensor.hpp"

namespace mp {

/// A whole LSTM layer on the vendor library's sequence-level LSTM: oneDNN's RNN primitive on the CPU,
/// cuDNN's RNN on CUDA (the "library" implementation of nn::LSTM, LstmImpl::library).
///   x [T, B, I]; h0, c0 [B, H]; PyTorch's layouts and gate order (i, f, g, o): w_ih [4H, I], w_hh [4H, H],
///   b_ih, b_hh [4H] (either may be undefined = zero).
/// Returns (y [T, B, H], h_T [B, H], c_T [B, H]) with the values of linear(x, w_ih, b_ih) followed by
/// lstm_layer(...): y and h_T in the compute dtype (x's), c_T in f32 (f64 when c0 is f64; the library
/// computes the cell state in f32). One autograd node (LstmLibraryBackward) gives the gradients of x, h0,
/// c0, w_ih, w_hh and both biases (the libraries add the two biases, so both get the same gradient).
/// Under autocast x, h0, w_ih, w_hh and the biases follow lstm_layer's "lower" policy; c0 keeps its
/// precision. Without autocast x, h0, w_ih and w_hh must share a dtype. Compute dtypes: f32 and bf16 on
/// the CPU (oneDNN has no f16 or f64 LSTM there); f32, f16 and bf16 on CUDA (bf16 needs cuDNN >= 9.13).
/// See Note [library LSTM] in src/ops/rnn_library.cpp.
std::tuple<Tensor, Tensor, Tensor> lstm_layer_library(const Tensor& x, const Tensor& h0, const Tensor& c0,
                                                      const Tensor& w_ih, const Tensor& w_hh,
                                                      const Tensor& b_ih = Tensor(), const Tensor& b_hh = Tensor());

}  // namespace mp

#pragma once
#include <utility>
#include <vector>

#include "mp/nn/module.hpp"

namespace mp::nn {

/// How nn::LSTM runs each layer (the three implementations `mixprec bench lstm-impl` compares).
enum class LstmImpl {
  basic,    ///< a per-step graph: linear + add + the fused gate kernel per time step (PyTorch's non-cuDNN path)
  fused,    ///< mp::lstm_layer: our sequence-level node (Note [lstm_layer]); the weight gradient as one GEMM
  library,  ///< mp::lstm_layer_library: the vendor library's LSTM (oneDNN on the CPU, cuDNN on CUDA)
};

/// "basic", "fused" or "library".
const char* lstm_impl_name(LstmImpl impl);

/// The LstmImpl of a command-line name for a model on `device`: basic, fused, or the library LSTM named after
/// the library that runs it (onednn on the CPU, cudnn on CUDA). An unknown name, or a library of the other
/// device, is refused naming what works (`flag` names the option in the message, e.g. "--lstm_impl").
LstmImpl lstm_impl_from_flag(const std::string& name, Device device, const char* flag = "--lstm_impl");

/// Options of LSTM, GRU and RNN (PyTorch's arguments; unidirectional).
struct RNNOptions {
  int64_t input_size = 0;    ///< I, features per time step
  int64_t hidden_size = 0;   ///< H
  int64_t num_layers = 1;    ///< stacked layers
  bool bias = true;          ///< learn bias_ih_l* and bias_hh_l*
  bool batch_first = false;  ///< input/output [B, T, *] instead of [T, B, *]
  double dropout = 0.0;      ///< dropout on the outputs of every layer but the last, when training
  /// LSTM only: how each layer runs (LstmImpl). All three compute the same function (to rounding);
  /// fused (one mp::lstm_layer node per layer) is the default, basic the per-step graph, library the
  /// vendor's whole-layer LSTM (f32/bf16 on the CPU; f32/f16/bf16 on CUDA).
  LstmImpl impl = LstmImpl::fused;
};
/// Options of LSTM.
using LSTMOptions = RNNOptions;
/// Options of GRU.
using GRUOptions = RNNOptions;

/// Hidden and cell state of an LSTM: h and c [num_layers, B, H] ([num_layers, H] unbatched).
struct LSTMState {
  Tensor h;  ///< hidden state (h_n)
  Tensor c;  ///< cell state (c_n)
};

/// Shared machinery of the recurrent layers: per layer l the parameters weight_ih_l{l} [G*H, in],
/// weight_hh_l{l} [G*H, H], bias_ih_l{l} and bias_hh_l{l} [G*H] (G = 4 LSTM, 3 GRU, 1 RNN; PyTorch's
/// names, order and U(-1/sqrt(H), 1/sqrt(H)) initialisation).
class RNNBase : public Module {
 public:
  /// `gates` is G.
  RNNBase(std::string type_name, const RNNOptions& options, int64_t gates);
  /// Redraw every weight and bias from U(-1/sqrt(H), 1/sqrt(H)).
  void reset_parameters();
  /// "32, 64, num_layers=2, batch_first=true".
  std::string extra_repr() const override;
  /// The options it was built with.
  const RNNOptions& options() const { return options_; }
  /// weight_ih_l{layer} [G*H, in].
  const Tensor& weight_ih(int64_t layer) const { return *w_ih_.at(static_cast<size_t>(layer)); }
  /// weight_hh_l{layer} [G*H, H].
  const Tensor& weight_hh(int64_t layer) const { return *w_hh_.at(static_cast<size_t>(layer)); }
  /// bias_ih_l{layer} [G*H] (undefined without bias).
  const Tensor& bias_ih(int64_t layer) const { return *b_ih_.at(static_cast<size_t>(layer)); }
  /// bias_hh_l{layer} [G*H] (undefined without bias).
  const Tensor& bias_hh(int64_t layer) const { return *b_hh_.at(static_cast<size_t>(layer)); }

 protected:
  /// Check the input and bring it to time-major [T, B, I]; `unbatched` is set for a [T, I] input.
  Tensor time_major(const Tensor& input, bool& unbatched) const;
  /// Check (or create as zeros) an initial state [L, B, H] for a time-major input.
  Tensor initial_state(const Tensor& given, const Tensor& x, bool unbatched, const char* what) const;
  /// The per-layer output [T, B, H] back to the caller's layout, with dropout between layers applied
  /// by the caller; this undoes time_major for the final output.
  Tensor caller_layout(const Tensor& y, bool unbatched) const;
  /// Dropout between layers (not after the last) in training mode.
  Tensor between_layers(const Tensor& y, int64_t layer) const;
  /// The dtype layer tensors compute in: outside autocast, the promotion of the input's and the weights' (they differ
  /// once amp's automatic precision moved this module or one before it to f32; Note [automatic precision]).
  DType compute_dtype(const Tensor& x) const;
  /// `t` in dtype `dt` (itself when it is; an autograd cast otherwise).
  static Tensor in_dtype(const Tensor& t, DType dt);
  /// A cell of a single-state recurrence (gru_cell, rnn_tanh_cell): (x, h, w_ih, w_hh, b_ih, b_hh) -> h'.
  using SingleStateCell = Tensor (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&);
  /// The multi-layer forward of GRU and RNN: output and h_n for `cell`.
  std::pair<Tensor, Tensor> forward_single_state(const Tensor& input, const Tensor& h0, SingleStateCell cell);

  RNNOptions options_;
  int64_t gates_;
  std::vector<Tensor*> w_ih_, w_hh_, b_ih_, b_hh_;
};

/// Multi-layer LSTM (PyTorch's nn.LSTM, gate order i, f, g, o). Per layer (basic and fused), the input
/// projection of all time steps is one matmul; each step adds h W_hh^T + b_hh and runs the fused gate
/// kernel. With LstmImpl::library each layer is one mp::lstm_layer_library call (projection included).
class LSTM : public RNNBase {
 public:
  /// A layer stack with freshly initialised parameters.
  explicit LSTM(const LSTMOptions& options) : RNNBase("LSTM", options, 4) {}
  /// input [T, B, I] ([B, T, I] batch_first; [T, I] unbatched) and optional (h0, c0) [L, B, H]
  /// (zeros when undefined) -> (output [T, B, H] of the last layer, (h_n, c_n) [L, B, H]).
  std::pair<Tensor, LSTMState> forward(const Tensor& input, const LSTMState& state = {});
};

/// Multi-layer GRU (PyTorch's nn.GRU, gate order r, z, n).
class GRU : public RNNBase {
 public:
  /// A layer stack with freshly initialised parameters.
  explicit GRU(const GRUOptions& options) : RNNBase("GRU", options, 3) {}
  /// input as LSTM, optional h0 [L, B, H] -> (output [T, B, H], h_n [L, B, H]).
  std::pair<Tensor, Tensor> forward(const Tensor& input, const Tensor& h0 = Tensor());
};

/// Multi-layer Elman RNN with tanh (PyTorch's nn.RNN(nonlinearity='tanh')).
class RNN : public RNNBase {
 public:
  /// A layer stack with freshly initialised parameters.
  explicit RNN(const RNNOptions& options) : RNNBase("RNN", options, 1) {}
  /// input as LSTM, optional h0 [L, B, H] -> (output [T, B, H], h_n [L, B, H]).
  std::pair<Tensor, Tensor> forward(const Tensor& input, const Tensor& h0 = Tensor());
};

}  // namespace mp::nn

#pragma once
#include <memory>
#include <string>
#include <utility>

#include "mp/nn/dropout.hpp"
#include "mp/nn/embedding.hpp"
#include "mp/nn/linear.hpp"
#include "mp/nn/module.hpp"
#include "mp/nn/rnn.hpp"

namespace mp::models {

/// Options of WordLM (the defaults are the "medium" model of PyTorch's word_language_model example).
struct WordLMOptions {
  int64_t vocab_size = 0;                        ///< V: rows of the embedding and outputs of the decoder
  int64_t embed_size = 650;                      ///< embedding size (the RNN's input size)
  int64_t hidden_size = 650;                     ///< RNN hidden size
  int64_t num_layers = 2;                        ///< stacked RNN layers
  std::string cell = "lstm";                     ///< "lstm", "gru" or "rnn" (tanh)
  double dropout = 0.5;                          ///< on the embeddings, between RNN layers and on the RNN output
  bool tie_weights = false;                      ///< decoder.weight IS encoder.weight (needs hidden_size == embed_size)
  nn::LstmImpl lstm_impl = nn::LstmImpl::fused;  ///< lstm: how each layer runs (nn::RNNOptions::impl)
};

/// Word-level language model, PyTorch's examples/word_language_model RNNModel: drop(encoder(tokens))
/// -> rnn -> drop -> decoder. Names: encoder.weight [V, E]; rnn.weight_ih_l{l}, rnn.weight_hh_l{l},
/// rnn.bias_ih_l{l}, rnn.bias_hh_l{l}; decoder.weight [V, H], decoder.bias [V]. With tie_weights the
/// decoder's weight is the encoder's very tensor: named_parameters() lists it once (as
/// encoder.weight), the state dict under both names, and it gets one gradient (the sum of both uses).
/// Initialisation: encoder and decoder weights U(-0.1, 0.1), decoder bias 0, RNN as PyTorch.
class WordLM : public nn::Module {
 public:
  /// A freshly initialised model; throws on an unknown cell or untieable sizes.
  explicit WordLM(const WordLMOptions& options);
  /// tokens i64/i32 [T, B] and the state from the previous call ({} = zeros; c is unused and returned
  /// undefined for gru/rnn) -> (logits [T*B, V], state after the last step, h/c [num_layers, B, H]).
  std::pair<Tensor, nn::LSTMState> forward(const Tensor& tokens, const nn::LSTMState& state = {});
  /// The state with its history cut (truncated back-propagation through time): detached h and c.
  static nn::LSTMState detach(const nn::LSTMState& state);
  /// A zero state for `batch` sequences in the parameters' dtype (c only for lstm).
  nn::LSTMState init_state(int64_t batch) const;
  /// Encoder and decoder weights U(-0.1, 0.1), decoder bias 0 (the example's init_weights).
  void init_weights();
  /// The options it was built with.
  const WordLMOptions& options() const { return options_; }
  /// The embedding ("encoder").
  nn::Embedding& encoder() { return *encoder_; }
  /// The output projection ("decoder").
  nn::Linear& decoder() { return *decoder_; }
  /// The recurrent stack ("rnn": an nn::LSTM, nn::GRU or nn::RNN).
  nn::RNNBase& rnn() { return *rnn_; }

 private:
  WordLMOptions options_;
  std::shared_ptr<nn::Dropout> drop_;
  std::shared_ptr<nn::Embedding> encoder_;
  std::shared_ptr<nn::RNNBase> rnn_;
  std::shared_ptr<nn::Linear> decoder_;
};

}  // namespace mp::models

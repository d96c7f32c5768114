// models::WordLM: PyTorch's word_language_model RNNModel (embedding -> LSTM/GRU/RNN -> linear decoder).
#include "mp/models/word_lm.hpp"

#include <tuple>

#include "mp/nn/init.hpp"

namespace mp::models {

namespace {

WordLMOptions checked(const WordLMOptions& o) {
  MP_CHECK(o.vocab_size > 0 && o.embed_size > 0 && o.hidden_size > 0 && o.num_layers > 0,
           "WordLM: expected positive vocab_size, embed_size, hidden_size and num_layers, got ", o.vocab_size, ", ",
           o.embed_size, ", ", o.hidden_size, ", ", o.num_layers);
  MP_CHECK(o.cell == "lstm" || o.cell == "gru" || o.cell == "rnn", "WordLM: expected cell \"lstm\", \"gru\" or ",
           "\"rnn\", got \"", o.cell, "\"");
  MP_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, "WordLM: expected dropout in [0, 1), got ", o.dropout);
  MP_CHECK(!o.tie_weights || o.hidden_size == o.embed_size, "WordLM: tie_weights needs hidden_size == embed_size, got ",
           "hidden_size ", o.hidden_size, " and embed_size ", o.embed_size,
           "; make them equal or set tie_weights = false");
  return o;
}

}  // namespace

WordLM::WordLM(const WordLMOptions& options) : nn::Module("WordLM"), options_(checked(options)) {
  const WordLMOptions& o = options_;
  drop_ = register_module("drop", std::make_shared<nn::Dropout>(o.dropout));
  encoder_ = register_module("encoder", std::make_shared<nn::Embedding>(o.vocab_size, o.embed_size));
  const nn::RNNOptions ro{.input_size = o.embed_size,
                          .hidden_size = o.hidden_size,
                          .num_layers = o.num_layers,
                          .dropout = o.num_layers > 1 ? o.dropout : 0.0,
                          .impl = o.lstm_impl};
  if (o.cell == "lstm")
    rnn_ = std::make_shared<nn::LSTM>(ro);
  else if (o.cell == "gru")
    rnn_ = std::make_shared<nn::GRU>(ro);
  else
    rnn_ = std::make_shared<nn::RNN>(ro);
  register_module("rnn", rnn_);
  decoder_ = register_module("decoder", std::make_shared<nn::Linear>(o.hidden_size, o.vocab_size));
  if (o.tie_weights) decoder_->tie_weight(encoder_->weight());
  init_weights();
}

void WordLM::init_weights() {
  nn::init::uniform_(encoder_->weight(), -0.1, 0.1);
  nn::init::zeros_(decoder_->bias());
  nn::init::uniform_(decoder_->weight(), -0.1, 0.1);
}

std::pair<Tensor, nn::LSTMState> WordLM::forward(const Tensor& tokens, const nn::LSTMState& state) {
  MP_CHECK(tokens.defined() && tokens.dim() == 2 && (tokens.dtype() == DType::i64 || tokens.dtype() == DType::i32),
           "WordLM::forward: expected i64/i32 tokens [T, B] (time-major), got ",
           tokens.defined() ? tokens.describe() : std::string("an undefined tensor"));
  const Tensor emb = (*drop_)((*encoder_)(tokens));
  Tensor out;
  nn::LSTMState next;
  if (auto* lstm = dynamic_cast<nn::LSTM*>(rnn_.get())) {
    std::tie(out, next) = lstm->forward(emb, state);
  } else if (auto* gru = dynamic_cast<nn::GRU*>(rnn_.get())) {
    std::tie(out, next.h) = gru->forward(emb, state.h);
  } else {
    std::tie(out, next.h) = static_cast<nn::RNN&>(*rnn_).forward(emb, state.h);
  }
  rnn_->run_forward_hooks(emb, out);  // its forward takes a state, so it runs its hooks itself (the overflow finder)
  out = (*drop_)(out);
  Tensor logits = (*decoder_)(out);
  return {logits.reshape({tokens.size(0) * tokens.size(1), options_.vocab_size}), next};
}

nn::LSTMState WordLM::detach(const nn::LSTMState& state) {
  nn::LSTMState out;
  if (state.h.defined()) out.h = state.h.detach();
  if (state.c.defined()) out.c = state.c.detach();
  return out;
}

nn::LSTMState WordLM::init_state(int64_t batch) const {
  MP_CHECK(batch > 0, "WordLM::init_state: expected a positive batch size, got ", batch);
  const TensorOptions opt{.dtype = encoder_->weight().dtype(), .device = encoder_->weight().device()};
  nn::LSTMState s;
  s.h = zeros({options_.num_layers, batch, options_.hidden_size}, opt);
  if (options_.cell == "lstm") s.c = zeros({options_.num_layers, batch, options_.hidden_size}, opt);
  return s;
}

}  // namespace mp::models

// nn::LSTM, GRU, RNN: layer loops over time on top of the cell ops.
#include "mp/nn/rnn.hpp"

#include <cmath>
#include <sstream>
#include <tuple>

#include "mp/autocast/autocast.hpp"
#include "mp/nn/init.hpp"
#include "mp/ops/embedding.hpp"
#include "mp/ops/linalg.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/rnn.hpp"
#include "mp/ops/rnn_library.hpp"
#include "mp/ops/shape.hpp"

namespace mp::nn {

const char* lstm_impl_name(LstmImpl impl) {
  switch (impl) {
    case LstmImpl::basic: return "basic";
    case LstmImpl::fused: return "fused";
    case LstmImpl::library: return "library";
  }
  return "?";
}

LstmImpl lstm_impl_from_flag(const std::string& name, Device device, const char* flag) {
  if (name == "basic") return LstmImpl::basic;
  if (name == "fused") return LstmImpl::fused;
  MP_CHECK(name == "onednn" || name == "cudnn", "unknown ", flag, " '", name,
           "'; expected basic, fused, onednn (the library LSTM on the CPU) or cudnn (on CUDA)");
  MP_CHECK(name != "onednn" || device.is_cpu(), flag, " onednn is oneDNN's LSTM, which runs on the CPU, but the ",
           "device is ", device.str(), "; use ", flag, " cudnn for the library LSTM on CUDA");
  MP_CHECK(name != "cudnn" || device.is_cuda(), flag, " cudnn is cuDNN's LSTM, which runs on CUDA, but the ",
           "device is ", device.str(), "; use ", flag, " onednn for the library LSTM on the CPU");
  return LstmImpl::library;
}

RNNBase::RNNBase(std::string type_name, const RNNOptions& o, int64_t gates)
    : Module(std::move(type_name)), options_(o), gates_(gates) {
  MP_CHECK(o.input_size > 0 && o.hidden_size > 0 && o.num_layers > 0, this->type_name(),
           ": expected positive input_size, hidden_size and num_layers, got ", o.input_size, ", ", o.hidden_size, ", ",
           o.num_layers);
  MP_CHECK(o.dropout >= 0.0 && o.dropout <= 1.0, this->type_name(), ": expected dropout in [0, 1], got ", o.dropout);
  const int64_t GH = gates * o.hidden_size;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const std::string s = std::to_string(l);
    const int64_t in = l == 0 ? o.input_size : o.hidden_size;
    w_ih_.push_back(&register_parameter("weight_ih_l" + s, empty({GH, in})));
    w_hh_.push_back(&register_parameter("weight_hh_l" + s, empty({GH, o.hidden_size})));
    b_ih_.push_back(&register_parameter("bias_ih_l" + s, o.bias ? empty({GH}) : Tensor()));
    b_hh_.push_back(&register_parameter("bias_hh_l" + s, o.bias ? empty({GH}) : Tensor()));
  }
  reset_parameters();
}

void RNNBase::reset_parameters() {
  const double k = 1.0 / std::sqrt(static_cast<double>(options_.hidden_size));
  for (const Tensor& p : parameters(false)) init::uniform_(p, -k, k);
}

std::string RNNBase::extra_repr() const {
  std::ostringstream os;
  os << options_.input_size << ", " << options_.hidden_size;
  if (options_.num_layers != 1) os << ", num_layers=" << options_.num_layers;
  if (!options_.bias) os << ", bias=false";
  if (options_.batch_first) os << ", batch_first=true";
  if (options_.dropout != 0.0) os << ", dropout=" << options_.dropout;
  if (gates_ == 4 && options_.impl != LstmImpl::fused) os << ", impl=" << lstm_impl_name(options_.impl);
  return os.str();
}

Tensor RNNBase::time_major(const Tensor& input, bool& unbatched) const {
  MP_CHECK(input.defined() && (input.dim() == 3 || input.dim() == 2), type_name(),
           "::forward: expected input [T, B, I] (",
           options_.batch_first ? "[B, T, I] with batch_first" : "batch_first=false", ") or unbatched [T, I], got ",
           input.defined() ? input.describe() : std::string("an undefined tensor"));
  MP_CHECK(input.size(-1) == options_.input_size, type_name(), "::forward: expected ", options_.input_size,
           " input features in the last dim, got ", input.describe());
  unbatched = input.dim() == 2;
  if (unbatched) return input.unsqueeze(1);
  return options_.batch_first ? input.transpose(0, 1) : input;
}

Tensor RNNBase::initial_state(const Tensor& given, const Tensor& x, bool unbatched, const char* what) const {
  const Shape want{options_.num_layers, x.size(1), options_.hidden_size};
  if (!given.defined()) return zeros(want, {.dtype = x.dtype(), .device = x.device()});
  const Tensor s = unbatched && given.dim() == 2 ? given.unsqueeze(1) : given;
  MP_CHECK(s.sizes() == want, type_name(), "::forward: expected ", what, " of shape ",
           shape_str(unbatched ? Shape{want[0], want[2]} : want), " [num_layers, B, H], got ", given.describe());
  return s;
}

Tensor RNNBase::caller_layout(const Tensor& y, bool unbatched) const {
  if (unbatched) return y.squeeze(1);
  return options_.batch_first ? y.transpose(0, 1) : y;
}

Tensor RNNBase::between_layers(const Tensor& y, int64_t layer) const {
  if (options_.dropout > 0.0 && is_training() && layer + 1 < options_.num_layers)
    return dropout(y, options_.dropout, true);
  return y;
}

DType RNNBase::compute_dtype(const Tensor& x) const {
  if (amp::autocast_active(x.device().type)) return x.dtype();  // the ops cast
  return promote_types(x.dtype(), w_ih_[0]->dtype());
}

Tensor RNNBase::in_dtype(const Tensor& t, DType dt) { return !t.defined() || t.dtype() == dt ? t : t.to(dt); }

std::pair<Tensor, LSTMState> LSTM::forward(const Tensor& input, const LSTMState& state) {
  bool unbatched = false;
  Tensor x = time_major(input, unbatched);
  const DType dt = compute_dtype(x);
  x = in_dtype(x, dt);
  const Tensor h0 = in_dtype(initial_state(state.h, x, unbatched, "h0"), dt);
  const Tensor c0 = initial_state(state.c, x, unbatched, "c0");
  const int64_t T = x.size(0);
  std::vector<Tensor> h_n, c_n;
  for (int64_t l = 0; l < options_.num_layers; ++l) {
    const Tensor w_ih = in_dtype(*w_ih_[l], dt), w_hh = in_dtype(*w_hh_[l], dt);
    const Tensor b_ih = in_dtype(*b_ih_[l], dt), b_hh = in_dtype(*b_hh_[l], dt);
    if (options_.impl == LstmImpl::library) {
      auto [y, hT, cT] = lstm_layer_library(x, h0.select(0, l), c0.select(0, l), w_ih, w_hh, b_ih, b_hh);
      h_n.push_back(hT);
      c_n.push_back(cT);
      x = between_layers(y, l);
      continue;
    }
    // The input projection of every time step at once: [T, B, 4H].
    const Tensor gx = linear(x, w_ih, b_ih);
    if (options_.impl == LstmImpl::fused) {
      auto [y, hT, cT] = lstm_layer(gx, h0.select(0, l), c0.select(0, l), w_hh, b_hh);
      h_n.push_back(hT);
      c_n.push_back(cT);
      x = between_layers(y, l);
      continue;
    }
    Tensor h = h0.select(0, l), c = c0.select(0, l);
    const std::vector<Tensor> gx_t = unbind(gx, 0);
    std::vector<Tensor> outs;
    outs.reserve(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      std::tie(h, c) = lstm_gates(add(gx_t[static_cast<size_t>(t)], linear(h, w_hh, b_hh)), c);
      outs.push_back(h);
    }
    h_n.push_back(h);
    c_n.push_back(c);
    x = between_layers(stack(outs, 0), l);
  }
  Tensor hn = stack(h_n, 0), cn = stack(c_n, 0);
  if (unbatched) {
    hn = hn.squeeze(1);
    cn = cn.squeeze(1);
  }
  return {caller_layout(x, unbatched), LSTMState{hn, cn}};
}

std::pair<Tensor, Tensor> RNNBase::forward_single_state(const Tensor& input, const Tensor& h0_in,
                                                        SingleStateCell cell) {
  bool unbatched = false;
  Tensor x = time_major(input, unbatched);
  const DType dt = compute_dtype(x);
  x = in_dtype(x, dt);
  const Tensor h0 = in_dtype(initial_state(h0_in, x, unbatched, "h0"), dt);
  const int64_t T = x.size(0);
  std::vector<Tensor> h_n;
  for (int64_t l = 0; l < options_.num_layers; ++l) {
    const Tensor w_ih = in_dtype(*w_ih_[l], dt), w_hh = in_dtype(*w_hh_[l], dt);
    const Tensor b_ih = in_dtype(*b_ih_[l], dt), b_hh = in_dtype(*b_hh_[l], dt);
    Tensor h = h0.select(0, l);
    const std::vector<Tensor> x_t = unbind(x, 0);
    std::vector<Tensor> outs;
    outs.reserve(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      h = cell(x_t[static_cast<size_t>(t)], h, w_ih, w_hh, b_ih, b_hh);
      outs.push_back(h);
    }
    h_n.push_back(h);
    x = between_layers(stack(outs, 0), l);
  }
  Tensor hn = stack(h_n, 0);
  return {caller_layout(x, unbatched), unbatched ? hn.squeeze(1) : hn};
}

std::pair<Tensor, Tensor> GRU::forward(const Tensor& input, const Tensor& h0_in) {
  return forward_single_state(input, h0_in, &gru_cell);
}

std::pair<Tensor, Tensor> RNN::forward(const Tensor& input, const Tensor& h0_in) {
  return forward_single_state(input, h0_in, &rnn_tanh_cell);
}

}  // namespace mp::nn

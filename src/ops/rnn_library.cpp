// lstm_layer_library: a whole LSTM layer (input projection included) on the vendor library's LSTM,
// oneDNN's RNN primitive on the CPU and cuDNN's RNN on CUDA, as one autograd node.
#include "mp/ops/rnn_library.hpp"

#include <optional>

#include "backend/rnn_library_kernels.hpp"
#include "mp/autocast/autocast.hpp"
#include "mp/autograd/node.hpp"
#include "ops/rnn_checks.hpp"

namespace mp {

// Note [library LSTM]
// mp::lstm_layer (Note [lstm_layer] in rnn.cpp) is our own sequence-level LSTM: one GEMM per step plus
// the fused gate kernel. lstm_layer_library hands the whole layer to the vendor library instead --
// the input projection of every step, the recurrence and the backward (data and weight gradients) --
// which is what PyTorch does with cuDNN on GPUs; `mixprec bench lstm-impl` compares the three.
//
// Values: the same function as linear(x, w_ih, b_ih) followed by lstm_layer, computed in another
// order, so f32 results differ by GEMM accumulation order only. For 16-bit compute the libraries keep
// the gate pre-activations in f32 (the composite rounds x W_ih^T + b_ih and the per-step gates to 16
// bits), so they differ by 16-bit roundings of the operands. The cell state is f32: oneDNN takes an
// f32 src_iter_c/dst_iter_c with bf16 data; cuDNN keeps c in the data type, so on CUDA a 16-bit run
// rounds c0 to 16 bits on the way in and returns c_T widened from 16 bits (see cuda/cudnn/rnn.cu).
//
// The libraries have ONE bias per gate on the CPU (oneDNN: b = b_ih + b_hh, so both biases get
// diff_bias as their gradient) and two on CUDA (CUDNN_RNN_DOUBLE_BIAS, whose two gradients are equal
// because the biases enter the gates as a sum). Gradients come back in f32 from oneDNN and in the data
// type from cuDNN; the engine casts them to the inputs' dtypes.
//
// The forward keeps what the backward needs in LstmLibraryForward::saved (oneDNN's workspace: the
// gates and states of every step; cuDNN's reserve space and packed weight space), so the backward does
// not recompute the forward.

namespace {

using rnn_checks::check_floating;
using rnn_checks::check_same_device;

// A contiguous tensor sharing nothing with autograd (the kernels' operands).
Tensor operand(const Tensor& t) { return t.defined() ? t.detach().contiguous() : Tensor(); }

}  // namespace

std::tuple<Tensor, Tensor, Tensor> lstm_layer_library(const Tensor& x_in, const Tensor& h0_in, const Tensor& c0,
                                                      const Tensor& w_ih_in, const Tensor& w_hh_in,
                                                      const Tensor& b_ih_in, const Tensor& b_hh_in) {
  constexpr const char* op = "lstm_layer_library";
  check_floating(x_in, op, "input x");
  check_floating(h0_in, op, "initial hidden state h0");
  check_floating(c0, op, "initial cell state c0");
  check_floating(w_ih_in, op, "w_ih");
  check_floating(w_hh_in, op, "w_hh");
  Tensor x = x_in, h0 = h0_in, w_ih = w_ih_in, w_hh = w_hh_in, b_ih = b_ih_in, b_hh = b_hh_in;
  // Autocast: lstm_layer's policy (the GEMM operands go "lower"; c0, a state, keeps its precision).
  std::optional<amp::AutocastSuspend> suspend;
  if (amp::autocast_active(x.device().type) &&
      amp::cast_policy(amp::Op::lstm_layer, x.device().type) == amp::CastPolicy::lower) {
    const DType low = amp::autocast_dtype();
    for (Tensor* t : {&x, &h0, &w_ih, &w_hh, &b_ih, &b_hh})
      if (t->defined() && t->dtype() != DType::f64) *t = amp::autocast_cast(*t, low);
    suspend.emplace();
  }
  MP_CHECK(x.dim() == 3, op, ": expected input x of shape [T, B, I] (time-major), got ", shape_str(x.sizes()));
  const int64_t T = x.size(0), B = x.size(1), I = x.size(2);
  MP_CHECK(T > 0 && B > 0 && I > 0, op, ": expected a non-empty input x [T, B, I] (at least one step, sample and ",
           "feature), got ", shape_str(x.sizes()));
  MP_CHECK(h0.dim() == 2 && h0.size(0) == B && h0.size(1) > 0, op, ": expected h0 of shape [", B, ", H] (batch ", B,
           " as x ", shape_str(x.sizes()), "), got ", shape_str(h0.sizes()));
  const int64_t H = h0.size(1);
  MP_CHECK(c0.sizes() == (Shape{B, H}), op, ": expected c0 of shape [", B, ", ", H, "] like h0, got ",
           shape_str(c0.sizes()));
  MP_CHECK(w_ih.sizes() == (Shape{4 * H, I}), op, ": expected w_ih of shape [", 4 * H, ", ", I, "] (4 gates x hidden ",
           H, ", input ", I, "), got ", shape_str(w_ih.sizes()));
  MP_CHECK(w_hh.sizes() == (Shape{4 * H, H}), op, ": expected w_hh of shape [", 4 * H, ", ", H, "] (4 gates x hidden ",
           H, "), got ", shape_str(w_hh.sizes()));
  for (const auto& [b, what] : {std::pair{&b_ih, "b_ih"}, std::pair{&b_hh, "b_hh"}}) {
    if (!b->defined()) continue;
    check_floating(*b, op, what);
    MP_CHECK(b->sizes() == (Shape{4 * H}), op, ": expected ", what, " of shape [", 4 * H, "], got ",
             shape_str(b->sizes()));
    check_same_device(x, *b, op, what);
  }
  MP_CHECK(h0.dtype() == x.dtype() && w_ih.dtype() == x.dtype() && w_hh.dtype() == x.dtype(), op,
           ": expected x, h0, w_ih and w_hh of one dtype, got ", dtype_name(x.dtype()), ", ", dtype_name(h0.dtype()),
           ", ", dtype_name(w_ih.dtype()), " and ", dtype_name(w_hh.dtype()), "; convert them (or run under autocast)");
  check_same_device(x, h0, op, "h0");
  check_same_device(x, c0, op, "c0");
  check_same_device(x, w_ih, op, "w_ih");
  check_same_device(x, w_hh, op, "w_hh");

  const Device dev = x.device();
  const DType state_dt = c0.dtype() == DType::f64 ? DType::f64 : DType::f32;
  backend::LstmLibraryInputs in{operand(x),    operand(h0),   c0.detach().to(DType::f32).contiguous(),
                                operand(w_ih), operand(w_hh), operand(b_ih),
                                operand(b_hh)};
  std::vector<Tensor> inputs{x, h0, c0, w_ih, w_hh};
  const bool with_b_ih = b_ih.defined(), with_b_hh = b_hh.defined();
  if (with_b_ih) inputs.push_back(b_ih);
  if (with_b_hh) inputs.push_back(b_hh);
  const bool training = autograd::any_requires_grad(inputs);
  backend::LstmLibraryForward fwd;
  {
    autograd::NoGradGuard ng;
    fwd = backend::lstm_library_forward_kernel.get(dev)(in, training);
  }
  // The node's outputs are fresh handles on the kernel's buffers; the closure keeps the kernel's own
  // handles (never the outputs themselves, which would point back at the node).
  Tensor y = fwd.y.detach(), hT = fwd.h_n.detach(), cT = fwd.c_n.detach();
  if (state_dt != DType::f32) {
    autograd::NoGradGuard ng;
    cT = cT.to(state_dt);
  }
  if (training) {
    std::vector<bool> need;
    need.reserve(inputs.size());
    for (const Tensor& t : inputs) need.push_back(t.requires_grad());
    autograd::record("LstmLibraryBackward", inputs, {y, hT, cT},
                     [in, fwd = std::move(fwd), need, with_b_ih, with_b_hh](const std::vector<Tensor>& g) {
                       const backend::LstmLibraryGrads d = backend::lstm_library_backward_kernel.get(in.x.device())(
                           in, fwd, g[0].contiguous(), g[1].contiguous(), g[2].contiguous());
                       std::vector<Tensor> out{d.dx, d.dh0, d.dc0, d.dw_ih, d.dw_hh};
                       if (with_b_ih) out.push_back(d.db);
                       if (with_b_hh) out.push_back(d.db);
                       for (size_t i = 0; i < out.size(); ++i)
                         if (!need[i]) out[i] = Tensor();
                       return out;
                     });
  }
  return {y, hT, cT};
}

}  // namespace mp

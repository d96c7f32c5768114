// Recurrent cells: lstm_gates (fused gate arithmetic, forward and backward kernels), lstm_cell,
// gru_cell and rnn_tanh_cell (matmuls through mp::linear plus point-wise ops).
#include "mp/autocast/autocast.hpp"
#include "mp/ops/rnn.hpp"

#include "backend/linalg_kernels.hpp"
#include "backend/rnn_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/linalg.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/reduce.hpp"
#include "ops/rnn_checks.hpp"

#include <optional>

namespace mp {

// Note [lstm_gates saves pre-activations]
// The backward needs the activated gates i, f, g, o, the previous cell state c and tanh(c'). We save
// only the forward's inputs (pre-activation gates and c) and recompute the rest in the backward
// kernel rather than saving the activations:
//  * memory: the saved tensors are the inputs, which already exist (the gates are the matmul output,
//    c is the previous step's output), so saving them allocates nothing; saving activations would add
//    a [B, 4H] buffer (plus [B, H] for tanh(c')) per time step and write it in the forward pass.
//  * precision: recomputation happens in f32 from the same inputs with the same functor, so the
//    backward sees exactly the forward's values; activations saved in a 16-bit gates dtype would be
//    rounded (sigmoid near 1 in bf16 has ~3 significant digits, making 1 - sigmoid inaccurate).
//  * cost: 5 transcendentals per hidden unit, small next to the two matmuls of the cell.
//
// Output dtype: h' and c' have promote_types(gates, c), so an f32 cell state stays f32 when the gates
// come from a 16-bit matmul (the cell state is a running accumulator across steps).

namespace {

using rnn_checks::check_floating;
using rnn_checks::check_same_device;

// Shape checks shared by the cells: x [B, I] or [I], h [B, H] or [H], w_ih [G*H, I], w_hh [G*H, H],
// biases [G*H] or undefined, where G is the number of gates (4 LSTM, 3 GRU, 1 Elman).
void check_cell(const char* op, int64_t G, const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh,
                const Tensor& b_ih, const Tensor& b_hh) {
  check_floating(x, op, "input x");
  check_floating(h, op, "hidden state h");
  check_floating(w_ih, op, "w_ih");
  check_floating(w_hh, op, "w_hh");
  MP_CHECK(x.dim() == 1 || x.dim() == 2, op, ": expected input x of shape [B, I] (or [I] unbatched), got ",
           shape_str(x.sizes()));
  MP_CHECK(h.dim() == x.dim(), op, ": expected hidden state h with ", x.dim(), " dims like the input x ",
           shape_str(x.sizes()), ", got ", shape_str(h.sizes()));
  MP_CHECK(x.dim() == 1 || h.size(0) == x.size(0), op, ": expected hidden state h with batch size ", x.size(0),
           " (the input's), got ", shape_str(h.sizes()));
  const int64_t I = x.size(-1), H = h.size(-1);
  MP_CHECK(w_ih.sizes() == (Shape{G * H, I}), op, ": expected w_ih of shape [", G * H, ", ", I, "] (", G,
           " gates x hidden ", H, ", input ", I, "), got ", shape_str(w_ih.sizes()));
  MP_CHECK(w_hh.sizes() == (Shape{G * H, H}), op, ": expected w_hh of shape [", G * H, ", ", H, "] (", G,
           " gates x hidden ", H, "), got ", shape_str(w_hh.sizes()));
  for (const auto& [b, what] : {std::pair{&b_ih, "b_ih"}, std::pair{&b_hh, "b_hh"}}) {
    if (!b->defined()) continue;
    check_floating(*b, op, what);
    MP_CHECK(b->sizes() == (Shape{G * H}), op, ": expected ", what, " of shape [", G * H, "], got ",
             shape_str(b->sizes()));
    check_same_device(x, *b, op, what);
  }
  check_same_device(x, h, op, "h");
  check_same_device(x, w_ih, op, "w_ih");
  check_same_device(x, w_hh, op, "w_hh");
}

// [I] -> [1, I] for the unbatched form.
Tensor batched(const Tensor& t) { return t.dim() == 1 ? t.unsqueeze(0) : t; }

// x W_ih^T + b_ih + h W_hh^T + b_hh.
Tensor cell_gates(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                  const Tensor& b_hh) {
  return add(linear(x, w_ih, b_ih), linear(h, w_hh, b_hh));
}

}  // namespace

std::pair<Tensor, Tensor> lstm_gates(const Tensor& gates, const Tensor& c) {
  constexpr const char* op = "lstm_gates";
  check_floating(gates, op, "gates");
  check_floating(c, op, "cell state c");
  MP_CHECK(c.dim() == 2, op, ": expected cell state c of shape [B, H], got ", shape_str(c.sizes()));
  const int64_t B = c.size(0), H = c.size(1);
  MP_CHECK(gates.sizes() == (Shape{B, 4 * H}), op, ": expected gates of shape [", B, ", ", 4 * H,
           "] ([B, 4H] for cell state c ", shape_str(c.sizes()), ", gate order i, f, g, o), got ",
           shape_str(gates.sizes()));
  check_same_device(gates, c, op, "c");
  const Device dev = c.device();
  const DType out_dt = promote_types(gates.dtype(), c.dtype());
  Tensor gc = gates.detach().contiguous(), cc = c.detach().contiguous();
  Tensor h_out = empty({B, H}, {.dtype = out_dt, .device = dev});
  Tensor c_out = empty({B, H}, {.dtype = out_dt, .device = dev});
  backend::lstm_gates_forward_kernel.get(dev)(h_out, c_out, gc, cc);
  if (autograd::any_requires_grad({&gates, &c})) {
    const bool need_c = c.requires_grad();
    autograd::record("LstmGatesBackward", {gates, c}, {h_out, c_out}, [gc, cc, need_c](const std::vector<Tensor>& g) {
      const Device d = gc.device();
      Tensor dgates = empty(gc.sizes(), {.dtype = gc.dtype(), .device = d});
      Tensor dc = empty(cc.sizes(), {.dtype = cc.dtype(), .device = d});
      backend::lstm_gates_backward_kernel.get(d)(dgates, dc, g[0].contiguous(), g[1].contiguous(), gc, cc);
      return std::vector<Tensor>{dgates, need_c ? dc : Tensor()};
    });
  }
  return {h_out, c_out};
}

std::pair<Tensor, Tensor> lstm_cell(const Tensor& x, const Tensor& h, const Tensor& c, const Tensor& w_ih,
                                    const Tensor& w_hh, const Tensor& b_ih, const Tensor& b_hh) {
  MP_AUTOCAST(amp::Op::lstm_cell, lstm_cell, x, x, h, c, w_ih, w_hh, b_ih, b_hh);
  constexpr const char* op = "lstm_cell";
  check_cell(op, 4, x, h, w_ih, w_hh, b_ih, b_hh);
  check_floating(c, op, "cell state c");
  MP_CHECK(c.sizes() == h.sizes(), op, ": expected cell state c of the hidden state's shape ", shape_str(h.sizes()),
           ", got ", shape_str(c.sizes()));
  check_same_device(x, c, op, "c");
  auto [h1, c1] = lstm_gates(cell_gates(batched(x), batched(h), w_ih, w_hh, b_ih, b_hh), batched(c));
  if (x.dim() == 1) return {h1.squeeze(0), c1.squeeze(0)};
  return {h1, c1};
}

// Note [lstm_layer]
// The per-step composite (lstm_gates over linear + add) records 3-4 nodes per step; its backward
// computes the recurrent weight gradient as T GEMMs of B rows each and adds T weight-sized gradients.
// lstm_layer is one node: the forward saves the pre-activation gates of each step (as lstm_gates
// does, see Note [lstm_gates saves pre-activations]), the hidden states hs = [h0, h_1..h_T] and the
// f32 cell states cs = [c0, c_1..c_T]; the backward walks t = T-1..0 with the gate kernel and one
// [B, 4H] x [4H, H] GEMM per step, writing dG_t into one [T, B, 4H] buffer, which is then both the
// gradient of gx and the left operand of the single weight-gradient GEMM.
//
// Where the device's matmul computes a step's 16-bit GEMM through f32 (backend::matmul_compute_dtype: the CPU
// for f16, and for bf16 shapes where that path measured faster), each per-step GEMM would widen the whole recurrent
// weight again: 2T copies of a [4H, H] matrix per layer (the word LM, bf16 on such a CPU: most of the 113 ms of casts
// in a 382 ms step, bench/RESULTS.md). So w_hh (and b_hh) are widened once per pass, the small per-step operand is
// widened and the f32 result rounded to the gates' dtype: bit for bit the kernel's own widening (exact
// widening into the same layouts, the same f32 GEMM, one rounding; tests/ops/test_rnn.cpp checks both). The
// forward's f32 copy is kept for the backward when both go through f32 (as linear does, Note [linear through f32]).
std::tuple<Tensor, Tensor, Tensor> lstm_layer(const Tensor& gx_in, const Tensor& h0_in, const Tensor& c0_in,
                                              const Tensor& w_hh_in, const Tensor& b_hh_in) {
  constexpr const char* op = "lstm_layer";
  check_floating(gx_in, op, "input projection gx");
  check_floating(h0_in, op, "initial hidden state h0");
  check_floating(c0_in, op, "initial cell state c0");
  check_floating(w_hh_in, op, "w_hh");
  Tensor gx = gx_in, h0 = h0_in, w_hh = w_hh_in, b_hh = b_hh_in;
  std::optional<amp::AutocastSuspend> suspend;
  if (amp::autocast_active(gx.device().type) &&
      amp::cast_policy(amp::Op::lstm_layer, gx.device().type) == amp::CastPolicy::lower) {
    const DType low = amp::autocast_dtype();
    for (Tensor* t : {&gx, &h0, &w_hh, &b_hh})
      if (t->defined() && t->dtype() != DType::f64) *t = amp::autocast_cast(*t, low);
    suspend.emplace();
  }
  MP_CHECK(gx.dim() == 3 && gx.size(2) % 4 == 0, op,
           ": expected gx of shape [T, B, 4H] (the input projection of every step), got ", shape_str(gx.sizes()));
  const int64_t T = gx.size(0), B = gx.size(1), H = gx.size(2) / 4;
  MP_CHECK(T > 0, op, ": expected a sequence of at least one step, got gx ", shape_str(gx.sizes()));
  for (const auto& [t, what] : {std::pair{static_cast<const Tensor*>(&h0), "h0"}, std::pair{&c0_in, "c0"}})
    MP_CHECK(t->sizes() == (Shape{B, H}), op, ": expected ", what, " of shape [", B, ", ", H, "] ([B, H] for gx ",
             shape_str(gx.sizes()), "), got ", shape_str(t->sizes()));
  MP_CHECK(w_hh.sizes() == (Shape{4 * H, H}), op, ": expected w_hh of shape [", 4 * H, ", ", H, "], got ",
           shape_str(w_hh.sizes()));
  if (b_hh.defined()) {
    check_floating(b_hh, op, "b_hh");
    MP_CHECK(b_hh.sizes() == (Shape{4 * H}), op, ": expected b_hh of shape [", 4 * H, "], got ",
             shape_str(b_hh.sizes()));
    check_same_device(gx, b_hh, op, "b_hh");
  }
  MP_CHECK(h0.dtype() == gx.dtype() && w_hh.dtype() == gx.dtype(), op, ": expected gx, h0 and w_hh of one dtype, got ",
           dtype_name(gx.dtype()), ", ", dtype_name(h0.dtype()), " and ", dtype_name(w_hh.dtype()),
           "; convert them (or run under autocast)");
  for (const auto& [t, what] : {std::pair{static_cast<const Tensor*>(&h0), "h0"}, std::pair{&c0_in, "c0"},
                                std::pair{static_cast<const Tensor*>(&w_hh), "w_hh"}})
    check_same_device(gx, *t, op, what);

  const Device dev = gx.device();
  const DType dt = gx.dtype();
  const DType state_dt = dt == DType::f64 || c0_in.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor hs = empty({T + 1, B, H}, {.dtype = dt, .device = dev});
  Tensor cs = empty({T + 1, B, H}, {.dtype = state_dt, .device = dev});
  std::vector<Tensor> gates(static_cast<size_t>(T));
  auto* const compute_dtype = backend::matmul_compute_dtype.find(dev.type);
  // The per-step GEMMs: [B, H] x [H, 4H] forward (w^T, column-major: linear's operand), [B, 4H] x [4H, H] (w,
  // row-major) for the data gradient; asked with their layouts, as the kernel's own choice is made.
  const DType mm = compute_dtype != nullptr ? compute_dtype(dt, dt, 1, B, 4 * H, H, false, true) : dt;
  const DType mm_bwd = compute_dtype != nullptr ? compute_dtype(dt, dt, 1, B, H, 4 * H, false, false) : dt;
  const Tensor w = w_hh.detach(), b = b_hh.defined() ? b_hh.detach() : Tensor();
  // Widened once (above), in w's own layout: the kernel widens linear's w^T operand in memory order too (Note
  // [widening in memory order] in backend/cpu/linalg.cpp), so the f32 GEMM sees the same layout.
  const Tensor wm = mm == dt ? Tensor() : w.to(mm), bm = mm == dt || !b.defined() ? b : b.to(mm);
  {
    autograd::NoGradGuard ng;
    hs.select(0, 0).copy_(h0);
    cs.select(0, 0).copy_(c0_in);
    const Tensor gxd = gx.detach();
    for (int64_t t = 0; t < T; ++t) {
      Tensor g = mm == dt ? linear(hs.select(0, t), w, b) : linear(hs.select(0, t).to(mm), wm, bm).to(dt);
      add_(g, gxd.select(0, t));
      backend::lstm_gates_forward_kernel.get(dev)(hs.select(0, t + 1), cs.select(0, t + 1), g, cs.select(0, t));
      gates[static_cast<size_t>(t)] = std::move(g);
    }
  }
  // Outputs are views of the saved state buffers, detached from them so that the node's outputs
  // are fresh tensors for autograd; the backward reads the buffers, which nothing writes to later.
  Tensor y = hs.narrow(0, 1, T), hT = hs.select(0, T), cT = cs.select(0, T);
  std::vector<Tensor> inputs{gx, h0, c0_in, w_hh};
  if (b_hh.defined()) inputs.push_back(b_hh);
  if (autograd::any_requires_grad(inputs)) {
    y = y.detach();
    hT = hT.detach();
    cT = cT.detach();
    const bool with_bias = b_hh.defined();
    autograd::record("LstmLayerBackward", inputs, {y, hT, cT},
                     [hs, cs, gates = std::move(gates), w, wm_fwd = mm_bwd == mm ? wm : Tensor(), mm_bwd, with_bias, T,
                      B, H](const std::vector<Tensor>& g) {
                       const Device d = hs.device();
                       const DType gdt = gates[0].dtype();
                       // Widened once for the T data-gradient GEMMs (w itself when mm is w's dtype); the forward's
                       // copy when it made one of that dtype.
                       const Tensor wm = wm_fwd.defined() ? wm_fwd : w.to(mm_bwd);
                       Tensor dG = empty({T, B, 4 * H}, {.dtype = gdt, .device = d});
                       // Two ping-pong buffers of our own (never written through g[2], which may be the caller's).
                       Tensor dc_a = empty({B, H}, {.dtype = cs.dtype(), .device = d});
                       Tensor dc_b = empty({B, H}, {.dtype = cs.dtype(), .device = d});
                       dc_a.copy_(g[2]);
                       Tensor dh_rec = g[1];
                       const Tensor dy = g[0];
                       for (int64_t t = T - 1; t >= 0; --t) {
                         const Tensor dh = add(dy.select(0, t), dh_rec).contiguous();
                         Tensor dgt = dG.select(0, t);
                         backend::lstm_gates_backward_kernel.get(d)(dgt, dc_b, dh, dc_a, gates[static_cast<size_t>(t)],
                                                                    cs.select(0, t));
                         std::swap(dc_a, dc_b);
                         dh_rec = wm.dtype() == gdt ? matmul(dgt, wm) : matmul(dgt.to(wm.dtype()), wm).to(gdt);
                       }
                       const Tensor dG2 = dG.view({T * B, 4 * H});
                       Tensor dw = matmul(dG2.t(), hs.narrow(0, 0, T).reshape({T * B, H}));
                       std::vector<Tensor> r{dG, dh_rec, dc_a, dw};
                       if (with_bias) r.push_back(sum(dG2, {0}));
                       return r;
                     });
  }
  return {y, hT, cT};
}

Tensor gru_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                const Tensor& b_hh) {
  MP_AUTOCAST(amp::Op::gru_cell, gru_cell, x, x, h, w_ih, w_hh, b_ih, b_hh);
  check_cell("gru_cell", 3, x, h, w_ih, w_hh, b_ih, b_hh);
  const Tensor xb = batched(x), hb = batched(h);
  const int64_t H = hb.size(1);
  // PyTorch's formula: r and z see both projections summed; n sees r * (W_hn h + b_hn).
  const Tensor gi = linear(xb, w_ih, b_ih), gh = linear(hb, w_hh, b_hh);
  auto part = [H](const Tensor& t, int64_t k) { return t.narrow(1, k * H, H); };
  const Tensor r = sigmoid(add(part(gi, 0), part(gh, 0)));
  const Tensor z = sigmoid(add(part(gi, 1), part(gh, 1)));
  const Tensor n = tanh(add(part(gi, 2), mul(r, part(gh, 2))));
  const Tensor h1 = add(n, mul(z, sub(hb, n)));  // (1 - z) n + z h
  return x.dim() == 1 ? h1.squeeze(0) : h1;
}

Tensor rnn_tanh_cell(const Tensor& x, const Tensor& h, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                     const Tensor& b_hh) {
  MP_AUTOCAST(amp::Op::rnn_tanh_cell, rnn_tanh_cell, x, x, h, w_ih, w_hh, b_ih, b_hh);
  check_cell("rnn_tanh_cell", 1, x, h, w_ih, w_hh, b_ih, b_hh);
  const Tensor h1 = tanh(cell_gates(batched(x), batched(h), w_ih, w_hh, b_ih, b_hh));
  return x.dim() == 1 ? h1.squeeze(0) : h1;
}

}  // namespace mp

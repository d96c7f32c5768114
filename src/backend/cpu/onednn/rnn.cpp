// CPU kernels of mp::lstm_layer_library: oneDNN's LSTM primitive (lstm_forward with
// forward_training and a workspace, lstm_backward), f32 and bf16, with primitives and weight reorders
// cached per shape. Contract: src/backend/rnn_library_kernels.hpp; Note [library LSTM] in
// src/ops/rnn_library.cpp.
//
// Note [oneDNN LSTM layouts]
// oneDNN's LSTM has the gate order i, f, c~, o -- PyTorch's i, f, g, o -- and ONE bias per gate
// (bias {L, D, 4, H}, ldgo): we pass b_ih + b_hh in f32, and both biases get diff_bias as gradient.
// Its weights are {L, D, in, 4, H}; PyTorch's w_ih [4H, I] is that tensor in the ldgoi layout. oneDNN
// (2.6 and 3.2) takes no ldgoi weights in the forward (only ldigo, or `any`), and with plain ldigo bf16
// weights it falls back to its reference kernel: the weights are given as `any` (measured on 2.6, T 35, B 20,
// I = H = 650: f32 picks padded ldigo, bf16 a blocked layout for its brgemm/AMX kernel) and reordered
// from the user's ldgoi by cached reorder primitives on every call (weights change every step). The
// backward wants yet other weight layouts (its own reorders); its diff weights (`any`, f32) are
// reordered back to ldgoi f32. The activations are plain: src/dst layer tnc ([T, B, C] contiguous),
// states ldnc ([B, H] with L = D = 1).
//
// Note [oneDNN LSTM data types]
// Measured on oneDNN 2.6.3 (primitive creation; 3.2 creates the same configurations, test_lstm_library):
// f32 everything f32; bf16 takes bf16 src/weights/
// dst with f32 bias and an f32 cell state (src_iter_c/dst_iter_c), so c stays f32 as in mp::lstm_layer.
// Its backward only exists with every diff tensor f32 (diff_src_layer, diff_src_iter(_c), diff weights,
// diff_bias, diff_dst_*): bf16 or mixed diffs are unimplemented. So the bf16 backward converts dy and
// dh_n to f32 and returns f32 gradients. oneDNN has no f16 or f64 LSTM on the CPU.
//
// Note [bf16 LSTM without AVX-512]
// oneDNN (2.6 and 3.2) implements the bf16 LSTM only on CPUs with avx512_core (its brgemm kernels; with
// ONEDNN_MAX_CPU_ISA=AVX2 primitive creation answers "unimplemented"; 2.6 still ran bf16 matmuls there on
// its reference kernel, 3.2 has no bf16 matmul or convolution there at all). There the bf16 layer runs oneDNN's f32
// LSTM on the widened bf16 operands (exact conversions) and rounds y and h_n to bf16 once at the end: the same products
// with f32 accumulation, the one difference being that h is not rounded to bf16 between steps. The f32 plan's workspace
// and f32 outputs are kept for the backward.
//
// Note [oneDNN LSTM backward accumulates]
// lstm_backward ADDS into diff_weights_layer/iter and diff_bias (checked: running it twice doubles
// them), so those buffers are zeroed before every call.
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>

#include "backend/cpu/onednn/common.hpp"
#include "backend/rnn_library_kernels.hpp"
#include "mp/core/half.hpp"

namespace mp::backend::cpu {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using ddt = memory::data_type;

constexpr const char* kOp = "lstm_layer_library on cpu";

struct LstmKey {
  int64_t T, B, I, H;
  int64_t dtype;
  int64_t training;
  bool operator==(const LstmKey&) const = default;
};

std::string describe(const LstmKey& k) {
  return detail::str_cat("LSTM T ", k.T, ", B ", k.B, ", I ", k.I, ", H ", k.H, ", ",
                         dtype_name(static_cast<DType>(k.dtype)), k.training ? ", training" : ", inference");
}

// A layout change between the user's plain tensor and the primitive's: `needed` false when the two
// descriptors agree (the user's buffer is used as is).
struct Reorder {
  memory::desc from, to;
  dnnl::reorder prim;
  memory::desc scratch_md;
  bool needed = false;
};

Reorder make_reorder(const memory::desc& from, const memory::desc& to, const dnnl::primitive_attr& attr) {
  Reorder r;
  r.from = from;
  r.to = to;
  r.needed = from != to;
  if (r.needed) {
    const dnnl::engine& eng = onednn_engine();
    const dnnl::reorder::primitive_desc pd(eng, from, eng, to, attr);
    r.prim = dnnl::reorder(pd);
    r.scratch_md = pd.scratchpad_desc();
  }
  return r;
}

struct LstmPlan {
  // Forward: the user-layout descriptors of the activations and states, the weights the primitive wants.
  memory::desc src_layer, src_iter, src_iter_c, bias, dst_layer, dst_iter, dst_iter_c, workspace;
  dnnl::lstm_forward fwd;
  memory::desc fwd_scratch;
  Reorder fwd_w_layer, fwd_w_iter;  // user ldgoi -> forward layout
  // Backward (training plans only).
  memory::desc diff_src_layer, diff_iter, diff_dst_layer;  // f32, plain
  dnnl::lstm_backward bwd;
  memory::desc bwd_scratch;
  Reorder bwd_w_layer, bwd_w_iter;    // user ldgoi -> backward layout
  Reorder diff_w_layer, diff_w_iter;  // backward diff layout (f32) -> user ldgoi f32
  size_t scratch_bytes = 0;           // the largest scratchpad of the primitives and reorders
  std::string fwd_impl, bwd_impl;
};

using LstmCache = PrimitiveCache<LstmKey, LstmPlan>;

LstmCache& cache() {
  onednn_engine();  // constructed first, so destroyed after the cached primitives
  static LstmCache c;
  return c;
}

LstmPlan build_plan(const LstmKey& k) {
  const ddt dt = static_cast<DType>(k.dtype) == DType::bf16 ? ddt::bf16 : ddt::f32;
  const auto dir = dnnl::rnn_direction::unidirectional_left2right;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::engine& eng = onednn_engine();
  LstmPlan p;
  p.src_layer = memory::desc({k.T, k.B, k.I}, dt, tag::tnc);
  p.src_iter = memory::desc({1, 1, k.B, k.H}, dt, tag::ldnc);
  p.src_iter_c = memory::desc({1, 1, k.B, k.H}, ddt::f32, tag::ldnc);
  p.bias = memory::desc({1, 1, 4, k.H}, ddt::f32, tag::ldgo);
  p.dst_layer = memory::desc({k.T, k.B, k.H}, dt, tag::tnc);
  p.dst_iter = p.src_iter;
  p.dst_iter_c = p.src_iter_c;
  const memory::desc w_layer_any({1, 1, k.I, 4, k.H}, dt, tag::any), w_iter_any({1, 1, k.H, 4, k.H}, dt, tag::any);
  const memory::desc w_layer_user({1, 1, k.I, 4, k.H}, dt, tag::ldgoi);
  const memory::desc w_iter_user({1, 1, k.H, 4, k.H}, dt, tag::ldgoi);
  const auto prop = k.training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  const dnnl::lstm_forward::primitive_desc fpd(eng, prop, dir, p.src_layer, p.src_iter, p.src_iter_c, w_layer_any,
                                               w_iter_any, p.bias, p.dst_layer, p.dst_iter, p.dst_iter_c, attr);
  MP_ASSERT(fpd.src_layer_desc() == p.src_layer && fpd.dst_layer_desc() == p.dst_layer &&
                fpd.src_iter_c_desc() == p.src_iter_c,
            "oneDNN LSTM changed a plain activation layout for ", describe(k));
  p.fwd = dnnl::lstm_forward(fpd);
  p.fwd_impl = fpd.impl_info_str();
  p.fwd_scratch = fpd.scratchpad_desc();
  p.workspace = fpd.workspace_desc();
  p.fwd_w_layer = make_reorder(w_layer_user, fpd.weights_layer_desc(), attr);
  p.fwd_w_iter = make_reorder(w_iter_user, fpd.weights_iter_desc(), attr);
  record_onednn_impl("lstm_fwd", p.fwd_impl);
  for (const Reorder* r : {&p.fwd_w_layer, &p.fwd_w_iter})
    p.scratch_bytes = std::max(p.scratch_bytes, md_bytes(r->scratch_md));
  p.scratch_bytes = std::max(p.scratch_bytes, md_bytes(p.fwd_scratch));
  if (!k.training) return p;

  // Backward: every diff tensor f32 (Note [oneDNN LSTM data types]).
  p.diff_src_layer = memory::desc({k.T, k.B, k.I}, ddt::f32, tag::tnc);
  p.diff_iter = memory::desc({1, 1, k.B, k.H}, ddt::f32, tag::ldnc);
  p.diff_dst_layer = memory::desc({k.T, k.B, k.H}, ddt::f32, tag::tnc);
  const memory::desc dw_layer_any({1, 1, k.I, 4, k.H}, ddt::f32, tag::any),
      dw_iter_any({1, 1, k.H, 4, k.H}, ddt::f32, tag::any);
  const dnnl::lstm_backward::primitive_desc bpd(
      eng, dnnl::prop_kind::backward, dir, p.src_layer, p.src_iter, p.src_iter_c, w_layer_any, w_iter_any, p.bias,
      p.dst_layer, p.dst_iter, p.dst_iter_c, p.diff_src_layer, p.diff_iter, p.diff_iter, dw_layer_any, dw_iter_any,
      p.bias, p.diff_dst_layer, p.diff_iter, p.diff_iter, fpd, attr);
  MP_ASSERT(bpd.workspace_desc() == p.workspace, "oneDNN LSTM backward wants another workspace than its forward for ",
            describe(k));
  MP_ASSERT(bpd.diff_src_layer_desc() == p.diff_src_layer && bpd.diff_dst_layer_desc() == p.diff_dst_layer &&
                bpd.diff_bias_desc() == p.bias,
            "oneDNN LSTM backward changed a plain layout for ", describe(k));
  p.bwd = dnnl::lstm_backward(bpd);
  p.bwd_impl = bpd.impl_info_str();
  p.bwd_scratch = bpd.scratchpad_desc();
  p.bwd_w_layer = make_reorder(w_layer_user, bpd.weights_layer_desc(), attr);
  p.bwd_w_iter = make_reorder(w_iter_user, bpd.weights_iter_desc(), attr);
  const memory::desc dw_layer_user({1, 1, k.I, 4, k.H}, ddt::f32, tag::ldgoi),
      dw_iter_user({1, 1, k.H, 4, k.H}, ddt::f32, tag::ldgoi);
  p.diff_w_layer = make_reorder(bpd.diff_weights_layer_desc(), dw_layer_user, attr);
  p.diff_w_iter = make_reorder(bpd.diff_weights_iter_desc(), dw_iter_user, attr);
  record_onednn_impl("lstm_bwd", p.bwd_impl);
  for (const Reorder* r : {&p.bwd_w_layer, &p.bwd_w_iter, &p.diff_w_layer, &p.diff_w_iter})
    p.scratch_bytes = std::max(p.scratch_bytes, md_bytes(r->scratch_md));
  p.scratch_bytes = std::max(p.scratch_bytes, md_bytes(p.bwd_scratch));
  return p;
}

std::shared_ptr<const LstmPlan> get_plan(const LstmKey& k) {
  return cache().get_or_create(k, [&] {
    return onednn_check(
        "dnnl::lstm (primitive creation)", [&] { return describe(k); }, [&] { return build_plan(k); });
  });
}

// Whether this CPU has oneDNN's bf16 LSTM (forward and backward): a tiny plan built once.
bool bf16_lstm_available() {
  static const bool ok = [] {
    try {
      get_plan(LstmKey{1, 1, 1, 1, static_cast<int64_t>(DType::bf16), 1});
      return true;
    } catch (const Error&) { return false; }
  }();
  return ok;
}

LstmKey key_of(const LstmLibraryInputs& in, bool training) {
  const DType dt = in.x.dtype();
  MP_CHECK(dt == DType::f32 || dt == DType::bf16, kOp, ": oneDNN's LSTM computes in f32 or bf16 on the CPU, got ",
           dtype_name(dt),
           " (oneDNN has no f16 or f64 LSTM on the CPU); convert the operands with .to(mp::DType::f32) or "
           ".to(mp::DType::bf16), or use mp::lstm_layer (nn::LstmImpl::fused), which takes every floating dtype");
  return LstmKey{in.x.size(0), in.x.size(1), in.x.size(2), in.h0.size(1), static_cast<int64_t>(dt), training ? 1 : 0};
}

// A buffer of `md`'s size (64-byte aligned, from the CPU allocator).
Tensor buffer_for(const memory::desc& md) { return empty({static_cast<int64_t>(md_bytes(md))}, {.dtype = DType::u8}); }

// One weight in the layout a primitive wants: the user's buffer itself, or a reordered copy.
struct PrimWeight {
  Tensor keep;  // owns the reordered copy
  void* ptr = nullptr;
};

PrimWeight prim_weight(const Reorder& r, const Tensor& user, dnnl::stream& s, void* scratch) {
  if (!r.needed) return {Tensor(), user.raw_data()};
  PrimWeight w{buffer_for(r.to), nullptr};
  w.ptr = w.keep.raw_data();
  std::unordered_map<int, memory> args{{DNNL_ARG_FROM, wrap_memory(r.from, user.raw_data())},
                                       {DNNL_ARG_TO, wrap_memory(r.to, w.ptr)}};
  if (md_bytes(r.scratch_md) > 0) args.emplace(DNNL_ARG_SCRATCHPAD, wrap_memory(r.scratch_md, scratch));
  r.prim.execute(s, args);
  return w;
}

// oneDNN's single f32 bias: b_ih + b_hh (either may be undefined = zero), in f32.
Tensor combined_bias(const LstmLibraryInputs& in, int64_t H) {
  Tensor b = zeros({4 * H}, {.dtype = DType::f32});
  float* out = b.data_ptr<float>();
  for (const Tensor* t : {&in.b_ih, &in.b_hh}) {
    if (!t->defined()) continue;
    visit_floating(t->dtype(), kOp, [&]<class T>() {
      const T* p = t->data_ptr<T>();
      for (int64_t j = 0; j < 4 * H; ++j) out[j] += scalar_cast<float>(p[j]);
    });
  }
  return b;
}

// t as a contiguous f32 tensor (itself when it already is one).
Tensor as_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t.contiguous() : t.to(DType::f32).contiguous(); }

// The operands with the bf16 ones widened to f32 (Note [bf16 LSTM without AVX-512]).
LstmLibraryInputs widened(const LstmLibraryInputs& in) {
  auto w = [](const Tensor& t) { return t.defined() && t.dtype() == DType::bf16 ? t.to(DType::f32) : t; };
  return {w(in.x), w(in.h0), in.c0, w(in.w_ih), w(in.w_hh), in.b_ih, in.b_hh};
}

LstmLibraryForward lstm_library_forward_cpu(const LstmLibraryInputs& in, bool training);

// bf16 through the f32 LSTM; saved = the f32 run's saved + its y and h_n.
LstmLibraryForward forward_bf16_via_f32(const LstmLibraryInputs& in, bool training) {
  LstmLibraryForward r32 = lstm_library_forward_cpu(widened(in), training);
  LstmLibraryForward r{r32.y.to(DType::bf16), r32.h_n.to(DType::bf16), r32.c_n, std::move(r32.saved)};
  if (training) {
    r.saved.push_back(r32.y);
    r.saved.push_back(r32.h_n);
  }
  return r;
}

LstmLibraryForward lstm_library_forward_cpu(const LstmLibraryInputs& in, bool training) {
  if (in.x.dtype() == DType::bf16 && !bf16_lstm_available()) return forward_bf16_via_f32(in, training);
  const LstmKey k = key_of(in, training);
  const std::shared_ptr<const LstmPlan> plan = get_plan(k);
  const DType dt = in.x.dtype();
  LstmLibraryForward r;
  r.y = empty({k.T, k.B, k.H}, {.dtype = dt});
  r.h_n = empty({k.B, k.H}, {.dtype = dt});
  r.c_n = empty({k.B, k.H}, {.dtype = DType::f32});
  const Tensor bias = combined_bias(in, k.H);
  const Tensor ws = training ? buffer_for(plan->workspace) : Tensor();
  onednn_check(
      "dnnl::lstm_forward::execute", [&] { return describe(k); },
      [&] {
        dnnl::stream& s = onednn_stream();
        void* scratch =
            plan->scratch_bytes > 0 ? thread_scratch(ScratchSlot::scratchpad, plan->scratch_bytes) : nullptr;
        const PrimWeight wl = prim_weight(plan->fwd_w_layer, in.w_ih, s, scratch);
        const PrimWeight wi = prim_weight(plan->fwd_w_iter, in.w_hh, s, scratch);
        std::unordered_map<int, memory> args{{DNNL_ARG_SRC_LAYER, wrap_memory(plan->src_layer, in.x.raw_data())},
                                             {DNNL_ARG_SRC_ITER, wrap_memory(plan->src_iter, in.h0.raw_data())},
                                             {DNNL_ARG_SRC_ITER_C, wrap_memory(plan->src_iter_c, in.c0.raw_data())},
                                             {DNNL_ARG_WEIGHTS_LAYER, wrap_memory(plan->fwd_w_layer.to, wl.ptr)},
                                             {DNNL_ARG_WEIGHTS_ITER, wrap_memory(plan->fwd_w_iter.to, wi.ptr)},
                                             {DNNL_ARG_BIAS, wrap_memory(plan->bias, bias.raw_data())},
                                             {DNNL_ARG_DST_LAYER, wrap_memory(plan->dst_layer, r.y.raw_data())},
                                             {DNNL_ARG_DST_ITER, wrap_memory(plan->dst_iter, r.h_n.raw_data())},
                                             {DNNL_ARG_DST_ITER_C, wrap_memory(plan->dst_iter_c, r.c_n.raw_data())}};
        if (training) args.emplace(DNNL_ARG_WORKSPACE, wrap_memory(plan->workspace, ws.raw_data()));
        if (md_bytes(plan->fwd_scratch) > 0) args.emplace(DNNL_ARG_SCRATCHPAD, wrap_memory(plan->fwd_scratch, scratch));
        plan->fwd.execute(s, args);
        s.wait();
      });
  if (training) r.saved = {ws, bias};
  return r;
}

LstmLibraryGrads lstm_library_backward_cpu(const LstmLibraryInputs& in, const LstmLibraryForward& fwd, const Tensor& dy,
                                           const Tensor& dh_n, const Tensor& dc_n) {
  if (in.x.dtype() == DType::bf16 && !bf16_lstm_available()) {  // Note [bf16 LSTM without AVX-512]
    MP_ASSERT(fwd.saved.size() == 4, kOp, ": the backward needs the saved state of a training forward");
    const LstmLibraryForward f32{fwd.saved[2], fwd.saved[3], fwd.c_n, {fwd.saved[0], fwd.saved[1]}};
    return lstm_library_backward_cpu(widened(in), f32, dy, dh_n, dc_n);
  }
  const LstmKey k = key_of(in, true);
  MP_ASSERT(fwd.saved.size() == 2, kOp, ": the backward needs the workspace of a training forward");
  const std::shared_ptr<const LstmPlan> plan = get_plan(k);
  const Tensor& ws = fwd.saved[0];
  const Tensor& bias = fwd.saved[1];
  MP_ASSERT(ws.numel() == static_cast<int64_t>(md_bytes(plan->workspace)), kOp, ": workspace of ", ws.numel(),
            " bytes, the primitive wants ", md_bytes(plan->workspace));
  const Tensor dy32 = as_f32(dy), dh32 = as_f32(dh_n), dc32 = as_f32(dc_n);
  LstmLibraryGrads g;
  g.dx = empty({k.T, k.B, k.I}, {.dtype = DType::f32});
  g.dh0 = empty({k.B, k.H}, {.dtype = DType::f32});
  g.dc0 = empty({k.B, k.H}, {.dtype = DType::f32});
  g.dw_ih = empty({4 * k.H, k.I}, {.dtype = DType::f32});
  g.dw_hh = empty({4 * k.H, k.H}, {.dtype = DType::f32});
  Tensor db = zeros({4 * k.H}, {.dtype = DType::f32});  // accumulated into (Note [oneDNN LSTM backward accumulates])
  // The diff weights in the primitive's layout, zeroed: the user's tensors when the layouts agree.
  const Tensor dwl = plan->diff_w_layer.needed ? buffer_for(plan->diff_w_layer.from) : g.dw_ih;
  const Tensor dwi = plan->diff_w_iter.needed ? buffer_for(plan->diff_w_iter.from) : g.dw_hh;
  for (const Tensor* t : {&dwl, &dwi})
    std::memset(t->raw_data(), 0, static_cast<size_t>(t->numel()) * t->element_size());
  onednn_check(
      "dnnl::lstm_backward::execute", [&] { return describe(k); },
      [&] {
        dnnl::stream& s = onednn_stream();
        void* scratch =
            plan->scratch_bytes > 0 ? thread_scratch(ScratchSlot::scratchpad, plan->scratch_bytes) : nullptr;
        const PrimWeight wl = prim_weight(plan->bwd_w_layer, in.w_ih, s, scratch);
        const PrimWeight wi = prim_weight(plan->bwd_w_iter, in.w_hh, s, scratch);
        std::unordered_map<int, memory> args{
            {DNNL_ARG_SRC_LAYER, wrap_memory(plan->src_layer, in.x.raw_data())},
            {DNNL_ARG_SRC_ITER, wrap_memory(plan->src_iter, in.h0.raw_data())},
            {DNNL_ARG_SRC_ITER_C, wrap_memory(plan->src_iter_c, in.c0.raw_data())},
            {DNNL_ARG_WEIGHTS_LAYER, wrap_memory(plan->bwd_w_layer.to, wl.ptr)},
            {DNNL_ARG_WEIGHTS_ITER, wrap_memory(plan->bwd_w_iter.to, wi.ptr)},
            {DNNL_ARG_BIAS, wrap_memory(plan->bias, bias.raw_data())},
            {DNNL_ARG_DST_LAYER, wrap_memory(plan->dst_layer, fwd.y.raw_data())},
            {DNNL_ARG_DST_ITER, wrap_memory(plan->dst_iter, fwd.h_n.raw_data())},
            {DNNL_ARG_DST_ITER_C, wrap_memory(plan->dst_iter_c, fwd.c_n.raw_data())},
            {DNNL_ARG_WORKSPACE, wrap_memory(plan->workspace, ws.raw_data())},
            {DNNL_ARG_DIFF_SRC_LAYER, wrap_memory(plan->diff_src_layer, g.dx.raw_data())},
            {DNNL_ARG_DIFF_SRC_ITER, wrap_memory(plan->diff_iter, g.dh0.raw_data())},
            {DNNL_ARG_DIFF_SRC_ITER_C, wrap_memory(plan->diff_iter, g.dc0.raw_data())},
            {DNNL_ARG_DIFF_WEIGHTS_LAYER, wrap_memory(plan->diff_w_layer.from, dwl.raw_data())},
            {DNNL_ARG_DIFF_WEIGHTS_ITER, wrap_memory(plan->diff_w_iter.from, dwi.raw_data())},
            {DNNL_ARG_DIFF_BIAS, wrap_memory(plan->bias, db.raw_data())},
            {DNNL_ARG_DIFF_DST_LAYER, wrap_memory(plan->diff_dst_layer, dy32.raw_data())},
            {DNNL_ARG_DIFF_DST_ITER, wrap_memory(plan->diff_iter, dh32.raw_data())},
            {DNNL_ARG_DIFF_DST_ITER_C, wrap_memory(plan->diff_iter, dc32.raw_data())}};
        if (md_bytes(plan->bwd_scratch) > 0) args.emplace(DNNL_ARG_SCRATCHPAD, wrap_memory(plan->bwd_scratch, scratch));
        plan->bwd.execute(s, args);
        for (const auto& [r, from, to] :
             {std::tuple{&plan->diff_w_layer, &dwl, &g.dw_ih}, std::tuple{&plan->diff_w_iter, &dwi, &g.dw_hh}}) {
          if (!r->needed) continue;
          std::unordered_map<int, memory> rargs{{DNNL_ARG_FROM, wrap_memory(r->from, from->raw_data())},
                                                {DNNL_ARG_TO, wrap_memory(r->to, to->raw_data())}};
          if (md_bytes(r->scratch_md) > 0) rargs.emplace(DNNL_ARG_SCRATCHPAD, wrap_memory(r->scratch_md, scratch));
          r->prim.execute(s, rargs);
        }
        s.wait();
      });
  if (in.b_ih.defined() || in.b_hh.defined()) g.db = db;
  return g;
}

}  // namespace

MP_REGISTER_KERNEL(lstm_library_forward_kernel, DeviceType::cpu, &lstm_library_forward_cpu);
MP_REGISTER_KERNEL(lstm_library_backward_kernel, DeviceType::cpu, &lstm_library_backward_cpu);

}  // namespace mp::backend::cpu

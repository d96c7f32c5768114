#include "backend/cpu/onednn/conv.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>

namespace mp::backend::cpu {

namespace {

using dnnl::memory;
using tag = memory::format_tag;

// Note [convolution layouts]
// The caller's tensors are plain NCHW / OIHW. Measured with oneDNN 2.6 (Sapphire Rapids, 2 threads, batch 32,
// median of 15 interleaved fwd+bwd_data+bwd_weights steps, reorders from/to plain included; ms per step):
//
//   shape                     f32: nchw   any   nhwc     bf16: nchw   any   nhwc
//   3->64    32x32 3x3             9.2   10.0   13.9           10.4    6.1    6.0
//   64->64   32x32 3x3           109.4   53.8   54.9          101.5   17.0   16.3
//   128->128 16x16 3x3            93.2   60.4   81.2           51.8   18.7   18.3
//   256->256 8x8   3x3            64.1   39.6   46.7           46.3   26.5   26.7
//   512->512 4x4   3x3           107.1   41.5   48.2           93.0   53.4   54.3
//   64->256  16x16 1x1             7.4    9.9   12.6            6.9    6.4    6.0
//   256->128 8x8   1x1             3.1    3.7    3.8            1.9    3.1    3.1
//   128->256 16x16 1x1 s2          4.0    5.3    5.6            2.5    3.7    3.6
//
// (The 2 cores are shared with other builds, so single numbers are noisy, up to 2x between runs; the three
// layouts of a row were interleaved and the ranking repeated across runs.) With format_tag::any, oneDNN 2.6
// picks nhwc (acdb) activations for the AMX bf16 kernels (brgconv / jit:avx512_core_amx_bf16) and nChw16c
// for f32 (jit:avx512_core); weights go to blocked layouts (e.g. AcdB16b32a2b). Plain NCHW gets the im2col
// gemm kernels (x64:gemm:jit): 2-6x slower for 3x3 but fastest for 1x1 convolutions, where the reorders
// cost as much as the few flops per element. So: 1x1 kernels without padding run on the plain tensors
// (no reorder at all), everything else lets oneDNN choose (`any`) and reorders with cached primitives.
// Channels-last activations (Conv2dArgs::channels_last) are already the layout the bf16 kernels want: no
// activation reorder at all then (f32 still reorders to nChw16c); 1x1 convolutions choose too (see build_plan).
bool use_plain_layout(const Conv2dArgs& a) { return a.kh == 1 && a.kw == 1 && a.pad_h == 0 && a.pad_w == 0; }

// Note [backward data as a forward convolution]
// Measured with oneDNN 2.6 (3.x adds brgemm backward-data kernels; MP_CONV_BWD_DATA_AS_FORWARD=0 is the A/B switch for
// re-measuring). oneDNN 2.6 has brgemm convolution kernels (brgconv, AMX tiles) for the forward pass only; backward
// data runs its older jit:avx512_core_amx_bf16 kernel, measured here 1.2-2x slower than the forward kernel on the same
// shape (ResNet-18, batch 32, 2 threads: 512->512 at 4x4 16.5 vs 8.6 ms per call, 256->256 at 8x8 7.1 vs 4.5 ms). For
// stride 1 the data gradient IS a forward convolution:
//   dx[n, c, y, x] = sum_{o, i, j} dy[n, o, y + p - d i, x + p - d j] W[o, c, i, j]
//                  = conv(dy, W')[n, c, y, x]   with  W'[c, o, i, j] = W[o, c, k-1-i, k-1-j],
// padding p' = d (k - 1) - p and the same dilation d. The transpose of W' is free (the user-side weight
// descriptor says iohw, and the reorder into the primitive's blocked layout reads it so); the spatial flip
// is one pass over the weights (2.4 MB for 512x512x3x3 bf16) into a per-thread buffer. Used when stride is 1,
// groups 1, p <= d (k - 1) and the layout is not the plain 1x1 one; the sums are the same products in
// another order (f32 accumulation either way).
bool bwd_data_as_forward(const Conv2dArgs& a) {
  static const bool enabled = [] {
    const char* e = std::getenv("MP_CONV_BWD_DATA_AS_FORWARD");  // A/B experiments only
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return enabled && a.stride_h == 1 && a.stride_w == 1 && a.groups == 1 && !use_plain_layout(a) &&
         a.pad_h <= a.dil_h * (a.kh - 1) && a.pad_w <= a.dil_w * (a.kw - 1);
}

// out[o, c, i, j] = w[o, c, kh-1-i, kw-1-j] for `blocks` = O*C kernels of `taps` = kh*kw elements of `elem`
// bytes (2 or 4).
template <class E>
void flip_taps(const E* w, E* out, int64_t blocks, int64_t taps) {
#pragma omp parallel for if (blocks * taps >= (int64_t{1} << 16) && !omp_in_parallel()) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const E* src = w + b * taps;
    E* dst = out + b * taps;
    for (int64_t t = 0; t < taps; ++t) dst[t] = src[taps - 1 - t];
  }
}

struct ConvKey {
  int64_t pass;
  int64_t n, c, h, w, oc, kh, kw, sh, sw, ph, pw, dh, dw, groups;
  int64_t src_dtype, dst_dtype, bias, channels_last;
  bool operator==(const ConvKey&) const = default;
};

// One tensor argument of a plan: the plain layout and dtype the caller uses, the layout and dtype the
// primitive wants, and the reorder between them (user -> primitive for inputs, primitive -> user for the
// output), absent when the two agree and the caller's buffer is used directly.
struct PlanArg {
  int arg = 0;  // DNNL_ARG_*
  memory::desc user_md, prim_md;
  dnnl::reorder reorder;
  memory::desc reorder_scratch_md;
  bool needs_reorder = false;
};

struct ConvPlan {
  dnnl::primitive prim;
  memory::desc scratch_md;
  PlanArg in[2];
  PlanArg out;
  int bias_arg = 0;  // DNNL_ARG_BIAS / DNNL_ARG_DIFF_BIAS, 0 without bias
  memory::desc bias_md;
  size_t scratchpad_bytes = 0;  // the largest scratchpad of the primitive and its reorders
  bool flip_weights = false;    // backward data as a forward convolution: in[1] reads the flipped weights
  std::string impl;
};

using ConvCache = PrimitiveCache<ConvKey, ConvPlan>;

ConvCache& cache() {
  onednn_engine();  // constructed first, so destroyed after the cached primitives
  static ConvCache c;
  return c;
}

const char* pass_name(ConvPass p) {
  switch (p) {
    case ConvPass::forward: return "conv_fwd";
    case ConvPass::backward_data: return "conv_bwd_data";
    case ConvPass::backward_weights: return "conv_bwd_weights";
  }
  return "conv";
}

std::string describe(const Conv2dArgs& a, ConvPass pass) {
  return detail::str_cat(pass_name(pass), " input [", a.n, ",", a.c, ",", a.h, ",", a.w, "] weight [", a.oc, ",",
                         a.groups > 0 ? a.c / a.groups : a.c, ",", a.kh, ",", a.kw, "] stride (", a.stride_h, ",",
                         a.stride_w, ") pad (", a.pad_h, ",", a.pad_w, ") dilation (", a.dil_h, ",", a.dil_w,
                         ") groups ", a.groups, " src ", dtype_name(a.src_dtype), " dst ", dtype_name(a.dst_dtype),
                         a.channels_last ? " channels_last" : "");
}

void validate(const Conv2dArgs& a, ConvPass pass) {
  to_dnnl(a.src_dtype, "conv2d (input/weight)");
  to_dnnl(a.dst_dtype, "conv2d (output)");
  MP_CHECK(a.n >= 0 && a.c > 0 && a.h > 0 && a.w > 0 && a.oc > 0 && a.kh > 0 && a.kw > 0,
           "conv2d: sizes must be positive (batch may be 0), got ", describe(a, pass));
  MP_CHECK(a.stride_h >= 1 && a.stride_w >= 1 && a.dil_h >= 1 && a.dil_w >= 1 && a.pad_h >= 0 && a.pad_w >= 0,
           "conv2d: strides and dilations must be >= 1 and padding >= 0, got ", describe(a, pass));
  MP_CHECK(a.groups >= 1 && a.c % a.groups == 0 && a.oc % a.groups == 0, "conv2d: channels (", a.c,
           ") and output channels (", a.oc, ") must be multiples of groups (", a.groups, ")");
  MP_CHECK(a.out_h() > 0 && a.out_w() > 0, "conv2d: the dilated kernel is larger than the padded input, got ",
           describe(a, pass), " (output ", a.out_h(), "x", a.out_w(), ")");
}

ConvKey make_key(const Conv2dArgs& a, ConvPass pass, bool bias) {
  // clang-format off
  return ConvKey{static_cast<int64_t>(pass),
                 a.n, a.c, a.h, a.w, a.oc, a.kh, a.kw, a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w,
                 a.groups, static_cast<int64_t>(a.src_dtype), static_cast<int64_t>(a.dst_dtype), bias ? 1 : 0,
                 a.channels_last ? 1 : 0};
  // clang-format on
}

// Weights [oc, c/groups, kh, kw], seen by oneDNN as goihw when grouped; plain (the caller's) or `any`.
memory::desc weights_md(const Conv2dArgs& a, memory::data_type dt, bool any) {
  if (a.groups == 1) return memory::desc({a.oc, a.c, a.kh, a.kw}, dt, any ? tag::any : tag::oihw);
  return memory::desc({a.groups, a.oc / a.groups, a.c / a.groups, a.kh, a.kw}, dt, any ? tag::any : tag::goihw);
}

PlanArg make_arg(int arg, const memory::desc& user_md, const memory::desc& prim_md, bool is_input,
                 const dnnl::primitive_attr& attr) {
  PlanArg p;
  p.arg = arg;
  p.user_md = user_md;
  p.prim_md = prim_md;
  p.needs_reorder = user_md != prim_md;
  if (p.needs_reorder) {
    const dnnl::engine& eng = onednn_engine();
    const dnnl::reorder::primitive_desc pd = is_input ? dnnl::reorder::primitive_desc(eng, user_md, eng, prim_md, attr)
                                                      : dnnl::reorder::primitive_desc(eng, prim_md, eng, user_md, attr);
    p.reorder = dnnl::reorder(pd);
    p.reorder_scratch_md = pd.scratchpad_desc();
  }
  return p;
}

ConvPlan build_plan(const Conv2dArgs& a, ConvPass pass, bool with_bias) {
  using dt = memory::data_type;
  // Compute dtypes: input, weight and (for the backward passes) diff_dst are computed in src_dtype; a
  // different caller dtype is converted by the reorder. Forward writes dst_dtype directly when it computes in
  // 16 bits (f32 compute with a 16-bit output is written f32 and converted by the reorder).
  const dt ct = to_dnnl(a.src_dtype);
  const dt fwd_dst = a.src_dtype != DType::f32 ? to_dnnl(a.dst_dtype) : dt::f32;
  const memory::dims strides{a.stride_h, a.stride_w}, dil{a.dil_h - 1, a.dil_w - 1}, pad{a.pad_h, a.pad_w};
  const memory::dims src_dims{a.n, a.c, a.h, a.w}, dst_dims{a.n, a.oc, a.out_h(), a.out_w()};
  // Note [convolution layouts]; with channels-last activations even 1x1 ones choose (plain NHWC with plain
  // OIHW weights has only the reference kernel: 100x slower).
  const bool choose = !use_plain_layout(a) || a.channels_last;
  const tag user_act = a.channels_last ? tag::nhwc : tag::nchw;
  const tag act = choose ? tag::any : user_act;
  const memory::desc prim_src(src_dims, ct, act), prim_wei = weights_md(a, ct, choose);
  const memory::desc bias_md({a.oc}, dt::f32, tag::a), no_bias;

  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::engine& eng = onednn_engine();
  auto fwd_pd = [&](dt dst_dt, bool bias, const dnnl::primitive_attr& at) {
    const memory::desc d(dst_dims, dst_dt, act);
    return dnnl::convolution_forward::primitive_desc(eng, dnnl::prop_kind::forward_training,
                                                     dnnl::algorithm::convolution_direct, prim_src, prim_wei,
                                                     bias ? bias_md : no_bias, d, strides, dil, pad, pad, at);
  };
  ConvPlan plan;
  const memory::desc user_src(src_dims, ct, user_act);
  const memory::desc user_dst(dst_dims, to_dnnl(a.dst_dtype), user_act);
  switch (pass) {
    case ConvPass::forward: {
      const auto pd = fwd_pd(fwd_dst, with_bias, attr);
      plan.prim = dnnl::convolution_forward(pd);
      plan.impl = pd.impl_info_str();
      plan.scratch_md = pd.scratchpad_desc();
      plan.in[0] = make_arg(DNNL_ARG_SRC, user_src, pd.src_desc(), true, attr);
      plan.in[1] = make_arg(DNNL_ARG_WEIGHTS, weights_md(a, ct, false), pd.weights_desc(), true, attr);
      plan.out = make_arg(DNNL_ARG_DST, user_dst, pd.dst_desc(), false, attr);
      if (with_bias) plan.bias_arg = DNNL_ARG_BIAS;
      break;
    }
    case ConvPass::backward_data: {
      if (bwd_data_as_forward(a)) {  // Note [backward data as a forward convolution]
        const memory::dims tpad{a.dil_h * (a.kh - 1) - a.pad_h, a.dil_w * (a.kw - 1) - a.pad_w};
        const memory::dims one{1, 1};
        const memory::desc s(dst_dims, ct, tag::any), w({a.c, a.oc, a.kh, a.kw}, ct, tag::any),
            d(src_dims, ct, tag::any);
        const dnnl::convolution_forward::primitive_desc pd(eng, dnnl::prop_kind::forward_training,
                                                           dnnl::algorithm::convolution_direct, s, w, no_bias, d, one,
                                                           dil, tpad, tpad, attr);
        plan.prim = dnnl::convolution_forward(pd);
        plan.impl = pd.impl_info_str();
        plan.scratch_md = pd.scratchpad_desc();
        plan.flip_weights = true;
        plan.in[0] = make_arg(DNNL_ARG_SRC, user_dst, pd.src_desc(), true, attr);
        // The flipped weights keep the caller's [O, C, kH, kW] memory order: as [C, O, kH, kW] that is iohw.
        plan.in[1] = make_arg(DNNL_ARG_WEIGHTS, memory::desc({a.c, a.oc, a.kh, a.kw}, ct, tag::iohw), pd.weights_desc(),
                              true, attr);
        plan.out = make_arg(DNNL_ARG_DST, user_src, pd.dst_desc(), false, attr);
        break;
      }
      const auto hint = fwd_pd(ct, false, dnnl::primitive_attr());
      const memory::desc diff_dst(dst_dims, ct, act);
      const dnnl::convolution_backward_data::primitive_desc pd(eng, dnnl::algorithm::convolution_direct, prim_src,
                                                               prim_wei, diff_dst, strides, dil, pad, pad, hint, attr);
      plan.prim = dnnl::convolution_backward_data(pd);
      plan.impl = pd.impl_info_str();
      plan.scratch_md = pd.scratchpad_desc();
      plan.in[0] = make_arg(DNNL_ARG_DIFF_DST, user_dst, pd.diff_dst_desc(), true, attr);
      plan.in[1] = make_arg(DNNL_ARG_WEIGHTS, weights_md(a, ct, false), pd.weights_desc(), true, attr);
      plan.out = make_arg(DNNL_ARG_DIFF_SRC, user_src, pd.diff_src_desc(), false, attr);
      break;
    }
    case ConvPass::backward_weights: {
      const auto hint = fwd_pd(ct, with_bias, dnnl::primitive_attr());
      const memory::desc diff_dst(dst_dims, ct, act);
      const memory::desc diff_wei = weights_md(a, dt::f32, choose);
      const dnnl::convolution_backward_weights::primitive_desc pd(eng, dnnl::algorithm::convolution_direct, prim_src,
                                                                  diff_wei, with_bias ? bias_md : no_bias, diff_dst,
                                                                  strides, dil, pad, pad, hint, attr);
      plan.prim = dnnl::convolution_backward_weights(pd);
      plan.impl = pd.impl_info_str();
      plan.scratch_md = pd.scratchpad_desc();
      plan.in[0] = make_arg(DNNL_ARG_SRC, user_src, pd.src_desc(), true, attr);
      plan.in[1] = make_arg(DNNL_ARG_DIFF_DST, user_dst, pd.diff_dst_desc(), true, attr);
      plan.out = make_arg(DNNL_ARG_DIFF_WEIGHTS, weights_md(a, dt::f32, false), pd.diff_weights_desc(), false, attr);
      if (with_bias) plan.bias_arg = DNNL_ARG_DIFF_BIAS;
      break;
    }
  }
  plan.bias_md = bias_md;
  plan.scratchpad_bytes = md_bytes(plan.scratch_md);
  for (const PlanArg* p : {&plan.in[0], &plan.in[1], &plan.out})
    plan.scratchpad_bytes = std::max(plan.scratchpad_bytes, md_bytes(p->reorder_scratch_md));
  record_onednn_impl(pass_name(pass), plan.impl);
  return plan;
}

std::shared_ptr<const ConvPlan> get_plan(const Conv2dArgs& a, ConvPass pass, bool with_bias) {
  return cache().get_or_create(make_key(a, pass, with_bias), [&] {
    return onednn_check(
        "dnnl::convolution (primitive creation)", [&] { return describe(a, pass); },
        [&] { return build_plan(a, pass, with_bias); });
  });
}

// Runs a plan: inputs are reordered into per-thread buffers where the primitive wants another layout or
// dtype, the output is written to a per-thread buffer and reordered into the caller's when needed.
// `prepared[i]`, when given, is input i already in the primitive's layout (no reorder).
void run_plan(const ConvPlan& plan, const Conv2dArgs& a, ConvPass pass, const void* in0, const void* in1, void* out,
              void* bias, const std::array<const void*, 2>& prepared = {nullptr, nullptr}) {
  onednn_check(
      "dnnl::convolution::execute", [&] { return describe(a, pass); },
      [&] {
        dnnl::stream& s = onednn_stream();
        void* scratch =
            plan.scratchpad_bytes > 0 ? thread_scratch(ScratchSlot::scratchpad, plan.scratchpad_bytes) : nullptr;
        auto run = [&](const dnnl::primitive& p, std::unordered_map<int, memory> args, const memory::desc& sp) {
          if (md_bytes(sp) > 0) args.emplace(DNNL_ARG_SCRATCHPAD, wrap_memory(sp, scratch));
          p.execute(s, args);
        };
        std::unordered_map<int, memory> args;
        const void* inputs[2] = {in0, in1};
        if (plan.flip_weights) {
          const int64_t taps = a.kh * a.kw, blocks = a.oc * a.c;
          void* flipped = thread_scratch(ScratchSlot::staging, md_bytes(plan.in[1].user_md));
          if (dtype_size(a.src_dtype) == 2)
            flip_taps(static_cast<const uint16_t*>(in1), static_cast<uint16_t*>(flipped), blocks, taps);
          else
            flip_taps(static_cast<const uint32_t*>(in1), static_cast<uint32_t*>(flipped), blocks, taps);
          inputs[1] = flipped;
        }
        const ScratchSlot slots[2] = {ScratchSlot::input0, ScratchSlot::input1};
        for (int i = 0; i < 2; ++i) {
          const PlanArg& p = plan.in[i];
          if (prepared[static_cast<size_t>(i)] != nullptr) {
            args.emplace(p.arg, wrap_memory(p.prim_md, prepared[static_cast<size_t>(i)]));
            continue;
          }
          if (!p.needs_reorder) {
            args.emplace(p.arg, wrap_memory(p.user_md, inputs[i]));
            continue;
          }
          memory m = wrap_memory(p.prim_md, thread_scratch(slots[i], md_bytes(p.prim_md)));
          run(p.reorder, {{DNNL_ARG_FROM, wrap_memory(p.user_md, inputs[i])}, {DNNL_ARG_TO, m}}, p.reorder_scratch_md);
          args.emplace(p.arg, m);
        }
        const memory out_user = wrap_memory(plan.out.user_md, out);
        const memory out_prim =
            plan.out.needs_reorder
                ? wrap_memory(plan.out.prim_md, thread_scratch(ScratchSlot::output, md_bytes(plan.out.prim_md)))
                : out_user;
        args.emplace(plan.out.arg, out_prim);
        if (plan.bias_arg != 0) args.emplace(plan.bias_arg, wrap_memory(plan.bias_md, bias));
        run(plan.prim, std::move(args), plan.scratch_md);
        if (plan.out.needs_reorder)
          run(plan.out.reorder, {{DNNL_ARG_FROM, out_prim}, {DNNL_ARG_TO, out_user}}, plan.out.reorder_scratch_md);
        s.wait();
      });
}

}  // namespace

int64_t Conv2dArgs::out_h() const {
  const int64_t span = h + 2 * pad_h - dil_h * (kh - 1) - 1;
  return span < 0 || stride_h < 1 ? 0 : span / stride_h + 1;
}

int64_t Conv2dArgs::out_w() const {
  const int64_t span = w + 2 * pad_w - dil_w * (kw - 1) - 1;
  return span < 0 || stride_w < 1 ? 0 : span / stride_w + 1;
}

void conv2d_forward(const Conv2dArgs& args, const void* src, const void* weight, const void* bias, void* dst) {
  validate(args, ConvPass::forward);
  if (args.n == 0) return;
  MP_CHECK(src != nullptr && weight != nullptr && dst != nullptr, "conv2d_forward: null input, weight or output");
  const auto plan = get_plan(args, ConvPass::forward, bias != nullptr);
  run_plan(*plan, args, ConvPass::forward, src, weight, dst, const_cast<void*>(bias));
}

void conv2d_backward_data(const Conv2dArgs& args, const void* diff_dst, const void* weight, void* diff_src) {
  validate(args, ConvPass::backward_data);
  if (args.n == 0) return;
  MP_CHECK(diff_dst != nullptr && weight != nullptr && diff_src != nullptr,
           "conv2d_backward_data: null diff_dst, weight or diff_src");
  const auto plan = get_plan(args, ConvPass::backward_data, false);
  run_plan(*plan, args, ConvPass::backward_data, diff_dst, weight, diff_src, nullptr);
}

void conv2d_backward_weights(const Conv2dArgs& args, const void* src, const void* diff_dst, void* diff_weight,
                             void* diff_bias) {
  validate(args, ConvPass::backward_weights);
  MP_CHECK(diff_weight != nullptr, "conv2d_backward_weights: diff_weight is null");
  if (args.n == 0) {  // no samples: the gradients are zero
    std::memset(diff_weight, 0, static_cast<size_t>(args.oc * (args.c / args.groups) * args.kh * args.kw) * 4);
    if (diff_bias != nullptr) std::memset(diff_bias, 0, static_cast<size_t>(args.oc) * 4);
    return;
  }
  MP_CHECK(src != nullptr && diff_dst != nullptr, "conv2d_backward_weights: null src or diff_dst");
  const auto plan = get_plan(args, ConvPass::backward_weights, diff_bias != nullptr);
  run_plan(*plan, args, ConvPass::backward_weights, src, diff_dst, diff_weight, diff_bias);
}

void conv2d_backward(const Conv2dArgs& args, const void* src, const void* diff_dst, const void* weight, void* diff_src,
                     void* diff_weight, void* diff_bias) {
  if (diff_src == nullptr || diff_weight == nullptr || args.n == 0) {
    if (diff_src != nullptr) conv2d_backward_data(args, diff_dst, weight, diff_src);
    if (diff_weight != nullptr) conv2d_backward_weights(args, src, diff_dst, diff_weight, diff_bias);
    return;
  }
  validate(args, ConvPass::backward_data);
  MP_CHECK(src != nullptr && diff_dst != nullptr && weight != nullptr, "conv2d_backward: null src, diff_dst or weight");
  const auto pd = get_plan(args, ConvPass::backward_data, false);
  const auto pw = get_plan(args, ConvPass::backward_weights, diff_bias != nullptr);
  const PlanArg& dd = pd->in[0];  // diff_dst of the data gradient (the src of its forward form)
  const PlanArg& dw = pw->in[1];  // diff_dst of the weight gradient
  if (!(dd.needs_reorder && dw.needs_reorder && dd.user_md == dw.user_md && dd.prim_md == dw.prim_md)) {
    run_plan(*pd, args, ConvPass::backward_data, diff_dst, weight, diff_src, nullptr);
    run_plan(*pw, args, ConvPass::backward_weights, src, diff_dst, diff_weight, diff_bias);
    return;
  }
  void* shared = thread_scratch(ScratchSlot::shared_input, md_bytes(dd.prim_md));
  onednn_check(
      "dnnl::reorder (convolution diff_dst)", [&] { return describe(args, ConvPass::backward_weights); },
      [&] {
        dnnl::stream& s = onednn_stream();
        std::unordered_map<int, memory> m{{DNNL_ARG_FROM, wrap_memory(dd.user_md, diff_dst)},
                                          {DNNL_ARG_TO, wrap_memory(dd.prim_md, shared)}};
        if (md_bytes(dd.reorder_scratch_md) > 0)
          m.emplace(DNNL_ARG_SCRATCHPAD,
                    wrap_memory(dd.reorder_scratch_md,
                                thread_scratch(ScratchSlot::scratchpad, md_bytes(dd.reorder_scratch_md))));
        dd.reorder.execute(s, m);
        s.wait();
      });
  run_plan(*pd, args, ConvPass::backward_data, diff_dst, weight, diff_src, nullptr, {shared, nullptr});
  run_plan(*pw, args, ConvPass::backward_weights, src, diff_dst, diff_weight, diff_bias, {nullptr, shared});
}

std::string conv2d_impl_info(const Conv2dArgs& args, ConvPass pass, bool with_bias) {
  validate(args, pass);
  MP_CHECK(args.n > 0, "conv2d_impl_info: an empty batch runs no primitive; pass n > 0");
  return get_plan(args, pass, with_bias && pass != ConvPass::backward_data)->impl;
}

CacheStats conv2d_cache_stats() { return cache().stats(); }

}  // namespace mp::backend::cpu

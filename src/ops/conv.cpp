// conv2d: argument checks, dtype promotion of input and weight, dispatch and autograd.
#include "mp/autocast/autocast.hpp"
#include "mp/ops/conv.hpp"

#include "backend/conv_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/reduce.hpp"

namespace mp {
namespace {

std::string pair_str(const std::array<int64_t, 2>& a) { return detail::str_cat("(", a[0], ", ", a[1], ")"); }

void check_conv_args(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& opt) {
  MP_CHECK(x.defined() && weight.defined(), "conv2d: got an undefined input or weight");
  MP_CHECK(x.device() == weight.device() && (!bias.defined() || bias.device() == x.device()),
           "conv2d: input, weight and bias must be on one device, got input on ", x.device().str(), ", weight on ",
           weight.device().str(), bias.defined() ? ", bias on " + bias.device().str() : std::string());
  MP_CHECK(is_floating(x.dtype()) && is_floating(weight.dtype()) && (!bias.defined() || is_floating(bias.dtype())),
           "conv2d: expected floating tensors (f32, f64, f16, bf16), got input ", x.describe(), ", weight ",
           weight.describe(), bias.defined() ? ", bias " + bias.describe() : std::string(),
           "; convert with .to(mp::DType::f32)");
  MP_CHECK(x.dim() == 4, "conv2d: expected input [N, C, H, W] (4 dims), got ", x.describe(),
           x.dim() == 3 ? "; add a batch dim with unsqueeze(0)" : "");
  MP_CHECK(weight.dim() == 4, "conv2d: expected weight [out_channels, in_channels/groups, kH, kW] (4 dims), got ",
           weight.describe());
  MP_CHECK(opt.stride[0] >= 1 && opt.stride[1] >= 1 && opt.dilation[0] >= 1 && opt.dilation[1] >= 1 &&
               opt.padding[0] >= 0 && opt.padding[1] >= 0,
           "conv2d: expected stride >= 1, dilation >= 1 and padding >= 0, got stride=", pair_str(opt.stride),
           " dilation=", pair_str(opt.dilation), " padding=", pair_str(opt.padding));
  const int64_t C = x.size(1), O = weight.size(0), g = opt.groups;
  MP_CHECK(g >= 1, "conv2d: expected groups >= 1, got ", g);
  MP_CHECK(C % g == 0, "conv2d: input channels (", C, ") must be divisible by groups (", g, "), got input ",
           x.describe());
  MP_CHECK(O % g == 0, "conv2d: output channels (weight.size(0) = ", O, ") must be divisible by groups (", g,
           "), got weight ", weight.describe());
  MP_CHECK(weight.size(1) * g == C, "conv2d: expected weight [", O, ", ", C / g, ", kH, kW] for input channels ", C,
           " and groups ", g, " (weight.size(1) * groups == C), got weight ", weight.describe(), " with input ",
           x.describe());
  MP_CHECK(weight.size(2) > 0 && weight.size(3) > 0 && O > 0, "conv2d: expected a non-empty kernel, got weight ",
           weight.describe());
  MP_CHECK(x.size(2) > 0 && x.size(3) > 0 && C > 0, "conv2d: expected non-empty channels and spatial dims, got input ",
           x.describe());
  MP_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == O), "conv2d: expected bias [", O, "], got ",
           bias.describe());
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& opt) {
  MP_AUTOCAST(amp::Op::conv2d, conv2d, x, x, weight, bias, opt);
  check_conv_args(x, weight, bias, opt);
  const backend::Conv2dGeometry geo{opt.stride, opt.padding, opt.dilation, opt.groups};
  const int64_t N = x.size(0), O = weight.size(0), kh = weight.size(2), kw = weight.size(3);
  const int64_t oh = backend::conv_out_size(x.size(2), kh, opt.stride[0], opt.padding[0], opt.dilation[0]);
  const int64_t ow = backend::conv_out_size(x.size(3), kw, opt.stride[1], opt.padding[1], opt.dilation[1]);
  MP_CHECK(oh > 0 && ow > 0, "conv2d: expected an output of at least 1x1, got ", oh, "x", ow, " for input ",
           x.describe(), ", kernel ", kh, "x", kw, ", padding=", pair_str(opt.padding),
           ", dilation=", pair_str(opt.dilation),
           " (the dilated kernel is larger than the padded input); pad the input or use a "
           "smaller kernel");
  // Input and weight compute in one dtype (the wider); bias keeps its dtype (oneDNN reads it as f32).
  const DType dt = promote_types(x.dtype(), weight.dtype());
  const Tensor xc = x.to(dt), wc = weight.to(dt);
  // A channels-last input gives a channels-last output (and gradient): oneDNN's and cuDNN's fast kernels work
  // in NHWC (Note [channels-last convolutions] in backend/conv_kernels.hpp).
  const MemoryFormat fmt = x.suggest_memory_format();
  Tensor out = empty({N, O, oh, ow}, {.dtype = dt, .device = x.device(), .memory_format = fmt});
  {
    autograd::NoGradGuard ng;
    backend::conv2d_forward_kernel.get(x.device())(out, xc.detach(), wc.detach(),
                                                   bias.defined() ? bias.detach() : Tensor(), geo);
  }
  const std::vector<Tensor> inputs{xc, wc, bias};
  if (autograd::any_requires_grad(inputs)) {
    const bool need_x = xc.requires_grad(), need_w = wc.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    // Capture only what the needed gradients read: dx needs the weight, dweight needs the input.
    const Tensor xd = need_w ? xc.detach() : Tensor(), wd = need_x ? wc.detach() : Tensor();
    const Shape xs = xc.sizes(), ws = wc.sizes();
    const Device dev = x.device();
    autograd::record("Conv2dBackward", inputs, {out}, [=](const std::vector<Tensor>& g) {
      const Tensor gy = g[0].to(dt);
      Tensor gx, gw, gb;
      if (need_x) gx = empty(xs, {.dtype = dt, .device = dev, .memory_format = fmt});
      // dweight (and dbias with it) come out in f32 (f64 for f64); the engine casts them to the parameters' dtypes.
      const DType acc = dt == DType::f64 ? DType::f64 : DType::f32;
      if (need_w) {
        gw = empty(ws, {.dtype = acc, .device = dev});
        if (need_b) gb = empty({O}, {.dtype = acc, .device = dev});
      }
      if (need_x || need_w) backend::conv2d_backward_kernel.get(dev)(gx, gw, gb, xd, gy, wd, geo);
      if (!need_w && need_b) gb = sum(gy.to(acc), {0, 2, 3});
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  return out;
}

}  // namespace mp

// max_pool2d, avg_pool2d, adaptive_avg_pool2d: argument checks (PyTorch's rules), output sizes, dispatch and
// autograd.
#include <limits>

#include "backend/pool_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/pool.hpp"

namespace mp {
namespace {

std::string pair_str(const std::array<int64_t, 2>& a) { return detail::str_cat("(", a[0], ", ", a[1], ")"); }

void check_pool_input(const Tensor& x, const char* op) {
  MP_CHECK(x.defined(), op, ": got an undefined input");
  MP_CHECK(x.dim() == 4, op, ": expected input [N, C, H, W] (4 dims), got ", x.describe(),
           x.dim() == 3 ? "; add a batch dim with unsqueeze(0)" : "");
  MP_CHECK(is_floating(x.dtype()), op, ": expected a floating input (f32, f64, f16, bf16), got ", x.describe(),
           "; convert with .to(mp::DType::f32)");
  MP_CHECK(x.size(1) > 0 && x.size(2) > 0 && x.size(3) > 0, op,
           ": expected non-empty channels and spatial dims, got input ", x.describe());
}

// Resolves stride 0 to the kernel, checks the window (PyTorch: padding at most half the kernel) and returns the
// window and the output [N, C, oh, ow].
std::pair<backend::Pool2dWindow, Shape> pool_geometry(const Tensor& x, const Pool2dOptions& opt, const char* op) {
  check_pool_input(x, op);
  backend::Pool2dWindow w;
  w.kernel = opt.kernel;
  w.padding = opt.padding;
  for (int d = 0; d < 2; ++d) w.stride[d] = opt.stride[d] == 0 ? opt.kernel[d] : opt.stride[d];
  MP_CHECK(w.kernel[0] > 0 && w.kernel[1] > 0 && w.stride[0] > 0 && w.stride[1] > 0, op,
           ": expected a positive kernel and stride (stride 0 = kernel), got kernel=", pair_str(opt.kernel),
           " stride=", pair_str(opt.stride));
  MP_CHECK(w.padding[0] >= 0 && w.padding[1] >= 0 && w.padding[0] <= w.kernel[0] / 2 && w.padding[1] <= w.kernel[1] / 2,
           op, ": expected padding between 0 and half the kernel size, got padding=", pair_str(opt.padding),
           " with kernel=", pair_str(opt.kernel));
  const int64_t H = x.size(2), W = x.size(3);
  const int64_t oh = backend::pool_out_size(H, w.kernel[0], w.stride[0], w.padding[0], opt.ceil_mode);
  const int64_t ow = backend::pool_out_size(W, w.kernel[1], w.stride[1], w.padding[1], opt.ceil_mode);
  MP_CHECK(oh > 0 && ow > 0, op, ": output size is too small: input ", x.describe(),
           " with kernel=", pair_str(w.kernel), " stride=", pair_str(w.stride), " padding=", pair_str(w.padding),
           opt.ceil_mode ? " ceil_mode" : "", " gives ", oh, "x", ow, "; use a smaller kernel or more padding");
  return {w, Shape{x.size(0), x.size(1), oh, ow}};
}

}  // namespace

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& opt) {
  const auto [win, out_shape] = pool_geometry(x, opt, "max_pool2d");
  const Tensor xd = x.detach().contiguous();
  const Device dev = x.device();
  Tensor out = empty(out_shape, {.dtype = x.dtype(), .device = dev});
  // Indices are offsets inside one H*W plane: i32 unless a plane is larger than 2^31 - 1 elements.
  const DType idx_dt = x.size(2) * x.size(3) <= std::numeric_limits<int32_t>::max() ? DType::i32 : DType::i64;
  Tensor indices = empty(out_shape, {.dtype = idx_dt, .device = dev});
  {
    autograd::NoGradGuard ng;
    backend::max_pool2d_forward_kernel.get(dev)(out, indices, xd, win);
  }
  if (autograd::any_requires_grad({&x})) {
    const Shape xs = x.sizes();
    const DType dt = x.dtype();
    autograd::record("MaxPool2dBackward", {x}, {out}, [indices, xs, dt, dev](const std::vector<Tensor>& g) {
      Tensor gx = empty(xs, {.dtype = dt, .device = dev});
      backend::max_pool2d_backward_kernel.get(dev)(gx, g[0].to(dt).contiguous(), indices);
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& opt) {
  const auto [win, out_shape] = pool_geometry(x, opt, "avg_pool2d");
  const Device dev = x.device();
  Tensor out = empty(out_shape, {.dtype = x.dtype(), .device = dev});
  const bool cip = opt.count_include_pad;
  {
    autograd::NoGradGuard ng;
    backend::avg_pool2d_forward_kernel.get(dev)(out, x.detach().contiguous(), win, cip);
  }
  if (autograd::any_requires_grad({&x})) {
    const Shape xs = x.sizes();
    const DType dt = x.dtype();
    const backend::Pool2dWindow w = win;
    autograd::record("AvgPool2dBackward", {x}, {out}, [w, cip, xs, dt, dev](const std::vector<Tensor>& g) {
      Tensor gx = empty(xs, {.dtype = dt, .device = dev});
      backend::avg_pool2d_backward_kernel.get(dev)(gx, g[0].to(dt).contiguous(), w, cip);
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size) {
  check_pool_input(x, "adaptive_avg_pool2d");
  MP_CHECK(output_size[0] > 0 && output_size[1] > 0, "adaptive_avg_pool2d: expected a positive output size, got ",
           pair_str(output_size));
  const Device dev = x.device();
  Tensor out = empty({x.size(0), x.size(1), output_size[0], output_size[1]}, {.dtype = x.dtype(), .device = dev});
  {
    autograd::NoGradGuard ng;
    backend::adaptive_avg_pool2d_forward_kernel.get(dev)(out, x.detach().contiguous());
  }
  if (autograd::any_requires_grad({&x})) {
    const Shape xs = x.sizes();
    const DType dt = x.dtype();
    autograd::record("AdaptiveAvgPool2dBackward", {x}, {out}, [xs, dt, dev](const std::vector<Tensor>& g) {
      Tensor gx = empty(xs, {.dtype = dt, .device = dev});
      backend::adaptive_avg_pool2d_backward_kernel.get(dev)(gx, g[0].to(dt).contiguous());
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

}  // namespace mp

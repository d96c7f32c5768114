// Softmax and log-softmax along any dim: argument checks, dispatch to the fused kernels, autograd.
#include "mp/autocast/autocast.hpp"
#include "mp/ops/softmax.hpp"

#include <algorithm>

#include "backend/softmax_kernels.hpp"
#include "mp/autograd/node.hpp"

namespace mp {

namespace {

// [outer, n, inner] around `dim` of a shape (a 0-dim tensor is one row of one element).
backend::SoftmaxShape softmax_shape(const Shape& sizes, int64_t dim) {
  backend::SoftmaxShape s;
  for (int64_t i = 0; i < static_cast<int64_t>(sizes.size()); ++i) {
    if (i < dim)
      s.outer *= sizes[i];
    else if (i == dim)
      s.n = sizes[i];
    else
      s.inner *= sizes[i];
  }
  return s;
}

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  MP_CHECK(x.defined(), name, ": got an undefined tensor");
  MP_CHECK(is_floating(x.dtype()), name, ": expected a floating tensor (f32, f64, f16, bf16), got ", x.describe(),
           "; convert with .to(mp::DType::f32)");
  dim = wrap_dim(dim, std::max<int64_t>(x.dim(), 1), name);  // a 0-dim tensor accepts dim 0 / -1, like PyTorch
  const backend::SoftmaxShape s = softmax_shape(x.sizes(), dim);
  Tensor xc = x.detach().contiguous();
  Tensor out = empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()});
  backend::softmax_kernel.get(x.device())(log, out, xc, s);
  if (autograd::any_requires_grad({&x})) {
    Tensor y = out.detach();
    autograd::record(log ? "LogSoftmaxBackward" : "SoftmaxBackward", {x}, {out},
                     [y, s, log](const std::vector<Tensor>& g) {
                       Tensor gi = empty(y.sizes(), {.dtype = y.dtype(), .device = y.device()});
                       backend::softmax_backward_kernel.get(y.device())(log, gi, g[0].contiguous(), y, s);
                       return std::vector<Tensor>{gi};
                     });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  MP_AUTOCAST(amp::Op::softmax, softmax, x, x, dim);
  return softmax_impl(x, dim, false);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  MP_AUTOCAST(amp::Op::log_softmax, log_softmax, x, x, dim);
  return softmax_impl(x, dim, true);
}

}  // namespace mp

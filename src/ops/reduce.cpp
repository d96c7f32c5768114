// Reductions: sum, mean, var, amax/amin, max with indices, argmax, sum_to_size.
#include "mp/autocast/autocast.hpp"
#include "mp/ops/reduce.hpp"

#include <algorithm>
#include <numeric>

#include "backend/reduce_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/pointwise.hpp"

namespace mp {

using backend::ReduceOp;

namespace {

// Normalised, sorted, unique dims; empty `dims` means all.
std::vector<bool> dim_mask(const Tensor& x, const Shape& dims, const char* op) {
  std::vector<bool> m(static_cast<size_t>(x.dim()), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, x.dim(), op);
    MP_CHECK(!m[w] || dims.empty(), op, ": dim ", d, " appears twice in ", shape_str(dims));
    m[w] = true;
  }
  return m;
}

Shape kept_shape(const Tensor& x, const std::vector<bool>& mask, bool keepdim) {
  Shape s;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (!mask[i])
      s.push_back(x.sizes()[i]);
    else if (keepdim)
      s.push_back(1);
  }
  return s;
}

// Run a reduction kernel: permute to [kept..., reduced...] (a view) and reduce.
Tensor reduce_values(ReduceOp op, const Tensor& x, const std::vector<bool>& mask, bool keepdim) {
  Shape perm;
  int64_t nred = 0;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (!mask[i]) perm.push_back(i);
  for (int64_t i = 0; i < x.dim(); ++i)
    if (mask[i]) {
      perm.push_back(i);
      ++nred;
    }
  Tensor xv = x.detach().permute(perm);
  Tensor out = empty(kept_shape(x, mask, false), {.dtype = x.dtype(), .device = x.device()});
  backend::reduce_kernel.get(x.device())(op, out, xv, nred);
  if (keepdim) out = out.view(kept_shape(x, mask, true));
  return out;
}

int64_t reduced_count(const Tensor& x, const std::vector<bool>& mask) {
  int64_t n = 1;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (mask[i]) n *= x.sizes()[i];
  return n;
}

// Grad of a reduction: reshape g to keepdim form and expand back to x's shape.
Tensor expand_back(const Tensor& g, const Shape& keep_shape, const Shape& x_shape) {
  return g.reshape(keep_shape).expand(x_shape);
}

Tensor sum_impl(const Tensor& x, const std::vector<bool>& mask, bool keepdim) {
  MP_CHECK(x.defined(), "sum: got an undefined tensor");
  Tensor out = reduce_values(ReduceOp::sum, x, mask, keepdim);
  Shape ks = kept_shape(x, mask, true), xs = x.sizes();
  autograd::record("SumBackward", {x}, {out}, [ks, xs](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{expand_back(g[0], ks, xs).contiguous()};
  });
  return out;
}

Tensor extreme_impl(bool is_max, const Tensor& x, const std::vector<bool>& mask, bool keepdim) {
  Tensor out = reduce_values(is_max ? ReduceOp::max : ReduceOp::min, x, mask, keepdim);
  if (autograd::any_requires_grad({&x})) {
    Shape ks = kept_shape(x, mask, true), xs = x.sizes();
    Tensor xd = x.detach(), od = out.detach();
    autograd::record(is_max ? "AmaxBackward" : "AminBackward", {x}, {out},
                     [ks, xs, xd, od, mask](const std::vector<Tensor>& g) {
                       // Ties share the gradient evenly (torch.amax semantics).
                       Tensor hit = eq(xd, expand_back(od, ks, xs)).to(g[0].dtype());
                       Tensor count = sum_impl(hit, mask, true);
                       return std::vector<Tensor>{mul(div(expand_back(g[0], ks, xs), count.expand(xs)), hit)};
                     });
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) {
  MP_AUTOCAST(amp::Op::sum, sum, x, x);
  return sum_impl(x, dim_mask(x, {}, "sum"), false);
}
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim) {
  MP_AUTOCAST(amp::Op::sum, sum, x, x, dims, keepdim);
  return sum_impl(x, dim_mask(x, dims, "sum"), keepdim);
}

Tensor sum_squares(const Tensor& x) {
  MP_CHECK(x.defined(), "sum_squares: got an undefined tensor");
  MP_CHECK(is_floating(x.dtype()), "sum_squares: expected a floating tensor, got ", x.describe());
  const DType acc = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = empty({}, {.dtype = acc, .device = x.device()});
  backend::reduce_kernel.get(x.device())(ReduceOp::sum_squares, out, x.detach(), x.dim());
  if (autograd::any_requires_grad({&x})) {
    const Tensor xd = x.detach();
    autograd::record("SumSquaresBackward", {x}, {out},
                     [xd](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(xd, mul(g[0], 2.0))}; });
  }
  return out;
}

Tensor mean(const Tensor& x) { return mean(x, {}, false); }
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim) {
  MP_AUTOCAST(amp::Op::mean, mean, x, x, dims, keepdim);
  MP_CHECK(is_floating(x.dtype()), "mean: expected a floating tensor, got ", x.describe());
  auto mask = dim_mask(x, dims, "mean");
  const int64_t n = reduced_count(x, mask);
  return mul(sum_impl(x, mask, keepdim),
             n > 0 ? 1.0 / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN());
}

Tensor var(const Tensor& x, const Shape& dims, int64_t correction, bool keepdim) {
  MP_AUTOCAST(amp::Op::var, var, x, x, dims, correction, keepdim);
  MP_CHECK(is_floating(x.dtype()), "var: expected a floating tensor, got ", x.describe());
  auto mask = dim_mask(x, dims, "var");
  const int64_t n = reduced_count(x, mask);
  // Two-pass: mean first, then squared deviations (stable; low precision computes in f32 via the loops).
  Tensor m = mean(x, dims, true);
  Tensor d = sub(x, m);
  const double denom = static_cast<double>(std::max<int64_t>(n - correction, 0));
  return mul(sum_impl(square(d), mask, keepdim), denom > 0 ? 1.0 / denom : std::numeric_limits<double>::infinity());
}

Tensor amax(const Tensor& x, const Shape& dims, bool keepdim) {
  return extreme_impl(true, x, dim_mask(x, dims, "amax"), keepdim);
}
Tensor amin(const Tensor& x, const Shape& dims, bool keepdim) {
  return extreme_impl(false, x, dim_mask(x, dims, "amin"), keepdim);
}
Tensor max(const Tensor& x) { return extreme_impl(true, x, dim_mask(x, {}, "max"), false); }

std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim) {
  dim = wrap_dim(dim, x.dim(), "max");
  Tensor xv = x.detach();
  if (x.dim() == 0) xv = xv.reshape({1});
  Shape perm;
  for (int64_t i = 0; i < xv.dim(); ++i)
    if (i != dim) perm.push_back(i);
  perm.push_back(dim);
  Tensor xp = xv.permute(perm);
  Shape ks(xp.sizes().begin(), xp.sizes().end() - 1);
  Tensor values = empty(ks, {.dtype = x.dtype(), .device = x.device()});
  Tensor indices = empty(ks, {.dtype = DType::i64, .device = x.device()});
  backend::arg_reduce_kernel.get(x.device())(true, values, indices, xp);
  Shape keep_shape = x.sizes();
  if (x.dim() > 0) keep_shape[dim] = 1;
  if (keepdim) {
    values = values.view(keep_shape);
    indices = indices.view(keep_shape);
  }
  if (autograd::any_requires_grad({&x})) {
    Shape xs = x.sizes();
    Tensor idx = indices.reshape(keep_shape);
    DType dt = x.dtype();
    autograd::record("MaxBackward", {x}, {values}, [xs, idx, keep_shape, dim, dt](const std::vector<Tensor>& g) {
      // Scatter g to the arg-max positions: one-hot along dim.
      Tensor pos = arange(xs.empty() ? 1 : xs[dim], {.dtype = DType::i64, .device = g[0].device()});
      Shape ps(xs.size(), 1);
      if (!xs.empty()) ps[dim] = xs[dim];
      Tensor onehot = eq(pos.reshape(ps), idx).to(dt);
      return std::vector<Tensor>{mul(onehot, g[0].reshape(keep_shape))};
    });
  }
  return {values, indices};
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  autograd::NoGradGuard ng;
  return max(x, dim, keepdim).second;
}

Tensor sum_to_size(const Tensor& x, const Shape& shape) {
  if (x.sizes() == shape) return x;
  MP_CHECK(shape.size() <= x.sizes().size(), "sum_to_size: cannot reduce ", shape_str(x.sizes()), " to ",
           shape_str(shape));
  const size_t lead = x.sizes().size() - shape.size();
  Shape dims;
  for (size_t i = 0; i < x.sizes().size(); ++i) {
    if (i < lead) {
      dims.push_back(static_cast<int64_t>(i));
    } else if (shape[i - lead] == 1 && x.sizes()[i] != 1) {
      dims.push_back(static_cast<int64_t>(i));
    } else {
      MP_CHECK(shape[i - lead] == x.sizes()[i], "sum_to_size: ", shape_str(x.sizes()), " is not expandable from ",
               shape_str(shape));
    }
  }
  if (dims.empty()) return x.reshape(shape);
  return sum(x, dims, true).reshape(shape);
}

}  // namespace mp

// matmul, bmm, linear: shape logic, broadcasting of batch dims, dispatch and autograd.
#include "mp/autocast/autocast.hpp"
#include "mp/ops/linalg.hpp"

#include "backend/linalg_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/reduce.hpp"
#include "ops/pointwise_internal.hpp"

namespace mp {
namespace {

void check_operands(const Tensor& a, const Tensor& b, const char* op) {
  MP_CHECK(a.defined() && b.defined(), op, ": got an undefined tensor");
  MP_CHECK(a.device() == b.device(), op, ": operands on ", a.device().str(), " and ", b.device().str());
  MP_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()), op, ": expected floating tensors, got ", a.describe(),
           " and ", b.describe());
}

// [B, m, k] x [B, k, n] -> [B, m, n] without autograd; a/b batch may be 1 (broadcast).
Tensor mm3(const Tensor& a, const Tensor& b, const Tensor& bias = Tensor(),
           backend::MatmulEpilogue epilogue = backend::MatmulEpilogue::none) {
  const int64_t B = std::max(a.size(0), b.size(0));
  Tensor out = empty({B, a.size(1), b.size(2)}, {.dtype = a.dtype(), .device = a.device()});
  backend::matmul_kernel.get(a.device())(out, a, b, bias, false, epilogue);
  return out;
}

// Values of matmul for a, b of dims >= 2 with equal dtype, without autograd.
Tensor matmul_values(const Tensor& a, const Tensor& b) {
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  MP_CHECK(b.size(-2) == k, "matmul: inner dims differ: ", a.describe(), " x ", b.describe(), " (", k, " vs ",
           b.size(-2), ")");
  Shape ba(a.sizes().begin(), a.sizes().end() - 2), bb(b.sizes().begin(), b.sizes().end() - 2);
  Shape batch = broadcast_shapes(ba, bb, "matmul");
  Shape out_shape = batch;
  out_shape.push_back(m);
  out_shape.push_back(n);
  const int64_t nb = shape_numel(batch);
  if (bb.empty() || shape_numel(bb) == 1) {
    // [..., m, k] x [k, n]: fold a's batch into the rows (one GEMM).
    Tensor a2 = a.expand([&] {
                   Shape s = batch;
                   s.push_back(m);
                   s.push_back(k);
                   return s;
                 }())
                    .reshape({1, nb * m, k});
    Tensor b2 = b.reshape({1, k, n});
    return mm3(a2, b2).view(out_shape);
  }
  Shape sa = batch, sb = batch;
  sa.insert(sa.end(), {m, k});
  sb.insert(sb.end(), {k, n});
  Tensor a3 = shape_numel(ba) == 1 ? a.reshape({1, m, k}) : a.expand(sa).reshape({nb, m, k});
  Tensor b3 = b.expand(sb).reshape({nb, k, n});
  return mm3(a3, b3).view(out_shape);
}

}  // namespace

Tensor matmul(const Tensor& a0, const Tensor& b0) {
  MP_AUTOCAST(amp::Op::matmul, matmul, a0, a0, b0);
  check_operands(a0, b0, "matmul");
  MP_CHECK(a0.dim() >= 1 && b0.dim() >= 1, "matmul: expected tensors with at least 1 dim, got ", a0.describe(), " and ",
           b0.describe());
  // 1-D operands: promote to matrices and squeeze the added dims at the end (PyTorch semantics).
  const DType dt = promote_types(a0.dtype(), b0.dtype());
  Tensor a = a0.to(dt), b = b0.to(dt);
  const bool a1 = a.dim() == 1, b1 = b.dim() == 1;
  if (a1) a = a.unsqueeze(0);
  if (b1) b = b.unsqueeze(1);
  Tensor out;
  {
    autograd::NoGradGuard ng;
    out = matmul_values(a.detach(), b.detach());
  }
  if (autograd::any_requires_grad({&a, &b})) {
    Tensor ad = a.requires_grad() || b.requires_grad() ? a.detach() : Tensor();
    Tensor bd = b.detach();
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    Shape sa = a.sizes(), sb = b.sizes();
    autograd::record("MatmulBackward", {a, b}, {out}, [ad, bd, need_a, need_b, sa, sb](const std::vector<Tensor>& g) {
      Tensor ga, gb;
      if (need_a) ga = sum_to_size(matmul_values(g[0], bd.transpose(-1, -2)), sa);
      if (need_b) gb = sum_to_size(matmul_values(ad.transpose(-1, -2), g[0]), sb);
      return std::vector<Tensor>{ga, gb};
    });
  }
  if (a1) out = out.squeeze(-2);
  if (b1) out = out.squeeze(-1);
  return out;
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  MP_AUTOCAST(amp::Op::bmm, bmm, a, a, b);
  check_operands(a, b, "bmm");
  MP_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0), "bmm: expected [B, n, k] and [B, k, m], got ",
           a.describe(), " and ", b.describe());
  return matmul(a, b);
}

namespace {

// linear and linear_relu: y = epilogue(x W^T + b); the backward masks the gradient with y > 0 first
// when the ReLU was fused.
// Not fused (deliberately): GELU, since mp::gelu is the exact erf form (PyTorch's default) and cuBLASLt's GELU
// epilogues use the tanh approximation (different values; the wrapper in backend/cuda/cublaslt.hpp offers them
// for callers that want it); and the bias gradient, which stays one column-sum kernel beside the weight-gradient
// GEMM on both backends (cuBLASLt's BGRADB epilogue would save that one pass over g; to be weighed on a GPU).
Tensor linear_impl(const Tensor& x, const Tensor& w, const Tensor& bias, bool relu) {
  const char* name = relu ? "linear_relu" : "linear";
  check_operands(x, w, name);
  MP_CHECK(w.dim() == 2, name, ": expected weight [out, in], got ", w.describe());
  MP_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1), name, ": input ", x.describe(), " has ", x.dim() ? x.size(-1) : 0,
           " features, weight expects ", w.size(1));
  MP_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == w.size(0)), name, ": expected bias [", w.size(0),
           "], got ", bias.describe());
  const DType dt = promote_types(x.dtype(), w.dtype());
  Tensor xc = x.to(dt), wc = w.to(dt);
  const int64_t in = w.size(1), outf = w.size(0);
  Shape out_shape = x.sizes();
  out_shape.back() = outf;
  const int64_t rows = shape_numel(Shape(x.sizes().begin(), x.sizes().end() - 1));  // also when in == 0
  Tensor out;
  {
    autograd::NoGradGuard ng;
    Tensor x2 = xc.detach().reshape({1, rows, in});
    Tensor wt = wc.detach().t().unsqueeze(0);  // [1, in, out] strided view of W: no copy
    out = mm3(x2, wt, bias.defined() ? bias.detach() : Tensor(),
              relu ? backend::MatmulEpilogue::relu : backend::MatmulEpilogue::none)
              .view(out_shape);
  }
  std::vector<Tensor> inputs{xc, wc, bias};
  if (autograd::any_requires_grad(inputs)) {
    Tensor xd = xc.detach(), wd = wc.detach();
    Tensor od = relu ? out.detach() : Tensor();
    const bool need_x = xc.requires_grad(), need_w = wc.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    Shape xs = xc.sizes();
    autograd::record(relu ? "LinearReluBackward" : "LinearBackward", inputs, {out}, [=](const std::vector<Tensor>& g) {
      Tensor gy = relu ? detail::relu_backward_from_output(g[0], od) : g[0];
      Tensor g2 = gy.reshape({1, rows, outf});
      Tensor gx, gw, gb;
      if (need_x) gx = mm3(g2, wd.unsqueeze(0)).view(xs);                                    // g W
      if (need_w) gw = mm3(g2.transpose(1, 2), xd.reshape({1, rows, in})).view({outf, in});  // g^T x
      if (need_b) gb = sum(g2.view({rows, outf}), {0});
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  return out;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  MP_AUTOCAST(amp::Op::linear, linear, x, x, w, bias);
  return linear_impl(x, w, bias, false);
}

Tensor linear_relu(const Tensor& x, const Tensor& w, const Tensor& bias) {
  MP_AUTOCAST(amp::Op::linear, linear_relu, x, x, w, bias);
  return linear_impl(x, w, bias, true);
}

}  // namespace mp

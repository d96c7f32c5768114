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

// Note [linear through f32]
// Where the device computes a 16-bit GEMM by widening its operands to f32 (backend::matmul_compute_dtype: the CPU
// for f16, and for bf16 where that path is chosen), each of linear's three GEMMs would widen its own operands: the
// weight twice a step (forward, data gradient) and the output gradient twice (data and weight gradients). linear
// widens each once instead: the weight in the forward, kept for the backward (an f32 copy of the weight held from
// forward to backward, 4 bytes a parameter, only on such devices), the output gradient once in the backward. The
// products are the kernel's own (the same f32 operands in the same layouts, one rounding of each result), so the
// values are bit for bit those of the kernel's path (tests/ops/test_linalg.cpp). Casts were 6% of a bf16 LSTM
// step on Zen 3, the word LM's decoder weight and its [T*B, V] gradient the largest of them (bench/RESULTS.md).
struct LinearGemms {
  bool forward = false;   // the forward GEMM goes through f32
  bool backward = false;  // both gradient GEMMs go through f32
};

LinearGemms linear_through_f32(DType dt, Device dev, int64_t rows, int64_t in, int64_t outf, bool grad) {
  auto* const compute = backend::matmul_compute_dtype.find(dev.type);
  if (compute == nullptr || !is_low_precision(dt) || rows == 0 || in == 0 || outf == 0) return {};
  auto f32 = [&](int64_t m, int64_t n, int64_t k, bool a_cm, bool b_cm) {
    return compute(dt, dt, 1, m, n, k, a_cm, b_cm) == DType::f32;
  };
  return {.forward = f32(rows, outf, in, false, true),
          .backward = grad && f32(rows, in, outf, false, false) && f32(outf, in, rows, true, false)};
}

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
  std::vector<Tensor> inputs{xc, wc, bias};
  const bool grad = autograd::any_requires_grad(inputs);
  // Contiguous operands only: their f32 copies then have the layouts the kernel's own widening gives them.
  const LinearGemms f32 = xc.is_contiguous() && wc.is_contiguous()
                              ? linear_through_f32(dt, xc.device(), rows, in, outf, grad)
                              : LinearGemms{};
  const auto epilogue = relu ? backend::MatmulEpilogue::relu : backend::MatmulEpilogue::none;
  Tensor out, w32;  // w32: the widened weight (Note [linear through f32])
  {
    autograd::NoGradGuard ng;
    Tensor x2 = xc.detach().reshape({1, rows, in});
    if (f32.forward) {
      w32 = wc.detach().to(DType::f32);
      out = mm3(x2.to(DType::f32), w32.t().unsqueeze(0), bias.defined() ? bias.detach().to(DType::f32) : Tensor(),
                epilogue)
                .to(dt)
                .view(out_shape);
    } else {
      Tensor wt = wc.detach().t().unsqueeze(0);  // [1, in, out] strided view of W: no copy
      out = mm3(x2, wt, bias.defined() ? bias.detach() : Tensor(), epilogue).view(out_shape);
    }
  }
  if (grad) {
    Tensor xd = xc.detach(), wd = wc.detach();
    if (f32.backward && xc.requires_grad() && !w32.defined()) w32 = wd.to(DType::f32);
    Tensor od = relu ? out.detach() : Tensor();
    const bool need_x = xc.requires_grad(), need_w = wc.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    const bool through_f32 = f32.backward;
    if (through_f32) wd = need_x ? w32 : Tensor();  // the f32 copy serves the data gradient; w itself is not needed
    Shape xs = xc.sizes();
    autograd::record(relu ? "LinearReluBackward" : "LinearBackward", inputs, {out}, [=](const std::vector<Tensor>& g) {
      Tensor gy = relu ? detail::relu_backward_from_output(g[0], od) : g[0];
      Tensor g2 = gy.reshape({1, rows, outf});
      Tensor gx, gw, gb;
      if (through_f32) {
        const Tensor g32 = need_x || need_w ? g2.contiguous().to(DType::f32) : Tensor();
        if (need_x) gx = mm3(g32, wd.unsqueeze(0)).to(g2.dtype()).view(xs);
        if (need_w)
          gw = mm3(g32.transpose(1, 2), xd.reshape({1, rows, in}).to(DType::f32)).to(g2.dtype()).view({outf, in});
      } else {
        if (need_x) gx = mm3(g2, wd.unsqueeze(0)).view(xs);                                    // g W
        if (need_w) gw = mm3(g2.transpose(1, 2), xd.reshape({1, rows, in})).view({outf, in});  // g^T x
      }
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

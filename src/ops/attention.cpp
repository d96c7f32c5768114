// scaled_dot_product_attention: argument checks, the fused kernels where a device has them (one autograd
// node; Note [fused attention] in backend/cpu/attention.cpp) and the composite of other ops elsewhere.
#include "mp/ops/attention.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "backend/attention_kernels.hpp"
#include "mp/autocast/autocast.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/embedding.hpp"
#include "mp/ops/linalg.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/reduce.hpp"
#include "mp/ops/softmax.hpp"
#include "ops/attention_composite.hpp"

namespace mp {
namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// q, k, v and the mask checked and brought to 4-D; the compute dtype and the additive mask (compute dtype,
// expanded to [B, H, Tq, Tk]).
struct Prepared {
  Tensor q, k, v;
  Tensor mask;  // additive, compute dtype, [B, H, Tq, Tk] view; undefined when none
  bool three_d = false;
  DType compute = DType::f32;
  backend::AttentionParams p;
};

Prepared prepare(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  MP_CHECK(q.defined() && k.defined() && v.defined(), kOp, ": got an undefined tensor among q, k, v");
  MP_CHECK((q.dim() == 4 || q.dim() == 3) && k.dim() == q.dim() && v.dim() == q.dim(), kOp,
           ": expected q [B, H, Tq, D], k and v [B, H, Tk, D] (or all 3-D: [B, T, D]), got q ", q.describe(), ", k ",
           k.describe(), ", v ", v.describe(), "; reshape the heads into dim 1");
  MP_CHECK(k.device() == q.device() && v.device() == q.device(), kOp, ": expected q, k, v on one device, got ",
           q.device().str(), ", ", k.device().str(), ", ", v.device().str(), "; move them with .to(device)");
  MP_CHECK(is_floating(q.dtype()), kOp, ": expected a floating q (f32, f64, f16, bf16), got ", q.describe(),
           "; convert with .to(mp::DType::f32)");
  MP_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kOp, ": expected q, k, v of one dtype, got ",
           dtype_name(q.dtype()), ", ", dtype_name(k.dtype()), ", ", dtype_name(v.dtype()),
           "; convert them with .to(dtype) (or run under autocast)");
  Prepared r;
  r.three_d = q.dim() == 3;
  r.q = r.three_d ? q.unsqueeze(1) : q;
  r.k = r.three_d ? k.unsqueeze(1) : k;
  r.v = r.three_d ? v.unsqueeze(1) : v;
  const int64_t B = r.q.size(0), H = r.q.size(1), Tq = r.q.size(2), D = r.q.size(3), Tk = r.k.size(2);
  MP_CHECK(r.k.size(0) == B && r.v.size(0) == B && r.k.size(1) == H && r.v.size(1) == H, kOp,
           ": expected k and v with q's batch and heads (", B, ", ", H, "), got k ", k.describe(), ", v ", v.describe(),
           "; q, k and v must come from the same [B, H] split");
  MP_CHECK(r.k.size(3) == D && r.v.size(3) == D, kOp, ": expected k and v with q's head size D = ", D, ", got k ",
           k.describe(), ", v ", v.describe(), "; project them to the same head size");
  MP_CHECK(r.v.size(2) == Tk, kOp, ": expected v with as many keys as k (Tk = ", Tk, "), got k ", k.describe(), ", v ",
           v.describe());
  MP_CHECK(Tq > 0 && Tk > 0 && D > 0 && B > 0 && H > 0, kOp, ": expected non-empty q, k, v, got q ", q.describe(),
           ", k ", k.describe());
  MP_CHECK(o.dropout_p >= 0.0 && o.dropout_p < 1.0, kOp, ": expected dropout_p in [0, 1), got ", o.dropout_p,
           "; pass 0 to turn dropout off");
  MP_CHECK(!(o.causal && o.mask.defined()), kOp,
           ": expected either causal = true or a mask, got both; fold the causal rule into the mask (as PyTorch "
           "requires)");
  MP_CHECK(!o.scale || std::isfinite(*o.scale), kOp, ": expected a finite scale, got ", o.scale.value_or(0.0));
  r.compute = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  r.p = {.B = B,
         .H = H,
         .Tq = Tq,
         .Tk = Tk,
         .D = D,
         .scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(D)),
         .causal = o.causal,
         .dropout_p = o.dropout_p};
  if (o.mask.defined()) {
    const Tensor& m = o.mask;
    const Shape target = r.three_d ? Shape{B, Tq, Tk} : Shape{B, H, Tq, Tk};
    MP_CHECK(m.device() == q.device(), kOp, ": expected the mask on ", q.device().str(), ", got ", m.describe(),
             "; move it with .to(device)");
    MP_CHECK(m.dtype() == DType::b8 || is_floating(m.dtype()), kOp,
             ": expected a bool mask (true = attend) or a floating additive mask, got ", m.describe(),
             "; compare it to make a bool mask");
    bool fits = m.dim() <= static_cast<int64_t>(target.size());
    for (int64_t i = 1; fits && i <= m.dim(); ++i) {
      const int64_t ms = m.size(-i), ts = target[target.size() - static_cast<size_t>(i)];
      fits = ms == 1 || ms == ts;
    }
    MP_CHECK(fits, kOp, ": expected a mask broadcastable to ", shape_str(target), ", got ", m.describe(),
             "; give it size 1 or the full size in each dim");
    Tensor add;
    {
      autograd::NoGradGuard ng;
      const TensorOptions to{.dtype = r.compute, .device = q.device()};
      add = m.dtype() == DType::b8 ? where(m, zeros({}, to), full({}, -std::numeric_limits<double>::infinity(), to))
                                   : m.detach().to(r.compute);
    }
    if (r.three_d && add.dim() == 3) add = add.unsqueeze(1);
    r.mask = add.expand({B, H, Tq, Tk});
  }
  return r;
}

// A [Tq, Tk] additive causal mask (0 on and below the diagonal, -inf above) in dtype dt on device d.
Tensor causal_additive(int64_t Tq, int64_t Tk, DType dt, Device d) {
  std::vector<double> m(static_cast<size_t>(Tq * Tk), 0.0);
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = i + 1; j < Tk; ++j) m[static_cast<size_t>(i * Tk + j)] = -std::numeric_limits<double>::infinity();
  return from_vector(m, {Tq, Tk}).to(dt).to(d);
}

Tensor fused(const Prepared& r) {
  backend::AttentionParams p = r.p;
  if (p.dropout_p > 0) p.dropout_rng = default_generator().reserve_batch(static_cast<uint64_t>(p.B * p.H * p.Tq * p.Tk));
  const Tensor q = r.q.detach().contiguous(), k = r.k.detach().contiguous(), v = r.v.detach().contiguous();
  Tensor out = empty(q.sizes(), {.dtype = q.dtype(), .device = q.device()});
  Tensor lse = empty({p.B, p.H, p.Tq}, {.dtype = r.compute, .device = q.device()});
  backend::attention_forward_kernel.get(q.device())(out, lse, q, k, v, r.mask, p);
  if (autograd::any_requires_grad({&r.q, &r.k, &r.v})) {
    const Tensor o = out.detach(), mask = r.mask;
    autograd::record("ScaledDotProductAttentionBackward", {r.q, r.k, r.v}, {out},
                     [q, k, v, o, lse, mask, p](const std::vector<Tensor>& g) {
                       const TensorOptions to{.dtype = q.dtype(), .device = q.device()};
                       Tensor dq = empty(q.sizes(), to), dk = empty(k.sizes(), to), dv = empty(v.sizes(), to);
                       backend::attention_backward_kernel.get(q.device())(dq, dk, dv, g[0].to(q.dtype()).contiguous(),
                                                                          q, k, v, o, lse, mask, p);
                       return std::vector<Tensor>{dq, dk, dv};
                     });
  }
  return out;
}

}  // namespace

namespace detail {

Tensor sdpa_composite(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const AttentionOptions& o) {
  const Prepared r = prepare(q_in, k_in, v_in, o);
  const backend::AttentionParams& p = r.p;
  const bool f64 = r.compute == DType::f64;
  const double lowest = f64 ? std::numeric_limits<double>::lowest() : std::numeric_limits<float>::lowest();
  const TensorOptions to{.dtype = r.compute, .device = r.q.device()};
  // Scores in the input dtype (a 16-bit matmul accumulates in f32), then f32 for the softmax.
  Tensor s = matmul(r.q, r.k.transpose(-2, -1)).to(r.compute) * p.scale;
  if (r.mask.defined()) s = s + r.mask;
  if (p.causal) s = s + causal_additive(p.Tq, p.Tk, r.compute, r.q.device());
  // -inf becomes the lowest finite value, so a row with every key masked has finite (uniform) weights
  // that `keep` then zeroes, with zero gradient, as the fused kernel's empty rows.
  s = maximum(s, full({}, lowest, to));
  Tensor keep;
  {
    autograd::NoGradGuard ng;
    keep = gt(amax(s, {-1}, true), full({}, lowest, to)).to(r.compute);
  }
  Tensor w = softmax(s, -1) * keep;
  if (p.dropout_p > 0) w = dropout(w, p.dropout_p, true);
  Tensor out = matmul(w.to(r.q.dtype()), r.v);
  return r.three_d ? out.squeeze(1) : out;
}

}  // namespace detail

namespace {

// MP_ATTENTION=composite runs the composite on every device (a fallback, and the reference of the fused kernels in
// benchmarks); unset or `fused`, a device's fused kernels run where it has them.
bool composite_forced() {
  static const bool forced = [] {
    const char* e = std::getenv("MP_ATTENTION");
    if (e == nullptr || *e == '\0' || std::string(e) == "fused") return false;
    MP_CHECK(std::string(e) == "composite", "MP_ATTENTION: expected fused or composite, got '", e,
             "'; unset it to run the fused kernels");
    return true;
  }();
  return forced;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  MP_AUTOCAST(amp::Op::scaled_dot_product_attention, scaled_dot_product_attention, q, q, k, v, options);
  if (!q.defined() || composite_forced() || backend::attention_forward_kernel.find(q.device().type) == nullptr)
    return detail::sdpa_composite(q, k, v, options);
  const Prepared r = prepare(q, k, v, options);
  Tensor out = fused(r);
  return r.three_d ? out.squeeze(1) : out;
}

}  // namespace mp

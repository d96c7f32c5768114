// Element-wise ops: argument checks, type promotion, broadcasting, dispatch, autograd.
#include "mp/autocast/autocast.hpp"
#include "mp/ops/pointwise.hpp"
#include "ops/pointwise_internal.hpp"

#include "backend/pointwise_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/reduce.hpp"

namespace mp {

using backend::PointwiseOp;
using backend::PointwiseParams;

namespace {

DType compute_type(DType t) { return is_floating(t) ? t : DType::i64; }

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  MP_CHECK(a.device() == b.device(), op, ": expected both tensors on one device, got ", a.device().str(), " and ",
           b.device().str(), "; move one with .to(device)");
}

// The memory format of an element-wise result: that of the first operand with the full shape (not
// broadcast), so a channels-last activation stays channels-last through ReLU, residual adds and their
// gradients (as PyTorch's TensorIterator); contiguous otherwise.
MemoryFormat result_format(const Shape& shape, std::initializer_list<Tensor> ins) {
  for (const Tensor& t : ins)
    if (t.sizes() == shape) return t.suggest_memory_format();
  return MemoryFormat::contiguous;
}

// Run the kernel into a fresh output of `shape` and dtype `out_dt` (memory format: result_format).
Tensor launch(PointwiseOp op, const Shape& shape, DType out_dt, DType compute, std::initializer_list<Tensor> ins,
              PointwiseParams p = {}) {
  Device dev = ins.begin()->device();
  Tensor out = empty(shape, {.dtype = out_dt, .device = dev, .memory_format = result_format(shape, ins)});
  std::vector<Tensor> ex;
  ex.reserve(ins.size());
  for (const Tensor& t : ins) ex.push_back(t.sizes() == shape ? t.detach() : t.detach().expand(shape));
  backend::pointwise_kernel.get(dev)(op, out, ex, compute, p);
  return out;
}

Tensor unary(PointwiseOp op, const Tensor& x, const char* name, PointwiseParams p = {}) {
  MP_CHECK(x.defined(), name, ": got an undefined tensor");
  DType dt = x.dtype();
  if (op != PointwiseOp::neg && op != PointwiseOp::abs && op != PointwiseOp::relu && op != PointwiseOp::copy &&
      op != PointwiseOp::square && op != PointwiseOp::clamp && op != PointwiseOp::sign && !is_floating(dt))
    dt = DType::f32;  // exp/log/... of integers give float, as in PyTorch
  return launch(op, x.sizes(), dt, compute_type(dt), {x}, p);
}

Tensor binary_values(PointwiseOp op, const Tensor& a, const Tensor& b, const char* name, PointwiseParams p = {}) {
  MP_CHECK(a.defined() && b.defined(), name, ": got an undefined tensor");
  check_same_device(a, b, name);
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), name);
  DType dt = promote_types(a.dtype(), b.dtype());
  if (op == PointwiseOp::div && !is_floating(dt)) dt = DType::f32;
  const DType out_dt = backend::pointwise_is_comparison(op) ? DType::b8 : dt;
  return launch(op, shape, out_dt, compute_type(dt), {a, b}, p);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  MP_AUTOCAST(amp::Op::add, add, a, a, b, alpha);
  Tensor out = alpha == 1.0 ? binary_values(PointwiseOp::add, a, b, "add")
                            : binary_values(PointwiseOp::add_scaled, a, b, "add", {.scalar0 = alpha});
  Shape sa = a.sizes(), sb = b.sizes();
  autograd::record("AddBackward", {a, b}, {out}, [sa, sb, alpha](const std::vector<Tensor>& g) {
    Tensor gb = alpha == 1.0 ? g[0] : mul(g[0], alpha);
    return std::vector<Tensor>{sum_to_size(g[0], sa), sum_to_size(gb, sb)};
  });
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  MP_AUTOCAST(amp::Op::sub, sub, a, a, b);
  Tensor out = binary_values(PointwiseOp::sub, a, b, "sub");
  Shape sa = a.sizes(), sb = b.sizes();
  autograd::record("SubBackward", {a, b}, {out}, [sa, sb](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to_size(g[0], sa), sum_to_size(neg(g[0]), sb)};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  MP_AUTOCAST(amp::Op::mul, mul, a, a, b);
  Tensor out = binary_values(PointwiseOp::mul, a, b, "mul");
  if (autograd::any_requires_grad({&a, &b})) {
    Tensor sa = a.requires_grad() ? b.detach() : Tensor(), sb = b.requires_grad() ? a.detach() : Tensor();
    Shape za = a.sizes(), zb = b.sizes();
    autograd::record("MulBackward", {a, b}, {out}, [sa, sb, za, zb](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sa.defined() ? sum_to_size(mul(g[0], sa), za) : Tensor(),
                                 sb.defined() ? sum_to_size(mul(g[0], sb), zb) : Tensor()};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  MP_AUTOCAST(amp::Op::div, div, a, a, b);
  Tensor out = binary_values(PointwiseOp::div, a, b, "div");
  if (autograd::any_requires_grad({&a, &b})) {
    Tensor ad = a.detach(), bd = b.detach();
    const bool need_b = b.requires_grad();
    Shape za = a.sizes(), zb = b.sizes();
    autograd::record("DivBackward", {a, b}, {out}, [ad, bd, need_b, za, zb](const std::vector<Tensor>& g) {
      Tensor ga = sum_to_size(div(g[0], bd), za);
      Tensor gb = need_b ? sum_to_size(neg(div(mul(g[0], ad), mul(bd, bd))), zb) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

Tensor pow(const Tensor& a, const Tensor& b) {
  MP_AUTOCAST(amp::Op::pow, pow, a, a, b);
  Tensor out = binary_values(PointwiseOp::pow, a, b, "pow");
  if (autograd::any_requires_grad({&a, &b})) {
    Tensor ad = a.detach(), bd = b.detach(), od = out.detach();
    const bool need_b = b.requires_grad();
    Shape za = a.sizes(), zb = b.sizes();
    autograd::record("PowBackward", {a, b}, {out}, [ad, bd, od, need_b, za, zb](const std::vector<Tensor>& g) {
      // d/da a^b = b a^(b-1); d/db a^b = a^b ln a
      Tensor ga = sum_to_size(mul(g[0], mul(bd, pow(ad, sub(bd, ones_like(bd))))), za);
      Tensor gb = need_b ? sum_to_size(mul(g[0], mul(od, log(ad))), zb) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

Tensor pow(const Tensor& a, double e) {
  MP_AUTOCAST(amp::Op::pow, pow, a, a, e);
  Tensor out = unary(PointwiseOp::pow_scalar, a, "pow", {.scalar0 = e});
  if (autograd::any_requires_grad({&a})) {
    Tensor ad = a.detach();
    autograd::record("PowBackward", {a}, {out}, [ad, e](const std::vector<Tensor>& g) {
      if (e == 0.0) return std::vector<Tensor>{zeros_like(g[0])};
      return std::vector<Tensor>{mul(g[0], mul(pow(ad, e - 1.0), e))};
    });
  }
  return out;
}

Tensor add(const Tensor& a, double s) {
  Tensor out = unary(PointwiseOp::add_scalar, a, "add", {.scalar0 = s});
  autograd::record("AddBackward", {a}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor mul(const Tensor& a, double s) {
  Tensor out = unary(PointwiseOp::mul_scalar, a, "mul", {.scalar0 = s});
  autograd::record("MulBackward", {a}, {out},
                   [s](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(g[0], s)}; });
  return out;
}

namespace {
// maximum/minimum: the gradient goes to the selected operand; ties split evenly (as PyTorch).
Tensor extremum(PointwiseOp op, const Tensor& a, const Tensor& b, const char* name) {
  Tensor out = binary_values(op, a, b, name);
  if (autograd::any_requires_grad({&a, &b})) {
    Tensor ad = a.detach(), bd = b.detach();
    Shape za = a.sizes(), zb = b.sizes();
    const bool is_max = op == PointwiseOp::maximum;
    autograd::record(is_max ? "MaximumBackward" : "MinimumBackward", {a, b}, {out},
                     [ad, bd, za, zb, is_max](const std::vector<Tensor>& g) {
                       Tensor wa = is_max ? gt(ad, bd) : lt(ad, bd);
                       Tensor tie = eq(ad, bd);
                       Tensor fa = add(wa.to(g[0].dtype()), mul(tie.to(g[0].dtype()), 0.5));
                       Tensor ga = mul(g[0], fa);
                       Tensor gb = sub(g[0], ga);
                       return std::vector<Tensor>{sum_to_size(ga, za), sum_to_size(gb, zb)};
                     });
  }
  return out;
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  MP_AUTOCAST(amp::Op::maximum, maximum, a, a, b);
  return extremum(PointwiseOp::maximum, a, b, "maximum");
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  MP_AUTOCAST(amp::Op::minimum, minimum, a, a, b);
  return extremum(PointwiseOp::minimum, a, b, "minimum");
}

Tensor neg(const Tensor& x) {
  Tensor out = unary(PointwiseOp::neg, x, "neg");
  autograd::record("NegBackward", {x}, {out},
                   [](const std::vector<Tensor>& g) { return std::vector<Tensor>{neg(g[0])}; });
  return out;
}

Tensor exp(const Tensor& x) {
  MP_AUTOCAST(amp::Op::exp, exp, x, x);
  Tensor out = unary(PointwiseOp::exp, x, "exp");
  if (autograd::any_requires_grad({&x})) {
    Tensor od = out.detach();
    autograd::record("ExpBackward", {x}, {out},
                     [od](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(g[0], od)}; });
  }
  return out;
}

Tensor log(const Tensor& x) {
  MP_AUTOCAST(amp::Op::log, log, x, x);
  Tensor out = unary(PointwiseOp::log, x, "log");
  if (autograd::any_requires_grad({&x})) {
    Tensor xd = x.detach();
    autograd::record("LogBackward", {x}, {out},
                     [xd](const std::vector<Tensor>& g) { return std::vector<Tensor>{div(g[0], xd)}; });
  }
  return out;
}

Tensor sqrt(const Tensor& x) {
  Tensor out = unary(PointwiseOp::sqrt, x, "sqrt");
  if (autograd::any_requires_grad({&x})) {
    Tensor od = out.detach();
    autograd::record("SqrtBackward", {x}, {out},
                     [od](const std::vector<Tensor>& g) { return std::vector<Tensor>{div(mul(g[0], 0.5), od)}; });
  }
  return out;
}

Tensor rsqrt(const Tensor& x) {
  MP_AUTOCAST(amp::Op::rsqrt, rsqrt, x, x);
  Tensor out = unary(PointwiseOp::rsqrt, x, "rsqrt");
  if (autograd::any_requires_grad({&x})) {
    Tensor od = out.detach();
    // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 y^3
    autograd::record("RsqrtBackward", {x}, {out}, [od](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{mul(mul(g[0], mul(od, square(od))), -0.5)};
    });
  }
  return out;
}

namespace {
Tensor activation(PointwiseOp fwd, PointwiseOp bwd, bool save_output, const Tensor& x, const char* name,
                  const char* node) {
  Tensor out = unary(fwd, x, name);
  if (autograd::any_requires_grad({&x})) {
    Tensor saved = save_output ? out.detach() : x.detach();
    autograd::record(node, {x}, {out}, [saved, bwd](const std::vector<Tensor>& g) {
      const Shape& s = g[0].sizes();
      return std::vector<Tensor>{
          launch(bwd, s, g[0].dtype(), compute_type(promote_types(g[0].dtype(), saved.dtype())), {g[0], saved})};
    });
  }
  return out;
}
}  // namespace

namespace detail {
Tensor relu_backward_from_output(const Tensor& grad, const Tensor& output) {
  return launch(PointwiseOp::relu_backward, grad.sizes(), grad.dtype(),
                compute_type(promote_types(grad.dtype(), output.dtype())), {grad, output});
}
}  // namespace detail

Tensor relu(const Tensor& x) {
  return activation(PointwiseOp::relu, PointwiseOp::relu_backward, true, x, "relu", "ReluBackward");
}
Tensor gelu(const Tensor& x, GeluApproximate approximate) {
  if (approximate == GeluApproximate::tanh)
    return activation(PointwiseOp::gelu_tanh, PointwiseOp::gelu_tanh_backward, false, x, "gelu", "GeluTanhBackward");
  return activation(PointwiseOp::gelu, PointwiseOp::gelu_backward, false, x, "gelu", "GeluBackward");
}
Tensor tanh(const Tensor& x) {
  return activation(PointwiseOp::tanh, PointwiseOp::tanh_backward, true, x, "tanh", "TanhBackward");
}
Tensor sigmoid(const Tensor& x) {
  return activation(PointwiseOp::sigmoid, PointwiseOp::sigmoid_backward, true, x, "sigmoid", "SigmoidBackward");
}

Tensor abs(const Tensor& x) {
  Tensor out = unary(PointwiseOp::abs, x, "abs");
  if (autograd::any_requires_grad({&x})) {
    Tensor xd = x.detach();
    autograd::record("AbsBackward", {x}, {out}, [xd](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{mul(g[0], unary(PointwiseOp::sign, xd, "sign"))};
    });
  }
  return out;
}

Tensor square(const Tensor& x) {
  Tensor out = unary(PointwiseOp::square, x, "square");
  if (autograd::any_requires_grad({&x})) {
    Tensor xd = x.detach();
    autograd::record("SquareBackward", {x}, {out},
                     [xd](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul(mul(g[0], xd), 2.0)}; });
  }
  return out;
}

Tensor clamp(const Tensor& x, double lo, double hi) {
  MP_CHECK(lo <= hi, "clamp: expected lo <= hi, got lo=", lo, " hi=", hi);
  Tensor out = unary(PointwiseOp::clamp, x, "clamp", {.scalar0 = lo, .scalar1 = hi});
  if (autograd::any_requires_grad({&x})) {
    Tensor xd = x.detach();
    autograd::record("ClampBackward", {x}, {out}, [xd, lo, hi](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{launch(PointwiseOp::clamp_backward, g[0].sizes(), g[0].dtype(),
                                        compute_type(g[0].dtype()), {g[0], xd}, {.scalar0 = lo, .scalar1 = hi})};
    });
  }
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  MP_AUTOCAST(amp::Op::where, where, a, cond, a, b);
  check_same_device(a, b, "where");
  check_same_device(cond, a, "where");
  const Shape shape = broadcast_shapes(broadcast_shapes(cond.sizes(), a.sizes(), "where"), b.sizes(), "where");
  const DType dt = promote_types(a.dtype(), b.dtype());
  Tensor out = launch(PointwiseOp::where, shape, dt, compute_type(dt), {cond, a, b});
  if (autograd::any_requires_grad({&a, &b})) {
    Tensor c = cond.detach();
    Shape za = a.sizes(), zb = b.sizes();
    autograd::record("WhereBackward", {Tensor(), a, b}, {out}, [c, za, zb](const std::vector<Tensor>& g) {
      Tensor z = zeros({}, {.dtype = g[0].dtype(), .device = g[0].device()});
      return std::vector<Tensor>{Tensor(), sum_to_size(where(c, g[0], z), za), sum_to_size(where(c, z, g[0]), zb)};
    });
  }
  return out;
}

Tensor eq(const Tensor& a, const Tensor& b) { return binary_values(PointwiseOp::eq, a, b, "eq"); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_values(PointwiseOp::ne, a, b, "ne"); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_values(PointwiseOp::lt, a, b, "lt"); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_values(PointwiseOp::le, a, b, "le"); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_values(PointwiseOp::gt, a, b, "gt"); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_values(PointwiseOp::ge, a, b, "ge"); }

namespace {
// self = op(self, other) in place (other broadcast to self's shape), in the promoted type; no autograd.
Tensor& binary_in_place(Tensor& self, const Tensor& other, PointwiseOp op, const PointwiseParams& p, const char* name) {
  check_same_device(self, other, name);
  const Shape shape = broadcast_shapes(self.sizes(), other.sizes(), name);
  MP_CHECK(shape == self.sizes(), name, ": cannot broadcast ", shape_str(other.sizes()), " into the in-place target ",
           shape_str(self.sizes()));
  Tensor o = other.detach().expand(self.sizes());
  const Tensor ins[2] = {self.detach(), o};
  const DType compute = compute_type(promote_types(self.dtype(), other.dtype()));
  backend::pointwise_kernel.get(self.device())(op, self, std::span<const Tensor>(ins, 2), compute, p);
  self.bump_version();
  return self;
}
}  // namespace

Tensor& add_(Tensor& self, const Tensor& other, double alpha) {
  return binary_in_place(self, other, alpha == 1.0 ? PointwiseOp::add : PointwiseOp::add_scaled, {.scalar0 = alpha},
                         "add_");
}

Tensor& axpby_(Tensor& self, double self_scale, const Tensor& other, double other_scale) {
  return binary_in_place(self, other, PointwiseOp::axpby, {.scalar0 = self_scale, .scalar1 = other_scale}, "axpby_");
}

Tensor& mul_(Tensor& self, double s) {
  const Tensor ins[1] = {self.detach()};
  backend::pointwise_kernel.get(self.device())(PointwiseOp::mul_scalar, self, std::span<const Tensor>(ins, 1),
                                               compute_type(self.dtype()), {.scalar0 = s});
  self.bump_version();
  return self;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double s) { return add(a, s); }
Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
Tensor operator+(double s, const Tensor& a) { return add(a, s); }
Tensor operator-(double s, const Tensor& a) { return add(neg(a), s); }
Tensor operator*(double s, const Tensor& a) { return mul(a, s); }

}  // namespace mp

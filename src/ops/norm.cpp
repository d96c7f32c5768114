// Normalisation ops: batch_norm and layer_norm (argument checks, dispatch to the fused kernels,
// running-statistics update, autograd).
#include "mp/autocast/autocast.hpp"
#include "mp/ops/norm.hpp"

#include <cstdlib>
#include <string>
#include <utility>

#include "backend/norm_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/pointwise.hpp"

namespace mp {

namespace {

// f64 statistics for f64 input, f32 otherwise (Note [normalisation statistics on the CPU]).
DType stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

// A [C]-shaped parameter or buffer: undefined, or floating, 1-D of size C, on x's device.
void check_channel_vector(const Tensor& t, const Tensor& x, int64_t C, const char* op, const char* what) {
  if (!t.defined()) return;
  MP_CHECK(t.dim() == 1 && t.size(0) == C, op, ": expected ", what, " of shape [", C, "] (one value per channel of ",
           "input ", shape_str(x.sizes()), "), got ", shape_str(t.sizes()),
           "; the channel count is dim 1 of the input (layout [N, C, ...])");
  MP_CHECK(is_floating(t.dtype()), op, ": expected a floating ", what, ", got ", t.describe());
  MP_CHECK(t.device() == x.device(), op, ": ", what, " is on ", t.device().str(), " but the input is on ",
           x.device().str(), "; move it with .to(device)");
}

// A fresh contiguous copy of t in dtype dt (never aliases t, so later in-place updates of t do not
// change what a backward closure captured).
Tensor fresh_copy(const Tensor& t, DType dt) {
  Tensor out = empty(t.sizes(), {.dtype = dt, .device = t.device()});
  out.copy_(t);
  return out;
}

// batch_norm, batch_norm_relu and batch_norm_add_relu: y = relu?(bn(x) + residual?) (Note [batch norm + add +
// ReLU] in backend/norm_kernels.hpp).
Tensor batch_norm_impl(const char* op, const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                       const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                       double momentum, double eps, bool relu) {
  MP_CHECK(x.defined(), op, ": got an undefined input");
  MP_CHECK(x.dim() >= 2, op, ": expected an input of shape [N, C, ...] (at least 2 dims), got ", shape_str(x.sizes()));
  MP_CHECK(is_floating(x.dtype()), op, ": expected a floating input (f32, f64, f16, bf16), got ", x.describe(),
           "; convert with .to(mp::DType::f32)");
  MP_CHECK(eps >= 0.0, op, ": expected eps >= 0, got ", eps);
  const int64_t N = x.size(0), C = x.size(1);
  const int64_t S = shape_numel(Shape(x.sizes().begin() + 2, x.sizes().end()));  // spatial size (1 for [N, C])
  check_channel_vector(weight, x, C, op, "weight");
  check_channel_vector(bias, x, C, op, "bias");
  check_channel_vector(running_mean, x, C, op, "running_mean");
  check_channel_vector(running_var, x, C, op, "running_var");
  MP_CHECK(running_mean.defined() == running_var.defined(), op,
           ": expected running_mean and running_var both defined or both undefined, got only ",
           running_mean.defined() ? "running_mean" : "running_var");
  // As PyTorch: without running statistics the batch statistics are used even in eval.
  const bool use_batch_stats = training || !running_mean.defined();
  const int64_t M = N * S;  // values per channel
  MP_CHECK(!use_batch_stats || M > 1, op, ": expected more than 1 value per channel when using batch statistics, ",
           "got input ", shape_str(x.sizes()), "; use a larger batch or eval mode with running statistics");

  if (residual.defined())
    MP_CHECK(residual.device() == x.device(), op, ": the residual is on ", residual.device().str(),
             " but the input is on ", x.device().str(), "; move it with .to(device)");
  // The unfused ops define the result where a residual broadcasts or promotes the type, and they run instead
  // when MP_BN_FUSION=0 (A/B experiments only).
  static const bool fusion = [] {
    const char* e = std::getenv("MP_BN_FUSION");
    return e == nullptr || std::string(e) != "0";
  }();
  const bool odd_residual = residual.defined() && (residual.sizes() != x.sizes() || residual.dtype() != x.dtype());
  if ((relu || residual.defined()) && (!fusion || odd_residual)) {
    Tensor y =
        batch_norm_impl(op, x, Tensor(), running_mean, running_var, weight, bias, training, momentum, eps, false);
    if (residual.defined()) y = add(y, residual);
    return relu ? mp::relu(y) : y;
  }

  const DType sdt = stats_dtype(x.dtype());
  const Device dev = x.device();
  // A channels-last input is normalised in place of its layout: the kernels take [N, C, S] with strides
  // {S C, 1, C} too, and y, dy and dx share x's layout (no NHWC <-> NCHW copies around batch norm).
  const bool cl = x.suggest_memory_format() == MemoryFormat::channels_last;
  Tensor xc = cl ? x.detach().view({N, C, S}) : x.detach().contiguous().reshape({N, C, S});
  // The residual in x's layout (a copy only when the layouts differ).
  const Tensor rc = !residual.defined() ? Tensor()
                    : cl                ? residual.detach().contiguous(MemoryFormat::channels_last).view({N, C, S})
                                        : residual.detach().contiguous().reshape({N, C, S});
  auto like_x = [cl, N, C, S](DType dt, Device d) {
    return cl ? empty({N, S, C}, {.dtype = dt, .device = d}).permute({0, 2, 1})
              : empty({N, C, S}, {.dtype = dt, .device = d});
  };
  Tensor y = like_x(x.dtype(), dev);
  Tensor mean, var;
  if (use_batch_stats) {
    mean = empty({C}, {.dtype = sdt, .device = dev});
    var = empty({C}, {.dtype = sdt, .device = dev});
  } else {
    mean = fresh_copy(running_mean.detach(), sdt);
    var = fresh_copy(running_var.detach(), sdt);
  }
  Tensor invstd = empty({C}, {.dtype = sdt, .device = dev});
  Tensor wd = weight.defined() ? weight.detach().contiguous() : Tensor();
  Tensor bd = bias.defined() ? bias.detach().contiguous() : Tensor();
  backend::batch_norm_forward_kernel.get(dev)(y, mean, var, invstd, xc, wd, bd, use_batch_stats, eps, rc, relu);

  if (training && running_mean.defined()) {
    // new = (1 - m) old + m batch, with the unbiased batch variance (n / (n - 1)) for running_var.
    autograd::NoGradGuard ng;
    const double unbias = static_cast<double>(M) / static_cast<double>(M - 1);
    // One element-wise pass per buffer (was five ops: two scalings, a sum and a copy each): on a GPU every op
    // costs host time, and a ResNet-18 step has 20 batch norms (bench/RESULTS.md, NVIDIA H200).
    Tensor rm = running_mean, rv = running_var;
    axpby_(rm, 1.0 - momentum, mean, momentum);
    axpby_(rv, 1.0 - momentum, var, momentum * unbias);
  }

  Tensor out = y.view(x.sizes());
  if (autograd::any_requires_grad({&x, &weight, &bias, &residual})) {
    const bool need_x = x.requires_grad(), need_w = weight.defined() && weight.requires_grad();
    const bool need_b = bias.defined() && bias.requires_grad();
    const bool need_r = residual.defined() && residual.requires_grad();
    const Shape xs = x.sizes();
    const Tensor ys = relu ? y : Tensor();  // the output, for the ReLU's mask
    autograd::record(
        relu ? (residual.defined() ? "BatchNormAddReluBackward" : "BatchNormReluBackward") : "BatchNormBackward",
        {x, weight, bias, residual}, {out},
        [xc, wd, mean, invstd, use_batch_stats, need_x, need_w, need_b, need_r, xs, sdt, cl, like_x,
         ys](const std::vector<Tensor>& g) {
          const Tensor g0 = ys.defined() ? g[0].to(xc.dtype()) : g[0];  // the fused mask wants x's dtype
          const Tensor dy =
              cl ? g0.contiguous(MemoryFormat::channels_last).view(xc.sizes()) : g0.contiguous().reshape(xc.sizes());
          const Device d = xc.device();
          Tensor dx = need_x ? like_x(xc.dtype(), d) : Tensor();
          Tensor dw = need_w ? empty({xc.size(1)}, {.dtype = sdt, .device = d}) : Tensor();
          Tensor db = need_b ? empty({xc.size(1)}, {.dtype = sdt, .device = d}) : Tensor();
          // The residual's gradient: the masked gradient with the ReLU fused, else dy itself.
          Tensor dz = need_r && ys.defined() ? like_x(xc.dtype(), d) : Tensor();
          backend::batch_norm_backward_kernel.get(d)(dx, dw, db, dy, xc, mean, invstd, wd, use_batch_stats, ys, dz);
          Tensor dr = need_r ? (ys.defined() ? dz.view(xs) : g[0]) : Tensor();
          return std::vector<Tensor>{need_x ? dx.view(xs) : Tensor(), dw, db, dr};
        });
  }
  return out;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl("batch_norm", x, Tensor(), running_mean, running_var, weight, bias, training, momentum, eps,
                         false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl("batch_norm_relu", x, Tensor(), running_mean, running_var, weight, bias, training, momentum,
                         eps, true);
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                           double momentum, double eps) {
  MP_CHECK(residual.defined(), "batch_norm_add_relu: got an undefined residual; use batch_norm_relu without one");
  return batch_norm_impl("batch_norm_add_relu", x, residual, running_mean, running_var, weight, bias, training,
                         momentum, eps, true);
}

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  MP_AUTOCAST(amp::Op::layer_norm, layer_norm, x, x, normalized_shape, weight, bias, eps);
  constexpr const char* op = "layer_norm";
  MP_CHECK(x.defined(), op, ": got an undefined input");
  MP_CHECK(is_floating(x.dtype()), op, ": expected a floating input (f32, f64, f16, bf16), got ", x.describe(),
           "; convert with .to(mp::DType::f32)");
  const auto nd = static_cast<int64_t>(normalized_shape.size());
  MP_CHECK(nd >= 1, op, ": expected a non-empty normalized_shape, got []");
  MP_CHECK(eps >= 0.0, op, ": expected eps >= 0, got ", eps);
  const Shape tail = x.dim() >= nd ? Shape(x.sizes().end() - nd, x.sizes().end()) : Shape{};
  MP_CHECK(tail == normalized_shape, op, ": expected an input whose trailing dims are normalized_shape ",
           shape_str(normalized_shape), ", got input ", shape_str(x.sizes()),
           "; normalized_shape must equal the last dims of the input");
  for (const auto& [t, what] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!t->defined()) continue;
    MP_CHECK(t->sizes() == normalized_shape, op, ": expected ", what, " of shape ", shape_str(normalized_shape),
             " (normalized_shape), got ", shape_str(t->sizes()));
    MP_CHECK(is_floating(t->dtype()), op, ": expected a floating ", what, ", got ", t->describe());
    MP_CHECK(t->device() == x.device(), op, ": ", what, " is on ", t->device().str(), " but the input is on ",
             x.device().str(), "; move it with .to(device)");
  }
  const int64_t N = shape_numel(normalized_shape);
  MP_CHECK(N > 0, op, ": expected normalized_shape with at least one element, got ", shape_str(normalized_shape));
  const int64_t M = x.numel() / N;

  const DType sdt = stats_dtype(x.dtype());
  const Device dev = x.device();
  Tensor xc = x.detach().contiguous().reshape({M, N});
  Tensor y = empty({M, N}, {.dtype = x.dtype(), .device = dev});
  Tensor mean = empty({M}, {.dtype = sdt, .device = dev});
  Tensor rstd = empty({M}, {.dtype = sdt, .device = dev});
  Tensor wd = weight.defined() ? weight.detach().contiguous().reshape({N}) : Tensor();
  Tensor bd = bias.defined() ? bias.detach().contiguous().reshape({N}) : Tensor();
  backend::layer_norm_forward_kernel.get(dev)(y, mean, rstd, xc, wd, bd, eps);

  Tensor out = y.view(x.sizes());
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    const bool need_x = x.requires_grad(), need_w = weight.defined() && weight.requires_grad();
    const bool need_b = bias.defined() && bias.requires_grad();
    const Shape xs = x.sizes(), ns = normalized_shape;
    autograd::record("LayerNormBackward", {x, weight, bias}, {out},
                     [xc, wd, mean, rstd, need_x, need_w, need_b, xs, ns, sdt](const std::vector<Tensor>& g) {
                       const Tensor dy = g[0].contiguous().reshape(xc.sizes());
                       const Device d = xc.device();
                       Tensor dx = need_x ? empty(xc.sizes(), {.dtype = xc.dtype(), .device = d}) : Tensor();
                       Tensor dw = need_w ? empty({xc.size(1)}, {.dtype = sdt, .device = d}) : Tensor();
                       Tensor db = need_b ? empty({xc.size(1)}, {.dtype = sdt, .device = d}) : Tensor();
                       backend::layer_norm_backward_kernel.get(d)(dx, dw, db, dy, xc, mean, rstd, wd);
                       return std::vector<Tensor>{need_x ? dx.view(xs) : Tensor(), need_w ? dw.view(ns) : Tensor(),
                                                  need_b ? db.view(ns) : Tensor()};
                     });
  }
  return out;
}

}  // namespace mp

// Losses: cross entropy (fused log-softmax + NLL), NLL on log-probabilities, mean squared error.
// The class losses always compute and return f32 (f64 for f64 input); their gradient wrt the input is
// produced in the input's dtype.
#include "mp/autocast/autocast.hpp"
#include "mp/ops/loss.hpp"

#include "backend/softmax_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/reduce.hpp"

namespace mp {

namespace {

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::none: return "none";
    case Reduction::mean: return "mean";
    case Reduction::sum: return "sum";
  }
  return "?";
}

// Shared body of cross_entropy (log_probs = false) and nll_loss (log_probs = true).
Tensor class_loss(const char* op, const Tensor& input, const Tensor& target, const CrossEntropyOptions& opt,
                  bool log_probs) {
  MP_CHECK(input.defined() && target.defined(), op, ": got an undefined tensor");
  MP_CHECK(is_floating(input.dtype()), op, ": expected floating ", log_probs ? "log-probabilities" : "logits",
           " (f32, f64, f16, bf16), got ", input.describe(), "; convert with .to(mp::DType::f32)");
  MP_CHECK(target.dtype() == DType::i64 || target.dtype() == DType::i32, op, ": expected i64 class-index targets, got ",
           target.describe(), "; convert with .to(mp::DType::i64) (class-probability targets are not supported)");
  MP_CHECK(input.device() == target.device(), op, ": input on ", input.device().str(), " but target on ",
           target.device().str(), "; move one with .to(device)");
  MP_CHECK(input.dim() >= 1, op, ": expected input [N, C] or [N, C, d...] (or [C]), got a 0-dim tensor");
  MP_CHECK(opt.label_smoothing >= 0.0 && opt.label_smoothing <= 1.0, op, ": label_smoothing must be in [0, 1], got ",
           opt.label_smoothing);
  // [C] with a 0-dim target is one sample.
  const bool single = input.dim() == 1;
  Shape tshape = input.sizes();
  tshape.erase(tshape.begin() + (single ? 0 : 1));
  MP_CHECK(target.sizes() == tshape, op, ": input ", shape_str(input.sizes()), " (class dim ", single ? 0 : 1,
           ") needs target of shape ", shape_str(tshape), ", got ", shape_str(target.sizes()));

  backend::SoftmaxShape s;
  s.outer = single ? 1 : input.sizes()[0];
  s.n = input.sizes()[single ? 0 : 1];
  for (int64_t i = 2; i < input.dim(); ++i) s.inner *= input.sizes()[i];
  const int64_t rows = s.outer * s.inner;
  const DType acc = input.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const backend::ClassLossParams p{
      .ignore_index = opt.ignore_index, .label_smoothing = opt.label_smoothing, .log_probs = log_probs};

  Tensor xc = input.detach().contiguous();
  Tensor tc = target.detach().to(DType::i64).contiguous();
  Tensor losses = empty({rows}, {.dtype = acc, .device = input.device()});
  Tensor stats = log_probs ? Tensor() : empty({rows, 2}, {.dtype = acc, .device = input.device()});
  backend::class_loss_kernel.get(input.device())(op, losses, stats, xc, tc, s, p);

  Tensor out, count;
  {
    autograd::NoGradGuard ng;
    switch (opt.reduction) {
      case Reduction::none: out = losses.view(tshape); break;
      case Reduction::sum: out = sum(losses); break;
      case Reduction::mean:
        // Divides by the number of non-ignored targets (0/0 = NaN when all are ignored, as PyTorch).
        count =
            sum(ne(tc, full({}, static_cast<double>(opt.ignore_index), {.dtype = DType::i64, .device = tc.device()}))
                    .to(acc));
        out = div(sum(losses), count);
        break;
    }
  }
  if (autograd::any_requires_grad({&input})) {
    const Shape in_sizes = input.sizes();
    const DType in_dt = input.dtype();
    const Reduction red = opt.reduction;
    autograd::record(log_probs ? "NllLossBackward" : "CrossEntropyBackward", {input}, {out},
                     [xc, stats, tc, count, s, p, rows, acc, in_sizes, in_dt, red](const std::vector<Tensor>& g) {
                       Tensor w = g[0].to(acc);
                       if (red == Reduction::mean) w = div(w, count);
                       w = w.reshape({red == Reduction::none ? rows : 1}).contiguous();
                       Tensor gi = empty(in_sizes, {.dtype = in_dt, .device = xc.device()});
                       backend::class_loss_backward_kernel.get(xc.device())(gi, w, xc, stats, tc, s, p);
                       return std::vector<Tensor>{gi};
                     });
  }
  return out;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& opt) {
  MP_AUTOCAST(amp::Op::cross_entropy, cross_entropy, logits, logits, target, opt);
  return class_loss("cross_entropy", logits, target, opt, false);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const CrossEntropyOptions& opt) {
  MP_AUTOCAST(amp::Op::nll_loss, nll_loss, log_probs, log_probs, target, opt);
  return class_loss("nll_loss", log_probs, target, opt, true);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  MP_AUTOCAST(amp::Op::mse_loss, mse_loss, input, input, target, reduction);
  MP_CHECK(input.defined() && target.defined(), "mse_loss: got an undefined tensor");
  MP_CHECK(is_floating(input.dtype()) && is_floating(target.dtype()),
           "mse_loss: expected floating input and target, got ", input.describe(), " and ", target.describe(),
           "; convert with .to(mp::DType::f32)");
  MP_CHECK(input.sizes() == target.sizes(), "mse_loss: input ", shape_str(input.sizes()), " and target ",
           shape_str(target.sizes()), " must have the same shape (no broadcasting); reshape or expand one first");
  // Squares and the reduction run in f32 for 16-bit inputs: (a - b)^2 of f16 values overflows past 255.
  DType dt = promote_types(input.dtype(), target.dtype());
  if (is_low_precision(dt)) dt = DType::f32;
  Tensor sq = square(sub(input.to(dt), target.to(dt)));
  switch (reduction) {
    case Reduction::none: return sq;
    case Reduction::sum: return sum(sq);
    case Reduction::mean: return mean(sq);
  }
  MP_FAIL("mse_loss: unknown reduction ", reduction_name(reduction));
}

}  // namespace mp

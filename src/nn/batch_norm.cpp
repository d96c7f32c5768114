// nn::BatchNorm1d / BatchNorm2d, and their statistics over a data-parallel run's global batch
// (mp/nn/sync_batch_norm.hpp).
//
// Note [synchronised batch norm]
// In a data-parallel run each rank normalises with its own batch's statistics by default (B examples; PyTorch's DDP
// without SyncBatchNorm), so N ranks at B compute another function than one process at N x B. With --sync_batchnorm
// the trainer opens a SyncBatchNormScope with its process group's sum, and every batch-norm layer in training mode
// computes instead, per channel c over the M = sum of every rank's N_r x spatial elements:
//   1. Forward. x widened to f64; each rank's sums s_c = sum x and q_c = sum x^2 and its count, one all-reduce (sum,
//      f64) of [s, q, count]; mean = S / M, var = Q / M - mean^2 (biased, as the kernel's), in f64, where the
//      cancellation of Q / M - mean^2 costs (mean^2 / var) 2^-53: negligible for activations (f32 statistics would
//      lose (mean^2 / var) 2^-24, which is why they are not summed in f32); y = (x - mean) / sqrt(var + eps) * w + b,
//      rounded once to x's dtype (the op's contract: f32-or-better statistics, output in the input dtype); the
//      running statistics take the global mean and the unbiased global variance var M / (M - 1), so every rank keeps
//      the same ones (a single process's).
//   2. Backward. The all-reduce is an autograd node whose backward all-reduces (sums) the gradients of [s, q]: the
//      global sums of dy and dy * x that SyncBatchNorm's backward exchanges (d mean and d var reach every rank's x
//      through them). Everything else is the ordinary autograd of the composite, so the gradient of each rank's x is
//      what one process at the global batch computes, up to rounding (the sums run in another order; f64 here against
//      the fused kernel's f32).
//   3. Order. Each rank runs the same layers in the same order, forward and backward (the graph and the autograd
//      engine's order are the same on every rank), so the blocking all-reduces match across ranks; the gradient
//      buckets' non-blocking all-reduces (Note [bucketed gradient all-reduce]) start from the same points of the same
//      backward on every rank, so they interleave the same way too.
//   4. Cost. Two small all-reduces per layer per step (2C + 1 doubles), and the composite (f64, unfused: relu and the
//      residual added after) instead of the fused kernels: slower, which is why it is a flag. Eval mode (running
//      statistics) never communicates, so the sharded evaluation is unchanged.
//   5. One process. With the flag a single process takes the same composite (its sum over one process is the
//      identity), so N ranks at B with the flag equal one process at N x B with the flag up to rounding (measured:
//      5e-5 of a gradient tensor after a step of ResNet-8). Against the fused kernels (one process without the flag)
//      the composite differs by more than rounding on ResNet-8: 1.5e-2 of a momentum tensor after one step, on
//      small, cancelling batch-norm bias gradients; equal to 1e-6 on random data (tests/nn/test_nn_layers.cpp).
//      Measured against the same ResNet-8 step in f64 (tests/models/test_models_batch_norm_accuracy.cpp, AMD Zen 3):
//      the two are one function (in f64 they agree to 5e-14), and in f32 the fused channels-last kernels are the
//      more accurate: worst gradient error 7.3e-6 of its tensor's largest value, the composite 4.4e-2 (NCHW fused:
//      6.2e-3), the large ones on the batch-norm biases, whose true values are small sums of cancelling terms. The
//      composite widens x, but its gradient reaches x through f32 convolutions whose rounding those sums amplify;
//      why the fused kernels' sums come out closer was not found. So the flag is for equality across rank counts,
//      not accuracy: without it one process at N x B and N ranks at B train different functions.
#include "mp/nn/batch_norm.hpp"

#include <algorithm>
#include <sstream>

#include "mp/autograd/node.hpp"
#include "mp/nn/init.hpp"
#include "mp/nn/sync_batch_norm.hpp"
#include "mp/ops/norm.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/reduce.hpp"
#include "mp/ops/shape.hpp"

namespace mp::nn {
namespace {

// The sum of the open SyncBatchNormScope, or null.
const BatchNormAllReduce* g_sync = nullptr;

// `local` summed over the processes, as an autograd node whose backward sums the gradient likewise (Note
// [synchronised batch norm] 2).
Tensor all_reduce_sum(const Tensor& local, const BatchNormAllReduce& sum) {
  Tensor out;
  {
    autograd::NoGradGuard ng;
    out = local.detach().contiguous().clone();
  }
  sum(out);
  autograd::record("SyncBatchNormAllReduceBackward", {local}, {out}, [sum](const std::vector<Tensor>& g) {
    Tensor gi;
    {
      autograd::NoGradGuard ng;
      gi = g[0].to(DType::f64).contiguous().clone();
    }
    sum(gi);
    return std::vector<Tensor>{gi};
  });
  return out;
}

// Note [synchronised batch norm] 1: the layer's output with the global batch's statistics; updates the running ones.
Tensor sync_batch_norm(const Tensor& x, const Tensor& residual, bool relu_after, const Tensor& running_mean,
                       const Tensor& running_var, const Tensor& weight, const Tensor& bias, double factor, double eps,
                       const BatchNormAllReduce& sum_fn) {
  const int64_t C = x.size(1);
  Shape dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  Shape bshape(static_cast<size_t>(x.dim()), 1);
  bshape[1] = C;
  const Tensor xd = x.to(DType::f64);
  const double count = static_cast<double>(x.numel() / std::max<int64_t>(C, 1));
  const Tensor local = cat({sum(xd, dims), sum(mul(xd, xd), dims), full({1}, count, {.dtype = DType::f64})}, 0);
  const Tensor global = all_reduce_sum(local, sum_fn);
  const double m = global.narrow(0, 2 * C, 1).item<double>();
  MP_CHECK(m > 0, "batch norm over the global batch: no elements on any rank (", x.describe(), ")");
  const Tensor mean = mul(global.narrow(0, 0, C), 1.0 / m);
  const Tensor var = sub(mul(global.narrow(0, C, C), 1.0 / m), mul(mean, mean));
  const Tensor invstd = rsqrt(add(var, eps));
  Tensor y = mul(sub(xd, mean.reshape(bshape)), invstd.reshape(bshape));
  if (weight.defined()) y = add(mul(y, weight.to(DType::f64).reshape(bshape)), bias.to(DType::f64).reshape(bshape));
  y = y.to(x.dtype());
  if (running_mean.defined()) {
    autograd::NoGradGuard ng;
    Tensor rm = running_mean, rv = running_var;
    const Tensor unbiased = mul(var.detach(), m > 1 ? m / (m - 1) : 1.0);
    rm.copy_(add(mul(rm.to(DType::f64), 1.0 - factor), mul(mean.detach(), factor)));
    rv.copy_(add(mul(rv.to(DType::f64), 1.0 - factor), mul(unbiased, factor)));
  }
  if (residual.defined()) y = add(y, residual);
  return relu_after ? relu(y) : y;
}

}  // namespace

SyncBatchNormScope::SyncBatchNormScope(BatchNormAllReduce sum) {
  MP_CHECK(static_cast<bool>(sum), "SyncBatchNormScope: expected a sum over the processes, got an empty function");
  MP_CHECK(g_sync == nullptr, "SyncBatchNormScope: another scope is open; close it first (one run at a time)");
  g_sync = new BatchNormAllReduce(std::move(sum));
}

SyncBatchNormScope::~SyncBatchNormScope() {
  delete g_sync;
  g_sync = nullptr;
}

BatchNormBase::BatchNormBase(std::string type_name, const BatchNormOptions& o, std::vector<int64_t> input_dims)
    : UnaryModule(std::move(type_name)), options_(o), input_dims_(std::move(input_dims)) {
  MP_CHECK(o.num_features > 0, this->type_name(), ": expected num_features > 0, got ", o.num_features);
  MP_CHECK(o.eps >= 0.0, this->type_name(), ": expected eps >= 0, got ", o.eps);
  MP_CHECK(!o.momentum || (*o.momentum >= 0.0 && *o.momentum <= 1.0), this->type_name(),
           ": expected momentum in [0, 1] (or nullopt for a cumulative average), got ", o.momentum.value_or(0.0));
  const int64_t C = o.num_features;
  weight_ = &register_parameter("weight", o.affine ? empty({C}) : Tensor());
  bias_ = &register_parameter("bias", o.affine ? empty({C}) : Tensor());
  running_mean_ = &register_buffer("running_mean", o.track_running_stats ? empty({C}) : Tensor());
  running_var_ = &register_buffer("running_var", o.track_running_stats ? empty({C}) : Tensor());
  num_batches_tracked_ =
      &register_buffer("num_batches_tracked", o.track_running_stats ? zeros({}, {.dtype = DType::i64}) : Tensor());
  reset_parameters();
}

void BatchNormBase::reset_running_stats() {
  if (!options_.track_running_stats) return;
  init::zeros_(*running_mean_);
  init::ones_(*running_var_);
  init::zeros_(*num_batches_tracked_);
}

void BatchNormBase::reset_parameters() {
  reset_running_stats();
  if (options_.affine) {
    init::ones_(*weight_);
    init::zeros_(*bias_);
  }
}

Tensor BatchNormBase::forward(const Tensor& x) { return forward_fused(x, Tensor(), false); }

// With forward hooks (amp diagnostics, a user's probe), the hooks see this module's own output: not fused.
Tensor BatchNormBase::forward_relu(const Tensor& x) {
  if (has_forward_hooks()) return relu((*this)(x));
  return forward_fused(x, Tensor(), true);
}

Tensor BatchNormBase::forward_add_relu(const Tensor& x, const Tensor& residual) {
  MP_CHECK(residual.defined(), type_name(), "::forward_add_relu: got an undefined residual");
  if (has_forward_hooks()) return relu(add((*this)(x), residual));
  return forward_fused(x, residual, true);
}

Tensor BatchNormBase::forward_fused(const Tensor& x, const Tensor& residual, bool relu) {
  MP_CHECK(std::find(input_dims_.begin(), input_dims_.end(), x.dim()) != input_dims_.end(), type_name(),
           "::forward: expected a ", input_dims_.front(), input_dims_.size() > 1 ? "-D or " : "-D",
           input_dims_.size() > 1 ? std::to_string(input_dims_.back()) + "-D" : std::string(), " input, got ",
           x.describe());
  MP_CHECK(x.size(1) == options_.num_features, type_name(), "::forward: expected ", options_.num_features,
           " channels in dim 1, got ", x.describe());
  double factor = options_.momentum.value_or(0.0);
  const bool update = is_training() && options_.track_running_stats;
  if (update) {
    autograd::NoGradGuard ng;
    if (options_.momentum) {
      // Counted on the buffer's device: no read back (on a GPU, a read is a host synchronisation per layer).
      num_batches_tracked_->copy_(add(*num_batches_tracked_, 1.0));
    } else {
      const int64_t n = num_batches_tracked_->item<int64_t>() + 1;
      num_batches_tracked_->fill_(static_cast<double>(n));
      factor = 1.0 / static_cast<double>(n);  // cumulative moving average
    }
  }
  // Running statistics are used in eval mode only when tracked (else batch statistics, as PyTorch).
  const bool batch_stats = is_training() || !options_.track_running_stats;
  if (is_training() && g_sync != nullptr)  // Note [synchronised batch norm]
    return sync_batch_norm(x, residual, relu, update ? *running_mean_ : Tensor(), *running_var_, *weight_, *bias_,
                           factor, options_.eps, *g_sync);
  if (residual.defined())
    return batch_norm_add_relu(x, residual, *running_mean_, *running_var_, *weight_, *bias_, batch_stats, factor,
                               options_.eps);
  if (relu)
    return batch_norm_relu(x, *running_mean_, *running_var_, *weight_, *bias_, batch_stats, factor, options_.eps);
  return batch_norm(x, *running_mean_, *running_var_, *weight_, *bias_, batch_stats, factor, options_.eps);
}

std::string BatchNormBase::extra_repr() const {
  std::ostringstream os;
  os << options_.num_features << ", eps=" << options_.eps << ", momentum=";
  if (options_.momentum) {
    os << *options_.momentum;
  } else {
    os << "None";
  }
  os << ", affine=" << (options_.affine ? "true" : "false")
     << ", track_running_stats=" << (options_.track_running_stats ? "true" : "false");
  return os.str();
}

bool is_batch_norm(const Module& m) { return dynamic_cast<const BatchNormBase*>(&m) != nullptr; }

}  // namespace mp::nn

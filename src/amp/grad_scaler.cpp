#include "mp/amp/grad_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "backend/amp_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/pointwise.hpp"

namespace mp::amp {

GradScalerOptions grad_scaler_defaults(DType dtype) {
  GradScalerOptions o;
  o.enabled = dtype == DType::f16;
  return o;
}

// Note [gradient accumulation in f32]
// Accumulating N micro-batches into a bf16 gradient rounds the running sum to 8 significant bits N-1
// times: each partial sum loses up to 2^-9 of its value, and small micro-batch contributions added to a
// large sum vanish entirely once they fall below half its last place (f16: 11 bits, the same story).
// PyTorch's autocast avoids this by keeping f32 parameters, hence f32 gradients, and pays for them in
// memory all the time. Here the 16-bit gradient of the first
// micro-batch is widened to f32 (exact) and the engine's AccumulateGrad adds every later micro-batch
// into that f32 buffer (add_ computes in the promoted type, f32), so the sum is rounded once, when the
// optimizer's fused step applies it to the f32 master. The cost is an f32 gradient per 16-bit parameter
// while a step accumulates (the optimizer step itself reads any floating gradient dtype, as for the f16
// gradients unscale_ widens), nothing when there is one micro-batch per step.
void accumulate_grads_in_f32(const std::vector<Tensor>& params) {
  autograd::NoGradGuard ng;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined() || (g.dtype() != DType::f16 && g.dtype() != DType::bf16)) continue;
    Tensor wide =
        empty(g.sizes(), {.dtype = DType::f32, .device = g.device(), .memory_format = g.suggest_memory_format()});
    wide.copy_(g);
    p.set_grad(wide);
  }
}

GradScaler::GradScaler(const GradScalerOptions& o)
    : options_(o), scale_(o.init_scale), hysteresis_tracker_(o.hysteresis) {
  MP_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale), "GradScaler: init_scale must be positive and finite, got ",
           o.init_scale);
  MP_CHECK(o.growth_factor > 1.0, "GradScaler: growth_factor must be > 1, got ", o.growth_factor);
  MP_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, "GradScaler: backoff_factor must be in (0, 1), got ",
           o.backoff_factor);
  MP_CHECK(o.growth_interval > 0, "GradScaler: growth_interval must be positive, got ", o.growth_interval);
  MP_CHECK(o.hysteresis >= 1, "GradScaler: hysteresis must be >= 1, got ", o.hysteresis);
  MP_CHECK(o.min_scale > 0 && o.min_scale <= o.max_scale, "GradScaler: expected 0 < min_scale <= max_scale, got ",
           o.min_scale, " and ", o.max_scale);
  if (o.dynamic) scale_ = std::clamp(scale_, o.min_scale, o.max_scale);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  MP_CHECK(loss.defined() && is_floating(loss.dtype()), "GradScaler::scale: expected a floating loss, got ",
           loss.describe());
  if (!options_.enabled) return loss;
  return mul(loss.to(DType::f32), scale_);
}

GradScaler::PerOptimizer& GradScaler::state_of(const optim::Optimizer& opt) { return per_opt_[&opt]; }

std::vector<Tensor> GradScaler::grads_of(const optim::Optimizer& opt) {
  std::vector<Tensor> gs;
  for (const Tensor& p : opt.parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    MP_CHECK(g.is_contiguous(), "GradScaler: gradient of ", p.describe(), " is not contiguous");
    gs.push_back(g);
  }
  return gs;
}

void GradScaler::unscale_(optim::Optimizer& opt) {
  if (!options_.enabled) return;
  PerOptimizer& st = state_of(opt);
  MP_CHECK(!st.unscaled,
           "GradScaler::unscale_: already called on this optimizer since the last update(); call it "
           "at most once per step, after all micro-batches' backward and before step()");
  MP_CHECK(!st.stepped, "GradScaler::unscale_: called after step(); unscale_ must come before step()");
  autograd::NoGradGuard ng;
  // Note [unscaling f16 gradients]: g / S written back into f16 storage would underflow again (values
  // below 2^-24, the ones loss scaling exists for, become 0), so f16 gradients are first widened to f32
  // (exact) and unscaled there; the optimizer's fused step reads gradients of any floating dtype.
  // (bf16 has f32's exponent range and is unscaled in place.)
  for (const Tensor& p : opt.parameters()) {
    const Tensor g = p.grad();
    if (g.defined() && g.dtype() == DType::f16) p.set_grad(g.to(DType::f32).contiguous());
  }
  const std::vector<Tensor> gs = grads_of(opt);
  if (!gs.empty()) st.found_inf = backend::unscale_kernel.get(gs.front().device())(gs, 1.0 / scale_, true);
  if (agree_) st.found_inf = agree_(st.found_inf);
  st.unscaled = true;
}

bool GradScaler::step(optim::Optimizer& opt) {
  if (!options_.enabled) {
    opt.step();
    last_skipped_ = false;
    return true;
  }
  PerOptimizer& st = state_of(opt);
  MP_CHECK(!st.stepped, "GradScaler::step: already called on this optimizer since the last update()");
  autograd::NoGradGuard ng;
  double inv = 1.0;
  if (!st.unscaled) {
    // Note [GradScaler fused step]: check only, let the optimizer's fused pass unscale.
    const std::vector<Tensor> gs = grads_of(opt);
    if (!gs.empty()) st.found_inf = backend::unscale_kernel.get(gs.front().device())(gs, 1.0, false);
    if (agree_) st.found_inf = agree_(st.found_inf);
    inv = 1.0 / scale_;
  }
  st.stepped = true;
  last_skipped_ = st.found_inf;
  if (st.found_inf) {
    ++skipped_steps_;
    return false;
  }
  const double prev = opt.grad_scale_inv();
  opt.set_grad_scale_inv(prev * inv);
  try {
    opt.step();
  } catch (...) {
    opt.set_grad_scale_inv(prev);
    throw;
  }
  opt.set_grad_scale_inv(prev);
  return true;
}

// Note [giving up on a loss scale]
// Skipping a step whose gradients hold inf/NaN cures an overflow caused by the scale, not one caused by the
// model: a skipped step leaves the weights as they were, so when the next batches overflow too, skipping
// more cannot help. A dynamic scale backs off first and gives up after max_overflows_at_min_scale
// overflows in a row at min_scale (the gradients are non-finite even unscaled); a static scale never
// changes and gives up after max_consecutive_skips skipped steps in a row. The default, 20, is generous:
// 20 overflows in a row at unchanged weights are what a dynamic scale would have answered by shrinking
// 2^20-fold. Both throw NumericalError (the CLI's exit status 3); 0 turns either off.
void GradScaler::update() {
  if (!options_.enabled) return;
  MP_CHECK(!per_opt_.empty(),
           "GradScaler::update: no step() or unscale_() was recorded since the last update(); "
           "call scaler.step(optimizer) before scaler.update()");
  bool found_inf = false;
  for (const auto& [opt, st] : per_opt_) found_inf = found_inf || st.found_inf;
  per_opt_.clear();
  if (!options_.dynamic) {  // Note [giving up on a loss scale]
    consecutive_skips_ = found_inf ? consecutive_skips_ + 1 : 0;
    if (found_inf && options_.max_consecutive_skips != 0 && consecutive_skips_ >= options_.max_consecutive_skips)
      throw NumericalError(detail::str_cat(
          "GradScaler: ", consecutive_skips_,
          " consecutive steps were skipped for inf/NaN gradients at the static "
          "loss scale ",
          scale_, " (max_consecutive_skips ", options_.max_consecutive_skips,
          "): a skipped step leaves "
          "the weights as they were, so the overflow repeats. Use a smaller static scale, dynamic loss scaling "
          "(--loss_scale dynamic), or bf16 (f32's exponent range, no loss scaling needed)"));
    return;
  }
  if (found_inf) {
    growth_tracker_ = 0;
    if (scale_ <= options_.min_scale) {
      ++overflows_at_min_;
      if (options_.max_overflows_at_min_scale != 0 && overflows_at_min_ >= options_.max_overflows_at_min_scale)
        throw NumericalError(detail::str_cat(
            "GradScaler: the loss scale is stuck at its minimum (", options_.min_scale, ") after ", overflows_at_min_,
            " consecutive steps with inf/NaN gradients: the gradients are non-finite even unscaled, so skipping "
            "steps cannot recover. The model has likely diverged: lower the learning rate, or train in bf16 "
            "(f32's exponent range, no loss scaling needed)"));
    }
    if (--hysteresis_tracker_ <= 0) {
      scale_ = std::max(options_.min_scale, scale_ * options_.backoff_factor);
      hysteresis_tracker_ = options_.hysteresis;
    }
    return;
  }
  overflows_at_min_ = 0;
  if (++growth_tracker_ >= options_.growth_interval) {
    scale_ = std::min(options_.max_scale, scale_ * options_.growth_factor);
    growth_tracker_ = 0;
    hysteresis_tracker_ = options_.hysteresis;
  }
}

nn::StateDict GradScaler::state_dict() const {
  nn::StateDict sd;
  auto f64 = [](double v) { return scalar_tensor(v, {.dtype = DType::f64}); };
  auto i64 = [](int64_t v) { return scalar_tensor(static_cast<double>(v), {.dtype = DType::i64}); };
  sd.insert("scale", f64(scale_));
  sd.insert("growth_factor", f64(options_.growth_factor));
  sd.insert("backoff_factor", f64(options_.backoff_factor));
  sd.insert("growth_interval", i64(options_.growth_interval));
  sd.insert("growth_tracker", i64(growth_tracker_));
  sd.insert("hysteresis", i64(options_.hysteresis));
  sd.insert("hysteresis_tracker", i64(hysteresis_tracker_));
  sd.insert("overflows_at_min_scale", i64(overflows_at_min_));
  sd.insert("skipped_steps", i64(skipped_steps_));
  sd.insert("dynamic", i64(options_.dynamic ? 1 : 0));
  sd.insert("enabled", i64(options_.enabled ? 1 : 0));
  sd.insert("min_scale", f64(options_.min_scale));
  sd.insert("max_scale", f64(options_.max_scale));
  sd.insert("max_overflows_at_min_scale", i64(options_.max_overflows_at_min_scale));
  sd.insert("consecutive_skips", i64(consecutive_skips_));
  sd.insert("max_consecutive_skips", i64(options_.max_consecutive_skips));
  return sd;
}

void GradScaler::load_state_dict(const nn::StateDict& sd) {
  auto get = [&](const char* key) {
    MP_CHECK(sd.contains(key), "GradScaler::load_state_dict: missing entry '", key,
             "'; was the state dict saved by GradScaler::state_dict()?");
    const Tensor& t = sd.at(key);
    MP_CHECK(t.numel() == 1, "GradScaler::load_state_dict: entry '", key, "' must be a scalar, got ", t.describe());
    return t.item<double>();
  };
  const double s = get("scale");
  MP_CHECK(s > 0 && std::isfinite(s), "GradScaler::load_state_dict: scale must be positive and finite, got ", s);
  scale_ = s;
  options_.growth_factor = get("growth_factor");
  options_.backoff_factor = get("backoff_factor");
  options_.growth_interval = static_cast<int64_t>(get("growth_interval"));
  growth_tracker_ = static_cast<int64_t>(get("growth_tracker"));
  options_.hysteresis = static_cast<int64_t>(get("hysteresis"));
  hysteresis_tracker_ = static_cast<int64_t>(get("hysteresis_tracker"));
  overflows_at_min_ = static_cast<int64_t>(get("overflows_at_min_scale"));
  skipped_steps_ = static_cast<int64_t>(get("skipped_steps"));
  options_.dynamic = get("dynamic") != 0.0;
  options_.enabled = get("enabled") != 0.0;
  options_.min_scale = get("min_scale");
  options_.max_scale = get("max_scale");
  options_.max_overflows_at_min_scale = static_cast<int64_t>(get("max_overflows_at_min_scale"));
  // Absent from state dicts saved before the static scale's limit existed: the counter starts at 0 and the
  // limit stays this scaler's.
  consecutive_skips_ = sd.contains("consecutive_skips") ? static_cast<int64_t>(get("consecutive_skips")) : 0;
  if (sd.contains("max_consecutive_skips"))
    options_.max_consecutive_skips = static_cast<int64_t>(get("max_consecutive_skips"));
}

}  // namespace mp::amp

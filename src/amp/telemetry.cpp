// Per-layer numerics telemetry (mp/amp/telemetry.hpp).
#include "mp/amp/telemetry.hpp"

#include <cmath>
#include <limits>

#include "mp/amp/diagnostics.hpp"
#include "mp/autograd/node.hpp"
#include "mp/core/error.hpp"
#include "mp/ops/ops.hpp"

namespace mp::amp {

// Note [updates lost to rounding]
// A 16-bit weight w changes only when its update moves it by at least half an ulp of w (round to nearest:
// a smaller |delta| rounds back to w; the f16 ulp of |w| in [2^e, 2^(e+1)) is 2^(e-10), 2^-24 below 2^-14;
// bf16's 2^(e-7), 2^-133 below 2^-126). The share of lost updates is measured over the weights that the step
// moved:
//  - with f32 masters (O2) the update is delta = master after - master before, counted where delta != 0,
//    and lost where |delta| < half an ulp of the 16-bit weight before the step (the master keeps it; the
//    16-bit copy may still change later, when the master's small steps add up: what master weights are for);
//  - without masters (O3) the update itself is gone after the step: counted where the gradient was nonzero,
//    lost where the stored 16-bit weight did not change (the same rule, read off the result; with
//    --stochastic_rounding a small update changes the weight with a probability instead).
double half_ulp(double w, DType dtype) {
  MP_CHECK(dtype == DType::f16 || dtype == DType::bf16, "half_ulp: expected f16 or bf16, got ", dtype_name(dtype));
  const int mantissa = dtype == DType::f16 ? 10 : 7;
  const int min_exp = dtype == DType::f16 ? -14 : -126;  // exponent of the smallest normal
  const double a = std::fabs(w);
  int e = min_exp;
  if (a >= std::ldexp(1.0, min_exp)) e = std::ilogb(a);
  return std::ldexp(1.0, e - mantissa - 1);
}

namespace {

constexpr double kUnseen = -1;  // an amax not yet seen (NaN stands for a non-finite one)

// max(cur, v) that keeps a NaN once seen.
void fold_max(double& cur, double v) {
  if (std::isnan(cur)) return;
  if (std::isnan(v) || v > cur) cur = v;
}

double amax_of(const Tensor& t) {
  autograd::NoGradGuard ng;
  if (!t.defined() || t.numel() == 0 || !is_floating(t.dtype())) return kUnseen;
  return max(abs(t.detach())).item<double>();
}

// A host f32 copy of t (contiguous).
Tensor host_f32(const Tensor& t) { return t.detach().to(DType::f32).to(Device()).contiguous(); }

}  // namespace

/// What one watched module accumulates over an armed step.
struct NumericsRecorder::Watched {
  nn::Module* module = nullptr;
  LayerNumerics rec;
  std::vector<Tensor> params;  ///< its own parameters (not its children's)
  double act = kUnseen, grad = kUnseen;
  int64_t nonfinite_at = -1;  ///< when its forward output first went non-finite (the recorder's count), -1: never
  // before_update's host copies of its 16-bit parameters: the weights, and the masters or the nonzero-gradient mask
  std::vector<Tensor> w_before, master_before, grad_nonzero;
};

NumericsRecorder::NumericsRecorder(nn::Module& root) {
  for (auto& [name, m] : root.named_modules()) {
    auto own = m->named_parameters(/*recurse=*/false);
    if (own.empty()) continue;
    auto w = std::make_shared<Watched>();
    w->module = m;
    w->rec.module = name;
    w->rec.type = m->type_name();
    w->rec.dtype = dtype_name(own.front().second.dtype());
    for (auto& [pn, p] : own) w->params.push_back(p);
    watched_.push_back(std::move(w));
  }
}

NumericsRecorder::~NumericsRecorder() { disarm(); }

void NumericsRecorder::disarm() {
  for (auto& [m, id] : hooks_) m->remove_forward_hook(id);
  hooks_.clear();
}

void NumericsRecorder::arm() {
  if (armed()) return;
  *nonfinite_count_ = 0;
  for (const auto& w : watched_) {
    w->act = w->grad = kUnseen;
    w->nonfinite_at = -1;
    w->rec = LayerNumerics{.module = w->rec.module, .type = w->rec.type};
    w->w_before.clear();
    w->master_before.clear();
    w->grad_nonzero.clear();
    // Training passes only: an evaluation between steps runs without grad mode and is not recorded. The hooks
    // hold the shared record, so a gradient hook that fires after the recorder is gone stays valid.
    const size_t id =
        w->module->register_forward_hook([w, count = nonfinite_count_](nn::Module&, const Tensor&, const Tensor& out) {
          if (!autograd::grad_mode_enabled() || !out.defined() || !out.requires_grad()) return;
          const double amax = amax_of(out);
          if (!std::isfinite(amax) && w->nonfinite_at < 0) w->nonfinite_at = (*count)++;
          fold_max(w->act, amax);
          autograd::register_hook(out, [w](const Tensor& g) {
            fold_max(w->grad, amax_of(g));
            return Tensor();
          });
        });
    hooks_.emplace_back(w->module, id);
  }
}

void NumericsRecorder::gradients(double scale) {
  for (const auto& w : watched_) {
    // The parameters may have been replaced since construction (O2 converts them): read the live ones.
    w->params.clear();
    for (auto& [pn, p] : w->module->named_parameters(false)) w->params.push_back(p);
    w->rec.dtype = dtype_name(w->params.front().dtype());
    const UnderflowStats s = underflow_stats_of_scaled_grads(w->params, scale);
    w->rec.grad_values = s.values;
    w->rec.grad_underflow = s.underflow_scaled;
    w->rec.grad_underflow_unscaled = s.underflow_unscaled;
    w->rec.grad_zero = s.values > 0 ? static_cast<double>(s.zeros) / static_cast<double>(s.values) : 0.0;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    w->rec.has_update = false;
    for (const Tensor& p : w->params) w->rec.has_update = w->rec.has_update || is_low_precision(p.dtype());
    w->rec.update_lost = nan;  // until after_update() measures an applied step
    w->rec.act_amax = w->act == kUnseen ? nan : w->act;
    w->rec.act_first_nonfinite = w->nonfinite_at == 0;
    w->rec.grad_amax = w->grad == kUnseen || std::isnan(w->grad) ? nan : w->grad / scale;
  }
}

void NumericsRecorder::before_update(const optim::Optimizer& opt) {
  for (const auto& w : watched_) {
    w->w_before.clear();
    w->master_before.clear();
    w->grad_nonzero.clear();
    for (const Tensor& p : w->params) {
      if (!is_low_precision(p.dtype())) continue;
      w->w_before.push_back(host_f32(p));
      // With master weights on, a parameter's first step creates its master from the 16-bit value.
      const Tensor m = opt.master(p);
      const bool masters = m.defined() || opt.master_weights();
      w->master_before.push_back(m.defined() ? host_f32(m) : masters ? w->w_before.back() : Tensor());
      const Tensor g = p.grad();
      w->grad_nonzero.push_back(masters || !g.defined() ? Tensor() : host_f32(g));
    }
  }
}

void NumericsRecorder::after_update(const optim::Optimizer& opt, bool stepped) {
  for (const auto& w : watched_) {
    if (w->w_before.empty() || !stepped) continue;
    int64_t moved = 0, lost = 0;
    size_t k = 0;
    for (const Tensor& p : w->params) {
      if (!is_low_precision(p.dtype())) continue;
      const DType dt = p.dtype();
      const Tensor& before = w->w_before[k];
      const float* wb = before.data_ptr<float>();
      const int64_t n = before.numel();
      if (w->master_before[k].defined()) {
        const Tensor after = host_f32(opt.master(p));
        const float* mb = w->master_before[k].data_ptr<float>();
        const float* ma = after.data_ptr<float>();
        for (int64_t i = 0; i < n; ++i) {
          const double d = static_cast<double>(ma[i]) - static_cast<double>(mb[i]);
          if (d == 0) continue;
          ++moved;
          lost += std::fabs(d) < half_ulp(wb[i], dt) ? 1 : 0;
        }
      } else if (w->grad_nonzero[k].defined()) {
        const Tensor after = host_f32(p);
        const float* wa = after.data_ptr<float>();
        const float* g = w->grad_nonzero[k].data_ptr<float>();
        for (int64_t i = 0; i < n; ++i) {
          if (g[i] == 0) continue;
          ++moved;
          lost += wa[i] == wb[i] ? 1 : 0;
        }
      }
      ++k;
    }
    w->rec.update_lost = moved > 0 ? static_cast<double>(lost) / static_cast<double>(moved) : 0.0;
  }
}

std::vector<LayerNumerics> NumericsRecorder::take() {
  disarm();
  std::vector<LayerNumerics> out;
  for (const auto& w : watched_) out.push_back(w->rec);
  return out;
}

}  // namespace mp::amp

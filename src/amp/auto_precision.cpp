// Automatic per-layer precision (mp/amp/auto_precision.hpp).
#include "mp/amp/auto_precision.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <utility>

#include "mp/autograd/node.hpp"
#include "mp/core/error.hpp"

namespace mp::amp {

// Note [automatic precision]
// With --auto_precision an O2 run starts every layer O2 casts in 16-bit and reads their telemetry (NumericsRecorder)
// every --auto_precision_every steps and on the step after each skipped one. Overflow sign: the layer's forward output
// was the step's first non-finite one, or its output's or output gradient's (at scale 1) amax reaches
// --auto_precision_overflow x its 16-bit largest value. Underflow sign (f16): its output gradient's amax at the loss
// scale is below --auto_precision_underflow (2^-14: all of it subnormal or zero; an f16 gradient holds no values below
// 2^-24 to count, only zeros, which dead ReLUs and unused embedding rows make too). After --auto_precision_patience
// consecutive observations with one sign the layer moves to f32:
//  - f32, not bf16: f32 answers both signs (bf16 has f32's range but 3 bits less precision than f16), and a bf16
//    layer among f16 ones runs no faster: f16 with bf16 operands promote to f32 anyway.
//  - its output stays f32, so the ops after it compute in f32 by type promotion; casting it back to 16-bit would bring
//    back the overflow that moved it.
//  - one way: its range does not shrink by itself, and moving back and forth would make a run's numerics hang on when
//    it looked; a move costs speed, never accuracy.
//  - its f32 master becomes the parameter (the 16-bit weight was its rounding); the optimizer keeps the moments and
//    step count (f32 already) and drops the master.
//  - moves and streaks are checkpointed and --resume replays the moves: the resumed run continues exactly.
// Data-parallel ranks see different batches: they add up their signs (any rank's counts), so all decide alike.

namespace {

double largest(DType d) { return d == DType::f16 ? 65504.0 : 3.3895313892515355e38; }

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

}  // namespace

LayerSign assess(const LayerNumerics& l, const AutoPrecisionOptions& o, double scale) {
  LayerSign s;
  if (l.dtype != "f16" && l.dtype != "bf16") return s;  // f32 layers (batch norm under O2, layers moved) stay
  const DType d = dtype_from_string(l.dtype);
  const double limit = o.overflow * largest(d);
  if (l.act_first_nonfinite) {
    s.overflow = true;
    s.why = "forward output non-finite (the step's first)";
  } else if (std::isfinite(l.act_amax) && l.act_amax >= limit) {
    s.overflow = true;
    s.why = "forward output amax " + num(l.act_amax) + " >= " + num(o.overflow) + " x " + num(largest(d));
  } else if (std::isfinite(l.grad_amax) && l.grad_amax >= limit) {
    s.overflow = true;
    s.why = "output gradient amax " + num(l.grad_amax) + " at scale 1 >= " + num(o.overflow) + " x " + num(largest(d));
  }
  if (d == DType::f16 && std::isfinite(l.grad_amax) && l.grad_amax * scale < o.underflow) {
    s.underflow = true;
    s.why += std::string(s.why.empty() ? "" : "; ") + "output gradient amax " + num(l.grad_amax * scale) +
             " at loss scale " + num(scale) + " < " + num(o.underflow);
  }
  return s;
}

AutoPrecision::AutoPrecision(const AutoPrecisionOptions& options) : options_(options) {
  MP_CHECK(options.overflow > 0 && options.overflow <= 1, "AutoPrecision: overflow must be in (0, 1], got ",
           options.overflow);
  MP_CHECK(options.underflow > 0 && options.underflow <= 1, "AutoPrecision: underflow must be in (0, 1], got ",
           options.underflow);  // a gradient amax: below 1, or every gradient would count
  MP_CHECK(options.patience >= 1, "AutoPrecision: patience must be at least 1, got ", options.patience);
}

std::vector<PrecisionMove> AutoPrecision::observe(const std::vector<LayerNumerics>& layers,
                                                  const std::vector<LayerSign>& signs, int64_t step) {
  MP_CHECK(layers.size() == signs.size(), "AutoPrecision::observe: ", layers.size(), " layers but ", signs.size(),
           " signs");
  std::vector<PrecisionMove> now;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerNumerics& l = layers[i];
    const LayerSign& s = signs[i];
    Streak st = streaks_.count(l.module) ? streaks_.at(l.module) : Streak{};
    st.overflow = s.overflow ? st.overflow + 1 : 0;
    st.underflow = s.underflow ? st.underflow + 1 : 0;
    streaks_.erase(l.module);
    const int64_t n = std::max(st.overflow, st.underflow);
    if (n >= options_.patience) {
      PrecisionMove m{.module = l.module,
                      .type = l.type,
                      .from = dtype_from_string(l.dtype),
                      .to = DType::f32,
                      .step = step,
                      .reason = std::string(st.overflow >= options_.patience ? "overflow" : "underflow") + " in " +
                                std::to_string(n) + " consecutive observation" + (n == 1 ? "" : "s") + ": " + s.why};
      moves_.push_back(m);
      now.push_back(std::move(m));
    } else if (st.overflow > 0 || st.underflow > 0) {
      streaks_[l.module] = st;
    }
  }
  return now;
}

void AutoPrecision::restore(std::vector<PrecisionMove> moves, std::map<std::string, Streak> streaks) {
  moves_ = std::move(moves);
  streaks_ = std::move(streaks);
}

std::vector<std::string> promote_to_f32(nn::Module& root, const std::string& name, optim::Optimizer& opt) {
  autograd::NoGradGuard ng;
  nn::Module* target = nullptr;
  for (auto& [n, m] : root.named_modules())
    if (n == name) target = m;
  MP_CHECK(target != nullptr, "auto precision: the model has no module named '", name,
           "' (a checkpoint of another model?); resume with the model the checkpoint was written by");
  // The modules holding one of the target's parameters convert together: to() keeps their ties.
  std::set<const TensorImpl*> own;
  for (const auto& [pn, p] : target->named_parameters(false)) own.insert(p.impl_ptr().get());
  std::set<const nn::Module*> group;
  std::vector<std::string> names;
  for (auto& [n, m] : root.named_modules())
    for (const auto& [pn, p] : m->named_parameters(false))
      if (own.count(p.impl_ptr().get()) != 0) {
        if (group.insert(m).second) names.push_back(n);
        break;
      }
  std::stable_partition(names.begin(), names.end(), [&](const std::string& n) { return n == name; });
  std::vector<Tensor> before, masters;
  for (auto& [n, m] : root.named_modules()) {
    if (group.count(m) == 0) continue;
    for (const auto& [pn, p] : m->named_parameters(false)) {
      before.push_back(p);
      masters.push_back(opt.master(p));
    }
  }
  root.to(DType::f32, [&](const nn::Module& m) { return group.count(&m) != 0; });
  std::vector<Tensor> after;
  for (auto& [n, m] : root.named_modules())
    if (group.count(m) != 0)
      for (const auto& [pn, p] : m->named_parameters(false)) after.push_back(p);
  MP_ASSERT(after.size() == before.size(), "promote_to_f32: ", before.size(), " parameters before, ", after.size(),
            " after");
  std::set<const TensorImpl*> optimized;
  for (const Tensor& p : opt.parameters()) optimized.insert(p.impl_ptr().get());
  std::set<const TensorImpl*> done;
  for (size_t i = 0; i < before.size(); ++i) {
    if (before[i].impl_ptr() == after[i].impl_ptr() || !done.insert(before[i].impl_ptr().get()).second) continue;
    if (masters[i].defined()) after[i].copy_(masters[i]);
    if (optimized.count(before[i].impl_ptr().get()) == 0) continue;
    opt.replace_parameter(before[i], after[i]);
    opt.drop_master(after[i]);
  }
  return names;
}

}  // namespace mp::amp

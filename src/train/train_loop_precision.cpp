// TrainLoop's automatic per-layer precision (Note [automatic precision] in src/amp/auto_precision.cpp): the
// observations, the moves and their replay on --resume.
#include <string>
#include <vector>

#include "mp/autograd/node.hpp"
#include "mp/core/error.hpp"
#include "mp/train/checkpoint.hpp"
#include "train/precision_moves.hpp"
#include "train/train_loop.hpp"

namespace mp::train::detail {

void TrainLoop::observe_precision(const std::vector<amp::LayerNumerics>& layers, double scale, int64_t global) {
  std::vector<amp::LayerSign> signs;
  for (const amp::LayerNumerics& l : layers) signs.push_back(amp::assess(l, auto_->options(), scale));
  if (data_parallel()) {  // any rank's sign counts, so every rank decides alike (Note [automatic precision])
    std::vector<double> mine;
    for (const amp::LayerSign& s : signs) mine.insert(mine.end(), {s.overflow ? 1.0 : 0.0, s.underflow ? 1.0 : 0.0});
    const std::vector<double> all = parts_.dp->sum(mine);
    for (size_t i = 0; i < signs.size(); ++i) {
      const bool overflow = all[2 * i] > 0, underflow = all[2 * i + 1] > 0;
      if (overflow != signs[i].overflow || underflow != signs[i].underflow)
        signs[i].why += std::string(signs[i].why.empty() ? "" : "; ") + "a sign seen on another rank";
      signs[i].overflow = overflow;
      signs[i].underflow = underflow;
    }
  }
  bool underflow_moved = false;
  for (const amp::PrecisionMove& m : auto_->observe(layers, signs, global)) {
    const std::vector<std::string> converted = move_layer(m.module);
    out_ << "auto precision: " << move_text(m, converted) << "\n";
    if (log_) write_precision_move(*log_, epoch_ + 1, m, converted);
    underflow_moved = underflow_moved || m.reason.find("underflow") != std::string::npos;
  }
  // Underflowing f16 gradients are what loss scaling is for: it keeps the layers in f16 (bench/RESULTS.md: gpt-mini
  // without scaling moved 28 of 39 layers to f32). Said once, when the run has no dynamic scaler.
  const bool dynamic = parts_.scaler.is_enabled() && parts_.scaler.options().dynamic;
  if (underflow_moved && !dynamic && !hinted_scaling_) {
    hinted_scaling_ = true;
    out_ << "auto precision: f16 gradients underflow at loss scale " << scale
         << "; dynamic loss scaling (--loss_scale dynamic, fp16's default) keeps such layers in f16 and fast, where "
            "moving them to f32 gives up their speed\n";
  }
}

std::vector<std::string> TrainLoop::move_layer(const std::string& module) {
  std::vector<std::string> converted = amp::promote_to_f32(*parts_.refs.model, module, parts_.optimizer);
  parts_.params = parts_.refs.model->parameters();
  if (buckets_) {  // their hooks sit on the old tensors
    buckets_.reset();
    buckets_ = parts_.dp->gradient_buckets(parts_.params, c_.bucket_mb, c_.grad_comm_dtype);
  }
  // The last good buffers keep their values in the buffers' new dtypes (Note [stopping on a numerical failure]).
  const std::vector<Tensor> live = parts_.refs.model->buffers();
  if (live.size() == buffers_.size())
    for (size_t i = 0; i < live.size(); ++i)
      if (buffers_[i].dtype() != live[i].dtype()) buffers_[i] = buffers_[i].to(live[i].dtype());
  return converted;
}

void TrainLoop::replay_precision(const std::string& json) {
  restore_precision_state(json, "checkpoint '" + ckpt_ + "': metadata '" + kAutoPrecisionKey + "'", *auto_,
                          observe_next_);
  if (auto_->moves().empty()) return;
  const nn::StateDict saved = read_model_state(ckpt_);
  autograd::NoGradGuard ng;
  std::string names;
  for (const amp::PrecisionMove& m : auto_->moves()) {
    names += (names.empty() ? "" : ", ") + m.module;
    for (const std::string& module : move_layer(m.module)) {
      for (auto& [n, mod] : parts_.refs.model->named_modules()) {
        if (n != module) continue;
        for (auto& [pn, p] : mod->named_parameters(false)) {
          const std::string key = module.empty() ? pn : module + "." + pn;
          const Tensor* t = saved.find(key);
          MP_CHECK(t != nullptr && t->dtype() == p.dtype() && t->sizes() == p.sizes(), "checkpoint '", ckpt_,
                   "': its metadata '", kAutoPrecisionKey, "' moved ", m.module, " to f32, so expected model tensor '",
                   key, "' as ", dtype_name(p.dtype()), " ", shape_str(p.sizes()), ", got ",
                   t == nullptr ? std::string("none") : t->describe(),
                   "; the file is damaged: resume from another checkpoint");
          p.copy_(*t);
        }
      }
    }
  }
  out_ << "auto precision: resumed with " << auto_->moves().size() << " layer"
       << (auto_->moves().size() == 1 ? "" : "s") << " moved to f32 (" << names << ")\n";
}

}  // namespace mp::train::detail

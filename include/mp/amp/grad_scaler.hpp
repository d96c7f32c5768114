#pragma once
// Loss scaling (docs/DESIGN.md 1.3) with PyTorch's torch.amp.GradScaler semantics and defaults.
#include <cstdint>
#include <functional>
#include <unordered_map>

#include "mp/nn/state_dict.hpp"
#include "mp/optim/optimizer.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::amp {

/// Options of GradScaler. The defaults are PyTorch's (dynamic, 65536, x2 every 2000 clean steps,
/// x0.5 on overflow).
struct GradScalerOptions {
  double init_scale = 65536.0;              ///< starting scale S
  double growth_factor = 2.0;               ///< S *= growth_factor after growth_interval clean steps
  double backoff_factor = 0.5;              ///< S *= backoff_factor on overflow
  int64_t growth_interval = 2000;           ///< clean steps between growths
  bool dynamic = true;                      ///< false: static scale (init_scale, never changes; overflows still skip)
  int64_t hysteresis = 1;                   ///< overflows tolerated before backing off (1 = back off at the first)
  double min_scale = 1.0;                   ///< S never goes below this
  double max_scale = 16777216.0;            ///< S never goes above this (2^24)
  int64_t max_overflows_at_min_scale = 10;  ///< consecutive overflows at min_scale before giving up (0 = never)
  int64_t max_consecutive_skips = 20;       ///< static scale: consecutive skipped steps before giving up (0 = never)
  bool enabled = true;                      ///< false: scale() is the identity, step() just steps
};

/// The defaults for training in `dtype`: enabled for f16, disabled for bf16 and f32 (bf16 has f32's
/// exponent range, so gradients do not underflow).
GradScalerOptions grad_scaler_defaults(DType dtype);

/// Gradient accumulation with 16-bit parameters (O2/O3): replace each f16/bf16 gradient of `params` by
/// an f32 copy (exact), so that the next micro-batches' backward passes add into f32 (the engine adds
/// into the gradient it finds, in that gradient's dtype) and the sum is rounded once, by the optimizer
/// step, instead of once per micro-batch (Note [gradient accumulation in f32]). Call it after the
/// first micro-batch's backward of each optimizer step; the scaler and the optimizers read f32
/// gradients of 16-bit parameters. Other gradients and absent ones are left alone.
void accumulate_grads_in_f32(const std::vector<Tensor>& params);

/// Dynamic or static loss scaling:
///   scaler.scale(loss).backward();  // optional: scaler.unscale_(opt); clip_grad_norm_(...);
///   if (scaler.step(opt)) scheduler.step();  // skipped on inf/NaN
///   scaler.update();
/// For gradient accumulation, scale and backward every micro-batch and call unscale_/step/update
/// once per optimizer step (with 16-bit parameters, see accumulate_grads_in_f32). Note [GradScaler fused step]: step()
/// without a prior unscale_() checks the gradients for inf/NaN in one read-only multi-tensor pass and then lets the
/// optimizer's fused pass unscale them while it updates (one write pass instead of two).
class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});

  /// loss * S (in f32; the loss keeps its graph).
  Tensor scale(const Tensor& loss) const;
  /// Divide the gradients of `opt`'s parameters by S in place and record whether any is inf/NaN.
  /// f16 gradients are replaced by f32 ones first, so unscaled values below f16's range survive.
  /// At most once per optimizer between update()s (a second call throws).
  void unscale_(optim::Optimizer& opt);
  /// Step `opt` unless its gradients hold inf/NaN; returns whether it stepped. A skipped step must not
  /// advance the LR schedule (use the return value).
  bool step(optim::Optimizer& opt);
  /// Adjust S after the step: back off on overflow (after `hysteresis` overflows), grow after
  /// `growth_interval` clean steps. Throws NumericalError when a dynamic S is stuck at min_scale, or a static
  /// S has skipped max_consecutive_skips steps in a row (Note [giving up on a loss scale]).
  void update();

  /// Current S (1 when disabled).
  double get_scale() const { return options_.enabled ? scale_ : 1.0; }
  /// Whether scaling is on.
  bool is_enabled() const { return options_.enabled; }
  /// Whether the last step() found inf/NaN and skipped.
  bool last_step_skipped() const { return last_skipped_; }
  /// Steps skipped so far.
  int64_t skipped_steps() const { return skipped_steps_; }
  /// Clean steps since the last growth or backoff.
  int64_t growth_tracker() const { return growth_tracker_; }
  /// The options.
  const GradScalerOptions& options() const { return options_; }
  /// Data-parallel runs: `agree` receives this process's found-inf of every check (in unscale_(), or in step()
  /// without one) and returns the verdict of every rank (any rank's inf/NaN skips everyone's step), so all ranks
  /// skip the same steps and keep the same scale. It is called on every check, also with no gradients, since it
  /// is a collective. Empty (the default): this process's own finding.
  void set_found_inf_agreement(std::function<bool(bool)> agree) { agree_ = std::move(agree); }

  /// Scale, growth tracker, hysteresis tracker, skipped steps and options as tensors (f64/i64 scalars).
  nn::StateDict state_dict() const;
  /// Restore a state_dict(); throws naming a missing or malformed entry.
  void load_state_dict(const nn::StateDict& sd);

 private:
  struct PerOptimizer {
    bool unscaled = false;
    bool stepped = false;
    bool found_inf = false;
  };
  PerOptimizer& state_of(const optim::Optimizer& opt);
  static std::vector<Tensor> grads_of(const optim::Optimizer& opt);

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
  int64_t overflows_at_min_ = 0;
  int64_t consecutive_skips_ = 0;  ///< static scale: steps skipped in a row
  int64_t skipped_steps_ = 0;
  bool last_skipped_ = false;
  std::unordered_map<const optim::Optimizer*, PerOptimizer> per_opt_;
  std::function<bool(bool)> agree_;
};

}  // namespace mp::amp

#pragma once
// Exponential moving average of a model's weights (timm's ModelEma, PyTorch's AveragedModel with an EMA
// function), kept in f32 whatever the weights' dtype: Note [weight EMA in f32] in src/optim/ema.cpp.
#include <cstdint>

#include "mp/nn/module.hpp"
#include "mp/nn/state_dict.hpp"

namespace mp::optim {

class Optimizer;

/// An f32 average of every floating entry of a model's state dict (parameters and buffers such as batch
/// norm's running statistics); integer entries (counters) are copied. Usage: construct after the model
/// has its training dtypes (after amp::initialize), call update() after each optimizer step that was not
/// skipped, evaluate inside a swap_into() scope.
class ModelEma {
 public:
  /// Start the averages at `model`'s current state (or, for parameters with an f32 master in `opt`, at
  /// the master). `decay` in [0, 1): the weight of the old average at each update.
  ModelEma(const nn::Module& model, double decay, const Optimizer* opt = nullptr);

  /// average = decay * average + (1 - decay) * weight, in f32, for every floating entry; a parameter
  /// with an f32 master in `opt` contributes the master (O2), not its 16-bit rounding.
  void update(const nn::Module& model, const Optimizer* opt = nullptr);

  double decay() const { return decay_; }
  /// Updates so far (saved with the averages).
  int64_t num_updates() const { return updates_; }

  /// The averages under the model's state-dict names (f32 for floating entries), plus "num_updates".
  nn::StateDict state_dict() const;
  /// Restore what state_dict() returned; names, shapes and kinds must match the averages (a mismatch
  /// is refused naming the entry, and nothing is changed).
  void load_state_dict(const nn::StateDict& state);
  /// The averages as a model state dict (without "num_updates"), for load_state_dict or saving.
  const nn::StateDict& averages() const { return avg_; }

  /// While it lives, `model` holds the averages (rounded to each tensor's dtype); its own state comes
  /// back, bit for bit, when it ends. Not copyable.
  class Swap {
   public:
    Swap(nn::Module& model, const nn::StateDict& averages);
    ~Swap();
    Swap(const Swap&) = delete;
    Swap& operator=(const Swap&) = delete;

   private:
    nn::Module& model_;
    nn::StateDict saved_;
  };
  /// Put the averages into `model` until the returned guard ends (evaluation with the EMA weights).
  [[nodiscard]] Swap swap_into(nn::Module& model) const { return Swap(model, avg_); }

 private:
  double decay_;
  int64_t updates_ = 0;
  nn::StateDict avg_;
};

}  // namespace mp::optim

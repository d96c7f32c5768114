#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "mp/optim/optimizer.hpp"

namespace mp::optim {

/// What an LR scheduler saves: steps taken and the base learning rates.
struct SchedulerStateDict {
  int64_t last_step = 0;         ///< scheduler steps taken (PyTorch's last_epoch)
  std::vector<double> base_lrs;  ///< per group, the lr the schedule scales
};

/// The base of the learning-rate schedules (PyTorch's LRScheduler): a closed-form function of
/// (step, base_lr). Construction records each group's current lr as its base and applies step 0;
/// each step() advances one step and writes the new lr into every group. Call it once per
/// optimizer update, after optimizer.step(): update k (0-based) then runs with lr(k).
class LRScheduler {
 public:
  /// lr of a group at `step` given its base lr.
  using Schedule = std::function<double(int64_t step, double base_lr)>;

  /// Schedule `optimizer` (which must outlive the scheduler) with `schedule`.
  LRScheduler(Optimizer& optimizer, Schedule schedule);
  virtual ~LRScheduler();
  /// Advance one step and set every group's lr.
  void step();
  /// The lr last written into each group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  /// Steps taken since construction (0 right after it).
  int64_t last_step() const { return last_step_; }
  /// Each group's base lr.
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// lr of group `group` at any step (does not change the optimizer).
  double lr_at(int64_t step, size_t group = 0) const;
  /// Steps taken and base lrs.
  SchedulerStateDict state_dict() const;
  /// Restore steps and base lrs, and write the lr of that step into the optimizer.
  void load_state_dict(const SchedulerStateDict& state);

 private:
  void apply();

  Optimizer& optimizer_;
  Schedule schedule_;
  int64_t last_step_ = 0;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
};

/// What follows the warm-up in a WarmupSchedule.
enum class Decay { constant, linear, cosine, step };

/// Options of WarmupSchedule.
struct WarmupScheduleOptions {
  int64_t warmup_steps = 0;  ///< steps of linear warm-up (0 = none)
  int64_t total_steps = 0;   ///< end of the linear/cosine decay (warm-up included)
  Decay decay = Decay::constant;
  double min_lr = 0.0;    ///< floor of every decay, absolute (not a factor)
  int64_t step_size = 1;  ///< Decay::step: multiply by gamma every step_size steps after warm-up
  double gamma = 0.1;     ///< Decay::step factor
};

/// Linear warm-up, then constant / linear decay / cosine decay / step decay. With W warmup steps,
/// D = total_steps - W and d = step - W:
///   step < W:  base * (step + 1) / W              (reaches base at step W - 1)
///   constant:  base
///   linear:    min_lr + (base - min_lr) * (1 - min(d / D, 1))
///   cosine:    min_lr + (base - min_lr) * (1 + cos(pi * min(d / D, 1))) / 2
///   step:      max(min_lr, base * gamma^floor(d / step_size))  (PyTorch's StepLR after warm-up)
class WarmupSchedule : public LRScheduler {
 public:
  /// Schedule `optimizer` with `options` (validated).
  WarmupSchedule(Optimizer& optimizer, const WarmupScheduleOptions& options);
  /// The closed form above for one base lr.
  static double compute(const WarmupScheduleOptions& o, int64_t step, double base_lr);
  /// The options.
  const WarmupScheduleOptions& options() const { return options_; }

 private:
  WarmupScheduleOptions options_;
};

/// lr = base * factor(step) (PyTorch's LambdaLR).
class LambdaLR : public LRScheduler {
 public:
  /// Schedule `optimizer` with a multiplicative factor of the step.
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t step)> factor);
};

}  // namespace mp::optim

// LR schedules: the scheduler base and the warm-up/decay family.
#include "mp/optim/lr_scheduler.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mp::optim {

LRScheduler::LRScheduler(Optimizer& optimizer, Schedule schedule)
    : optimizer_(optimizer), schedule_(std::move(schedule)) {
  MP_CHECK(schedule_ != nullptr, "LRScheduler: got an empty schedule function");
  for (size_t g = 0; g < optimizer_.num_param_groups(); ++g) base_lrs_.push_back(optimizer_.lr(g));
  apply();
}

LRScheduler::~LRScheduler() = default;

double LRScheduler::lr_at(int64_t step, size_t group) const {
  MP_CHECK(group < base_lrs_.size(), "LRScheduler::lr_at: group ", group, " out of range for ", base_lrs_.size(),
           " groups");
  return schedule_(step, base_lrs_[group]);
}

void LRScheduler::apply() {
  MP_CHECK(optimizer_.num_param_groups() == base_lrs_.size(), "LRScheduler: the optimizer has ",
           optimizer_.num_param_groups(), " parameter groups but the scheduler was built for ", base_lrs_.size(),
           "; create the scheduler after adding every group");
  last_lr_.clear();
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    const double lr = schedule_(last_step_, base_lrs_[g]);
    optimizer_.set_lr(g, lr);
    last_lr_.push_back(lr);
  }
}

void LRScheduler::step() {
  ++last_step_;
  apply();
}

SchedulerStateDict LRScheduler::state_dict() const { return {last_step_, base_lrs_}; }

void LRScheduler::load_state_dict(const SchedulerStateDict& state) {
  MP_CHECK(state.base_lrs.size() == base_lrs_.size() && state.last_step >= 0, "LRScheduler::load_state_dict: got ",
           state.base_lrs.size(), " base lrs and step ", state.last_step, ", expected ", base_lrs_.size(),
           " base lrs and a non-negative step");
  last_step_ = state.last_step;
  base_lrs_ = state.base_lrs;
  apply();
}

namespace {

WarmupScheduleOptions checked(const WarmupScheduleOptions& o) {
  MP_CHECK(o.warmup_steps >= 0, "WarmupSchedule: expected warmup_steps >= 0, got ", o.warmup_steps);
  MP_CHECK(o.min_lr >= 0.0, "WarmupSchedule: expected min_lr >= 0, got ", o.min_lr);
  if (o.decay == Decay::linear || o.decay == Decay::cosine)
    MP_CHECK(o.total_steps > o.warmup_steps, "WarmupSchedule: linear and cosine decay need total_steps > ",
             "warmup_steps, got total_steps = ", o.total_steps, ", warmup_steps = ", o.warmup_steps);
  if (o.decay == Decay::step)
    MP_CHECK(o.step_size > 0 && o.gamma > 0.0, "WarmupSchedule: step decay needs step_size > 0 and gamma > 0, got ",
             o.step_size, " and ", o.gamma);
  return o;
}

}  // namespace

double WarmupSchedule::compute(const WarmupScheduleOptions& o, int64_t step, double base) {
  if (step < o.warmup_steps) return base * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  const auto d = static_cast<double>(step - o.warmup_steps);
  const auto D = static_cast<double>(o.total_steps - o.warmup_steps);
  switch (o.decay) {
    case Decay::constant: return base;
    case Decay::linear: return o.min_lr + (base - o.min_lr) * (1.0 - std::min(d / D, 1.0));
    case Decay::cosine:
      return o.min_lr + (base - o.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(d / D, 1.0)));
    case Decay::step:
      return std::max(o.min_lr, base * std::pow(o.gamma, std::floor(d / static_cast<double>(o.step_size))));
  }
  return base;
}

WarmupSchedule::WarmupSchedule(Optimizer& optimizer, const WarmupScheduleOptions& options)
    : LRScheduler(optimizer, [o = checked(options)](int64_t s, double base) { return compute(o, s, base); }),
      options_(options) {}

namespace {
std::function<double(int64_t)> checked(std::function<double(int64_t)> factor) {
  MP_CHECK(factor != nullptr, "LambdaLR: got an empty factor function");
  return factor;
}
}  // namespace

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t step)> factor)
    : LRScheduler(optimizer, [f = checked(std::move(factor))](int64_t s, double base) { return base * f(s); }) {}

}  // namespace mp::optim

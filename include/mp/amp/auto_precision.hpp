#pragma once
// Automatic per-layer precision (issue 25 item 3; Note [automatic precision] in src/amp/auto_precision.cpp): the
// rule that reads a 16-bit layer's telemetry (mp/amp/telemetry.hpp) and decides to move it to f32, and the move.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mp/amp/telemetry.hpp"
#include "mp/core/dtype.hpp"
#include "mp/nn/module.hpp"
#include "mp/optim/optimizer.hpp"

namespace mp::amp {

/// The thresholds of the rule (the defaults are those of `mixprec train --auto_precision`).
struct AutoPrecisionOptions {
  double overflow = 0.5;  ///< an amax (forward output, or output gradient at scale 1) at or above this share of the
                          ///< layer's 16-bit largest value (f16 65504, bf16 3.39e38) is an overflow sign
  double underflow = 6.103515625e-05;  ///< an f16 layer whose output gradient's amax at the loss scale is below this
                                       ///< (2^-14, f16's smallest normal: all of it subnormal or zero) shows an
                                       ///< underflow sign
  int64_t patience = 2;                ///< consecutive observations showing the same sign before the layer moves
  int64_t every = 10;  ///< observe every N optimizer steps (and the step after a skipped one); the run's choice
};

/// What one observation of one layer shows.
struct LayerSign {
  bool overflow = false;
  bool underflow = false;
  std::string why;  ///< the measured values behind the sign ("" when none)
};

/// The rule on one layer's telemetry of one step whose gradients carried loss scale `scale` (a pure function): layers
/// that are not 16-bit show no sign.
LayerSign assess(const LayerNumerics& layer, const AutoPrecisionOptions& options, double scale);

/// One layer's change of dtype.
struct PrecisionMove {
  std::string module;  ///< its name in named_modules()
  std::string type;    ///< its type name ("Conv2d", ...)
  DType from = DType::f16;
  DType to = DType::f32;
  int64_t step = 0;    ///< the optimizer step (global, 1-based) whose observation decided it
  std::string reason;  ///< the sign and how long it was shown
};

/// The decisions of a run: consecutive signs per layer, and the moves made (each layer at most once; Note
/// [automatic precision]).
class AutoPrecision {
 public:
  explicit AutoPrecision(const AutoPrecisionOptions& options);
  /// Consecutive observations with a sign of one layer not moved yet.
  struct Streak {
    int64_t overflow = 0;
    int64_t underflow = 0;
    bool operator==(const Streak&) const = default;
  };
  /// Fold in the observation of optimizer step `step`: `layers` and their `signs` (same length; the signs may be
  /// agreed among ranks, see assess()). Returns the layers to move now, in `layers`' order; moves() keeps them.
  std::vector<PrecisionMove> observe(const std::vector<LayerNumerics>& layers, const std::vector<LayerSign>& signs,
                                     int64_t step);
  /// Every move so far, in order.
  const std::vector<PrecisionMove>& moves() const { return moves_; }
  /// The streaks of layers showing a sign now (a layer absent has none).
  const std::map<std::string, Streak>& streaks() const { return streaks_; }
  /// Put back the state of a resumed run (what moves() and streaks() returned).
  void restore(std::vector<PrecisionMove> moves, std::map<std::string, Streak> streaks);
  const AutoPrecisionOptions& options() const { return options_; }

 private:
  AutoPrecisionOptions options_;
  std::vector<PrecisionMove> moves_;
  std::map<std::string, Streak> streaks_;
};

/// Move module `name` of `root` to f32 (Note [automatic precision]): its own 16-bit parameters and buffers become f32
/// (and those of every module sharing a parameter with it: tied weights stay tied); a parameter's f32 master in `opt`,
/// when it has one, becomes its value (else its 16-bit value, exactly widened), the optimizer optimizes the new tensor
/// with the rest of the old one's state (moments, step count) and no master. Returns the modules converted (`name`
/// first). Throws naming `name` when `root` has no such module.
std::vector<std::string> promote_to_f32(nn::Module& root, const std::string& name, optim::Optimizer& opt);

}  // namespace mp::amp

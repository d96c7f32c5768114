#pragma once
// Per-layer numerics telemetry (issue 25 item 2, docs/RUN_LOG.md "numerics"): for every module that holds
// parameters of its own, the largest forward output and output gradient, where its parameter gradients sit
// relative to f16's range, and how many of its 16-bit weights' updates were lost to rounding.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mp/nn/module.hpp"
#include "mp/optim/optimizer.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::amp {

/// One module's numerics over one optimizer step (all its micro-batches).
struct LayerNumerics {
  std::string module;   ///< its name in named_modules() (its parameters are "<module>.<name>" in the state dict)
  std::string type;     ///< its type name ("Linear", "Conv2d", ...)
  std::string dtype;    ///< dtype of its first parameter ("f32", "f16", "bf16")
  double act_amax = 0;  ///< max |forward output| (NaN when its forward did not run or was non-finite)
  bool act_first_nonfinite = false;    ///< its forward output was the step's first non-finite one among the watched
                                       ///< modules (in the order their forwards ended)
  double grad_amax = 0;                ///< max |dL/d output|, the loss scale divided out (NaN: not seen or non-finite)
  int64_t grad_values = 0;             ///< elements of its parameters' gradients
  double grad_underflow = 0;           ///< share of nonzero gradient values with |g * S| < 2^-24 (S: the scale)
  double grad_underflow_unscaled = 0;  ///< the same at scale 1: |g| < 2^-24
  double grad_zero = 0;                ///< share of all gradient values that are exactly 0 as computed
  bool has_update = false;             ///< it has 16-bit parameters: update_lost applies
  double update_lost = 0;              ///< share of its 16-bit weights' updates lost to rounding, NaN when the step was
                                       ///< skipped (Note [updates lost to rounding] in src/amp/telemetry.cpp)
};

/// Records LayerNumerics for the steps it is armed for. Usage per recorded step: arm() before the step's
/// first forward pass; after the last backward (before unscaling), gradients(scale); then before_update(opt)
/// and after_update(opt, stepped) around the optimizer step; take() returns the records and disarms.
/// Unarmed, it has no hooks on the model: a run that records every N steps runs the other steps untouched.
class NumericsRecorder {
 public:
  /// Watch the modules of `root` that hold parameters of their own.
  explicit NumericsRecorder(nn::Module& root);
  ~NumericsRecorder();
  NumericsRecorder(const NumericsRecorder&) = delete;
  NumericsRecorder& operator=(const NumericsRecorder&) = delete;

  /// Hook the modules: the coming forward passes with grad mode on (and their backward) are recorded.
  void arm();
  /// Whether arm() was called since the last take().
  bool armed() const { return !hooks_.empty(); }
  /// Gradient statistics of each module's parameters, whose gradients hold values multiplied by `scale`.
  void gradients(double scale);
  /// Remember the 16-bit parameters (and their f32 masters in `opt`) before the optimizer step.
  void before_update(const optim::Optimizer& opt);
  /// Compare with before_update's copies: the share of updates lost to rounding (when `stepped`).
  void after_update(const optim::Optimizer& opt, bool stepped);
  /// The records of the armed step, in named_modules() order; removes the hooks.
  std::vector<LayerNumerics> take();

 private:
  struct Watched;
  void disarm();
  std::vector<std::shared_ptr<Watched>> watched_;
  std::vector<std::pair<nn::Module*, size_t>> hooks_;
  /// Modules whose forward output went non-finite in the armed step so far (shared with the hooks).
  std::shared_ptr<int64_t> nonfinite_count_ = std::make_shared<int64_t>(0);
};

/// Half an ulp of the f16 or bf16 value `w` (the spacing of the 16-bit values around |w|; the subnormal
/// spacing below the normal range): an update smaller than this leaves w unchanged (Note [updates lost to
/// rounding] in src/amp/telemetry.cpp).
double half_ulp(double w, DType dtype);

}  // namespace mp::amp

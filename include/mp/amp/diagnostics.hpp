#pragma once
// Diagnostics of mixed-precision training: where gradients sit relative to f16's range, and which
// module first produced a non-finite value.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mp/nn/module.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::amp {

/// Shares of nonzero gradient values that would be lost or degraded in f16.
struct UnderflowStats {
  int64_t values = 0;             ///< all gradient values (zeros and inf/NaN included)
  int64_t zeros = 0;              ///< values exactly 0 (as stored: with a scale, those flushed at that scale)
  int64_t nonzero = 0;            ///< nonzero finite gradient values
  int64_t nonfinite = 0;          ///< inf/NaN values
  double underflow_unscaled = 0;  ///< share with |g| < 2^-24 (lost in f16 without loss scaling)
  double subnormal_unscaled = 0;  ///< share with 2^-24 <= |g| < 2^-14 (f16 subnormal without scaling)
  double underflow_scaled = 0;    ///< share with |g * S| < 2^-24 (lost even at the current scale S)
  double subnormal_scaled = 0;    ///< share with 2^-24 <= |g * S| < 2^-14
  double scale = 1.0;             ///< S the scaled shares refer to
};

/// Underflow statistics of `grads` (true, unscaled gradient values) at scale 1 and at `scale`.
UnderflowStats underflow_stats(const std::vector<Tensor>& grads, double scale);
/// Underflow statistics of the .grad of `params` whose gradients hold values multiplied by `scale`
/// (as after scaler.scale(loss).backward() and before unscale_): the scaled shares classify the values as
/// stored, the unscaled ones the values divided by `scale` (in f32, without copying the gradients; a value
/// that the division takes to 0 counts as underflowing). `zeros` counts the stored zeros.
UnderflowStats underflow_stats_of_scaled_grads(const std::vector<Tensor>& params, double scale);

/// Whether any element of `tensors` is inf/NaN (undefined, empty and integer tensors are skipped): one read-only
/// pass over all of them, the loss scaler's check. All on one device.
bool any_nonfinite(const std::vector<Tensor>& tensors);

/// Watches every module of a model: names the first module whose forward output, and the first whose
/// output gradient, contained inf/NaN. Hooks are removed when it is destroyed.
class OverflowFinder {
 public:
  /// Attach to `root` and all its descendants.
  explicit OverflowFinder(nn::Module& root);
  ~OverflowFinder();
  OverflowFinder(const OverflowFinder&) = delete;
  OverflowFinder& operator=(const OverflowFinder&) = delete;

  /// "conv1 (Conv2d)" of the first module whose forward output was non-finite, if any.
  const std::optional<std::string>& first_forward() const { return found_->first_forward; }
  /// The first module (in backward order) whose output gradient was non-finite, if any.
  const std::optional<std::string>& first_backward() const { return found_->first_backward; }
  /// Forget what was found (e.g. at the start of each step).
  void reset();
  /// A sentence describing what was found, or "no non-finite values seen".
  std::string report() const;

 private:
  struct Found {
    std::optional<std::string> first_forward, first_backward;
  };
  std::vector<std::pair<nn::Module*, size_t>> hooks_;
  std::shared_ptr<Found> found_;
};

}  // namespace mp::amp

#pragma once
// Opt levels O0-O3 (Apex's vocabulary, docs/DESIGN.md 1.5) and the fastai-style one-call conversion.
#include <memory>
#include <optional>
#include <string>

#include "mp/autocast/autocast.hpp"
#include "mp/amp/grad_scaler.hpp"
#include "mp/nn/module.hpp"
#include "mp/optim/optimizer.hpp"

namespace mp::amp {

/// Apex opt levels: O0 pure f32; O1 autocast with f32 weights; O2 16-bit model with f32 batch norm
/// and f32 master weights; O3 pure 16-bit (a speed ceiling, may not converge).
enum class OptLevel { O0, O1, O2, O3 };

/// "O0".."O3".
const char* opt_level_name(OptLevel l);
/// Parse "O0".."O3" (also "o1", "1"); throws naming the accepted values.
OptLevel opt_level_from_string(const std::string& s);

/// A loss-scale setting: dynamic, a fixed number, or none.
struct LossScale {
  enum class Kind { dynamic, fixed, none } kind = Kind::dynamic;
  double value = 0.0;  ///< the fixed scale (Kind::fixed)
  /// Parse "dynamic", "none" or a positive number (e.g. "128"); throws otherwise.
  static LossScale parse(const std::string& s);
  /// "dynamic", "none" or the number.
  std::string str() const;
};

/// Options of initialize(). Unset optionals take the level's defaults (Apex's), see resolve().
struct AmpOptions {
  OptLevel opt_level = OptLevel::O1;
  DType dtype = DType::bf16;                ///< low-precision type: f16 or bf16 (ignored by O0)
  std::optional<LossScale> loss_scale;      ///< default: dynamic for f16 O1/O2, none for bf16, none for O0/O3
  std::optional<bool> keep_batchnorm_fp32;  ///< default: true for O2, false for O3 (O0/O1 keep every weight f32)
  std::optional<bool> master_weights;       ///< default: true for O2
  /// Round the 16-bit weights that have no master (O3, or master_weights off) stochastically after each
  /// update (Note [stochastic rounding]); needs such weights. The Philox stream is `rounding_seed`.
  bool stochastic_rounding = false;
  uint64_t rounding_seed = 0;  ///< seed of the stochastic rounding's random bits
  GradScalerOptions scaler;    ///< growth/backoff/interval/hysteresis of the dynamic scale
};

/// Every option of AmpOptions filled in for its level and dtype.
AmpOptions resolve(const AmpOptions& options);

/// A model prepared by initialize(): forward() applies the level's casting (autocast for O1, 16-bit
/// inputs for O2/O3) and returns an f32 output (the final output and the loss are f32 at every level).
class AmpModel {
 public:
  AmpModel(std::shared_ptr<nn::UnaryModule> module, AmpOptions options);
  /// Run the model under the level's precision rules; the result is f32.
  Tensor forward(const Tensor& x);
  /// forward(x).
  Tensor operator()(const Tensor& x) { return forward(x); }
  /// The wrapped module (its parameters are in the level's dtypes).
  nn::UnaryModule& module() { return *module_; }
  /// Shared pointer to the wrapped module.
  const std::shared_ptr<nn::UnaryModule>& module_ptr() const { return module_; }
  /// The resolved options.
  const AmpOptions& options() const { return options_; }

 private:
  std::shared_ptr<nn::UnaryModule> module_;
  AmpOptions options_;
};

/// What initialize() returns: the prepared model and the loss scaler of the level.
struct AmpSetup {
  AmpModel model;
  GradScaler scaler;
  /// Resolved options.
  const AmpOptions& options() const { return model.options(); }
  /// A one-line description: "O2 bf16, keep_batchnorm_fp32, master weights, loss scale none".
  std::string describe() const;
};

/// A one-line description of resolved options: "O2 bf16, batch norm f32, f32 master weights, loss scale none".
std::string describe(const AmpOptions& options);

/// Prepare `model` and `optimizer` (built over the model's f32 parameters) for the opt level: convert
/// the model (O2/O3), point the optimizer at the converted parameters with f32 masters holding the
/// original values (O2), and make the scaler. Call once, before training.
AmpSetup initialize(std::shared_ptr<nn::UnaryModule> model, optim::Optimizer& optimizer, const AmpOptions& options);
/// The model/optimizer half of initialize() for models whose forward is not a single tensor (the word
/// LM): converts `model` and points `optimizer` at the converted parameters with f32 masters (O2/O3)
/// and returns the resolved options. The caller applies the level's casting around its forward
/// (an Autocast guard for O1; 16-bit inputs for O2/O3 where inputs are floating) and builds a
/// GradScaler from the resolved options' `scaler`.
AmpOptions prepare(nn::Module& model, optim::Optimizer& optimizer, const AmpOptions& options);

/// fastai's to_fp16(): O2 in f16 (f16 model, f32 batch norm, f32 masters, dynamic loss scaling).
AmpSetup to_fp16(std::shared_ptr<nn::UnaryModule> model, optim::Optimizer& optimizer);
/// The same in bf16 (no loss scaling: bf16 has f32's range).
AmpSetup to_bf16(std::shared_ptr<nn::UnaryModule> model, optim::Optimizer& optimizer);

}  // namespace mp::amp

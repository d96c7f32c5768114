#pragma once
#include <optional>

#include "mp/nn/module.hpp"

namespace mp::nn {

/// Options of BatchNorm1d / BatchNorm2d (PyTorch's defaults).
struct BatchNormOptions {
  int64_t num_features = 0;              ///< C, dim 1 of the input
  double eps = 1e-5;                     ///< added to the variance
  std::optional<double> momentum = 0.1;  ///< running-average factor; nullopt = cumulative average
  bool affine = true;                    ///< learn weight (init 1) and bias (init 0)
  bool track_running_stats = true;       ///< keep running_mean/running_var/num_batches_tracked
};

/// Batch normalisation over dim 1 (PyTorch's _BatchNorm): parameters weight/bias [C]; buffers
/// running_mean (0), running_var (1) [C] and num_batches_tracked (i64 scalar 0). Training mode
/// normalises with batch statistics and updates the running ones; eval mode uses the running ones.
/// Statistics are f32 whatever the input dtype (the op's contract), so amp O2 keeps these modules
/// in f32 (see is_batch_norm).
class BatchNormBase : public UnaryModule {
 public:
  /// `type_name` for printing; `input_dims` lists the accepted input ranks.
  BatchNormBase(std::string type_name, const BatchNormOptions& options, std::vector<int64_t> input_dims);
  /// Normalise x [N, C, ...].
  Tensor forward(const Tensor& x) override;
  /// relu(forward(x)), fused (mp::batch_norm_relu: bit-identical, fewer passes over the activation).
  Tensor forward_relu(const Tensor& x);
  /// relu(forward(x) + residual), fused (mp::batch_norm_add_relu): the end of a ResNet block.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);
  /// running_mean = 0, running_var = 1, num_batches_tracked = 0.
  void reset_running_stats();
  /// reset_running_stats() and weight = 1, bias = 0.
  void reset_parameters();
  /// "16, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true".
  std::string extra_repr() const override;
  /// Scale [C] (undefined when not affine).
  const Tensor& weight() const { return *weight_; }
  /// Shift [C] (undefined when not affine).
  const Tensor& bias() const { return *bias_; }
  /// Running mean [C] (undefined when not tracking).
  const Tensor& running_mean() const { return *running_mean_; }
  /// Running (unbiased) variance [C] (undefined when not tracking).
  const Tensor& running_var() const { return *running_var_; }
  /// Number of training batches seen (i64 scalar; undefined when not tracking).
  const Tensor& num_batches_tracked() const { return *num_batches_tracked_; }
  /// The options it was built with.
  const BatchNormOptions& options() const { return options_; }

 private:
  Tensor forward_fused(const Tensor& x, const Tensor& residual, bool relu);
  BatchNormOptions options_;
  std::vector<int64_t> input_dims_;
  Tensor* weight_;
  Tensor* bias_;
  Tensor* running_mean_;
  Tensor* running_var_;
  Tensor* num_batches_tracked_;
};

/// Batch norm of [N, C] or [N, C, L] inputs.
class BatchNorm1d : public BatchNormBase {
 public:
  /// A layer with weight 1, bias 0 and fresh running statistics.
  explicit BatchNorm1d(const BatchNormOptions& options) : BatchNormBase("BatchNorm1d", options, {2, 3}) {}
  /// BatchNorm1d({.num_features = num_features}).
  explicit BatchNorm1d(int64_t num_features) : BatchNorm1d(BatchNormOptions{.num_features = num_features}) {}
};

/// Batch norm of [N, C, H, W] inputs.
class BatchNorm2d : public BatchNormBase {
 public:
  /// A layer with weight 1, bias 0 and fresh running statistics.
  explicit BatchNorm2d(const BatchNormOptions& options) : BatchNormBase("BatchNorm2d", options, {4}) {}
  /// BatchNorm2d({.num_features = num_features}).
  explicit BatchNorm2d(int64_t num_features) : BatchNorm2d(BatchNormOptions{.num_features = num_features}) {}
};

/// Whether m is a batch-norm layer: the predicate amp O2 passes to Module::to(dtype, predicate)
/// negated, to keep batch norm in f32 (Apex's keep_batchnorm_fp32).
bool is_batch_norm(const Module& m);

}  // namespace mp::nn

#pragma once
#include "mp/tensor/tensor.hpp"

namespace mp {

/// How a loss reduces over the batch.
enum class Reduction { none, mean, sum };

/// Options of cross_entropy / nll_loss (PyTorch's semantics).
struct CrossEntropyOptions {
  int64_t ignore_index = -100;   ///< targets equal to this contribute nothing (and are not counted in the mean)
  double label_smoothing = 0.0;  ///< in [0, 1]
  Reduction reduction = Reduction::mean;
};

/// Cross entropy of logits [N, C] (or [N, C, d...]) against i64 class targets [N] ([N, d...]).
/// Always computed in f32 (f64 for f64 logits); the loss is f32.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& opt = {});
/// Negative log likelihood of log-probabilities [N, C] against i64 targets [N].
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const CrossEntropyOptions& opt = {});
/// Mean squared error (promotes to f32 for 16-bit inputs).
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

}  // namespace mp

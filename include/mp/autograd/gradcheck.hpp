#pragma once
#include <functional>
#include <string>
#include <vector>

#include "mp/tensor/tensor.hpp"

namespace mp::autograd {

/// Options of gradcheck.
struct GradcheckOptions {
  double eps = 1e-6;     ///< central-difference step
  double atol = 1e-5;    ///< absolute tolerance
  double rtol = 1e-3;    ///< relative tolerance
  uint64_t seed = 1234;  ///< seed of the random output weights
};

/// Result of gradcheck: ok, and when not, a message naming the input, element and both values.
struct GradcheckResult {
  bool ok = true;
  std::string message;
  double max_abs_error = 0.0;
};

/// Compare the autograd gradient of `fn` with central differences in f64. Inputs must be f64 leaves
/// requiring grad (others are treated as constants). Checks v^T J for random weights v on every
/// output: one backward and 2 forwards per input element.
GradcheckResult gradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& opt = {});

}  // namespace mp::autograd

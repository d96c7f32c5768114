// Activation layers: thin wrappers over the point-wise ops.
#include "mp/nn/activation.hpp"

#include "mp/ops/pointwise.hpp"

namespace mp::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate_); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }
Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }

}  // namespace mp::nn

#pragma once
#include <vector>

#include "mp/tensor/tensor.hpp"

namespace mp {

/// Concatenate along dim (dtypes promote to the widest).
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Stack along a new dim.
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Split into chunks of `size` along dim (views).
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim = 0);
/// The slices of x along dim, each without that dim (views; as torch.unbind). One autograd node
/// serves all slices, so their gradients land in one buffer.
std::vector<Tensor> unbind(const Tensor& x, int64_t dim = 0);
/// Split into n nearly equal chunks along dim (views).
std::vector<Tensor> chunk(const Tensor& x, int64_t n, int64_t dim = 0);

}  // namespace mp

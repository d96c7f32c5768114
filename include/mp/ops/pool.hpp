#pragma once
// The 2-D pools (src/ops/pool.cpp, slots in src/backend/pool_kernels.hpp).
#include <array>

#include "mp/tensor/tensor.hpp"

namespace mp {

/// Options of the 2-D pools.
struct Pool2dOptions {
  std::array<int64_t, 2> kernel{2, 2};
  std::array<int64_t, 2> stride{0, 0};  ///< 0 = same as kernel
  std::array<int64_t, 2> padding{0, 0};
  bool ceil_mode = false;
  bool count_include_pad = true;  ///< avg pool only
};

/// Max pool over [N, C, H, W].
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& opt);
/// Average pool over [N, C, H, W].
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& opt);
/// Adaptive average pool to [N, C, out_h, out_w] (PyTorch's bin boundaries).
Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size);

}  // namespace mp

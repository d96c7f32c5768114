#pragma once
#include <array>

#include "mp/tensor/tensor.hpp"

namespace mp {

/// Options of conv2d (PyTorch's arguments; dilation 1 = none).
struct Conv2dOptions {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

/// 2-D convolution: x [N, C, H, W], weight [O, C/groups, kH, kW], bias [O] or undefined.
/// f32/f64/bf16 (oneDNN; bf16 accumulates in f32). Autocast class: lower precision.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dOptions& opt = {});

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

#pragma once
#include <array>

#include "mp/ops/pool.hpp"  // the pools were declared here: kept for code that includes this header for them
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

}  // namespace mp

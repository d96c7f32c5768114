// One cuDNN convolution call's problem and pointers, shared by the legacy-API path (conv.cu) and the
// graph-API path (cudnn/conv_graph.cu). Internal to the CUDA backend; for CUDA sources with cuDNN only.
#pragma once
#if defined(MP_HAVE_CUDNN)
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/conv_kernels.hpp"
#include "backend/key_hash.hpp"
#include "mp/core/dtype.hpp"
#include "mp/core/error.hpp"

namespace mp::backend::cuda {

enum class ConvDir : int { forward = 0, backward_data = 1, backward_filter = 2 };

inline const char* dir_name(ConvDir d) {
  switch (d) {
    case ConvDir::forward: return "forward";
    case ConvDir::backward_data: return "backward data";
    case ConvDir::backward_filter: return "backward weights";
  }
  return "?";
}

using ConvKey = std::array<int64_t, 20>;

// One cuDNN call's problem: a chunk of n samples, x [n, c, h, w], weight [o, c / groups, kh, kw],
// y [n, o, oh, ow].
struct ConvProblem {
  ConvDir dir = ConvDir::forward;
  DType dtype = DType::f32;
  bool tf32 = false;
  bool nhwc = false;  // Note [cuDNN convolution layouts]
  int64_t n = 0, c = 0, h = 0, w = 0, o = 0, kh = 0, kw = 0, oh = 0, ow = 0;
  Conv2dGeometry g;

  ConvKey key() const {
    return {static_cast<int64_t>(dir),
            static_cast<int64_t>(dtype),
            tf32 ? 1 : 0,
            nhwc ? 1 : 0,
            n,
            c,
            h,
            w,
            o,
            kh,
            kw,
            oh,
            ow,
            g.stride[0],
            g.stride[1],
            g.padding[0],
            g.padding[1],
            g.dilation[0],
            g.dilation[1],
            g.groups};
  }
  /// Elements of the tensor the call writes: y (forward), dx (backward data) or dw (backward filter).
  int64_t output_numel() const {
    switch (dir) {
      case ConvDir::forward: return n * o * oh * ow;
      case ConvDir::backward_data: return n * c * h * w;
      case ConvDir::backward_filter: return o * (c / g.groups) * kh * kw;
    }
    return 0;
  }
  std::string str() const {
    return detail::str_cat("conv2d ", dir_name(dir), " ", dtype_name(dtype), tf32 ? " (TF32 allowed)" : "",
                           nhwc ? " channels-last (NHWC, KRSC filter)" : "", ": input [", n, ", ", c, ", ", h, ", ", w,
                           "], weight [", o, ", ", c / g.groups, ", ", kh, ", ", kw, "], output [", n, ", ", o, ", ",
                           oh, ", ", ow, "], stride (", g.stride[0], ", ", g.stride[1], "), padding (", g.padding[0],
                           ", ", g.padding[1], "), dilation (", g.dilation[0], ", ", g.dilation[1], "), groups ",
                           g.groups);
  }
};

// Device pointers of one call. forward: x, w -> out (y); backward data: w, dy -> out (dx);
// backward filter: x, dy -> out (dw).
struct ConvPointers {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* dy = nullptr;
  void* out = nullptr;
};

}  // namespace mp::backend::cuda

#endif  // MP_HAVE_CUDNN

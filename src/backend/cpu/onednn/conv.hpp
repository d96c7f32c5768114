#pragma once
// 2-D convolution (forward, backward data, backward weights) on raw pointers through oneDNN: f32, bf16, and f16 where
// oneDNN has f16 kernels (CPUs with AVX512-FP16 or AMX-FP16).

#include <cstdint>
#include <string>

#include "backend/cpu/onednn/common.hpp"
#include "mp/core/dtype.hpp"

namespace mp::backend::cpu {

/// A 2-D convolution with PyTorch semantics: input [n, c, h, w], weight [oc, c/groups, kh, kw] (contiguous OIHW),
/// output [n, oc, out_h(), out_w()], symmetric zero padding. Activations (input, output and their gradients) are
/// contiguous NCHW, or NHWC when channels_last.
struct Conv2dArgs {
  int64_t n = 0, c = 0, h = 0, w = 0;  ///< input batch, channels, height, width
  int64_t oc = 0, kh = 0, kw = 0;      ///< output channels, kernel height and width
  int64_t stride_h = 1, stride_w = 1;  ///< strides (>= 1)
  int64_t pad_h = 0, pad_w = 0;        ///< zero padding on each side (>= 0)
  int64_t dil_h = 1, dil_w = 1;        ///< dilations as in PyTorch: 1 = dense kernel
  int64_t groups = 1;                  ///< c and oc must be multiples of groups (groups == c == oc: depthwise)
  DType src_dtype = DType::f32;        ///< dtype of input and weight (and of diff_src): f32, bf16 or f16
  DType dst_dtype = DType::f32;        ///< dtype of output (and of diff_dst): f32, bf16 or f16
  bool channels_last = false;          ///< activations are NHWC in memory (else NCHW)

  /// Output height: (h + 2*pad_h - dil_h*(kh-1) - 1) / stride_h + 1.
  int64_t out_h() const;
  /// Output width: (w + 2*pad_w - dil_w*(kw-1) - 1) / stride_w + 1.
  int64_t out_w() const;
};

/// dst = conv(src, weight) + bias. src and weight are src_dtype, dst is dst_dtype, bias is f32 [oc] or null.
/// Accumulation is f32 in every case.
void conv2d_forward(const Conv2dArgs& args, const void* src, const void* weight, const void* bias, void* dst);

/// diff_src (src_dtype, [n, c, h, w]) = gradient of the convolution with respect to its input, from diff_dst
/// (dst_dtype, [n, oc, oh, ow]) and weight (src_dtype). diff_src is overwritten.
void conv2d_backward_data(const Conv2dArgs& args, const void* diff_dst, const void* weight, void* diff_src);

/// diff_weight (always f32, [oc, c/groups, kh, kw]) and diff_bias (f32 [oc], or null to skip) = gradients of the
/// convolution from src (src_dtype) and diff_dst (dst_dtype). Both outputs are overwritten, not accumulated.
void conv2d_backward_weights(const Conv2dArgs& args, const void* src, const void* diff_dst, void* diff_weight,
                             void* diff_bias);

/// Both gradients in one call: diff_src as conv2d_backward_data and diff_weight/diff_bias as
/// conv2d_backward_weights (diff_src or diff_weight may be null: not needed). diff_dst is reordered into
/// oneDNN's layout once when both primitives want it in the same layout (they usually do).
void conv2d_backward(const Conv2dArgs& args, const void* src, const void* diff_dst, const void* weight, void* diff_src,
                     void* diff_weight, void* diff_bias);

/// The three convolution primitives.
enum class ConvPass { forward, backward_data, backward_weights };

/// impl_info_str() of the oneDNN primitive `pass` runs for `args` (building and caching it if needed), e.g.
/// "brg:avx512_core_amx" for bf16 on AMX. `with_bias`: forward with bias / backward weights with diff_bias.
std::string conv2d_impl_info(const Conv2dArgs& args, ConvPass pass, bool with_bias = false);

/// Counters of the convolution primitive cache (one plan per args, pass and bias flag).
CacheStats conv2d_cache_stats();

}  // namespace mp::backend::cpu

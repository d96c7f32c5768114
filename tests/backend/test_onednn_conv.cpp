// oneDNN conv2d (forward, backward data, backward weights) against double-precision reference loops, in f32
// and bf16 (and f16 where the CPU has oneDNN's f16 kernels): strides, padding, dilation, groups, depthwise,
// 1x1, odd and rectangular shapes, errors, caching and the AMX kernel choice.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/bf16_policy.hpp"
#include "backend/cpu/onednn/conv.hpp"
#include "mp/core/half.hpp"

namespace mp::backend::cpu {
namespace {

constexpr DType kF32 = DType::f32, kBf16 = DType::bf16, kF16 = DType::f16;

// A dense tensor of `storage` dtype whose float mirror holds exactly what the kernel reads. Values are
// also rounded to `compute` (the dtype the kernel computes in), so a dtype conversion inside the backend
// (an f32 diff_dst fed to a bf16 convolution) is exact and the reference sees the same numbers.
struct Tensor {
  DType storage;
  std::vector<float> values;
  std::vector<uint8_t> bytes;

  Tensor(DType storage_dtype, int64_t count)
      : storage(storage_dtype), values(count), bytes(count * dtype_size(storage_dtype)) {}
  Tensor(DType storage_dtype, DType compute, int64_t count, std::mt19937& rng) : Tensor(storage_dtype, count) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int64_t i = 0; i < count; ++i) {
      float v = dist(rng);
      if (compute == kBf16 || storage == kBf16) v = static_cast<float>(BFloat16(v));
      if (compute == kF16 || storage == kF16) v = static_cast<float>(Half(v));
      values[i] = v;
      if (storage == kBf16) {
        const BFloat16 h(v);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      } else if (storage == kF16) {
        const Half h(v);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      } else {
        std::memcpy(bytes.data() + 4 * i, &v, 4);
      }
    }
  }
  float get(int64_t i) const {
    if (storage == kBf16) {
      BFloat16 h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      return static_cast<float>(h);
    }
    if (storage == kF16) {
      Half h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      return static_cast<float>(h);
    }
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
  }
  void* data() { return bytes.data(); }
};

// Reference results with, per element, scale = sum of |terms| (for a cancellation-proof tolerance).
struct Reference {
  std::vector<double> value, scale;
  explicit Reference(size_t n) : value(n, 0.0), scale(n, 0.0) {}
  void add(size_t i, double term) {
    value[i] += term;
    scale[i] += std::abs(term);
  }
};

// Visits every (output element, kernel tap) pair of the convolution with its input element:
// f(dst_index, src_index, weight_index). Forward, backward data and backward weights are all sums over these.
template <class F>
void for_each_tap(const Conv2dArgs& a, F&& f) {
  const int64_t oh = a.out_h(), ow = a.out_w(), cpg = a.c / a.groups, opg = a.oc / a.groups;
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t o = 0; o < a.oc; ++o)
      for (int64_t y = 0; y < oh; ++y)
        for (int64_t x = 0; x < ow; ++x)
          for (int64_t ci = 0; ci < cpg; ++ci)
            for (int64_t ky = 0; ky < a.kh; ++ky)
              for (int64_t kx = 0; kx < a.kw; ++kx) {
                const int64_t iy = y * a.stride_h - a.pad_h + ky * a.dil_h;
                const int64_t ix = x * a.stride_w - a.pad_w + kx * a.dil_w;
                if (iy < 0 || iy >= a.h || ix < 0 || ix >= a.w) continue;  // zero padding
                const int64_t c = (o / opg) * cpg + ci;
                f(((n * a.oc + o) * oh + y) * ow + x, ((n * a.c + c) * a.h + iy) * a.w + ix,
                  ((o * cpg + ci) * a.kh + ky) * a.kw + kx);
              }
}

// Tolerance (see the matmul test for the argument): products of bf16 inputs are exact in f32, so both
// dtypes differ from the exact sum only by the f32 accumulation, bounded by 1e-5*sqrt(L)*scale with L the
// number of terms (generous against the typical sqrt(L)*2^-24*scale, tiny against any indexing bug). A bf16
// output adds its rounding, at most half an ulp; we allow 2^-8 |value| (f16: 2^-10).
void expect_close(const char* what, const Tensor& got, const Reference& ref, int64_t terms, DType out_dtype) {
  const double rel = 1e-5 * std::sqrt(static_cast<double>(std::max<int64_t>(terms, 1)));
  const double out_rel = out_dtype == kBf16 ? std::ldexp(1.0, -8) : out_dtype == kF16 ? std::ldexp(1.0, -10) : 0.0;
  int failures = 0;
  for (size_t i = 0; i < ref.value.size(); ++i) {
    const double g = got.get(static_cast<int64_t>(i));
    const double tol = rel * ref.scale[i] + out_rel * std::abs(ref.value[i]) + 1e-30;
    if (!(std::abs(g - ref.value[i]) <= tol) && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "] = " << g << ", reference " << ref.value[i] << ", tolerance " << tol;
  }
  EXPECT_EQ(failures, 0) << what << ": mismatches (first 5 shown above)";
}

// Runs all three passes of `a` on random data and checks them against the reference.
void check_conv(const Conv2dArgs& a, bool bias, uint32_t seed = 7) {
  SCOPED_TRACE(detail::str_cat("n", a.n, " c", a.c, " ", a.h, "x", a.w, " oc", a.oc, " k", a.kh, "x", a.kw, " s",
                               a.stride_h, ",", a.stride_w, " p", a.pad_h, ",", a.pad_w, " d", a.dil_h, ",", a.dil_w,
                               " g", a.groups, " ", dtype_name(a.src_dtype), "->", dtype_name(a.dst_dtype),
                               bias ? " bias" : ""));
  std::mt19937 rng(seed);
  const int64_t cpg = a.c / a.groups, opg = a.oc / a.groups;
  const int64_t src_n = a.n * a.c * a.h * a.w, dst_n = a.n * a.oc * a.out_h() * a.out_w();
  const int64_t wei_n = a.oc * cpg * a.kh * a.kw;
  Tensor src(a.src_dtype, a.src_dtype, src_n, rng), wei(a.src_dtype, a.src_dtype, wei_n, rng);
  Tensor b(kF32, kF32, a.oc, rng);
  Tensor diff_dst(a.dst_dtype, a.src_dtype, dst_n, rng);

  Tensor dst(a.dst_dtype, dst_n);
  conv2d_forward(a, src.data(), wei.data(), bias ? b.data() : nullptr, dst.data());
  Reference fwd(dst_n);
  for_each_tap(a, [&](int64_t d, int64_t s, int64_t w) { fwd.add(d, double(src.values[s]) * wei.values[w]); });
  if (bias)
    for (int64_t i = 0; i < dst_n; ++i) fwd.add(i, b.values[(i / (a.out_h() * a.out_w())) % a.oc]);
  expect_close("dst", dst, fwd, cpg * a.kh * a.kw + 1, a.dst_dtype);

  Tensor diff_src(a.src_dtype, src_n);
  conv2d_backward_data(a, diff_dst.data(), wei.data(), diff_src.data());
  Reference bwd_data(src_n);  // diff_src = J^T diff_dst: every tap sends diff_dst * weight back to its input
  for_each_tap(a,
               [&](int64_t d, int64_t s, int64_t w) { bwd_data.add(s, double(diff_dst.values[d]) * wei.values[w]); });
  expect_close("diff_src", diff_src, bwd_data, opg * a.kh * a.kw, a.src_dtype);

  Tensor diff_wei(kF32, wei_n), diff_bias(kF32, a.oc);
  std::memset(diff_wei.data(), 0xff, diff_wei.bytes.size());  // NaN: the pass must overwrite every element
  conv2d_backward_weights(a, src.data(), diff_dst.data(), diff_wei.data(), bias ? diff_bias.data() : nullptr);
  Reference bwd_wei(wei_n), bwd_bias(a.oc);  // each tap adds diff_dst * input to its weight
  for_each_tap(a, [&](int64_t d, int64_t s, int64_t w) { bwd_wei.add(w, double(diff_dst.values[d]) * src.values[s]); });
  for (int64_t i = 0; i < dst_n; ++i) bwd_bias.add((i / (a.out_h() * a.out_w())) % a.oc, diff_dst.values[i]);
  expect_close("diff_weight", diff_wei, bwd_wei, a.n * a.out_h() * a.out_w(), kF32);
  if (bias) expect_close("diff_bias", diff_bias, bwd_bias, a.n * a.out_h() * a.out_w(), kF32);

  // Both gradients in one call (diff_dst reordered once when the two primitives share its layout): the same
  // primitives on the same data, so the results are bit-identical to the separate calls.
  Tensor both_src(a.src_dtype, src_n), both_wei(kF32, wei_n), both_bias(kF32, a.oc);
  std::memset(both_src.data(), 0xff, both_src.bytes.size());
  std::memset(both_wei.data(), 0xff, both_wei.bytes.size());
  conv2d_backward(a, src.data(), diff_dst.data(), wei.data(), both_src.data(), both_wei.data(),
                  bias ? both_bias.data() : nullptr);
  EXPECT_EQ(both_src.bytes, diff_src.bytes) << "conv2d_backward diff_src differs from conv2d_backward_data";
  EXPECT_EQ(both_wei.bytes, diff_wei.bytes) << "conv2d_backward diff_weight differs from conv2d_backward_weights";
  if (bias) { EXPECT_EQ(both_bias.bytes, diff_bias.bytes) << "conv2d_backward diff_bias differs"; }
  // One of the two only.
  std::memset(both_src.data(), 0xff, both_src.bytes.size());
  conv2d_backward(a, nullptr, diff_dst.data(), wei.data(), both_src.data(), nullptr, nullptr);
  EXPECT_EQ(both_src.bytes, diff_src.bytes) << "conv2d_backward (data only)";
  std::memset(both_wei.data(), 0xff, both_wei.bytes.size());
  conv2d_backward(a, src.data(), diff_dst.data(), nullptr, nullptr, both_wei.data(), nullptr);
  EXPECT_EQ(both_wei.bytes, diff_wei.bytes) << "conv2d_backward (weights only)";
}

Conv2dArgs shape(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t k) {
  Conv2dArgs a;
  a.n = n, a.c = c, a.h = h, a.w = w, a.oc = oc, a.kh = a.kw = k;
  return a;
}

std::vector<Conv2dArgs> geometry_cases() {
  std::vector<Conv2dArgs> cases;
  Conv2dArgs a = shape(2, 5, 7, 6, 4, 3);  // 3x3, padding 1
  a.pad_h = a.pad_w = 1;
  cases.push_back(a);
  a = shape(2, 3, 9, 11, 6, 3);  // stride 2, odd sizes
  a.stride_h = a.stride_w = 2, a.pad_h = a.pad_w = 1;
  cases.push_back(a);
  a = shape(1, 4, 10, 9, 3, 3);  // dilation 2
  a.dil_h = a.dil_w = 2, a.pad_h = a.pad_w = 2;
  cases.push_back(a);
  a = shape(2, 6, 6, 7, 4, 3);  // 2 groups
  a.groups = 2, a.pad_h = a.pad_w = 1;
  cases.push_back(a);
  a = shape(2, 8, 8, 8, 8, 3);  // depthwise, stride 2
  a.groups = 8, a.stride_h = a.stride_w = 2, a.pad_h = a.pad_w = 1;
  cases.push_back(a);
  a = shape(2, 16, 5, 5, 8, 1);  // 1x1
  cases.push_back(a);
  a = shape(2, 8, 7, 7, 16, 1);  // 1x1 stride 2 (the ResNet projection shortcut)
  a.stride_h = a.stride_w = 2;
  cases.push_back(a);
  a = shape(1, 3, 8, 9, 5, 1);  // rectangular kernel, unequal stride/padding/dilation
  a.kh = 2, a.kw = 3, a.stride_w = 2, a.pad_w = 1, a.dil_h = 2;
  cases.push_back(a);
  a = shape(3, 2, 5, 5, 3, 5);  // 5x5 kernel on a 5x5 input (3x3 output), odd batch
  a.pad_h = a.pad_w = 1;
  cases.push_back(a);
  return cases;
}

struct DtypeCase {
  DType src, dst;
};
const DtypeCase kDtypeCases[] = {{kF32, kF32}, {kBf16, kF32}, {kBf16, kBf16}, {kF32, kBf16}};

// oneDNN 3.x has bf16 convolutions on AVX-512 CPUs only; on others (AMD Zen 3: AVX2) creating the primitive fails
// with an mp::Error naming the call, and the library computes bf16 through f32 there. The bf16 cases run where the
// library's probe (onednn_has_native, src/backend/cpu/bf16_policy.cpp) finds the kernels.
bool onednn_bf16_conv() { return onednn_has_native(DType::bf16); }

bool runs_here(const DtypeCase& d) { return (d.src != kBf16 && d.dst != kBf16) || onednn_bf16_conv(); }

TEST(OnednnConv, AllGeometriesAndDtypes) {
  int i = 0;
  for (const DtypeCase& d : kDtypeCases)
    for (Conv2dArgs a : geometry_cases()) {
      if (!runs_here(d)) continue;
      a.src_dtype = d.src, a.dst_dtype = d.dst;
      check_conv(a, ++i % 2 == 0);
    }
}

TEST(OnednnConv, ResNetLikeChannels) {
  // 64-channel 3x3 and a 1x1 projection: the shapes the blocked/AMX kernels are built for.
  for (const DtypeCase& d : {DtypeCase{kF32, kF32}, DtypeCase{kBf16, kBf16}}) {
    if (!runs_here(d)) continue;
    Conv2dArgs a = shape(2, 64, 6, 6, 64, 3);
    a.pad_h = a.pad_w = 1, a.src_dtype = d.src, a.dst_dtype = d.dst;
    check_conv(a, true);
    a = shape(2, 32, 6, 6, 64, 1);
    a.stride_h = a.stride_w = 2, a.src_dtype = d.src, a.dst_dtype = d.dst;
    check_conv(a, false);
  }
}

// f16 operands reach oneDNN 3.x, which has f16 convolution kernels on CPUs with AVX512-FP16 or AMX-FP16:
// every pass is right wherever its primitive is created, and a CPU without one says so in an mp::Error that
// names the oneDNN call and the problem.
TEST(OnednnConv, F16ComputesOrSaysWhy) {
  for (const DtypeCase& d : {DtypeCase{kF16, kF16}, DtypeCase{kF16, kF32}})
    for (Conv2dArgs a : {shape(2, 16, 6, 6, 16, 3), shape(2, 16, 6, 6, 32, 1)}) {
      a.pad_h = a.pad_w = a.kh / 2, a.src_dtype = d.src, a.dst_dtype = d.dst;
      SCOPED_TRACE(detail::str_cat("f16 -> ", dtype_name(d.dst), " k", a.kh));
      try {
        check_conv(a, true);
        std::printf("[   INFO   ] f16 -> %s convolution k%lld runs on %s / %s / %s\n", dtype_name(d.dst),
                    static_cast<long long>(a.kh), conv2d_impl_info(a, ConvPass::forward, true).c_str(),
                    conv2d_impl_info(a, ConvPass::backward_data).c_str(),
                    conv2d_impl_info(a, ConvPass::backward_weights, true).c_str());
      } catch (const Error& e) {
        const std::string msg = e.what();
        for (const char* part : {"dnnl::convolution", "f16", "unimplemented"})
          EXPECT_NE(msg.find(part), std::string::npos) << part << " missing from: " << msg;
        std::printf("[   INFO   ] no f16 convolution on this CPU: %s\n", msg.c_str());
      }
    }
}

TEST(OnednnConv, EmptyBatch) {
  Conv2dArgs a = shape(0, 3, 5, 5, 4, 3);
  float dst = 1, diff_w[4 * 3 * 9], diff_b[4];
  std::fill(std::begin(diff_w), std::end(diff_w), 1.0f);
  std::fill(std::begin(diff_b), std::end(diff_b), 1.0f);
  conv2d_forward(a, nullptr, nullptr, nullptr, &dst);
  EXPECT_EQ(dst, 1.0f);
  conv2d_backward_weights(a, nullptr, nullptr, diff_w, diff_b);
  for (float v : diff_w) EXPECT_EQ(v, 0.0f);
  for (float v : diff_b) EXPECT_EQ(v, 0.0f);
}

TEST(OnednnConv, ErrorsNameTheProblem) {
  std::vector<float> buf(4096);
  auto expect_error = [&](const Conv2dArgs& a, const std::string& needle) {
    try {
      conv2d_forward(a, buf.data(), buf.data(), nullptr, buf.data());
      ADD_FAILURE() << "expected an mp::Error mentioning " << needle;
    } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what(); }
  };
  Conv2dArgs a = shape(1, 4, 5, 5, 4, 3);
  a.src_dtype = DType::f64;
  expect_error(a, "f64");
  a = shape(1, 4, 5, 5, 6, 3);
  a.groups = 4;
  expect_error(a, "multiples of groups");
  a = shape(1, 4, 2, 5, 4, 3);
  expect_error(a, "larger than the padded input");
  a = shape(1, 4, 5, 5, 4, 3);
  a.stride_h = 0;
  expect_error(a, "strides");
}

TEST(OnednnConv, PrimitivesAreBuiltOncePerConfiguration) {
  Conv2dArgs a = shape(2, 8, 6, 6, 8, 3);
  a.pad_h = a.pad_w = 1, a.src_dtype = onednn_bf16_conv() ? kBf16 : kF32;
  check_conv(a, true, 1);
  const CacheStats before = conv2d_cache_stats();
  check_conv(a, true, 2);
  const CacheStats after = conv2d_cache_stats();
  EXPECT_EQ(after.misses, before.misses);
  // forward, backward data, backward weights; conv2d_backward's two (both gradients); its data-only and
  // weights-only calls (the latter without bias: a plan of its own, built by the first check_conv).
  EXPECT_EQ(after.hits, before.hits + 7);
}

bool cpu_has_amx_bf16() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) return line.find(" amx_bf16") != std::string::npos;
  return false;
}

TEST(OnednnConv, Bf16UsesAmxWhenTheCpuHasIt) {
  if (!onednn_bf16_conv()) GTEST_SKIP() << "oneDNN has no bf16 convolution on this CPU (no AVX-512)";
  Conv2dArgs a = shape(4, 64, 16, 16, 64, 3);
  a.pad_h = a.pad_w = 1, a.src_dtype = kBf16, a.dst_dtype = kBf16;
  const std::string fwd = conv2d_impl_info(a, ConvPass::forward, true);
  EXPECT_EQ(onednn_last_impl("conv_fwd"), fwd);
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "no amx_bf16 in /proc/cpuinfo; oneDNN chose " << fwd;
  EXPECT_NE(fwd.find("amx"), std::string::npos) << fwd;
  const std::string bwd_data = conv2d_impl_info(a, ConvPass::backward_data);
  EXPECT_NE(bwd_data.find("amx"), std::string::npos) << bwd_data;
  const std::string bwd_wei = conv2d_impl_info(a, ConvPass::backward_weights, true);
  EXPECT_NE(bwd_wei.find("amx"), std::string::npos) << bwd_wei;
}

}  // namespace
}  // namespace mp::backend::cpu

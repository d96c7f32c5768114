// The op table, library-backed network ops (tests/ops/op_cases.hpp): matmul / bmm / linear / linear_relu
// (2-D, 1-D, batched, broadcast and folded batches, transposed operands, bias, an f32 bias with 16-bit operands),
// scaled-dot-product attention (causal, Tq != Tk), conv2d (stride, padding, dilation, groups, depthwise, 1x1,
// asymmetric kernels, strided inputs, odd channels, channels-last with OIHW or channels-last weights) and max / avg
// / adaptive pools (ties, NaN, ceil mode, count_include_pad). Folded from tests/cuda/test_cuda_ops_nn.cpp,
// tolerances and reasons unchanged.
//
// Multilinear ops use OpCheck::abs_scales: the tolerance of every element is c sqrt(K) u_acc times the sum of
// |terms| behind that element (the op on |inputs| in f64), plus the output's rounding.
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "op_cases.hpp"

namespace mp::op_table {

using namespace cuda_test;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Tolerance of a library GEMM / convolution over K terms: c sqrt(K) u_acc sum|terms| (OpCheck::abs_scales)
// plus `ulps` of the output dtype.
Tol gemm_tol(DType dt, int64_t K, double c, double ulps, const std::string& why) {
  Tol t;
  t.scaled = c * std::sqrt(static_cast<double>(std::max<int64_t>(K, 1))) * acc_roundoff(dt);
  t.ulps = ulps;
  t.why = why;
  return t;
}

// Note [16-bit bias after the product]: on the device a 16-bit GEMM or convolution with a bias rounds
// the product to 16 bits before the bias is added (cuDNN's convolution and our bias pass; cuBLASLt's bias
// epilogue in the output dtype: Note [matmul bias rounding] in matmul.cu, as PyTorch does on GPUs); the
// CPU adds the bias to the f32 accumulator and rounds once. The extra rounding is of the product
// out - bias, so it is at most u16 (|out| + |bias|): 2 ulps of the output plus u16 max|bias| (the biases
// here lie in [-1, 1]). Seen on an H200 (2026-11-26): outputs near 0 (the bias cancelling the product)
// 1.2e-3 apart in bf16, 2e-4 in f16.
Tol with_bias_rounding(Tol t, DType dt, bool bias, double max_bias = 1.0) {
  if (!bias || !is_low_precision(dt)) return t;
  t.ulps = std::max(t.ulps, 2.0);
  t.atol += unit_roundoff(dt) * max_bias;
  t.why += "; Note [16-bit bias after the product]: + u16 max|bias|";
  return t;
}

// An OpCheck of conv2d on x, w (and a bias [w[0]] when asked) in dt, with the tolerances of cuDNN's algorithms
// over K terms per output and K_bwd per gradient element; the caller sets fn.
OpCheck conv_check(const std::string& name, DType dt, const Shape& x, const Shape& w, bool bias, int64_t K,
                   int64_t K_bwd) {
  OpCheck chk;
  chk.name = name;
  chk.inputs = {uniform(x, -1, 1, dt), uniform(w, -0.5, 0.5, dt), bias ? uniform({w[0]}, -1, 1, dt) : Tensor()};
  // cuDNN's algorithms (implicit GEMM, Winograd, FFT) sum in other orders and some add transform roundings:
  // 4 sqrt(K) u_acc sum|x w|. 16-bit with bias: the bias is added by a separate pass, so the output may be
  // rounded twice (Note [cuDNN convolution precision]): 2 ulps.
  chk.out = with_bias_rounding(
      gemm_tol(dt, K, 4, 1, "convolution: cuDNN's summation order / algorithm, output rounding"), dt, bias);
  chk.grad = gemm_tol(dt, K_bwd, 4, 2,
                      "data and weight gradients: cuDNN's order over O/g kh kw or N oh ow terms; a 16-bit weight "
                      "gradient is rounded inside cuDNN (Note [conv weight gradient dtype]) then once more");
  if (dt == DType::f16) {
    // cuDNN's f16 data-gradient kernels round a partial sum to f16 on the way (seen on an H200, 2026-11-26:
    // a few elements of dx 4-7 ulps off, by ~u16 times the larger partial sums behind them): one more
    // 16-bit rounding of a value bounded by sum|terms|.
    chk.grad->scaled += unit_roundoff(dt);
    chk.grad->why += "; f16: one more rounding of a partial sum inside cuDNN (u16 sum|terms|)";
  }
  chk.abs_scales = true;
  chk.f64_may_be_unsupported = true;
  return chk;
}

// The two-device tolerance of a 16-bit GEMM or an f32/f64 one: c = 4 (tensor-core tiles, f32 accumulation) or 2.
double gemm_c(DType dt) { return is_low_precision(dt) ? 4 : 2; }

}  // namespace

std::vector<OpCase> linalg_conv_pool_cases() {
  std::vector<OpCase> cases;
  // matmul. f32 / f64: FMA accumulation in another order than the CPU (and split-K partial sums): 2 sqrt(K) u.
  // f16 / bf16: products exact in f32, tensor-core accumulation in f32 in tile order: 4 sqrt(K) u_f32; the
  // batch-broadcast gradients sum 16-bit products again (one more rounding): 2 ulps.
  struct Mm {
    const char* name;
    Shape a, b;
    bool ta, tb;  // the leaf is stored transposed (the op sees .t() / transpose(-1, -2))
    int64_t K, K_bwd;
  };
  const std::vector<Mm> mms = {
      {"2-D [37, 53] x [53, 29]", {37, 53}, {53, 29}, false, false, 53, 37},
      {"1-D [53] x 2-D [53, 29]", {53}, {53, 29}, false, false, 53, 29},
      {"2-D [37, 53] x 1-D [53]", {37, 53}, {53}, false, false, 53, 37},
      {"dot [1037] x [1037]", {1037}, {1037}, false, false, 1037, 1},
      {"batched [4, 37, 53] x [4, 53, 29]", {4, 37, 53}, {4, 53, 29}, false, false, 53, 37},
      {"broadcast batch [3, 1, 17, 23] x [5, 23, 11]", {3, 1, 17, 23}, {5, 23, 11}, false, false, 23, 55},
      {"folded batch [4, 37, 53] x [53, 29]", {4, 37, 53}, {53, 29}, false, false, 53, 148},
      {"transposed operands [37, 53] x [53, 29]", {53, 37}, {29, 53}, true, true, 53, 37},
      {"batched, transposed a [4, 37, 53] x [4, 53, 29]", {4, 53, 37}, {4, 53, 29}, true, false, 53, 37},
      {"tensor-core tiles [128, 256] x [256, 96]", {128, 256}, {256, 96}, false, false, 256, 128},
  };
  for (const Mm& k : mms) {
    cases.push_back(
        {std::string("matmul ") + k.name, all_floats(), [k](DType dt) {
           OpCheck chk;
           chk.inputs = {uniform(k.a, -1, 1, dt), uniform(k.b, -1, 1, dt)};
           const bool ta = k.ta, tb = k.tb;
           chk.fn = [ta, tb](const std::vector<Tensor>& in) {
             return matmul(ta ? in[0].transpose(-1, -2) : in[0], tb ? in[1].transpose(-1, -2) : in[1]);
           };
           chk.out = gemm_tol(dt, k.K, gemm_c(dt), 1,
                              "GEMM: accumulation order differs (c sqrt(K) u_acc sum|a b|), output rounding");
           chk.grad = gemm_tol(dt, k.K_bwd, gemm_c(dt), 2, "gradient GEMMs (and batch sums) in another order, rounded");
           chk.abs_scales = true;
           chk.f64_may_be_unsupported = true;
           return chk;
         }});
  }
  cases.push_back({"bmm [6, 19, 40] x [6, 40, 12]", all_floats(), [](DType dt) {
                     OpCheck bm;
                     bm.inputs = {uniform({6, 19, 40}, -1, 1, dt), uniform({6, 40, 12}, -1, 1, dt)};
                     bm.fn = [](const std::vector<Tensor>& in) { return bmm(in[0], in[1]); };
                     bm.out = gemm_tol(dt, 40, gemm_c(dt), 1, "GEMM accumulation order");
                     bm.grad = gemm_tol(dt, 19, gemm_c(dt), 1, "gradient GEMMs");
                     bm.abs_scales = true;
                     bm.f64_may_be_unsupported = true;
                     return bm;
                   }});
  // linear_relu (Note [matmul ReLU epilogue]): RELU_BIAS with a bias, RELU without, the ReLU pass where cuBLASLt
  // has no epilogue kernel or the bias goes first (the transposed input). The inputs are dyadic (x: k/2, W: k/64,
  // so x W^T is a multiple of 1/128; bias: odd/256), so every pre-activation is exact in f32 in any order and, with
  // a bias, at least 1/256 from 0 (without one an exact 0, which every device masks alike): no device can
  // put an output on the other side of the mask. With random inputs one output within rounding of 0 did (H200,
  // bench/RESULTS.md, sixth lease): its mask bit differs, which changes a whole row of the input gradient and of
  // the weight gradient and one bias gradient, beyond any rounding tolerance. Accumulation order is the plain linear
  // and matmul cases' business.
  for (int variant = 0; variant < 3; ++variant) {
    const bool bias = variant != 1, tx = variant == 2;
    cases.push_back(
        {std::string("linear_relu") + (bias ? " + bias" : " no bias") + (tx ? " transposed x" : ""), all_floats(),
         [bias, tx](DType dt) {
           OpCheck chk;
           chk.inputs = {dyadic(tx ? Shape{53, 37} : Shape{37, 53}, 2, 2, 0, dt), dyadic({29, 53}, 32, 64, 0, dt),
                         bias ? dyadic({29}, 63, 128, 1.0 / 256, dt) : Tensor()};
           chk.fn = [tx](const std::vector<Tensor>& in) { return linear_relu(tx ? in[0].t() : in[0], in[1], in[2]); };
           chk.out = with_bias_rounding(gemm_tol(dt, 53, gemm_c(dt), 1, "GEMM accumulation order"), dt, bias);
           chk.grad = gemm_tol(dt, 37, gemm_c(dt), 2, "gradient GEMMs (the mask is exact: see above)");
           chk.abs_scales = true;
           chk.f64_may_be_unsupported = true;
           return chk;
         }});
  }
  // linear: 16-bit with bias: a bias pass may round the output twice (GEMM result, then + bias): 2 ulps. An f32
  // bias with a 16-bit output is rounded to 16 bits first as well (Note [matmul bias rounding]).
  struct Lin {
    const char* name;
    Shape x;
    bool bias, tx, f32_bias;  // f32_bias: an f32 bias with 16-bit x and weight keeps its dtype
    int64_t rows;
  };
  const std::vector<Lin> lins = {
      {"[37, 53] + bias", {37, 53}, true, false, false, 37},
      {"[4, 9, 53] (3-D) + bias", {4, 9, 53}, true, false, false, 36},
      {"[37, 53] no bias", {37, 53}, false, false, false, 37},
      {"[37, 53] transposed input + bias", {53, 37}, true, true, false, 37},
      {"[37, 53] + f32 bias", {37, 53}, true, false, true, 37},
      {"[1, 53] (one row) + bias", {1, 53}, true, false, false, 1},
  };
  for (const Lin& k : lins) {
    cases.push_back({std::string("linear ") + k.name, all_floats(), [k](DType dt) {
                       const DType bias_dt = !k.f32_bias ? dt : dt == DType::f64 ? DType::f64 : DType::f32;
                       OpCheck chk;
                       chk.inputs = {uniform(k.x, -1, 1, dt), uniform({29, 53}, -0.5, 0.5, dt),
                                     k.bias ? uniform({29}, -1, 1, bias_dt) : Tensor()};
                       const bool tx = k.tx;
                       chk.fn = [tx](const std::vector<Tensor>& in) {
                         return linear(tx ? in[0].t() : in[0], in[1], in[2]);
                       };
                       chk.out = with_bias_rounding(gemm_tol(dt, 53, gemm_c(dt), 1, "GEMM accumulation order"), dt,
                                                    k.bias, bias_dt != dt ? 2.0 : 1.0);
                       chk.grad = gemm_tol(dt, std::max<int64_t>(k.rows, 29), gemm_c(dt), 2,
                                           "gradient GEMMs over 29 outputs / the rows, bias gradient a column sum");
                       chk.abs_scales = true;
                       chk.f64_may_be_unsupported = true;
                       return chk;
                     }});
  }
  // scaled_dot_product_attention: CUDA runs cuBLASLt products around a fused masked-softmax row kernel (Note [CUDA
  // attention]), the CPU its fused tiled kernel (Note [fused attention]).
  for (const bool causal : {false, true}) {
    cases.push_back({std::string("scaled_dot_product_attention [2, 3, 17 | 23, 16]") + (causal ? " causal" : ""),
                     all_floats(), [causal](DType dt) {
                       OpCheck chk;
                       chk.inputs = {uniform({2, 3, 17, 16}, -1, 1, dt), uniform({2, 3, 23, 16}, -1, 1, dt),
                                     uniform({2, 3, 23, 16}, -1, 1, dt)};
                       chk.fn = [causal](const std::vector<Tensor>& in) {
                         return scaled_dot_product_attention(in[0], in[1], in[2], {.causal = causal});
                       };
                       // Outputs are convex combinations of v's rows (|out| <= 1): the f32/f64 sums (K = 16 for the
                       // scores, 23 for the weighted sum) and exp differ in order and ulps, absolute relative to the
                       // largest output. 16-bit: CUDA rounds the weights (and in the backward dS) to the input
                       // dtype (the CPU's fused kernel rounds only bf16 weights, on VDPBF16PS), each a relative 2^-p
                       // change that the weighted sums carry to the output: 4 units of 2^-p.
                       const double u = unit_roundoff(dt);
                       chk.out.normwise = is_low_precision(dt) ? 8 * u : 64 * acc_roundoff(dt);
                       chk.out.why = "CUDA (weights rounded in 16-bit) vs fused f32 tiles: normwise";
                       Tol g;
                       g.normwise = is_low_precision(dt) ? 16 * u : 256 * acc_roundoff(dt);
                       g.why = "gradients: the forward's differences through dS = P (dP - rowsum(dO O)), normwise";
                       chk.grad = g;
                       chk.f64_may_be_unsupported = true;
                       return chk;
                     }});
  }
  // conv2d geometries (NCHW).
  struct Conv {
    const char* name;
    Shape x, w;
    Conv2dOptions opt;
    bool bias;
    bool transposed_input;  // x's leaf is [N, H, C, W], the op sees transpose(1, 2)
  };
  const std::vector<Conv> convs = {
      {"3x3 pad 1 + bias", {2, 3, 11, 13}, {8, 3, 3, 3}, {.padding = {1, 1}}, true, false},
      {"3x3 stride 2", {2, 4, 12, 9}, {6, 4, 3, 3}, {.stride = {2, 2}}, false, false},
      {"3x3 dilation 2 pad 2 + bias",
       {1, 5, 10, 10},
       {4, 5, 3, 3},
       {.padding = {2, 2}, .dilation = {2, 2}},
       true,
       false},
      {"groups 2 + bias", {2, 6, 9, 9}, {8, 3, 3, 3}, {.padding = {1, 1}, .groups = 2}, true, false},
      {"depthwise (groups = C)", {2, 8, 10, 7}, {8, 1, 3, 3}, {.padding = {1, 1}, .groups = 8}, false, false},
      {"1x1 stride 2 + bias", {3, 16, 8, 8}, {32, 16, 1, 1}, {.stride = {2, 2}}, true, false},
      {"5x3 stride (1, 2) pad (2, 1) + bias",
       {2, 3, 15, 17},
       {5, 3, 5, 3},
       {.stride = {1, 2}, .padding = {2, 1}},
       true,
       false},
      {"odd channels [4, 13, 16, 16] x [17, 13, 3, 3]",
       {4, 13, 16, 16},
       {17, 13, 3, 3},
       {.padding = {1, 1}},
       false,
       false},
      {"strided input view (transpose(1, 2))", {2, 11, 3, 13}, {8, 3, 3, 3}, {.padding = {1, 1}}, true, true},
  };
  for (const Conv& k : convs) {
    cases.push_back({std::string("conv2d ") + k.name, all_floats(), [k](DType dt) {
                       const Shape xs = k.transposed_input ? Shape{k.x[0], k.x[2], k.x[1], k.x[3]} : k.x;
                       const int64_t groups = k.opt.groups, C = xs[1], O = k.w[0], kh = k.w[2], kw = k.w[3];
                       const int64_t oh =
                           (xs[2] + 2 * k.opt.padding[0] - k.opt.dilation[0] * (kh - 1) - 1) / k.opt.stride[0] + 1;
                       const int64_t ow =
                           (xs[3] + 2 * k.opt.padding[1] - k.opt.dilation[1] * (kw - 1) - 1) / k.opt.stride[1] + 1;
                       const int64_t K = C / groups * kh * kw;
                       const int64_t K_bwd = std::max(O / groups * kh * kw, xs[0] * oh * ow);
                       OpCheck chk = conv_check("", dt, k.x, k.w, k.bias, K, K_bwd);
                       const Conv2dOptions opt = k.opt;
                       const bool tr = k.transposed_input;
                       chk.fn = [opt, tr](const std::vector<Tensor>& in) {
                         return conv2d(tr ? in[0].transpose(1, 2) : in[0], in[1], in[2], opt);
                       };
                       return chk;
                     }});
  }
  // Channels-last (NHWC) convolutions: cuDNN with NHWC descriptors and a KRSC filter (Note [cuDNN convolution
  // layouts]) against the CPU's channels-last path, the weight OIHW (reordered per call) or itself channels-last.
  constexpr MemoryFormat kCL = MemoryFormat::channels_last;
  const std::vector<Conv> cl = {
      {"3x3 pad 1 + bias, C = O = 16", {4, 16, 10, 10}, {16, 16, 3, 3}, {.padding = {1, 1}}, true, false},
      {"3x3 stride 2 pad 1, 8 -> 24",
       {2, 8, 11, 9},
       {24, 8, 3, 3},
       {.stride = {2, 2}, .padding = {1, 1}},
       false,
       false},
      {"1x1 stride 2 + bias (projection shortcut)", {3, 16, 8, 8}, {32, 16, 1, 1}, {.stride = {2, 2}}, true, false},
      {"groups 2 + bias", {2, 8, 9, 9}, {12, 4, 3, 3}, {.padding = {1, 1}, .groups = 2}, true, false},
      {"odd channels 13 -> 17 + bias (scalar bias path)",
       {2, 13, 7, 7},
       {17, 13, 3, 3},
       {.padding = {1, 1}},
       true,
       false},
      {"C = 1 input (dense in both layouts) + bias", {2, 1, 9, 9}, {8, 1, 3, 3}, {.padding = {1, 1}}, true, false},
      {"1x1 output (dense in both layouts)", {3, 8, 4, 4}, {16, 8, 4, 4}, {}, true, false},
  };
  for (const Conv& k : cl) {
    for (const bool weight_cl : {false, true}) {
      cases.push_back(
          {std::string("conv2d channels-last ") + k.name + (weight_cl ? " (channels-last weight)" : " (OIHW weight)"),
           all_floats(), [k, weight_cl](DType dt) {
             const int64_t O = k.w[0], K = k.w[1] * k.w[2] * k.w[3];
             const int64_t oh = (k.x[2] + 2 * k.opt.padding[0] - (k.w[2] - 1) - 1) / k.opt.stride[0] + 1;
             const int64_t ow = (k.x[3] + 2 * k.opt.padding[1] - (k.w[3] - 1) - 1) / k.opt.stride[1] + 1;
             const int64_t K_bwd = std::max(O / k.opt.groups * k.w[2] * k.w[3], k.x[0] * oh * ow);
             OpCheck chk = conv_check("", dt, k.x, k.w, k.bias, K, K_bwd);
             const Conv2dOptions opt = k.opt;
             chk.fn = [opt, weight_cl](const std::vector<Tensor>& in) {
               return conv2d(in[0].contiguous(kCL), weight_cl ? in[1].contiguous(kCL) : in[1], in[2], opt);
             };
             return chk;
           }});
    }
  }
  // Pools.
  struct Pool {
    const char* name;
    Shape x;
    Pool2dOptions opt;
  };
  const std::vector<Pool> pools = {
      {"2x2 / 2", {2, 3, 8, 8}, {.kernel = {2, 2}}},
      {"3x3 / 2 pad 1", {2, 3, 9, 11}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}},
      {"3x3 / 1 pad 1 ceil", {1, 2, 7, 7}, {.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1}, .ceil_mode = true}},
      {"2x2 / 2 ceil (odd sizes)", {2, 2, 7, 9}, {.kernel = {2, 2}, .ceil_mode = true}},
      {"3x2 / (2, 1) no count_include_pad",
       {2, 3, 10, 6},
       {.kernel = {3, 2}, .stride = {2, 1}, .padding = {1, 1}, .count_include_pad = false}},
  };
  for (const Pool& k : pools) {
    const Pool2dOptions opt = k.opt;
    // Max pool on values with ties: the first maximum of each window wins on both devices (a selection); the
    // backward adds each window's gradient at its winner: up to 9 overlapping windows summed in another order
    // (<= 8 u_acc * 9 for |g| < 1), rounded once.
    cases.push_back({std::string("max_pool2d ") + k.name, all_floats(), [k, opt](DType dt) {
                       OpCheck mx;
                       mx.inputs = {from_set(k.x, {-2, -1, 0, 0.5, 1, 3}, dt)};
                       mx.fn = [opt](const std::vector<Tensor>& in) { return max_pool2d(in[0], opt); };
                       mx.out = exact("a selection");
                       mx.bit_exact_output = true;
                       mx.grad = Tol{.ulps = 1,
                                     .atol = 72 * acc_roundoff(dt),
                                     .why = "sums of the gradients of overlapping windows"};
                       return mx;
                     }});
    cases.push_back({std::string("avg_pool2d ") + k.name, all_floats(), [k, opt](DType dt) {
                       OpCheck av;
                       av.inputs = {uniform(k.x, -1, 1, dt)};
                       av.fn = [opt](const std::vector<Tensor>& in) { return avg_pool2d(in[0], opt); };
                       av.out =
                           reduction_tol(dt, opt.kernel[0] * opt.kernel[1], 2, "; the division may round once more");
                       av.out.ulps = 2;
                       av.grad = reduction_tol(dt, 9, 2, "; each input sums the shares of its windows");
                       av.grad->ulps = 2;
                       av.abs_scales = true;
                       return av;
                     }});
  }
  // NaN wins a max-pool window.
  cases.push_back({"max_pool2d 2x2 / 2 with NaN", all_floats(), [](DType dt) {
                     OpCheck chk;
                     Tensor x = uniform({1, 2, 6, 6}, -1, 1, dt);
                     x.select(1, 0).select(1, 2).narrow(1, 3, 1).fill_(kNaN);
                     chk.inputs = {x};
                     chk.fn = [](const std::vector<Tensor>& in) { return max_pool2d(in[0], {.kernel = {2, 2}}); };
                     chk.out = exact("a selection; NaN wins its window");
                     chk.bit_exact_output = true;
                     return chk;
                   }});
  const std::vector<std::pair<Shape, std::array<int64_t, 2>>> adaptive = {
      {{2, 3, 7, 5}, {3, 2}}, {{2, 3, 8, 8}, {1, 1}}, {{1, 2, 5, 7}, {5, 7}}, {{2, 4, 13, 11}, {4, 3}}};
  for (const auto& [xs, os] : adaptive) {
    const Shape x_shape = xs;
    const std::array<int64_t, 2> o = os;
    cases.push_back(
        {"adaptive_avg_pool2d " + shape_str(xs) + " -> (" + std::to_string(os[0]) + ", " + std::to_string(os[1]) + ")",
         all_floats(), [x_shape, o](DType dt) {
           OpCheck ad;
           ad.inputs = {uniform(x_shape, -1, 1, dt)};
           ad.fn = [o](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], o); };
           const int64_t bin = (x_shape[2] / o[0] + 2) * (x_shape[3] / o[1] + 2);
           ad.out = reduction_tol(dt, bin, 2, "; the division may round once more");
           ad.out.ulps = 2;
           ad.grad = reduction_tol(dt, 4, 2, "; each input sums the shares of <= 4 bins");
           ad.grad->ulps = 2;
           ad.abs_scales = true;
           return ad;
         }});
  }
  return cases;
}

}  // namespace mp::op_table

// CPU conv2d: for f32, oneDNN, or im2col + one f32 GEMM where the output is small, per shape and pass by measurement
// (Note [kernel paths chosen by measurement] in kernel_paths.cpp); for bf16 likewise oneDNN's bf16 primitives, its
// f32 ones on widened operands, or im2col + one bf16 GEMM; f16 through f32 (oneDNN has f16 kernels only with
// AVX512-FP16/AMX-FP16, where they are measured too; the result is rounded to f16 once); plain OpenMP loops in double
// for f64 (gradient checks: correctness over speed).
#include <omp.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/conv_kernels.hpp"
#include "backend/cpu/bf16_policy.hpp"
#include "backend/cpu/loops.hpp"
#include "backend/cpu/matmul_cpu.hpp"
#include "backend/cpu/onednn/conv.hpp"
#include "backend/linalg_kernels.hpp"
#include "backend/reduce_kernels.hpp"

namespace mp::backend::cpu {
namespace {

// Shapes of one convolution call, read from x [N, C, H, W] and weight [O, C/groups, kH, kW] (or dy's channels).
Conv2dArgs make_args(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh, int64_t kw,
                     const Conv2dGeometry& g, DType dt) {
  Conv2dArgs a;
  a.n = n;
  a.c = c;
  a.h = h;
  a.w = w;
  a.oc = oc;
  a.kh = kh;
  a.kw = kw;
  a.stride_h = g.stride[0];
  a.stride_w = g.stride[1];
  a.pad_h = g.padding[0];
  a.pad_w = g.padding[1];
  a.dil_h = g.dilation[0];
  a.dil_w = g.dilation[1];
  a.groups = g.groups;
  a.src_dtype = dt;
  a.dst_dtype = dt;
  return a;
}

// ----------------------------------------------------------------------------------------- f64 loops
// All operands contiguous. Each loop nest writes every output element from one thread (a gather), so no
// atomics are needed and the result does not depend on the thread count.

void forward_f64(const Conv2dArgs& a, const double* x, const double* w, const double* bias, double* y) {
  const int64_t oh = a.out_h(), ow = a.out_w(), cpg = a.c / a.groups, opg = a.oc / a.groups;
  const int64_t work = a.n * a.oc * oh * ow * cpg * a.kh * a.kw;
#pragma omp parallel for collapse(2) if (work >= kParallelGrain && !omp_in_parallel()) schedule(static)
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t o = 0; o < a.oc; ++o) {
      const int64_t c0 = (o / opg) * cpg;
      double* yp = y + (n * a.oc + o) * oh * ow;
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double s = bias ? bias[o] : 0.0;
          for (int64_t ci = 0; ci < cpg; ++ci) {
            const double* xp = x + (n * a.c + c0 + ci) * a.h * a.w;
            const double* wp = w + (o * cpg + ci) * a.kh * a.kw;
            for (int64_t ky = 0; ky < a.kh; ++ky) {
              const int64_t iy = oy * a.stride_h - a.pad_h + ky * a.dil_h;
              if (iy < 0 || iy >= a.h) continue;
              for (int64_t kx = 0; kx < a.kw; ++kx) {
                const int64_t ix = ox * a.stride_w - a.pad_w + kx * a.dil_w;
                if (ix < 0 || ix >= a.w) continue;
                s += xp[iy * a.w + ix] * wp[ky * a.kw + kx];
              }
            }
          }
          yp[oy * ow + ox] = s;
        }
    }
}

void backward_data_f64(const Conv2dArgs& a, const double* dy, const double* w, double* dx) {
  const int64_t oh = a.out_h(), ow = a.out_w(), cpg = a.c / a.groups, opg = a.oc / a.groups;
  const int64_t work = a.n * a.c * a.h * a.w * opg * a.kh * a.kw;
#pragma omp parallel for collapse(2) if (work >= kParallelGrain && !omp_in_parallel()) schedule(static)
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t c = 0; c < a.c; ++c) {
      const int64_t grp = c / cpg, ci = c % cpg;
      double* dxp = dx + (n * a.c + c) * a.h * a.w;
      for (int64_t iy = 0; iy < a.h; ++iy)
        for (int64_t ix = 0; ix < a.w; ++ix) {
          double s = 0.0;
          for (int64_t oi = 0; oi < opg; ++oi) {
            const int64_t o = grp * opg + oi;
            const double* dyp = dy + (n * a.oc + o) * oh * ow;
            const double* wp = w + (o * cpg + ci) * a.kh * a.kw;
            for (int64_t ky = 0; ky < a.kh; ++ky) {
              // Output row oy reads input row iy through tap ky when oy * stride - pad + ky * dil == iy.
              const int64_t ty = iy + a.pad_h - ky * a.dil_h;
              if (ty < 0 || ty % a.stride_h != 0 || ty / a.stride_h >= oh) continue;
              const int64_t oy = ty / a.stride_h;
              for (int64_t kx = 0; kx < a.kw; ++kx) {
                const int64_t tx = ix + a.pad_w - kx * a.dil_w;
                if (tx < 0 || tx % a.stride_w != 0 || tx / a.stride_w >= ow) continue;
                s += dyp[oy * ow + tx / a.stride_w] * wp[ky * a.kw + kx];
              }
            }
          }
          dxp[iy * a.w + ix] = s;
        }
    }
}

void backward_weights_f64(const Conv2dArgs& a, const double* x, const double* dy, double* dw, double* db) {
  const int64_t oh = a.out_h(), ow = a.out_w(), cpg = a.c / a.groups, opg = a.oc / a.groups;
  const int64_t work = a.n * a.oc * oh * ow * cpg * a.kh * a.kw;
#pragma omp parallel for collapse(2) if (work >= kParallelGrain && !omp_in_parallel()) schedule(static)
  for (int64_t o = 0; o < a.oc; ++o)
    for (int64_t ci = 0; ci < cpg; ++ci) {
      const int64_t c = (o / opg) * cpg + ci;
      for (int64_t ky = 0; ky < a.kh; ++ky)
        for (int64_t kx = 0; kx < a.kw; ++kx) {
          double s = 0.0;
          for (int64_t n = 0; n < a.n; ++n) {
            const double* xp = x + (n * a.c + c) * a.h * a.w;
            const double* dyp = dy + (n * a.oc + o) * oh * ow;
            for (int64_t oy = 0; oy < oh; ++oy) {
              const int64_t iy = oy * a.stride_h - a.pad_h + ky * a.dil_h;
              if (iy < 0 || iy >= a.h) continue;
              for (int64_t ox = 0; ox < ow; ++ox) {
                const int64_t ix = ox * a.stride_w - a.pad_w + kx * a.dil_w;
                if (ix < 0 || ix >= a.w) continue;
                s += xp[iy * a.w + ix] * dyp[oy * ow + ox];
              }
            }
          }
          dw[((o * cpg + ci) * a.kh + ky) * a.kw + kx] = s;
        }
    }
  if (db == nullptr) return;
  for (int64_t o = 0; o < a.oc; ++o) {
    double s = 0.0;
    for (int64_t n = 0; n < a.n; ++n) {
      const double* dyp = dy + (n * a.oc + o) * oh * ow;
      for (int64_t i = 0; i < oh * ow; ++i) s += dyp[i];
    }
    db[o] = s;
  }
}

// ----------------------------------------------------------------------------------------- kernels

void check_out(const Tensor& t, const char* what, MemoryFormat f = MemoryFormat::contiguous) {
  MP_ASSERT(t.is_contiguous(f), "conv2d kernel: ", what, " must be ", memory_format_name(f), ", got ", t.describe());
}

// Note [small convolutions as one GEMM]
// On ResNet's last stage (4x4 outputs, 512 channels, batch 32) oneDNN 2.6's AMX forward kernel runs at ~0.28
// TFLOP/s (8.6 ms per call, 2 threads): with 16 pixels per image and padding on every border most of its
// tiles are partial. The same convolution is one GEMM over the batch, at oneDNN's full bf16 matmul rate:
//   y^T [N oh ow, O] = col [N oh ow, C kH kW] x W^T [C kH kW, O],
// col = im2col(x) (Note [bf16 weight gradient as one GEMM]), then one small transposing copy into NCHW.
// The data gradient of a stride-1 convolution is a forward convolution of dy with the flipped, transposed
// weights (Note [backward data as a forward convolution] in onednn/conv.cpp), so it takes the same GEMM.
// This is KernelPath::gemm, a candidate for bf16 and f32, groups 1, kernels larger than 1x1 (1x1 ones run oneDNN's
// GEMM on the plain layout anyway) and at most kGemmMaxPixels output pixels per image (input pixels for the
// data gradient): whether it wins is measured per shape (Note [kernel paths chosen by measurement]); it lost
// on AVX512-BF16 without AMX, and at 16x16 pixels everywhere it was tried (bench/RESULTS.md), hence the bound,
// which keeps hopeless candidates from being timed. In f32 it won on AVX2 (AMD Zen 3: oneDNN 3.2's jit:avx2 ran
// the 512 -> 512 4x4 convolution at ~90 GFLOP/s, its weight gradient at ~60): 9 of ResNet-18's 12 eligible passes,
// the fp32 step 1.06-1.32x faster (bench/RESULTS.md); f32 convolutions that are not eligible are not measured.
constexpr int64_t kGemmMaxPixels = 64;

bool gemm_eligible(const Conv2dArgs& a, ConvPass pass) {
  if ((a.src_dtype != DType::bf16 && a.src_dtype != DType::f32) || a.groups != 1) return false;
  switch (pass) {
    case ConvPass::forward: return !(a.kh == 1 && a.kw == 1) && a.out_h() * a.out_w() <= kGemmMaxPixels;
    case ConvPass::backward_data:
      return !(a.kh == 1 && a.kw == 1) && a.stride_h == 1 && a.stride_w == 1 && a.pad_h <= a.dil_h * (a.kh - 1) &&
             a.pad_w <= a.dil_w * (a.kw - 1) && a.h * a.w <= kGemmMaxPixels;
    case ConvPass::backward_weights: return a.out_h() * a.out_w() <= kGemmMaxPixels;
  }
  return false;
}

// col = im2col(x) in x's dtype (bf16 or f32).
Tensor im2col_of(const Conv2dArgs& a, const Tensor& xc);

// out [N, O, oh, ow] (bf16 or f32) = conv(x, w2) + bias with w2 = the weights as [O, C kH kW] (x's dtype,
// contiguous).
void forward_gemm(const Conv2dArgs& a, const Tensor& xc, const Tensor& w2, const Tensor& bias, const Tensor& out) {
  const int64_t P = a.out_h() * a.out_w(), R = a.n * P;
  const int64_t K = a.c * a.kh * a.kw;
  const Tensor col = im2col_of(a, xc);
  const Tensor wt = w2.view({1, a.oc, K}).transpose(1, 2);
  if (a.channels_last) {  // y^T [N oh ow, O] is the NHWC output itself
    matmul_on_path(KernelPath::native, out.permute({0, 2, 3, 1}).view({1, R, a.oc}), col, wt, bias, false,
                   MatmulEpilogue::none);
    return;
  }
  const Tensor yt = empty({1, R, a.oc}, {.dtype = out.dtype()});
  matmul_on_path(KernelPath::native, yt, col, wt, bias, false, MatmulEpilogue::none);
  Tensor(out).view({a.n, a.oc, P}).copy_(yt.view({a.n, P, a.oc}).permute({0, 2, 1}));
}

// dx [N, C, H, W] (bf16) of a stride-1 convolution: forward_gemm of dy with wt[c, o, i, j] = w[o, c, kh-1-i, kw-1-j].
void backward_data_gemm(const Conv2dArgs& a, const Tensor& dyc, const Tensor& wc, const Tensor& dx) {
  Conv2dArgs t = a;
  t.c = a.oc;
  t.oc = a.c;
  t.h = a.out_h();
  t.w = a.out_w();
  t.pad_h = a.dil_h * (a.kh - 1) - a.pad_h;
  t.pad_w = a.dil_w * (a.kw - 1) - a.pad_w;
  const int64_t taps = a.kh * a.kw;
  Tensor wt = empty({a.c, a.oc * taps}, {.dtype = wc.dtype()});
  const auto flip = [&]<class E>() {
    const auto* w = static_cast<const E*>(wc.raw_data());
    auto* o = static_cast<E*>(wt.raw_data());
#pragma omp parallel for if (a.c * a.oc * taps >= kParallelGrain && !omp_in_parallel()) schedule(static)
    for (int64_t c = 0; c < a.c; ++c)
      for (int64_t oc = 0; oc < a.oc; ++oc) {
        const E* src = w + (oc * a.c + c) * taps;
        E* dst = o + (c * a.oc + oc) * taps;
        for (int64_t k = 0; k < taps; ++k) dst[k] = src[taps - 1 - k];
      }
  };
  if (wc.dtype() == DType::f32)
    flip.template operator()<float>();
  else
    flip.template operator()<uint16_t>();
  forward_gemm(t, dyc, wt, Tensor(), dx);
}

// Note [bf16 weight gradient as one GEMM]
// oneDNN 2.6's AMX weight-gradient kernel is slow when the output is small in space: for ResNet-18's last
// stage (512 -> 512, 3x3, 4x4 output, batch 32) one call took ~19 ms, ~0.13 TFLOP/s, slower than its f32
// kernel; its 8x8 stage ~10 ms. The weight gradient is one GEMM over all output pixels of the batch:
//   dW [O, C kH kW] = dY^T [O, N oh ow] x col [N oh ow, C kH kW],
// where col is x unfolded (im2col; zero where the window hangs over the padding). With few output pixels
// col stays small (4x4, C = 512, N = 32: 512 x 4608 bf16 = 4.7 MB), and the GEMM runs on oneDNN's bf16
// matmul with f32 output; the result differs from oneDNN's convolution only in the order of the f32 sums.
// It is the weight gradient's KernelPath::gemm, measured against the others per shape (gemm_eligible).
// col [N oh ow, C kH kW] (bf16) from x [N, C, H, W] (bf16, contiguous NCHW, or NHWC when a.channels_last).
// A table maps each (output pixel, tap) to its offset in an input plane, so the inner loop is a plain
// gather (no index arithmetic or bounds tests per element). When every plane is read several times over
// (stride 1: each input pixel feeds up to kH kW outputs), the planes of one image are first copied into a
// zero-bordered buffer and the table points into it, which removes the padding test too; otherwise
// (strided, few outputs per input pixel) padding taps are marked -1. ResNet-18's 512x4x4 stage, batch 32,
// 1 thread: 6.5 ms with per-element index arithmetic, 1.8 ms so.
template <class E>
void im2col(const Conv2dArgs& a, const E* x, E* col) {
  const int64_t oh = a.out_h(), ow = a.out_w(), P = oh * ow, taps = a.kh * a.kw, K = a.c * taps, HW = a.h * a.w;
  const int64_t PH = a.h + 2 * a.pad_h, PW = a.w + 2 * a.pad_w;
  const bool padded = P * taps >= 2 * HW;
  std::vector<int32_t> table(static_cast<size_t>(P * taps));
  for (int64_t p = 0; p < P; ++p) {
    const int64_t oy = p / ow, ox = p % ow;
    for (int64_t ky = 0; ky < a.kh; ++ky)
      for (int64_t kx = 0; kx < a.kw; ++kx) {
        const int64_t py = oy * a.stride_h + ky * a.dil_h, px = ox * a.stride_w + kx * a.dil_w;  // padded coords
        const int64_t iy = py - a.pad_h, ix = px - a.pad_w;
        int64_t off = -1;
        if (padded)
          off = py * PW + px;
        else if (iy >= 0 && iy < a.h && ix >= 0 && ix < a.w)
          off = iy * a.w + ix;
        table[static_cast<size_t>(p * taps + ky * a.kw + kx)] = static_cast<int32_t>(off);
      }
  }
  const int32_t* tab = table.data();
#pragma omp parallel if (a.n * P * K >= kParallelGrain && !omp_in_parallel())
  {
    std::vector<E> pad(padded ? static_cast<size_t>(a.c * PH * PW) : 0, E{0});  // borders stay 0
#pragma omp for schedule(static)
    for (int64_t n = 0; n < a.n; ++n) {
      const E* xn = x + n * a.c * HW;
      const E* planes = xn;
      int64_t plane_size = HW;
      if (padded && a.channels_last) {  // NHWC image -> zero-bordered CHW planes (a transposing copy)
        for (int64_t y = 0; y < a.h; ++y)
          for (int64_t xx = 0; xx < a.w; ++xx) {
            const E* src = xn + (y * a.w + xx) * a.c;
            E* dst = &pad[static_cast<size_t>((y + a.pad_h) * PW + xx + a.pad_w)];
            for (int64_t c = 0; c < a.c; ++c) dst[c * PH * PW] = src[c];
          }
      } else if (padded) {
        for (int64_t c = 0; c < a.c; ++c)
          for (int64_t y = 0; y < a.h; ++y)
            std::memcpy(&pad[static_cast<size_t>((c * PH + y + a.pad_h) * PW + a.pad_w)], xn + c * HW + y * a.w,
                        static_cast<size_t>(a.w) * sizeof(E));
      }
      if (padded) {
        planes = pad.data();
        plane_size = PH * PW;
      }
      for (int64_t p = 0; p < P; ++p) {
        E* out = col + (n * P + p) * K;
        const int32_t* tp = tab + p * taps;
        for (int64_t c = 0; c < a.c; ++c, out += taps) {
          if (padded) {
            const E* plane = planes + c * plane_size;
            for (int64_t t = 0; t < taps; ++t) out[t] = plane[tp[t]];
          } else if (a.channels_last) {  // pixel q of channel c at xn[q C + c]
            for (int64_t t = 0; t < taps; ++t) out[t] = tp[t] >= 0 ? xn[tp[t] * a.c + c] : E{0};
          } else {
            const E* plane = planes + c * plane_size;
            for (int64_t t = 0; t < taps; ++t) out[t] = tp[t] >= 0 ? plane[tp[t]] : E{0};
          }
        }
      }
    }
  }
}

Tensor im2col_of(const Conv2dArgs& a, const Tensor& xc) {
  const int64_t R = a.n * a.out_h() * a.out_w(), K = a.c * a.kh * a.kw;
  Tensor col = empty({1, R, K}, {.dtype = xc.dtype()});
  if (xc.dtype() == DType::f32)
    im2col(a, static_cast<const float*>(xc.raw_data()), static_cast<float*>(col.raw_data()));
  else
    im2col(a, static_cast<const uint16_t*>(xc.raw_data()), static_cast<uint16_t*>(col.raw_data()));
  return col;
}

void backward_weights_gemm(const Conv2dArgs& a, const Tensor& xc, const Tensor& dyc, const Tensor& dweight,
                           const Tensor& dbias) {
  const int64_t P = a.out_h() * a.out_w(), K = a.c * a.kh * a.kw, R = a.n * P;
  const Tensor col = im2col_of(a, xc);
  // dY^T [O, N P]: NCHW dy is copied so (small: O x N P); NHWC dy is [N P, O] already, read transposed.
  const Tensor dyt = a.channels_last ? dyc.permute({0, 2, 3, 1}).reshape({1, R, a.oc}).transpose(1, 2)
                                     : dyc.view({a.n, a.oc, P}).permute({1, 0, 2}).contiguous().view({1, a.oc, R});
  matmul_on_path(KernelPath::native, dweight.view({1, a.oc, K}), dyt, col, Tensor(), false, MatmulEpilogue::none);
  if (dbias.defined()) reduce_kernel.get(kCPU)(ReduceOp::sum, dbias, dyt.select(0, 0), 1);
}

// ------------------------------------------------------------------------------- one pass on a path
// `a` describes the call in the operands' own dtype; `p` says how 16-bit operands compute (f32 ones: native).
// Through f32, 16-bit results go to an f32 scratch tensor and are rounded into the output once.

DType path_dtype(const Conv2dArgs& a, KernelPath p) { return p == KernelPath::via_f32 ? DType::f32 : a.src_dtype; }

KernelPath conv_path(const Conv2dArgs& a, ConvPass pass);

// Note [through f32 on f32's path]: a 16-bit convolution through f32 runs its f32 copy on the path that f32
// convolution of that shape chose (oneDNN or one GEMM), so it costs the f32 convolution plus the casts. It used
// oneDNN's f32 kernel always: on AMD Zen 3, where f32 took the GEMM for ResNet-18's small convolutions and 16-bit
// computes through f32, bf16 O2 steps became 1.3-1.45x slower than fp32 (bench/RESULTS.md). conv_path decides
// the f32 path before it times the 16-bit candidates (one shape is timed at a time).
bool via_f32_gemm(Conv2dArgs a, ConvPass pass) {
  a.src_dtype = a.dst_dtype = DType::f32;
  return gemm_eligible(a, pass) && conv_path(a, pass) == KernelPath::gemm;
}

Tensor scratch_for(const Tensor& t, DType ct, MemoryFormat fmt) {
  return t.dtype() == ct ? t : empty(t.sizes(), {.dtype = ct, .device = t.device(), .memory_format = fmt});
}

void forward_on(KernelPath p, Conv2dArgs a, const Tensor& out, const Tensor& x, const Tensor& weight,
                const Tensor& bias, MemoryFormat fmt) {
  const Tensor bc = bias.defined() ? bias.to(DType::f32).contiguous() : Tensor();
  if (p == KernelPath::gemm)  // Note [small convolutions as one GEMM]
    return forward_gemm(a, x.contiguous(fmt), weight.contiguous().view({a.oc, a.c * a.kh * a.kw}), bc, out);
  const DType ct = path_dtype(a, p);
  const bool gemm = p == KernelPath::via_f32 && via_f32_gemm(a, ConvPass::forward);
  a.src_dtype = a.dst_dtype = ct;
  const Tensor xc = x.to(ct).contiguous(fmt), wc = weight.to(ct).contiguous(), dst = scratch_for(out, ct, fmt);
  if (gemm)  // Note [through f32 on f32's path]
    forward_gemm(a, xc, wc.view({a.oc, a.c * a.kh * a.kw}), bc, dst);
  else
    conv2d_forward(a, xc.raw_data(), wc.raw_data(), bc.defined() ? bc.raw_data() : nullptr, dst.raw_data());
  if (dst.raw_data() != out.raw_data()) Tensor(out).copy_(dst);
}

void backward_data_on(KernelPath p, Conv2dArgs a, const Tensor& dx, const Tensor& dy, const Tensor& weight,
                      MemoryFormat fmt) {
  if (p == KernelPath::gemm) return backward_data_gemm(a, dy.contiguous(fmt), weight.contiguous(), dx);
  const DType ct = path_dtype(a, p);
  const bool gemm = p == KernelPath::via_f32 && via_f32_gemm(a, ConvPass::backward_data);
  a.src_dtype = a.dst_dtype = ct;
  const Tensor dyc = dy.to(ct).contiguous(fmt), wc = weight.to(ct).contiguous(), dst = scratch_for(dx, ct, fmt);
  if (gemm)  // Note [through f32 on f32's path]
    backward_data_gemm(a, dyc, wc, dst);
  else
    conv2d_backward_data(a, dyc.raw_data(), wc.raw_data(), dst.raw_data());
  if (dst.raw_data() != dx.raw_data()) Tensor(dx).copy_(dst);
}

void backward_weights_on(KernelPath p, Conv2dArgs a, const Tensor& dweight, const Tensor& dbias, const Tensor& x,
                         const Tensor& dy, MemoryFormat fmt) {
  if (p == KernelPath::gemm)  // Note [bf16 weight gradient as one GEMM]
    return backward_weights_gemm(a, x.contiguous(fmt), dy.contiguous(fmt), dweight, dbias);
  const DType ct = path_dtype(a, p);
  const bool gemm = p == KernelPath::via_f32 && via_f32_gemm(a, ConvPass::backward_weights);
  a.src_dtype = a.dst_dtype = ct;
  const Tensor xc = x.to(ct).contiguous(fmt), dyc = dy.to(ct).contiguous(fmt);
  if (gemm)  // Note [through f32 on f32's path]
    return backward_weights_gemm(a, xc, dyc, dweight, dbias);
  conv2d_backward_weights(a, xc.raw_data(), dyc.raw_data(), dweight.raw_data(),
                          dbias.defined() ? dbias.raw_data() : nullptr);
}

const char* pass_name(ConvPass pass) {
  switch (pass) {
    case ConvPass::forward: return "conv_fwd";
    case ConvPass::backward_data: return "conv_bwd_data";
    case ConvPass::backward_weights: return "conv_bwd_weights";
  }
  return "?";
}

// The path of one pass (Note [kernel paths chosen by measurement]); f32 operands and empty batches: native.
KernelPath conv_path(const Conv2dArgs& a, ConvPass pass) {
  if (a.n == 0 || (a.src_dtype == DType::f32 && !gemm_eligible(a, pass))) return KernelPath::native;
  auto key = [&] {
    auto d = [](int64_t x, int64_t y) { return std::to_string(x) + "x" + std::to_string(y); };
    return std::string(pass_name(pass)) + " " + dtype_name(a.src_dtype) + " n" + std::to_string(a.n) + " c" +
           std::to_string(a.c) + " hw" + d(a.h, a.w) + " o" + std::to_string(a.oc) + " k" + d(a.kh, a.kw) + " s" +
           d(a.stride_h, a.stride_w) + " p" + d(a.pad_h, a.pad_w) + " d" + d(a.dil_h, a.dil_w) + " g" +
           std::to_string(a.groups) + (a.channels_last ? " nhwc" : " nchw");
  };
  // Stand-in operands: x, w, y (the output or dy) in the call's dtype, and an f32 weight gradient.
  auto run = [a, pass, ops = std::vector<Tensor>()](KernelPath p) mutable {
    const MemoryFormat fmt = a.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
    if (ops.empty()) {
      const TensorOptions act{.dtype = a.src_dtype, .memory_format = fmt};
      ops = {full({a.n, a.c, a.h, a.w}, 0.01, act),
             full({a.oc, a.c / a.groups, a.kh, a.kw}, 0.01, {.dtype = a.src_dtype}),
             full({a.n, a.oc, a.out_h(), a.out_w()}, 0.01, act), empty({a.oc, a.c / a.groups, a.kh, a.kw})};
    }
    switch (pass) {
      case ConvPass::forward: return forward_on(p, a, ops[2], ops[0], ops[1], Tensor(), fmt);
      case ConvPass::backward_data: return backward_data_on(p, a, ops[0], ops[2], ops[1], fmt);
      case ConvPass::backward_weights: return backward_weights_on(p, a, ops[3], Tensor(), ops[0], ops[2], fmt);
    }
  };
  if (a.src_dtype == DType::f32) {  // Note [small convolutions as one GEMM]: f32 too, measured against oneDNN's
    static constexpr KernelPath kF32[] = {KernelPath::native, KernelPath::gemm};
    return choose_kernel_path(key(), kF32, run);
  }
  auto reference = [a, pass] { return onednn_reference_impl(conv2d_impl_info(a, pass)); };
  (void)via_f32_gemm(a, pass);  // f32's path first (Note [through f32 on f32's path])
  return choose_16bit_path(a.src_dtype, gemm_eligible(a, pass), key, run, reference);
}

// ----------------------------------------------------------------------------------------- kernels

void conv2d_forward_cpu(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Conv2dGeometry& g) {
  const MemoryFormat fmt = conv_call_format(out, x);  // Note [channels-last convolutions]
  check_out(out, "output", fmt);
  MP_ASSERT(x.dtype() == weight.dtype() && out.dtype() == x.dtype(), "conv2d kernel: dtypes differ");
  Conv2dArgs a = make_args(x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0), weight.size(2), weight.size(3),
                           g, x.dtype());
  a.channels_last = fmt == MemoryFormat::channels_last;
  MP_ASSERT(out.size(2) == a.out_h() && out.size(3) == a.out_w(), "conv2d kernel: output ", out.describe(),
            " does not match the geometry");
  if (x.dtype() == DType::f64) {
    const Tensor xc = x.contiguous(), wc = weight.contiguous();
    const Tensor bc = bias.defined() ? bias.to(DType::f64).contiguous() : Tensor();
    const Tensor dst = out.is_contiguous() ? out : empty(out.sizes(), {.dtype = DType::f64});  // loops write NCHW
    forward_f64(a, xc.data_ptr<double>(), wc.data_ptr<double>(), bc.defined() ? bc.data_ptr<double>() : nullptr,
                dst.data_ptr<double>());
    if (dst.raw_data() != out.raw_data()) Tensor(out).copy_(dst);
    return;
  }
  forward_on(conv_path(a, ConvPass::forward), a, out, x, weight, bias, fmt);
}

void conv2d_backward_data_cpu(const Tensor& dx, const Tensor& dy, const Tensor& weight, const Conv2dGeometry& g) {
  const MemoryFormat fmt = conv_call_format(dx, dy);  // Note [channels-last convolutions]
  check_out(dx, "dx", fmt);
  MP_ASSERT(dy.dtype() == weight.dtype() && dx.dtype() == weight.dtype(), "conv2d backward kernel: dtypes differ");
  Conv2dArgs a = make_args(dx.size(0), dx.size(1), dx.size(2), dx.size(3), weight.size(0), weight.size(2),
                           weight.size(3), g, dx.dtype());
  a.channels_last = fmt == MemoryFormat::channels_last;
  MP_ASSERT(dy.size(2) == a.out_h() && dy.size(3) == a.out_w(), "conv2d backward kernel: dy ", dy.describe(),
            " does not match the geometry");
  if (dx.dtype() == DType::f64) {
    const Tensor dyc = dy.contiguous(), wc = weight.contiguous();
    const Tensor dst = dx.is_contiguous() ? dx : empty(dx.sizes(), {.dtype = DType::f64});  // loops write NCHW
    backward_data_f64(a, dyc.data_ptr<double>(), wc.data_ptr<double>(), dst.data_ptr<double>());
    if (dst.raw_data() != dx.raw_data()) Tensor(dx).copy_(dst);
    return;
  }
  backward_data_on(conv_path(a, ConvPass::backward_data), a, dx, dy, weight, fmt);
}

void conv2d_backward_weights_cpu(const Tensor& dweight, const Tensor& dbias, const Tensor& x, const Tensor& dy,
                                 const Conv2dGeometry& g) {
  check_out(dweight, "dweight");
  if (dbias.defined()) check_out(dbias, "dbias");
  MP_ASSERT(x.dtype() == dy.dtype(), "conv2d backward kernel: x and dy dtypes differ");
  const MemoryFormat fmt =
      conv_call_format(Tensor(), x.suggest_memory_format() == MemoryFormat::channels_last ? x : dy);
  Conv2dArgs a = make_args(x.size(0), x.size(1), x.size(2), x.size(3), dweight.size(0), dweight.size(2),
                           dweight.size(3), g, x.dtype());
  a.channels_last = fmt == MemoryFormat::channels_last;
  MP_ASSERT(dy.size(2) == a.out_h() && dy.size(3) == a.out_w(), "conv2d backward kernel: dy ", dy.describe(),
            " does not match the geometry");
  if (x.dtype() == DType::f64) {
    const Tensor xc = x.contiguous(), dyc = dy.contiguous();
    backward_weights_f64(a, xc.data_ptr<double>(), dyc.data_ptr<double>(), dweight.data_ptr<double>(),
                         dbias.defined() ? dbias.data_ptr<double>() : nullptr);
    return;
  }
  MP_ASSERT(dweight.dtype() == DType::f32 && (!dbias.defined() || dbias.dtype() == DType::f32),
            "conv2d backward kernel: dweight/dbias must be f32 for ", dtype_name(x.dtype()), " inputs");
  backward_weights_on(conv_path(a, ConvPass::backward_weights), a, dweight, dbias, x, dy, fmt);
}

// Both gradients: when both passes take one primitive path (native, or both through f32 on oneDNN's f32 kernels),
// one call, which reorders dy into oneDNN's layout once for the two; otherwise the two kernels.
void conv2d_backward_cpu(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& x,
                         const Tensor& dy, const Tensor& weight, const Conv2dGeometry& g) {
  if (!dx.defined() || !dweight.defined() || dx.dtype() == DType::f64) {
    if (dx.defined()) conv2d_backward_data_cpu(dx, dy, weight, g);
    if (dweight.defined()) conv2d_backward_weights_cpu(dweight, dbias, x, dy, g);
    return;
  }
  const MemoryFormat fmt = conv_call_format(dx, dy);  // Note [channels-last convolutions]
  check_out(dx, "dx", fmt);
  check_out(dweight, "dweight");
  if (dbias.defined()) check_out(dbias, "dbias");
  MP_ASSERT(x.dtype() == dy.dtype() && weight.dtype() == dy.dtype() && dx.dtype() == dy.dtype(),
            "conv2d backward kernel: dtypes differ");
  MP_ASSERT(dweight.dtype() == DType::f32 && (!dbias.defined() || dbias.dtype() == DType::f32),
            "conv2d backward kernel: dweight/dbias must be f32 for ", dtype_name(x.dtype()), " inputs");
  Conv2dArgs a = make_args(x.size(0), x.size(1), x.size(2), x.size(3), weight.size(0), weight.size(2), weight.size(3),
                           g, x.dtype());
  a.channels_last = fmt == MemoryFormat::channels_last;
  MP_ASSERT(dy.size(2) == a.out_h() && dy.size(3) == a.out_w(), "conv2d backward kernel: dy ", dy.describe(),
            " does not match the geometry");
  const KernelPath pd = conv_path(a, ConvPass::backward_data), pw = conv_path(a, ConvPass::backward_weights);
  if (a.n == 0 || pd != pw || pd == KernelPath::gemm ||
      (pd == KernelPath::via_f32 &&
       (via_f32_gemm(a, ConvPass::backward_data) || via_f32_gemm(a, ConvPass::backward_weights)))) {
    // Both passes through f32: dy widened once for the two (each pass's own widening would give the same copy).
    const Tensor dyw = pd == KernelPath::via_f32 && pw == KernelPath::via_f32 ? dy.to(DType::f32) : dy;
    backward_data_on(pd, a, dx, dyw, weight, fmt);
    backward_weights_on(pw, a, dweight, dbias, x, dyw, fmt);
    return;
  }
  const DType ct = path_dtype(a, pd);
  a.src_dtype = a.dst_dtype = ct;
  const Tensor xc = x.to(ct).contiguous(fmt), dyc = dy.to(ct).contiguous(fmt), wc = weight.to(ct).contiguous();
  const Tensor dxs = scratch_for(dx, ct, fmt);
  conv2d_backward(a, xc.raw_data(), dyc.raw_data(), wc.raw_data(), dxs.raw_data(), dweight.raw_data(),
                  dbias.defined() ? dbias.raw_data() : nullptr);
  if (dxs.raw_data() != dx.raw_data()) Tensor(dx).copy_(dxs);
}

}  // namespace

MP_REGISTER_KERNEL(conv2d_backward_kernel, DeviceType::cpu, &conv2d_backward_cpu);
MP_REGISTER_KERNEL(conv2d_forward_kernel, DeviceType::cpu, &conv2d_forward_cpu);

}  // namespace mp::backend::cpu

// CPU matmul: oneDNN for f32; for bf16 oneDNN's bf16 GEMM or its f32 GEMM on widened operands, per shape by
// measurement (Note [kernel paths chosen by measurement] in kernel_paths.cpp); f16 through f32 (oneDNN has f16
// kernels only with AVX512-FP16/AMX-FP16, where they are measured too); a plain loop in double for f64 (gradient
// checks).
#include <omp.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/bf16_policy.hpp"
#include "backend/cpu/matmul_cpu.hpp"
#include "backend/cpu/onednn/common.hpp"
#include "backend/cpu/onednn/matmul.hpp"
#include "backend/linalg_kernels.hpp"

namespace mp::backend::cpu {
namespace {

void matmul_f64(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, bool accumulate, bool relu) {
  const int64_t B = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  const double* pa = a.data_ptr<double>();
  const double* pb = b.data_ptr<double>();
  double* pc = out.data_ptr<double>();
  const double* pbias = bias.defined() ? bias.data_ptr<double>() : nullptr;
  const auto& as = a.strides();
  const auto& bs = b.strides();
  const auto& cs = out.strides();
  const int64_t biasst = bias.defined() ? bias.stride(0) : 0;
#pragma omp parallel for collapse(2) if (B * m * n * k >= 32768) schedule(static)
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = pbias ? pbias[j * biasst] : 0.0;
        for (int64_t p = 0; p < k; ++p)
          s += pa[bb * as[0] + i * as[1] + p * as[2]] * pb[bb * bs[0] + p * bs[1] + j * bs[2]];
        double& c = pc[bb * cs[0] + i * cs[1] + j * cs[2]];
        if (relu && s < 0.0) s = 0.0;  // NaN fails the test and stays NaN
        c = accumulate ? c + s : s;
      }
    }
}

// The dims of t from the largest stride to the smallest (ties keep their order): t.permute() of it is
// contiguous when t is dense in some order (a transposed weight or gradient is).
Shape memory_order(const Tensor& t) {
  Shape order(static_cast<size_t>(t.dim()));
  for (int64_t d = 0; d < t.dim(); ++d) order[static_cast<size_t>(d)] = d;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return order;
}

Shape inverse_permutation(const Shape& order) {
  Shape inv(order.size());
  for (size_t i = 0; i < order.size(); ++i) inv[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return inv;
}

// Note [widening in memory order]
// The through-f32 path widens each 16-bit operand and rounds the f32 result back. A transposed operand (the
// weight in dX = dY W^T, the activation in dW = X^T dY) cast into row-major order is a strided gather, ~20x
// slower than the flat cast (measured: 7.1 vs 0.34 ms for a transposed 2048^2 f16 tensor, Zen 4, 2 threads),
// and it cost the fp16 O2 MLP step a fifth of its time. So a dense operand is widened in its own memory order
// (a flat cast; the f32 copy has the same strides, which the f32 GEMM reads as it reads the 16-bit operand),
// and the f32 result is made in the output's order so that rounding it back is a flat cast too.
Tensor widen_in_memory_order(const Tensor& t) {
  const Shape order = memory_order(t);
  const Tensor p = t.permute(order);
  if (!p.is_contiguous()) return t.to(DType::f32);
  return p.to(DType::f32).permute(inverse_permutation(order));
}

Tensor empty_f32_in_memory_order(const Tensor& t) {
  const Shape order = memory_order(t);
  if (!t.permute(order).is_contiguous()) return empty(t.sizes());
  Shape sizes(order.size());
  for (size_t i = 0; i < order.size(); ++i) sizes[i] = t.size(order[i]);
  return empty(sizes).permute(inverse_permutation(order));
}

// oneDNN's arguments for out (+)= a x b with the tensors' sizes, dtypes and strides (no bias, no epilogue).
MatmulArgs matmul_args(const Tensor& out, const Tensor& a, const Tensor& b, bool accumulate) {
  MatmulArgs args;
  args.batch = out.size(0);
  args.m = out.size(1);
  args.n = out.size(2);
  args.k = a.size(2);
  args.a_dtype = a.dtype();
  args.b_dtype = b.dtype();
  args.c_dtype = out.dtype();
  for (int i = 0; i < 3; ++i) {
    args.a_strides[i] = a.stride(i);
    args.b_strides[i] = b.stride(i);
    args.c_strides[i] = out.stride(i);
  }
  if (a.size(0) == 1) args.a_strides[0] = 0;
  if (b.size(0) == 1) args.b_strides[0] = 0;
  args.accumulate = accumulate;
  return args;
}

// The dtype a bias reaches oneDNN in: f32, or A's and B's dtype; any other is widened to f32.
DType bias_dtype_for(DType bias, DType ab) { return bias == DType::f32 || bias == ab ? bias : DType::f32; }

}  // namespace

void matmul_on_path(KernelPath path, const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias,
                    bool accumulate, MatmulEpilogue epilogue) {
  const bool relu = epilogue == MatmulEpilogue::relu;
  if (a.dtype() != DType::f32 && path == KernelPath::via_f32) {
    // Through f32: widen the operands exactly, run the f32 GEMM, round the result once (Note [widening in
    // memory order]).
    Tensor a32 = widen_in_memory_order(a), b32 = widen_in_memory_order(b);
    Tensor bias32 = bias.defined() ? bias.to(DType::f32) : Tensor();
    if (out.dtype() == DType::f32) return matmul_on_path(path, out, a32, b32, bias32, accumulate, epilogue);
    Tensor o32 = accumulate ? widen_in_memory_order(out) : empty_f32_in_memory_order(out);
    matmul_on_path(path, o32, a32, b32, bias32, accumulate, epilogue);
    Tensor(out).copy_(o32);
    return;
  }
  MatmulArgs args = matmul_args(out, a, b, accumulate);
  args.relu = relu;
  Tensor bias_c;
  if (bias.defined()) {
    bias_c = bias.contiguous();
    bias_c = bias_c.to(bias_dtype_for(bias_c.dtype(), a.dtype()));
    args.has_bias = true;
    args.bias_dtype = bias_c.dtype();
  }
  matmul(args, a.raw_data(), b.raw_data(), out.raw_data(), bias_c.defined() ? bias_c.raw_data() : nullptr);
}

namespace {

// Whether a 3-D operand is read column-major (a transposed view: the weight of linear, dY^T of a weight gradient).
bool column_major(const Tensor& t) { return t.size(2) > 1 && t.stride(2) != 1; }

// What a call adds to the product, as oneDNN sees it: a bias (its dtype), a ReLU post-op, accumulation into C (a
// sum post-op). oneDNN 3.2's 16-bit kernels support some of these combinations only, so the stand-ins carry them.
struct MatmulExtras {
  std::optional<DType> bias;
  bool relu = false;
  bool accumulate = false;
  std::string key() const {
    return (bias ? std::string(" bias:") + dtype_name(*bias) : std::string()) + (relu ? " relu" : "") +
           (accumulate ? " acc" : "");
  }
};

// The path of a 16-bit matmul of these sizes (Note [kernel paths chosen by measurement]); timed on stand-in operands
// of the call's layouts (row- or column-major A and B: oneDNN's 16-bit kernels may differ by 100x between them, a
// reference implementation for one, while the f32 path reads both alike) and with its bias, ReLU and accumulation
// (measured on an AVX512-FP16 Xeon: the layouts alone left the fp16 O2 MLP step at 2.6 s, bench/RESULTS.md); the
// key names all of them.
KernelPath matmul_path(DType ab, DType c, int64_t batch, int64_t m, int64_t n, int64_t k, bool a_cm, bool b_cm,
                       const MatmulExtras& x = {}) {
  auto key = [&] {
    return std::string("matmul ") + dtype_name(ab) + ">" + dtype_name(c) + " b" + std::to_string(batch) + " m" +
           std::to_string(m) + " n" + std::to_string(n) + " k" + std::to_string(k) + (a_cm ? " a_cm" : "") +
           (b_cm ? " b_cm" : "") + x.key();
  };
  auto ops = std::make_shared<std::vector<Tensor>>();  // a, b, out, bias: made on first use
  auto stand_ins = [=]() -> const std::vector<Tensor>& {
    auto operand = [&](int64_t rows, int64_t cols, bool cm) {
      return cm ? full({batch, cols, rows}, 0.01, {.dtype = ab}).transpose(1, 2)
                : full({batch, rows, cols}, 0.01, {.dtype = ab});
    };
    if (ops->empty())
      *ops = {operand(m, k, a_cm), operand(k, n, b_cm), zeros({batch, m, n}, {.dtype = c}),
              x.bias ? full({n}, 0.01, {.dtype = *x.bias}) : Tensor()};
    return *ops;
  };
  const MatmulEpilogue epilogue = x.relu ? MatmulEpilogue::relu : MatmulEpilogue::none;
  auto run = [stand_ins, epilogue, acc = x.accumulate](KernelPath p) {
    const std::vector<Tensor>& o = stand_ins();
    matmul_on_path(p, o[2], o[0], o[1], o[3], acc, epilogue);
  };
  auto reference = [stand_ins, x, ab] {
    const std::vector<Tensor>& o = stand_ins();
    MatmulArgs args = matmul_args(o[2], o[0], o[1], x.accumulate);
    args.relu = x.relu;
    if (x.bias) {
      args.has_bias = true;
      args.bias_dtype = bias_dtype_for(*x.bias, ab);
    }
    return onednn_reference_impl(matmul_impl_info(args));
  };
  return choose_16bit_path(ab, false, key, run, reference);
}

void matmul_cpu(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, bool accumulate,
                MatmulEpilogue epilogue) {
  MP_ASSERT(a.dim() == 3 && b.dim() == 3 && out.dim() == 3, "matmul kernel wants 3-D operands");
  MP_ASSERT(!(epilogue == MatmulEpilogue::relu && accumulate),
            "matmul: a ReLU epilogue cannot be combined with accumulation");
  if (a.dtype() == DType::f64) return matmul_f64(out, a, b, bias, accumulate, epilogue == MatmulEpilogue::relu);
  const MatmulExtras extras{.bias = bias.defined() ? std::optional<DType>(bias.dtype()) : std::nullopt,
                            .relu = epilogue == MatmulEpilogue::relu,
                            .accumulate = accumulate};
  const KernelPath path = a.dtype() == DType::f32 || out.numel() == 0 || a.size(2) == 0
                              ? KernelPath::native
                              : matmul_path(a.dtype(), out.dtype(), out.size(0), out.size(1), out.size(2), a.size(2),
                                            column_major(a), column_major(b), extras);
  matmul_on_path(path, out, a, b, bias, accumulate, epilogue);
}

DType matmul_compute_dtype_cpu(DType ab, DType c, int64_t batch, int64_t m, int64_t n, int64_t k, bool a_cm,
                               bool b_cm) {
  if (ab != DType::bf16 && ab != DType::f16) return ab;
  return matmul_path(ab, c, batch, m, n, k, a_cm, b_cm) == KernelPath::via_f32 ? DType::f32 : ab;
}

}  // namespace

MP_REGISTER_KERNEL(matmul_kernel, DeviceType::cpu, &matmul_cpu);
MP_REGISTER_KERNEL(matmul_compute_dtype, DeviceType::cpu, &matmul_compute_dtype_cpu);

}  // namespace mp::backend::cpu

// CPU matmul: oneDNN for f32; for bf16 oneDNN's bf16 GEMM or its f32 GEMM on widened operands, per shape by
// measurement (Note [kernel paths chosen by measurement] in kernel_paths.cpp); f16 through f32 (oneDNN has f16
// kernels only with AVX512-FP16/AMX-FP16, where they are measured too); a plain loop in double for f64 (gradient
// checks).
#include <omp.h>

#include <string>
#include <vector>

#include "backend/cpu/bf16_policy.hpp"
#include "backend/cpu/matmul_cpu.hpp"
#include "backend/cpu/onednn_matmul.hpp"
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

}  // namespace

void matmul_on_path(KernelPath path, const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias,
                    bool accumulate, MatmulEpilogue epilogue) {
  const bool relu = epilogue == MatmulEpilogue::relu;
  if (a.dtype() != DType::f32 && path == KernelPath::via_f32) {
    // Through f32: widen the operands exactly, run the f32 GEMM, round the result once.
    Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32);
    Tensor bias32 = bias.defined() ? bias.to(DType::f32) : Tensor();
    if (out.dtype() == DType::f32) return matmul_on_path(path, out, a32, b32, bias32, accumulate, epilogue);
    Tensor o32 = accumulate ? out.to(DType::f32) : empty(out.sizes());
    matmul_on_path(path, o32, a32, b32, bias32, accumulate, epilogue);
    Tensor(out).copy_(o32);
    return;
  }
  MatmulArgs args;
  args.batch = out.size(0);
  args.m = out.size(1);
  args.n = out.size(2);
  args.k = a.size(2);
  args.a_dtype = a.dtype();
  args.b_dtype = b.dtype();
  args.c_dtype = out.dtype();
  for (int i = 0; i < 3; ++i) {
    args.a_strides[i] = a.size(i) == 1 && i == 0 ? 0 : a.stride(i);
    args.b_strides[i] = b.size(i) == 1 && i == 0 ? 0 : b.stride(i);
    args.c_strides[i] = out.stride(i);
  }
  if (a.size(0) == 1) args.a_strides[0] = 0;
  if (b.size(0) == 1) args.b_strides[0] = 0;
  args.accumulate = accumulate;
  args.relu = relu;
  Tensor bias_c;
  if (bias.defined()) {
    bias_c = bias.contiguous();
    if (bias_c.dtype() != DType::f32 && bias_c.dtype() != a.dtype()) bias_c = bias_c.to(DType::f32);
    args.has_bias = true;
    args.bias_dtype = bias_c.dtype();
  }
  matmul(args, a.raw_data(), b.raw_data(), out.raw_data(), bias_c.defined() ? bias_c.raw_data() : nullptr);
}

namespace {

// The path of a 16-bit matmul of these sizes (Note [kernel paths chosen by measurement]); timed on contiguous
// stand-in operands (the key leaves out layouts, bias and epilogue: they change little of the time).
KernelPath matmul_path(DType ab, DType c, int64_t batch, int64_t m, int64_t n, int64_t k) {
  auto key = [&] {
    return std::string("matmul ") + dtype_name(ab) + ">" + dtype_name(c) + " b" + std::to_string(batch) + " m" +
           std::to_string(m) + " n" + std::to_string(n) + " k" + std::to_string(k);
  };
  auto run = [ab, c, batch, m, n, k, ops = std::vector<Tensor>()](KernelPath p) mutable {
    if (ops.empty())
      ops = {full({batch, m, k}, 0.01, {.dtype = ab}), full({batch, k, n}, 0.01, {.dtype = ab}),
             empty({batch, m, n}, {.dtype = c})};
    matmul_on_path(p, ops[2], ops[0], ops[1], Tensor(), false, MatmulEpilogue::none);
  };
  return choose_16bit_path(ab, false, key, run);
}

void matmul_cpu(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, bool accumulate,
                MatmulEpilogue epilogue) {
  MP_ASSERT(a.dim() == 3 && b.dim() == 3 && out.dim() == 3, "matmul kernel wants 3-D operands");
  MP_ASSERT(!(epilogue == MatmulEpilogue::relu && accumulate),
            "matmul: a ReLU epilogue cannot be combined with accumulation");
  if (a.dtype() == DType::f64) return matmul_f64(out, a, b, bias, accumulate, epilogue == MatmulEpilogue::relu);
  const KernelPath path = a.dtype() == DType::f32 || out.numel() == 0 || a.size(2) == 0
                              ? KernelPath::native
                              : matmul_path(a.dtype(), out.dtype(), out.size(0), out.size(1), out.size(2), a.size(2));
  matmul_on_path(path, out, a, b, bias, accumulate, epilogue);
}

DType matmul_compute_dtype_cpu(DType ab, DType c, int64_t batch, int64_t m, int64_t n, int64_t k) {
  if (ab != DType::bf16 && ab != DType::f16) return ab;
  return matmul_path(ab, c, batch, m, n, k) == KernelPath::via_f32 ? DType::f32 : ab;
}

}  // namespace

MP_REGISTER_KERNEL(matmul_kernel, DeviceType::cpu, &matmul_cpu);
MP_REGISTER_KERNEL(matmul_compute_dtype, DeviceType::cpu, &matmul_compute_dtype_cpu);

}  // namespace mp::backend::cpu

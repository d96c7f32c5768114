// CUDA matmul (the matmul slot of backend/linalg_kernels.hpp) on cuBLASLt (cublaslt.hpp).
//
// Note [row-major on cuBLASLt]: mixprec's operands are strided row-major views, out[b] = a[b] b[b]
// with a [B, m, k], b [B, k, n], out [B, m, n]; cuBLASLt is column-major and cannot transpose its
// output (TRANSC must be N). A matrix whose columns are unit-stride (row-major) is, read column-major,
// its transpose; one whose rows are unit-stride is itself. So:
//   * out row-major (the usual case): cuBLASLt computes D = out^T (n x m) = b^T a^T. b^T is b's
//     memory read column-major when b is row-major (op N) or b's transpose when b is column-major
//     (op T); the same for a^T. The bias (one value per column of out) is one value per row of D:
//     cuBLASLt's BIAS epilogue.
//   * out column-major (a transposed view): D = out (m x n) = a b directly. The BIAS epilogue
//     broadcasts along rows of D only, so the bias is written into out first and the GEMM
//     accumulates onto it (beta = 1).
//   * an operand with neither dimension unit-stride (or a leading dimension too small: overlapping
//     rows) is copied to a contiguous tensor first (Tensor::contiguous, the element-wise copy); an
//     output with neither is computed into a contiguous temporary and copied back.
// Note [matmul bias rounding]: the CPU adds an f32 bias to an f16/bf16 product in f32 and rounds
// once. cuBLASLt's BIAS epilogue adds in f32 too, but takes the bias vector in the output's dtype,
// so an f32 bias with a 16-bit output is rounded to 16 bits first; the separate bias pass (column-major
// out, or no epilogue kernel) rounds bias (+ old out) to the output dtype and the GEMM rounds again.
// Either way the extra error is at most one 16-bit rounding of the bias (or of out + bias).
// Batches: an operand of batch 1 (or batch stride 0) has batch stride 0 (cuBLASLt broadcasts it; all
// layouts carry the same batch count). When the other operand and the output are laid out so that
// consecutive batches continue the columns of D (e.g. a contiguous [B, m, k] times a shared [k, n]
// into a contiguous out), the batch is folded into one GEMM with B times the columns.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/cublaslt.hpp"
#include "backend/cuda/runtime.hpp"
#include "backend/linalg_kernels.hpp"
#include "backend/pointwise_kernels.hpp"
#include "mp/core/error.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend::cuda {
namespace {

// ---- out = (accumulate ? out : 0) + bias ---------------------------------------------------------

// One thread per output element (grid-stride): the k == 0 product (an empty sum) and the bias pass
// of a column-major output. bias (acc_t<T>, stride bias_stride) may be null.
template <class T>
__global__ void bias_rows_kernel(T* out, int64_t total, int64_t m, int64_t n, int64_t s0, int64_t s1, int64_t s2,
                                 const acc_t<T>* bias, int64_t bias_stride, bool accumulate) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total; idx += step) {
    const int64_t j = idx % n, t = idx / n;
    const int64_t i = t % m, b = t / m;
    T& o = out[b * s0 + i * s1 + j * s2];
    acc_t<T> v = accumulate ? scalar_cast<acc_t<T>>(o) : acc_t<T>(0);
    if (bias != nullptr) v += bias[j * bias_stride];
    o = scalar_cast<T>(v);
  }
}

void bias_rows(const Tensor& out, const Tensor& bias, bool accumulate) {
  const int64_t B = out.size(0), m = out.size(1), n = out.size(2), total = B * m * n;
  if (total == 0) return;
  const int dev = out.device().index;
  Tensor bias_acc;
  if (bias.defined()) bias_acc = bias.to(out.dtype() == DType::f64 ? DType::f64 : DType::f32);
  const int threads = 256;
  const int64_t blocks =
      std::min<int64_t>((total + threads - 1) / threads, int64_t{32} * device_properties(dev).multiprocessors);
  visit_floating(out.dtype(), "matmul", [&]<class T>() {
    const acc_t<T>* pb = bias_acc.defined() ? static_cast<const acc_t<T>*>(bias_acc.raw_data()) : nullptr;
    bias_rows_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, current_stream(dev)>>>(
        static_cast<T*>(out.raw_data()), total, m, n, out.stride(0), out.stride(1), out.stride(2), pb,
        bias_acc.defined() ? bias_acc.stride(0) : 0, accumulate);
    MP_CUDA_CHECK_LAUNCH();
  });
}

// ---- layouts ----------------------------------------------------------------------------------------

// A matrix view: element (r, c) at r * rs + c * cs (elements from its first element).
struct Mat {
  int64_t rows, cols, rs, cs;
};

// How cuBLASLt reads a Mat: op(S) with S stored column-major with leading dimension ld; S = the
// matrix (trans false) or its transpose (trans true).
struct LtView {
  bool ok = false;
  bool trans = false;
  int64_t ld = 0;
};

// The matrix itself as column-major storage: unit-stride rows, a leading dimension covering the
// rows. Strides of size-1 dims do not matter (the leading dimension then takes its dense value).
LtView as_column_major(const Mat& v) {
  const int64_t r1 = std::max<int64_t>(v.rows, 1);
  if (v.rows > 1 && v.rs != 1) return {};
  const int64_t ld = v.cols <= 1 ? r1 : v.cs;
  if (ld < r1) return {};
  return {true, false, ld};
}

// The matrix as op(S): itself when column-major, else its transpose when that is column-major.
LtView as_lt(const Mat& v) {
  if (LtView l = as_column_major(v); l.ok) return l;
  LtView t = as_column_major(Mat{v.cols, v.rows, v.cs, v.rs});
  t.trans = true;
  return t;
}

// Elements spanned by one matrix of out (for the batch-overlap check).
int64_t span(const Tensor& t) {
  return (t.size(1) - 1) * std::abs(t.stride(1)) + (t.size(2) - 1) * std::abs(t.stride(2)) + 1;
}

// A batch-broadcast operand (batch 1, or batch stride 0 from expand) as one matrix.
Tensor single_if_broadcast(const Tensor& t) { return t.size(0) > 1 && t.stride(0) == 0 ? t.narrow(0, 0, 1) : t; }

void check_args(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias) {
  MP_ASSERT(out.dim() == 3 && a.dim() == 3 && b.dim() == 3, "matmul kernel wants 3-D operands");
  const Device d = out.device();
  MP_CHECK(a.device() == d && b.device() == d && (!bias.defined() || bias.device() == d),
           "matmul: operands on different devices: out ", out.describe(), ", a ", a.describe(), ", b ", b.describe(),
           bias.defined() ? ", bias " + bias.describe() : std::string(), "; move them to one device with .to()");
  const int64_t B = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  MP_CHECK(a.size(1) == m && b.size(1) == k && b.size(2) == n && (a.size(0) == B || a.size(0) == 1) &&
               (b.size(0) == B || b.size(0) == 1),
           "matmul: expected a [B or 1, m, k], b [B or 1, k, n] and out [B, m, n], got a ", a.describe(), ", b ",
           b.describe(), ", out ", out.describe());
  MP_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == n), "matmul: expected bias [", n, "], got ",
           bias.describe());
  MP_CHECK(a.dtype() == b.dtype(), "matmul: a and b must have the same dtype, got ", dtype_name(a.dtype()), " and ",
           dtype_name(b.dtype()), "; convert one of them");
  const DType t = a.dtype(), o = out.dtype();
  MP_CHECK((t == DType::f32 && o == DType::f32) || (t == DType::f64 && o == DType::f64) ||
               (is_low_precision(t) && (o == t || o == DType::f32)),
           "matmul on cuda: supported are f32 -> f32, f16 -> f16/f32, bf16 -> bf16/f32 and f64 -> f64, got ",
           dtype_name(t), " inputs with a ", dtype_name(o), " output; convert the inputs or the output");
  MP_CHECK(!bias.defined() || is_floating(bias.dtype()), "matmul: expected a floating bias, got ", bias.describe());
  MP_CHECK(B <= 1 || out.stride(0) != 0, "matmul: out cannot be broadcast over the batch (batch stride 0 with batch ",
           B, "), got ", out.describe());
}

// The GEMM of Note [row-major on cuBLASLt] for an output cuBLASLt can write (D = out^T or out).
// out = max(out, 0) in place: the ReLU epilogue where cuBLASLt's cannot be used.
// max(out, 0) in place through the element-wise kernel slot (a kernel calls kernels, never the ops layer).
void relu_in_place(const Tensor& out) {
  const Tensor in[1] = {out};
  pointwise_kernel.get(out.device())(PointwiseOp::relu, out, in, out.dtype() == DType::f64 ? DType::f64 : DType::f32,
                                     PointwiseParams{});
}

// Note [matmul ReLU epilogue]: with a bias per row of D (out_transposed) the GEMM uses cuBLASLt's
// RELU_BIAS epilogue, without a bias its RELU epilogue; both apply max(x, 0) to the f32 result before
// rounding, as oneDNN's post-op does on the CPU. Where the bias is written into out first (beta = 1) or
// cuBLASLt has no kernel for the epilogue, the GEMM runs plain and a ReLU pass follows (one extra
// read and write of out).
void matmul_direct(const Tensor& out, Tensor a, Tensor b, const Tensor& bias, bool accumulate, bool out_transposed,
                   bool relu) {
  const int64_t B = out.size(0), m = out.size(1), n = out.size(2), k = a.size(2);
  // The column-major problem D (M x N) = X (M x k) Y (k x N).
  auto problem_x = [&] {
    return out_transposed ? Mat{n, k, b.stride(2), b.stride(1)} : Mat{m, k, a.stride(1), a.stride(2)};
  };
  auto problem_y = [&] {
    return out_transposed ? Mat{k, m, a.stride(2), a.stride(1)} : Mat{k, n, b.stride(1), b.stride(2)};
  };
  const int64_t M = out_transposed ? n : m, N = out_transposed ? m : n;
  const LtView ld = as_column_major(out_transposed ? Mat{n, m, out.stride(2), out.stride(1)}
                                                   : Mat{m, n, out.stride(1), out.stride(2)});
  MP_ASSERT(ld.ok, "matmul_direct called with an output cuBLASLt cannot write");

  LtView lx = as_lt(problem_x()), ly = as_lt(problem_y());
  Tensor& tx = out_transposed ? b : a;
  Tensor& ty = out_transposed ? a : b;
  if (!lx.ok) {
    tx = tx.contiguous();
    lx = as_lt(problem_x());
  }
  if (!ly.ok) {
    ty = ty.contiguous();
    ly = as_lt(problem_y());
  }
  MP_ASSERT(lx.ok && ly.ok, "contiguous matmul operands must map onto cuBLASLt layouts");

  GemmArgs g;
  g.device = out.device().index;
  g.a = tx.raw_data();
  g.b = ty.raw_data();
  g.d = out.raw_data();
  g.ab_dtype = a.dtype();
  g.d_dtype = out.dtype();
  g.trans_a = lx.trans;
  g.trans_b = ly.trans;
  g.m = M;
  g.n = N;
  g.k = k;
  g.lda = lx.ld;
  g.ldb = ly.ld;
  g.ldd = ld.ld;
  g.batch = B;
  if (B > 1) {
    g.stride_a = tx.size(0) == 1 ? 0 : tx.stride(0);
    g.stride_b = ty.size(0) == 1 ? 0 : ty.stride(0);
    g.stride_d = out.stride(0);
    // Fold the batch into D's columns when X is shared and Y's and D's batches continue their columns.
    const bool y_folds = ly.trans ? g.stride_b == N && ly.ld >= B * N : g.stride_b == N * ly.ld;
    if (g.stride_a == 0 && g.stride_b != 0 && y_folds && g.stride_d == N * ld.ld && B * N <= INT32_MAX) {
      g.n = B * N;
      g.batch = 1;
      g.stride_a = g.stride_b = g.stride_d = 0;
    }
  }
  g.beta = accumulate ? 1.0 : 0.0;

  if (bias.defined()) {
    if (out_transposed) {
      // cuBLASLt takes the bias in D's dtype (Note [matmul bias rounding]), packed and (here) 16-byte
      // aligned: a bias viewed at an odd offset of a larger buffer is copied (n elements).
      Tensor bias_d = bias.to(out.dtype()).contiguous();
      if (reinterpret_cast<uintptr_t>(bias_d.raw_data()) % 16 != 0) bias_d = bias_d.clone();
      g.epilogue = relu ? GemmEpilogue::bias_relu : GemmEpilogue::bias;
      g.bias = bias_d.raw_data();
      g.bias_dtype = bias_d.dtype();
      if (gemm_supported(g)) {
        gemm(g);
        return;
      }
      g.epilogue = GemmEpilogue::none;
      g.bias = nullptr;
    }
    // The bias is per column of D here (or cuBLASLt has no bias kernel for this problem): write it
    // into out first and accumulate the product onto it.
    bias_rows(out, bias, accumulate);
    g.beta = 1.0;
  } else if (relu) {
    g.epilogue = GemmEpilogue::relu;
    if (gemm_supported(g)) {
      gemm(g);
      return;
    }
    g.epilogue = GemmEpilogue::none;
  }
  gemm(g);
  if (relu) relu_in_place(out);
}

// Picks the layout of Note [row-major on cuBLASLt] (the device is current, the arguments checked).
void matmul_dispatch(const Tensor& out, const Tensor& a0, const Tensor& b0, const Tensor& bias, bool accumulate,
                     bool relu) {
  const int64_t B = out.size(0), m = out.size(1), n = out.size(2), k = a0.size(2);
  if (B == 0 || m == 0 || n == 0) return;
  if (k == 0) {  // an empty product: out = (accumulate ? out : 0) + bias
    bias_rows(out, bias, accumulate);
    if (relu) relu_in_place(out);
    return;
  }

  const Tensor a = single_if_broadcast(a0), b = single_if_broadcast(b0);
  const bool batches_apart = B == 1 || std::abs(out.stride(0)) >= span(out);
  if (batches_apart && as_column_major(Mat{n, m, out.stride(2), out.stride(1)}).ok)
    return matmul_direct(out, a, b, bias, accumulate, true, relu);
  if (batches_apart && as_column_major(Mat{m, n, out.stride(1), out.stride(2)}).ok)
    return matmul_direct(out, a, b, bias, accumulate, false, relu);
  // An output cuBLASLt cannot write (no unit-stride dim, or overlapping batches): a contiguous temporary.
  Tensor tmp = empty({B, m, n}, {.dtype = out.dtype(), .device = out.device()});
  if (accumulate) tmp.copy_(out);
  matmul_direct(tmp, a, b, bias, accumulate, true, relu);
  Tensor(out).copy_(tmp);
}

void matmul_cuda(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, bool accumulate,
                 MatmulEpilogue epilogue) {
  DeviceGuard guard(out.device(), "matmul");
  check_args(out, a, b, bias);
  const bool relu = epilogue == MatmulEpilogue::relu;
  MP_CHECK(!(relu && accumulate), "matmul: a ReLU epilogue cannot be combined with accumulation");
  matmul_dispatch(out, a, b, bias, accumulate, relu);
}

}  // namespace

MP_REGISTER_KERNEL(matmul_kernel, DeviceType::cuda, &matmul_cuda);

}  // namespace mp::backend::cuda

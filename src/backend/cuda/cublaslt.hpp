// cuBLASLt GEMMs for the CUDA backend: one handle and one workspace per device, plans cached by
// problem, and the internal API every CUDA kernel that multiplies matrices calls (matmul.cu, the RNN
// cells, ...). Declared only in CUDA builds (MP_HAVE_CUDA); no CUDA header is needed to include it,
// so host code (the `mixprec bench` command) may call time_gemm_tflops behind `#if MP_HAVE_CUDA`.
//
// Note [cuBLASLt plans]: a GEMM is described by a matmul descriptor (compute type, transposes,
// epilogue), four matrix layouts (dtype, rows, columns, leading dimension, batch count and stride)
// and a heuristic query that picks an algorithm for them. Building these costs tens of microseconds
// to milliseconds, so each distinct problem (every field of GemmArgs except the pointers and
// alpha/beta values, plus the alignment class of each pointer) builds them once per device and
// keeps them for the process. The heuristic assumes 256-byte aligned operands unless told
// otherwise, so the key carries each pointer's alignment (a power of two up to 256) and the plan
// passes it as the MIN_ALIGNMENT preferences: a view at an odd offset gets a plan whose kernels
// accept it.
//
// Note [cuBLASLt accumulation]: f16/bf16 inputs use CUBLAS_COMPUTE_32F (f32 accumulation, the
// contract of the matmul slot). A split-K reduction may also be done in the output type
// (CUBLASLT_REDUCTION_SCHEME_INPLACE / OUTPUT_TYPE): for f16/bf16 outputs the plan allows only the
// schemes that reduce in f32 (NONE, COMPUTE_TYPE), so the result is rounded to 16 bits once, as on
// the CPU. f32 inputs use CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 when
// float32_matmul_precision() is `high` (Note [TF32] in mp/core/math_mode.hpp). f64 uses
// CUBLAS_COMPUTE_64F (cuBLASLt supports double: A/B/C/D CUDA_R_64F with 64F scale).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/cuda/runtime.hpp"
#include "mp/core/dtype.hpp"

#if defined(MP_HAVE_CUDA)
namespace mp::backend::cuda {

/// Bytes of the cuBLASLt workspace of each device (allocated from the caching allocator on the
/// device's first GEMM and kept; 32 MiB is what cuBLAS recommends on Hopper).
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

/// Point-wise step cuBLASLt applies to the product (Note: gelu is cuBLASLt's tanh approximation).
/// Bias vectors have one element per row of D (m elements), packed, of the bias dtype.
enum class GemmEpilogue {
  none,       ///< D = alpha op(A) op(B) + beta C
  bias,       ///< ... + bias[i] (broadcast over the columns of D)
  relu,       ///< max(0, ...)
  bias_relu,  ///< max(0, ... + bias[i])
  gelu,       ///< gelu(...)
  bias_gelu,  ///< gelu(... + bias[i])
  bgrada,     ///< also writes bias[i] = sum over k of op(A)[i, :] (bias gradient; bias is an output)
  bgradb,     ///< also writes bias[j] = sum over k of op(B)[:, j] (bias gradient; bias is an output)
};

/// Internal precision of the products (see Note [cuBLASLt accumulation]).
enum class GemmCompute {
  automatic,  ///< by input dtype: f64 -> f64; f16/bf16 -> f32; f32 -> f32 or TF32 per float32_matmul_precision()
  f32,        ///< CUBLAS_COMPUTE_32F (f32, f16 or bf16 inputs)
  tf32,       ///< CUBLAS_COMPUTE_32F_FAST_TF32 (f32 inputs only)
  f64,        ///< CUBLAS_COMPUTE_64F (f64 inputs only)
};

/// One (batched) GEMM in cuBLAS's column-major convention:
/// D[b] = epilogue(alpha * op(A[b]) * op(B[b]) + beta * C[b]) for b < batch, with op(A) m x k,
/// op(B) k x n and C, D m x n. A matrix X stored column-major with leading dimension ldx has element
/// (r, c) at X[r + c * ldx]; op(X) = X, or X^T when trans_x (then X itself is stored k x m / n x k).
/// A row-major caller computes C^T = B^T A^T (see matmul.cu). Supported dtypes (A = B):
/// f32 -> f32, f16 -> f16 or f32, bf16 -> bf16 or f32, f64 -> f64; C has D's dtype and layout.
struct GemmArgs {
  int device = 0;               ///< N of cuda:N; all pointers are device pointers there
  const void* a = nullptr;      ///< A (first element of batch 0)
  const void* b = nullptr;      ///< B
  const void* c = nullptr;      ///< C (read when beta != 0; may equal d: in place); null means d
  void* d = nullptr;            ///< D (the output)
  DType ab_dtype = DType::f32;  ///< dtype of A and B
  DType d_dtype = DType::f32;   ///< dtype of C and D
  bool trans_a = false;         ///< op(A) = A^T (A stored k x m)
  bool trans_b = false;         ///< op(B) = B^T (B stored n x k)
  int64_t m = 0, n = 0, k = 0;  ///< problem sizes (each < 2^31)
  int64_t lda = 0, ldb = 0;     ///< leading dimensions of A and B as stored (>= their row counts, >= 1)
  int64_t ldd = 0;              ///< leading dimension of C and D (>= max(1, m))
  int64_t batch = 1;            ///< number of products (< 2^31)
  int64_t stride_a = 0;         ///< elements between A[b] and A[b+1]; 0 broadcasts A over the batch
  int64_t stride_b = 0;         ///< elements between B[b] and B[b+1]; 0 broadcasts B over the batch
  int64_t stride_d = 0;         ///< elements between D[b] and D[b+1] (also C's); nonzero when batch > 1
  double alpha = 1.0;           ///< scale of the product
  double beta = 0.0;            ///< scale of C (1 to accumulate into D with c == d)
  GemmCompute compute = GemmCompute::automatic;  ///< internal precision
  GemmEpilogue epilogue = GemmEpilogue::none;    ///< point-wise step
  const void* bias = nullptr;     ///< bias (input) or bias gradient (output) vector for the epilogues that use one
  DType bias_dtype = DType::f32;  ///< its dtype: must be D's dtype (cuBLASLt's rule outside fp8)
  int64_t bias_batch_stride = 0;  ///< elements between the bias vectors of consecutive batches (0: shared)
};

/// Run the GEMM on the device's stream (asynchronously; nothing is synchronised). Builds and caches
/// its plan on first use (Note [cuBLASLt plans]). Throws mp::Error naming the cuBLASLt call, its
/// status and the problem (sizes, dtypes, transposes, leading dimensions) when the arguments are
/// invalid, when cuBLASLt has no algorithm for them, or when a call fails.
void gemm(const GemmArgs& args);

/// Whether cuBLASLt has an algorithm for the GEMM (builds and caches the plan, like gemm; throws
/// only for invalid arguments or failing calls). Lets callers fall back, e.g. to a separate bias pass.
bool gemm_supported(const GemmArgs& args);

/// The cuBLASLt compute type gemm() uses for these inputs: "32F", "32F_FAST_TF32" or "64F" (for
/// messages, benchmarks and tests of the TF32 switch). Throws on an unsupported dtype pair.
std::string gemm_compute_name(const GemmArgs& args);

/// Counters of one device's plan cache.
struct GemmCacheStats {
  int64_t plans = 0;   ///< plans built (distinct problems seen)
  int64_t hits = 0;    ///< gemm() calls that found their plan cached
  int64_t misses = 0;  ///< gemm() calls that built a plan
};

/// Plan cache counters of cuda:device (all zero before its first GEMM).
GemmCacheStats gemm_cache_stats(int device);

/// Throughput of a row-major [m, k] x [k, n] GEMM on cuda:device in TFLOP/s (2*m*n*k flops per
/// product): A, B and C of `dtype` (f32 runs in the current float32_matmul_precision(), f16/bf16 with
/// f32 accumulation, f64), filled with values in [-1, 1); a warm-up call, then `iters` GEMMs timed
/// with CUDA events on the device's stream. For `mixprec bench`.
double time_gemm_tflops(DType dtype, int64_t m, int64_t n, int64_t k, int iters, int device = 0);

/// Throw the mp::Error of a failed cuBLASLt call: names the call, the cublasStatus_t (name and
/// text), `context` (the problem: sizes, dtypes) and what to do. `status` is a cublasStatus_t.
[[noreturn]] void throw_cublas_error(int status, const char* call, const std::string& context, const char* file,
                                     int line);

}  // namespace mp::backend::cuda

/// Check a cuBLASLt call returning cublasStatus_t; on failure throw naming the call, the status and
/// `context_expr` (a std::string expression, evaluated only on failure). In sync-check mode (Note [sync
/// check]) it then waits for the device and names the call when its work faulted.
#define MP_CUBLASLT_CHECK(call, context_expr)                                                                       \
  do {                                                                                                              \
    const auto mp_cublas_status_ = (call);                                                                          \
    if (static_cast<int>(mp_cublas_status_) != 0) [[unlikely]]                                                      \
      ::mp::backend::cuda::throw_cublas_error(static_cast<int>(mp_cublas_status_), #call, (context_expr), __FILE__, \
                                              __LINE__);                                                            \
    if (::mp::backend::cuda::sync_check_enabled()) [[unlikely]]                                                     \
      ::mp::backend::cuda::sync_check(#call, __FILE__, __LINE__, __func__);                                         \
  } while (0)

#endif  // MP_HAVE_CUDA

#pragma once
// Batched strided matmul on raw pointers through oneDNN (f32, and bf16 / f16 with f32 accumulation; f16 only
// where oneDNN has f16 kernels: CPUs with AVX512-FP16 or AMX-FP16).

#include <cstdint>
#include <string>

#include "backend/cpu/onednn/common.hpp"
#include "mp/core/dtype.hpp"

namespace mp::backend::cpu {

/// Arguments of C[b] (+)= A[b] * B[b] (+ bias) for b < batch: A is [batch, m, k], B [batch, k, n],
/// C [batch, m, n], each addressed by three strides in elements (batch, row, column). Any non-negative
/// strides are accepted: transposed views (row stride 1) are passed to oneDNN without copies; layouts
/// oneDNN cannot take (e.g. zero row strides) are packed into a per-thread buffer first.
struct MatmulArgs {
  int64_t batch = 1, m = 0, n = 0, k = 0;  ///< problem sizes (all >= 0)
  DType a_dtype = DType::f32;              ///< f32, bf16 or f16; must equal b_dtype
  DType b_dtype = DType::f32;              ///< f32, bf16 or f16; must equal a_dtype
  DType c_dtype = DType::f32;              ///< f32, or the dtype of A and B (accumulation is f32 either way)
  int64_t a_strides[3] = {0, 0, 0};        ///< A strides (batch, row, col); batch stride 0 broadcasts A over batch
  int64_t b_strides[3] = {0, 0, 0};        ///< B strides (batch, row, col); batch stride 0 broadcasts B over batch
  int64_t c_strides[3] = {0, 0, 0};        ///< C strides (batch, row, col); C must not overlap itself
  bool accumulate = false;                 ///< C += A*B (+ bias) instead of C = A*B (+ bias): gradient accumulation
  DType bias_dtype = DType::f32;           ///< dtype of the bias vector (f32, or the dtype of A and B)
  bool has_bias = false;                   ///< add bias[j] (a vector of n elements) to every row of C
  bool relu = false;                       ///< C = max(A*B (+ bias), 0): a ReLU epilogue (not with accumulate)

  /// Arguments with contiguous row-major A, B and C (batch strides m*k, k*n, m*n).
  static MatmulArgs contiguous(int64_t batch, int64_t m, int64_t n, int64_t k, DType ab_dtype = DType::f32,
                               DType c_dtype = DType::f32);
};

/// C (+)= A * B (+ bias) [then ReLU] as described by `args`; bias is [n] of args.bias_dtype, used iff args.has_bias.
/// Primitives are cached by the full args (sizes, dtypes, strides, flags) and built only once.
void matmul(const MatmulArgs& args, const void* a, const void* b, void* c, const void* bias = nullptr);

/// impl_info_str() of the oneDNN matmul primitive that `args` runs (building and caching it if needed),
/// e.g. "brg:avx512_core_amx" for bf16 on AMX; "" when args need no primitive (an empty problem).
std::string matmul_impl_info(const MatmulArgs& args);

/// Counters of the matmul primitive cache.
CacheStats matmul_cache_stats();

}  // namespace mp::backend::cpu

// Copies and casts that transpose: tile by tile instead of a strided gather (Note [transposing copies]).
#include "backend/cpu/transpose_copy.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "backend/cpu/loops.hpp"
#include "mp/core/convert.hpp"

namespace mp::backend::cpu {
namespace {

// Note [transposing copies]
// The element-wise loop walks the output in memory order. When the input is unit-stride along another dim (a
// transpose, a permute to or from channels-last), each input element is a scalar gather with a large stride, 20-40x
// slower than a flat copy. Such copies go tile by tile: kTile rows of the input are read along its unit-stride dim
// (bulk-converted to f32, exact for f32/bf16/f16), copied into a padded buffer (rows a power of two apart share a
// cache set), and written transposed along the output's rows (bulk-converted). kTile = 128 measured 2-4x faster than
// 32 or 64 (bench/RESULTS.md). Other dtypes (f64, integers) and small copies keep the loop.
constexpr int64_t kTile = 128;
constexpr int64_t kMinElements = 4096;

bool tileable(DType dt) { return dt == DType::f32 || dt == DType::bf16 || dt == DType::f16; }

// Note [row copies]
// A copy whose tensors are both unit-stride along the output's innermost dim (contiguous tensors, a transpose of
// outer dims such as attention's [B, T, H, D] <-> [B, H, T, D], a slice) goes row by row in one call per piece:
// - one dtype: byte moves (memmove), so the bits are kept exactly (NaN payloads too) and 16-bit rows are not
//   widened to f32 and narrowed back as the element-wise loop does (that round trip was 2.4% of a bf16 gpt-mini
//   step; RESULTS);
// - f32 <-> bf16/f16 (a cast): the bulk converters of mp/core/convert.hpp straight from one tensor to the other.
//   The element-wise loop converted into a block buffer and copied that out, block by block: 3x slower than this
//   (bf16 -> f32 at 23 GB/s where an f32 copy runs at 76, Zen 3, 2 threads; RESULTS), and the casts around the
//   through-f32 matmuls were 7% of a bf16 MLP step.
// Rows shorter than kMinRowBytes keep the loop.
constexpr int64_t kMinRowBytes = 64;
constexpr int64_t kChunk = int64_t{1} << 14;  // elements per piece of one long row (for the threads; below the
                                              // converters' own parallel threshold)

// Copies n elements from `src` to `dst` with the dtypes of row_copy's operands (es: the element size when they
// are one dtype); nullptr when they have no row kernel.
using RowKernel = void (*)(const char* src, char* dst, int64_t n, int64_t es);

// One bulk conversion of mp/core/convert.hpp as a RowKernel.
template <class S, class D, void (*Convert)(const S*, D*, size_t)>
void convert_row(const char* s, char* d, int64_t n, int64_t) {
  Convert(reinterpret_cast<const S*>(s), reinterpret_cast<D*>(d), static_cast<size_t>(n));
}

RowKernel row_kernel(DType out, DType in) {
  if (out == in)
    return [](const char* s, char* d, int64_t n, int64_t es) { std::memmove(d, s, static_cast<size_t>(n * es)); };
  if (in == DType::f32 && out == DType::bf16) return &convert_row<float, BFloat16, convert_f32_to_bf16>;
  if (in == DType::bf16 && out == DType::f32) return &convert_row<BFloat16, float, convert_bf16_to_f32>;
  if (in == DType::f32 && out == DType::f16) return &convert_row<float, Half, convert_f32_to_f16>;
  if (in == DType::f16 && out == DType::f32) return &convert_row<Half, float, convert_f16_to_f32>;
  return nullptr;
}

}  // namespace

bool row_copy(const Tensor& out, const Tensor& in) {
  const RowKernel kernel = row_kernel(out.dtype(), in.dtype());
  if (kernel == nullptr || out.numel() == 0) return false;
  const LoopPlan<2> p = make_plan<2>({&out, &in});
  if (p.ndim < 1) return false;
  const int last = p.ndim - 1;
  if (p.strides[0][last] != 1 || p.strides[1][last] != 1) return false;
  const int64_t eo = static_cast<int64_t>(dtype_size(out.dtype())), ei = static_cast<int64_t>(dtype_size(in.dtype()));
  const int64_t nl = p.sizes[last];
  if (nl * std::min(eo, ei) < kMinRowBytes) return false;
  // A piece: row r's elements [c kChunk, ...) (one piece per row unless the row is long).
  const int64_t rows = p.numel / nl, chunks = (nl + kChunk - 1) / kChunk;
  auto piece = [&](int64_t w) {
    int64_t o = w / chunks;
    const int64_t c0 = (w % chunks) * kChunk, n = std::min(kChunk, nl - c0);
    std::array<int64_t, 2> off{c0, c0};
    for (int d = last - 1; d >= 0; --d) {
      const int64_t idx = o % p.sizes[d];
      o /= p.sizes[d];
      off[0] += idx * p.strides[0][d];
      off[1] += idx * p.strides[1][d];
    }
    kernel(p.base[1] + off[1] * ei, p.base[0] + off[0] * eo, n, ei);
  };
  const int64_t work = rows * chunks;
  if (should_parallelize(p.numel) && work > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t w = 0; w < work; ++w) piece(w);
  } else {
    for (int64_t w = 0; w < work; ++w) piece(w);
  }
  return true;
}

bool transpose_copy(const Tensor& out, const Tensor& in) {
  if (!tileable(out.dtype()) || !tileable(in.dtype()) || out.numel() < kMinElements) return false;
  const LoopPlan<2> p = make_plan<2>({&out, &in});
  const int last = p.ndim - 1;
  if (p.ndim < 2 || p.strides[0][last] != 1 || p.strides[1][last] == 1) return false;
  int q = -1;  // the dim along which the input is unit-stride
  for (int d = 0; d < last; ++d)
    if (p.strides[1][d] == 1) q = d;
  if (q < 0) return false;

  const int64_t nq = p.sizes[q], nl = p.sizes[last];
  const int64_t outer = p.numel / (nq * nl);
  const int64_t tiles_q = (nq + kTile - 1) / kTile, tiles_l = (nl + kTile - 1) / kTile;
  const int64_t work = outer * tiles_q * tiles_l;
  const int64_t in_es = static_cast<int64_t>(dtype_size(p.dtypes[1]));
  const int64_t out_es = static_cast<int64_t>(dtype_size(p.dtypes[0]));

  auto tile = [&](int64_t w) {
    const int64_t tl = w % tiles_l, tq = (w / tiles_l) % tiles_q;
    int64_t o = w / (tiles_l * tiles_q);
    std::array<int64_t, 2> off{};  // element offsets of the outer index in the output and the input
    for (int d = last - 1; d >= 0; --d) {
      if (d == q) continue;
      const int64_t idx = o % p.sizes[d];
      o /= p.sizes[d];
      off[0] += idx * p.strides[0][d];
      off[1] += idx * p.strides[1][d];
    }
    const int64_t q0 = tq * kTile, l0 = tl * kTile;
    const int64_t mq = std::min(kTile, nq - q0), ml = std::min(kTile, nl - l0);
    // buf[l][q]: the input's rows as read, always copied (rows of a power-of-two-strided source map to one L1 set:
    // gathering across them straight from the source missed L1 on every element), one padding line per row so
    // that the gather below spreads over the sets.
    alignas(64) float buf[kTile][kTile + 16];
    for (int64_t l = 0; l < ml; ++l) {
      const float* r = load_block<float>(p.base[1] + (off[1] + (l0 + l) * p.strides[1][last] + q0) * in_es, 1,
                                         p.dtypes[1], mq, buf[l]);
      if (r != buf[l]) std::copy_n(r, mq, buf[l]);
    }
    alignas(64) float row[kTile];
    for (int64_t i = 0; i < mq; ++i) {
      for (int64_t l = 0; l < ml; ++l) row[l] = buf[l][i];
      store_block<float>(p.base[0] + (off[0] + (q0 + i) * p.strides[0][q] + l0) * out_es, 1, p.dtypes[0], ml, row);
    }
  };
  if (should_parallelize(p.numel)) {
#pragma omp parallel for schedule(static)
    for (int64_t w = 0; w < work; ++w) tile(w);
  } else {
    for (int64_t w = 0; w < work; ++w) tile(w);
  }
  return true;
}

}  // namespace mp::backend::cpu

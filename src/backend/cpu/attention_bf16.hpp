#pragma once
// The bf16 tile products of the fused CPU attention (Note [fused attention] in attention.cpp): VDPBF16PS
// (AVX512-BF16) multiplies bf16 pairs exactly and sums them in f32, so every product's operands are laid out
// in pairs along the summed dimension. Call only when bf16_tiles_available().
#include <cstdint>

namespace mp::backend::cpu::attn_bf16 {

/// Whether this CPU has AVX512-BF16 and the AVX-512 loops are allowed (set_avx512_loops).
bool bf16_tiles_available();

/// c[m][0:N] = (accumulate ? c[m][0:N] : 0) + scale * sum_{p < Kp} a-pair(m, p) . b-pair(p, 0:N) for m < M.
/// a: M rows of 2 Kp bf16 (row stride lda elements), pair p of row m at a[m lda + 2p]; b: "VNNI" layout,
/// b[(p N + n) 2 + e] = B[2p + e][n]; N a multiple of 16; c: row stride ldc floats.
void gemm(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t N, float* c, int64_t ldc, int64_t M,
          int64_t Kp, bool accumulate, float scale);

/// dst[r ldd + j] = bf16(src[r lds + j]) (round to nearest even) for j < n, and 0 for n <= j < n2; r < rows.
void f32_rows_to_bf16(const float* src, int64_t lds, int64_t rows, int64_t n, int64_t n2, uint16_t* dst,
                      int64_t ldd);

/// The [rows, N] f32 matrix src (row stride lds) in VNNI layout for gemm's b, rows padded with 0 to rows2
/// (even) and columns n..N with 0: dst[(p N + j) 2 + e] = bf16(src[(2p + e) lds + j]).
void f32_rows_to_vnni(const float* src, int64_t lds, int64_t rows, int64_t rows2, int64_t n, int64_t N,
                      uint16_t* dst);

/// Rows [0, n) of a bf16 matrix src ([*, D], row stride D) copied into dst rows of D2 (D rounded up to even,
/// the pad 0): gemm's a with the pairs along D.
void pack_rows(const uint16_t* src, int64_t n, int64_t D, int64_t D2, uint16_t* dst);

/// Rows [0, n) of src ([*, D]) transposed into VNNI layout for gemm's b with N = cols (>= n): dst[(p cols + j)
/// 2 + e] = src[j D + 2p + e], 0 for j >= n and past D (D2 / 2 pairs): the b of a product with src^T.
void pack_transposed_vnni(const uint16_t* src, int64_t n, int64_t D, int64_t D2, int64_t cols, uint16_t* dst);

/// Rows [0, n) of src ([*, D]) in VNNI layout for gemm's b with N = Dp (>= D, a multiple of 16), rows padded
/// with 0 to rows2 (even): dst[(p Dp + d) 2 + e] = src[(2p + e) D + d], 0 for d >= D or 2p + e >= n.
void pack_vnni(const uint16_t* src, int64_t n, int64_t rows2, int64_t D, int64_t Dp, uint16_t* dst);

/// Rows [0, n) of src ([*, D]) transposed with the pairs along the rows: dst[d ld + r] = src[r D + d] for
/// r < n, 0 for n <= r < ld (ld even): gemm's a of a product with src^T on the left.
void pack_transposed_rows(const uint16_t* src, int64_t n, int64_t D, int64_t ld, uint16_t* dst);

}  // namespace mp::backend::cpu::attn_bf16

#pragma once
// Copies and casts that transpose (Note [transposing copies] in transpose_copy.cpp), and copies and casts of
// rows (Note [row copies]).
#include "mp/tensor/tensor.hpp"

namespace mp::backend::cpu {

/// out = in (converting between f32, bf16 and f16) tile by tile when `in` is unit-stride along another dim than
/// out's innermost one and the copy is large; returns false, doing nothing, otherwise (the element-wise loop's job).
bool transpose_copy(const Tensor& out, const Tensor& in);

/// out = in when both are unit-stride along out's innermost dim and have one dtype (byte moves of whole rows) or
/// are f32 and bf16/f16 (bulk conversion of whole rows); returns false, doing nothing, otherwise.
bool row_copy(const Tensor& out, const Tensor& in);

}  // namespace mp::backend::cpu

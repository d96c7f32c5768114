#pragma once
// Precision conversion of safetensors files (`mixprec convert IN OUT --dtype bf16`).
#include <cstdint>
#include <string>

#include "mp/core/dtype.hpp"

namespace mp::train {

/// Result of convert_safetensors.
struct ConvertStats {
  int64_t tensors = 0;    ///< tensors in the file
  int64_t converted = 0;  ///< floating tensors whose dtype changed
  int64_t bytes_in = 0;   ///< size of the input file
  int64_t bytes_out = 0;  ///< size of the output file
};

/// Read `in`, convert every floating tensor (F64/F32/F16/BF16) to the floating `dtype` (round to nearest
/// even, via Tensor::to), keep integer/bool tensors and the tensor order, keep the metadata exactly and
/// set metadata "dtype" = dtype_name(dtype), write `out` atomically. `in` == `out` is allowed (the input is
/// read whole first). A non-floating `dtype` is refused.
ConvertStats convert_safetensors(const std::string& in, const std::string& out, DType dtype);

}  // namespace mp::train

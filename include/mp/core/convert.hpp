#pragma once
#include <cstddef>
#include <cstdint>

#include "mp/core/half.hpp"

namespace mp {

// Bulk conversions between float and the 16-bit float types: vectorised (AVX-512 or AVX2+F16C,
// chosen at run time from cpu_features()) and OpenMP-parallel for large n. Every path gives
// results bit-identical to the scalar mp::Half(float) / mp::BFloat16(float) / float(...)
// conversions of half.hpp for every input, NaNs and subnormals included.
// src and dst must not overlap; neither needs any alignment.

/// dst[i] = Half(src[i]) for i < n: round to nearest even, subnormals, overflow to inf.
void convert_f32_to_f16(const float* src, Half* dst, size_t n);
/// dst[i] = float(src[i]) for i < n (exact).
void convert_f16_to_f32(const Half* src, float* dst, size_t n);
/// dst[i] = BFloat16(src[i]) for i < n: round to nearest even, FP32 subnormals kept.
void convert_f32_to_bf16(const float* src, BFloat16* dst, size_t n);
/// dst[i] = float(src[i]) for i < n (exact).
void convert_bf16_to_f32(const BFloat16* src, float* dst, size_t n);

/// Instruction-set path of the bulk conversions.
enum class ConvertPath : uint8_t {
  scalar,  ///< Portable loop over the half.hpp functions.
  avx2,    ///< AVX2 + F16C, 8 lanes.
  avx512,  ///< AVX-512 F/BW/VL, 16 lanes.
};

/// "scalar", "avx2" or "avx512".
const char* convert_path_name(ConvertPath path);
/// True when this CPU (and OS) can run `path`.
bool convert_path_supported(ConvertPath path);
/// The path the mp::convert_* functions use on this CPU (the widest supported).
ConvertPath best_convert_path();

namespace detail {
/// convert_f32_to_f16 on an explicit path (tests, benchmarks); throws mp::Error if unsupported.
void convert_f32_to_f16(ConvertPath path, const float* src, Half* dst, size_t n);
/// convert_f16_to_f32 on an explicit path (tests, benchmarks); throws mp::Error if unsupported.
void convert_f16_to_f32(ConvertPath path, const Half* src, float* dst, size_t n);
/// convert_f32_to_bf16 on an explicit path (tests, benchmarks); throws mp::Error if unsupported.
void convert_f32_to_bf16(ConvertPath path, const float* src, BFloat16* dst, size_t n);
/// convert_bf16_to_f32 on an explicit path (tests, benchmarks); throws mp::Error if unsupported.
void convert_bf16_to_f32(ConvertPath path, const BFloat16* src, float* dst, size_t n);

/// The conversion kernels of the best path, serial and without argument checks: for loops that already split the
/// work over threads and convert small blocks (the element-wise loop), where the checks and the path dispatch of the
/// public functions per block cost more than the conversion (measured: a tenth of a bf16 add). Bits as
/// uint16_t.
struct BlockConverters {
  void (*f32_to_f16)(const float* src, uint16_t* dst, size_t n);
  void (*f16_to_f32)(const uint16_t* src, float* dst, size_t n);
  void (*f32_to_bf16)(const float* src, uint16_t* dst, size_t n);
  void (*bf16_to_f32)(const uint16_t* src, float* dst, size_t n);
};
/// The kernels of best_convert_path(), resolved once.
const BlockConverters& block_converters();
}  // namespace detail

}  // namespace mp

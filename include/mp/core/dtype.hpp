#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "mp/core/error.hpp"
#include "mp/core/half.hpp"

namespace mp {

/// Element types of a Tensor.
enum class DType : uint8_t { f32, f64, f16, bf16, i64, i32, u8, b8 };

/// Number of dtypes (for tables indexed by DType).
inline constexpr int kNumDTypes = 8;

/// Bytes per element.
constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::u8:
    case DType::b8: return 1;
  }
  return 0;
}

/// Short name: "f32", "bf16", ... (the CLI and error messages use these).
const char* dtype_name(DType t);

/// Parse "f32"/"float32"/"fp32", "f16"/"half"/"fp16", "bf16"/"bfloat16", ...; throws mp::Error otherwise.
DType dtype_from_string(const std::string& s);

/// True for f32, f64, f16, bf16.
constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}
/// True for the 16-bit floating types.
constexpr bool is_low_precision(DType t) { return t == DType::f16 || t == DType::bf16; }

/// The wider of two dtypes under PyTorch-style type promotion (float beats int, wider beats narrower,
/// f16 with bf16 gives f32).
DType promote_types(DType a, DType b);

/// Boolean element type (one byte, 0 or 1).
struct Bool8 {
  uint8_t v = 0;
};

/// C++ type for a dtype.
template <DType D>
struct dtype_traits;
template <>
struct dtype_traits<DType::f32> {
  using type = float;
};
template <>
struct dtype_traits<DType::f64> {
  using type = double;
};
template <>
struct dtype_traits<DType::f16> {
  using type = Half;
};
template <>
struct dtype_traits<DType::bf16> {
  using type = BFloat16;
};
template <>
struct dtype_traits<DType::i64> {
  using type = int64_t;
};
template <>
struct dtype_traits<DType::i32> {
  using type = int32_t;
};
template <>
struct dtype_traits<DType::u8> {
  using type = uint8_t;
};
template <>
struct dtype_traits<DType::b8> {
  using type = bool;
};

/// dtype of a C++ element type.
template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::b8;
}

/// Accumulation / compute type: float for Half and BFloat16, the type itself otherwise.
template <class T>
struct acc_type {
  using type = T;
};
template <>
struct acc_type<Half> {
  using type = float;
};
template <>
struct acc_type<BFloat16> {
  using type = float;
};
template <>
struct acc_type<bool> {
  using type = bool;
};
template <class T>
using acc_t = typename acc_type<T>::type;

/// Call f.template operator()<T>() with T the C++ type of dtype `t`. One visitor, no macro tables.
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    case DType::i64: return f.template operator()<int64_t>();
    case DType::i32: return f.template operator()<int32_t>();
    case DType::u8: return f.template operator()<uint8_t>();
    case DType::b8: return f.template operator()<bool>();
  }
  MP_FAIL("visit_dtype: invalid dtype ", static_cast<int>(t));
}

/// Like visit_dtype but only floating dtypes; others throw an error naming `op`.
template <class F>
decltype(auto) visit_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    default: break;
  }
  MP_FAIL(op, ": expected a floating dtype (f32, f64, f16, bf16), got ", dtype_name(t),
          "; convert with .to(mp::DType::f32)");
}

/// Convert between element types through the compute type (float for 16-bit types).
template <class To, class From>
MP_HD MP_FORCE_INLINE To scalar_cast(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return scalar_cast<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace mp

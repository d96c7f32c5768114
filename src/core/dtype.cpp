#include "mp/core/dtype.hpp"

#include <algorithm>
#include <cctype>

#include "mp/core/device.hpp"

namespace mp {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
    case DType::b8: return "bool";
  }
  return "?";
}

DType dtype_from_string(const std::string& s0) {
  std::string s = s0;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "f32" || s == "fp32" || s == "float32" || s == "float") return DType::f32;
  if (s == "f64" || s == "fp64" || s == "float64" || s == "double") return DType::f64;
  if (s == "f16" || s == "fp16" || s == "float16" || s == "half") return DType::f16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "i64" || s == "int64" || s == "long") return DType::i64;
  if (s == "i32" || s == "int32" || s == "int") return DType::i32;
  if (s == "u8" || s == "uint8") return DType::u8;
  if (s == "bool" || s == "b8") return DType::b8;
  MP_FAIL("unknown dtype '", s0, "': expected one of f32, f64, f16, bf16, i64, i32, u8, bool");
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType t) {
    switch (t) {
      case DType::b8: return 0;
      case DType::u8: return 1;
      case DType::i32: return 2;
      case DType::i64: return 3;
      case DType::f16: return 4;
      case DType::bf16: return 4;
      case DType::f32: return 5;
      case DType::f64: return 6;
    }
    return 0;
  };
  if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16)) return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

Device::Device(const std::string& s) {
  if (s == "cpu") {
    type = DeviceType::cpu;
    index = 0;
    return;
  }
  if (s.rfind("cuda", 0) == 0) {
    type = DeviceType::cuda;
    index = 0;
    if (s.size() == 4) return;
    if (s.size() > 5 && s[4] == ':') {
      try {
        size_t pos = 0;
        index = std::stoi(s.substr(5), &pos);
        if (pos == s.size() - 5 && index >= 0) return;
      } catch (...) {}
    }
  }
  MP_FAIL("unknown device '", s, "': expected 'cpu', 'cuda' or 'cuda:N'");
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace mp

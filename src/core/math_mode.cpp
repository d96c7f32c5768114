#include "mp/core/math_mode.hpp"

#include <atomic>

#include "mp/core/error.hpp"

namespace mp {
namespace {

// Relaxed is enough: the flag orders nothing else, and a GEMM that races with a change may use
// either setting (as in PyTorch).
std::atomic<Float32MatmulPrecision> g_f32_precision{Float32MatmulPrecision::highest};

}  // namespace

void set_float32_matmul_precision(Float32MatmulPrecision p) { g_f32_precision.store(p, std::memory_order_relaxed); }

Float32MatmulPrecision float32_matmul_precision() { return g_f32_precision.load(std::memory_order_relaxed); }

const char* float32_matmul_precision_name(Float32MatmulPrecision p) {
  switch (p) {
    case Float32MatmulPrecision::highest: return "highest";
    case Float32MatmulPrecision::high: return "high";
  }
  return "unknown";
}

Float32MatmulPrecision float32_matmul_precision_from_string(const std::string& s) {
  if (s == "highest" || s == "f32" || s == "fp32") return Float32MatmulPrecision::highest;
  if (s == "high" || s == "tf32") return Float32MatmulPrecision::high;
  MP_FAIL("float32 matmul precision: expected \"highest\" (full f32) or \"high\" (TF32 on CUDA), got \"", s, "\"");
}

}  // namespace mp

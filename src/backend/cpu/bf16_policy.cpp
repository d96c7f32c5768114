#include "backend/cpu/bf16_policy.hpp"

#include <atomic>
#include <cstdlib>
#include <string>

#include "mp/core/cpu_features.hpp"
#include "mp/core/error.hpp"

namespace mp::backend::cpu {
namespace {

// Note [bf16 through f32 without AMX]
// Without AMX (AVX512-BF16 only, e.g. a VM that hides AMX) oneDNN 2.6's bf16 kernels run on VDPBF16PS, which
// does 32 multiply-adds per instruction but issues on one port, while f32 FMAs do 16 on two: no throughput
// edge, and the bf16 kernels add conversions and shuffles. Measured on such a VM (bench/RESULTS.md, "A machine
// without AMX", 2 threads): convolutions ~1.8-1.9x slower per call than f32, square matmuls 256-2048 at
// 0.52-0.78x f32's TFLOP/s. There bf16 matmuls and convolutions widen their operands to f32, run oneDNN's f32
// primitives and round the result to bf16 once (f32 outputs, such as weight gradients, are not rounded), as
// f16 does everywhere on the CPU. The arithmetic is the same class as the bf16 kernels': a bf16 value is
// exact in f32, the product of two is exact in f32 (8 + 8 significand bits), sums are f32; only the order of
// the sums and the kernels' denormal handling differ. Activations stay bf16 in memory (the saving remains);
// the widening copies cost memory traffic, small next to the O(n^3) work. The choice depends on the CPU only,
// never on timing, so runs on one machine stay bit-reproducible. (The LSTM's oneDNN RNN primitive keeps
// bf16: not measured without AMX yet.)
std::atomic<Bf16Path> g_path{Bf16Path::cpu_default};

Bf16Path parse_env() {
  const char* e = std::getenv("MP_BF16");
  if (e == nullptr || *e == '\0') return Bf16Path::cpu_default;
  for (const Bf16Path p : {Bf16Path::native_gemm, Bf16Path::native, Bf16Path::via_f32})
    if (std::string(e) == bf16_path_name(p)) return p;
  MP_FAIL("MP_BF16: expected native_gemm, native or via_f32, got '", e, "'; unset it for the CPU's default");
}

}  // namespace

const char* bf16_path_name(Bf16Path path) {
  switch (path) {
    case Bf16Path::cpu_default:
      return "cpu_default";
    case Bf16Path::native_gemm:
      return "native_gemm";
    case Bf16Path::native:
      return "native";
    case Bf16Path::via_f32:
      return "via_f32";
  }
  return "?";
}

void set_bf16_path(Bf16Path path) { g_path.store(path, std::memory_order_relaxed); }

Bf16Path bf16_path() {
  const Bf16Path set = g_path.load(std::memory_order_relaxed);
  if (set != Bf16Path::cpu_default) return set;
  static const Bf16Path from_env = parse_env();
  if (from_env != Bf16Path::cpu_default) return from_env;
  return cpu_features().amx_bf16 ? Bf16Path::native_gemm : Bf16Path::via_f32;
}

DType compute_dtype(DType dt) {
  return dt == DType::f16 || (dt == DType::bf16 && bf16_path() == Bf16Path::via_f32) ? DType::f32 : dt;
}

}  // namespace mp::backend::cpu

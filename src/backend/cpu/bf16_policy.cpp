#include "backend/cpu/bf16_policy.hpp"

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cpu/onednn/matmul.hpp"
#include "mp/core/error.hpp"

namespace mp::backend::cpu {
namespace {

// Note [16-bit paths on the CPU]
// bf16 has three ways to compute (KernelPath): oneDNN's bf16 primitives (VDPBF16PS or AMX tiles), through f32
// (a bf16 value is exact in f32 and so is the product of two, the sums are f32: the same class of arithmetic,
// only the order of the sums and the denormal handling differ; one rounding of the result; activations stay
// bf16 in memory), and for convolutions with few output pixels im2col + one bf16 GEMM. The fastest differs
// from CPU to CPU and shape to shape (Note [kernel paths chosen by measurement]), so it is measured; native is
// the default. f16 has native kernels in oneDNN 3.x only on CPUs with AVX512-FP16 or AMX-FP16; elsewhere (and
// for bf16 on CPUs without AVX-512, where oneDNN 3.2 has no bf16 kernel at all) the 16-bit kernel is no
// candidate and the call computes through f32. Where both exist for f16, through f32 stays the default (oneDNN's
// f16 kernels have to earn their place by measurement). A forced rule (set_bf16_path, MP_BF16) overrides the
// measurement for bf16; tests use it to run every path on any CPU.
std::atomic<Bf16Path> g_path{Bf16Path::cpu_default};

Bf16Path parse_env() {
  const char* e = std::getenv("MP_BF16");
  if (e == nullptr || *e == '\0') return Bf16Path::cpu_default;
  for (const Bf16Path p : {Bf16Path::native_gemm, Bf16Path::native, Bf16Path::via_f32})
    if (std::string(e) == bf16_path_name(p)) return p;
  MP_FAIL("MP_BF16: expected native_gemm, native or via_f32, got '", e, "'; unset it to choose paths by measurement");
}

// Whether oneDNN has a non-reference matmul kernel for `dt` on this CPU (an unimplemented one: no).
bool probe_native(DType dt) {
  try {
    return !onednn_reference_impl(matmul_impl_info(MatmulArgs::contiguous(1, 64, 64, 64, dt, dt)));
  } catch (const Error&) { return false; }
}

}  // namespace

bool onednn_has_native(DType dt) {
  static const bool bf16 = probe_native(DType::bf16), f16 = probe_native(DType::f16);
  return dt == DType::bf16 ? bf16 : f16;
}

const char* bf16_path_name(Bf16Path path) {
  switch (path) {
    case Bf16Path::cpu_default: return "cpu_default";
    case Bf16Path::native_gemm: return "native_gemm";
    case Bf16Path::native: return "native";
    case Bf16Path::via_f32: return "via_f32";
  }
  return "?";
}

void set_bf16_path(Bf16Path path) { g_path.store(path, std::memory_order_relaxed); }

Bf16Path bf16_path() {
  const Bf16Path set = g_path.load(std::memory_order_relaxed);
  if (set != Bf16Path::cpu_default) return set;
  static const Bf16Path from_env = parse_env();
  return from_env;
}

KernelPath choose_16bit_path(DType dt, bool gemm_ok, const std::function<std::string()>& key,
                             const std::function<void(KernelPath)>& run,
                             const std::function<bool()>& native_is_reference) {
  const auto usable = [&](KernelPath p) {
    try {
      return p != KernelPath::native || !native_is_reference();
    } catch (const Error&) { return false; }  // no primitive at all for the call: no candidate either
  };
  MP_ASSERT(dt == DType::bf16 || dt == DType::f16, "choose_16bit_path: not a 16-bit dtype: ", dtype_name(dt));
  if (dt == DType::f16) {
    if (!onednn_has_native(DType::f16)) return KernelPath::via_f32;
    static constexpr KernelPath kF16[] = {KernelPath::via_f32, KernelPath::native};
    return choose_kernel_path(key(), kF16, run, usable);
  }
  switch (bf16_path()) {
    case Bf16Path::native_gemm: return gemm_ok ? KernelPath::gemm : KernelPath::native;
    case Bf16Path::native: return KernelPath::native;
    case Bf16Path::via_f32: return KernelPath::via_f32;
    case Bf16Path::cpu_default: break;
  }
  if (!onednn_has_native(DType::bf16)) return KernelPath::via_f32;
  std::vector<KernelPath> candidates{KernelPath::native, KernelPath::via_f32};
  if (gemm_ok) candidates.push_back(KernelPath::gemm);
  return choose_kernel_path(key(), candidates, run, usable);
}

}  // namespace mp::backend::cpu

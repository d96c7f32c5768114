#pragma once
#include <string>

namespace mp {

/// x86 instruction-set features usable by this process: the CPU has them (cpuid) AND the OS saves
/// their register state (xgetbv). All false on other architectures.
struct CpuFeatures {
  bool avx2 = false;         ///< AVX2 (256-bit integer SIMD), with OS YMM state.
  bool f16c = false;         ///< F16C: VCVTPH2PS / VCVTPS2PH on 128/256-bit registers.
  bool fma = false;          ///< FMA3.
  bool avx512f = false;      ///< AVX-512 Foundation, with OS opmask/ZMM state.
  bool avx512bw = false;     ///< AVX-512 byte/word instructions.
  bool avx512vl = false;     ///< AVX-512 on 128/256-bit registers.
  bool avx512_bf16 = false;  ///< AVX512-BF16: VCVTNEPS2BF16, VDPBF16PS.
  bool avx512_fp16 = false;  ///< AVX512-FP16: native half arithmetic.
  bool amx_tile = false;     ///< AMX tiles, with OS XTILECFG/XTILEDATA state (Linux also wants
                             ///< arch_prctl(ARCH_REQ_XCOMP_PERM) before use; oneDNN does that).
  bool amx_bf16 = false;     ///< AMX-BF16 tile dot products.
  bool amx_int8 = false;     ///< AMX-INT8 tile dot products.
  std::string brand;         ///< cpuid brand string, e.g. "Intel(R) Xeon(R) Processor"; empty if unknown.
  int logical_cores = 1;     ///< Logical CPUs this process may run on (affinity mask), at least 1.
};

/// The features of the CPU this process runs on; detected once, then cached (thread-safe).
const CpuFeatures& cpu_features();

/// Space-separated names of the present features, e.g. "avx2 f16c fma avx512f ... amx_int8".
std::string cpu_features_string();

}  // namespace mp

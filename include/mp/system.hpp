#pragma once
#include <string>
#include <vector>

#include "mp/core/cpu_features.hpp"
#include "mp/core/device.hpp"
#include "mp/core/dtype.hpp"

namespace mp {

/// One GPU as the CUDA runtime reports it.
struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;  ///< compute capability
  double memory_gib = 0.0;         ///< device memory in GiB
  int multiprocessors = 0;         ///< SM count
};

/// What this build and machine offer for mixed precision.
struct SystemInfo {
  std::string version;                 ///< mixprec version
  CpuFeatures cpu;                     ///< CPU features
  std::string onednn_version;          ///< e.g. "3.2.0"
  std::string onednn_bf16_matmul_impl;  ///< kernel oneDNN picks for a bf16 matmul, e.g. "brg:avx512_core_amx"
  std::string onednn_f32_matmul_impl;   ///< kernel oneDNN picks for an f32 matmul
  std::string bf16_path;                ///< how bf16 matmuls/convolutions run: "native_gemm", "native", "via_f32"
  bool cuda_built = false;             ///< the CUDA backend is compiled in
  std::string cuda_status;             ///< "n device(s)" and the CUDA versions, or why there is none
  std::vector<GpuInfo> gpus;           ///< visible GPUs
};

/// Gather SystemInfo (builds two tiny oneDNN primitives to see which kernels they choose).
SystemInfo system_info();

/// The device a command-line flag names ("cpu", "cuda", "cuda:N"): throws mp::Error naming `flag`
/// when the text does not parse, or when the CUDA device does not exist (saying why there is none).
Device device_from_flag(const std::string& value, const std::string& flag);

/// Wait until all work queued on device d has finished (a no-op for the CPU, whose kernels are
/// synchronous). Timings of GPU work must call it before reading the clock.
void synchronize(Device d);

/// A recommendation of a compute dtype for a device and why.
struct PrecisionAdvice {
  DType dtype = DType::f32;
  std::string reason;
};

/// What precision the CPU should train in, and why.
PrecisionAdvice cpu_precision_advice(const CpuFeatures& cpu);
/// What precision a GPU should train in, and why (tensor cores need compute capability >= 7.0).
PrecisionAdvice gpu_precision_advice(const GpuInfo& gpu);

}  // namespace mp

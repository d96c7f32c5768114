#pragma once
#include <cstdint>
#include <map>
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
  std::string version;                  ///< mixprec version
  CpuFeatures cpu;                      ///< CPU features
  std::string onednn_version;           ///< e.g. "3.2.0"
  std::string onednn_bf16_matmul_impl;  ///< kernel oneDNN picks for a bf16 matmul, e.g. "brg:avx512_core_amx"
  std::string onednn_f32_matmul_impl;   ///< kernel oneDNN picks for an f32 matmul
  std::string bf16_path;                ///< a forced bf16 rule ("native_gemm", "native", "via_f32") or "cpu_default"
  bool cuda_built = false;              ///< the CUDA backend is compiled in
  std::string cuda_status;              ///< "n device(s)" and the CUDA versions, or why there is none
  std::string cudnn_status;             ///< cuDNN loaded / compiled versions and library folders (with a device)
  std::vector<GpuInfo> gpus;            ///< visible GPUs
};

/// cuDNN convolution calls of this process (Note [conv layout counters]): all of them, those asked for in
/// channels-last (NHWC), those of the latter that ran in NCHW because cuDNN had no NHWC algorithm, and those
/// that ran through cuDNN's graph API (the default; MP_CUDNN_GRAPH=0 turns it off). All zero without the CUDA backend
/// or cuDNN.
struct CudnnConvCounts {
  int64_t calls = 0;
  int64_t nhwc_calls = 0;
  int64_t nchw_fallbacks = 0;
  int64_t graph_calls = 0;
};
CudnnConvCounts cudnn_conv_counts();

/// Times the host has waited for a CUDA device in this process (device-to-host copies and read-backs,
/// synchronize(), staging buffers still in flight; Note [host synchronisation counter]); 0 without CUDA.
int64_t cuda_host_syncs();

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

/// A representative 16-bit CPU call and how it computes here (Note [kernel paths chosen by measurement]).
struct KernelPathProbe {
  std::string what;                  ///< e.g. "matmul 512x784 x 784x2048 (MLP layer)"
  std::string key;                   ///< the selector's key of the call
  std::string path;                  ///< the path it takes
  std::map<std::string, double> ms;  ///< each candidate's measured median (empty when not measured)
};

/// Runs bf16 calls of representative shapes (an MLP layer, a square GEMM, an LSTM step, ResNet convolutions) and
/// ResNet's small f32 convolution: measured now where this machine's cache has no entry, so it can take a few
/// seconds the first time.
std::vector<KernelPathProbe> probe_kernel_paths();

/// What precision the CPU should train in, and why, from the features and the measured probes (bf16 advised where
/// its fastest path beats f32 on the probes' GEMMs; `probes` may be empty: the features alone then).
PrecisionAdvice cpu_precision_advice(const CpuFeatures& cpu, const std::vector<KernelPathProbe>& probes = {});
/// Where `dt` (bf16 or f16) has no kernel on this CPU (oneDNN 3.2 has none without AVX-512; f16 none without
/// AVX512-FP16 or AMX-FP16), so that every 16-bit product computes through f32: a line saying so and what it means
/// for a run; empty otherwise (and for other dtypes). The trainers print it when a run asks for such a dtype.
std::string cpu_16bit_note(DType dt);
/// What precision a GPU should train in, and why (tensor cores need compute capability >= 7.0).
PrecisionAdvice gpu_precision_advice(const GpuInfo& gpu);

}  // namespace mp

#include "mp/system.hpp"

#include "backend/cpu/bf16_policy.hpp"
#include "backend/cpu/onednn_matmul.hpp"
#include "backend/cuda/runtime.hpp"
#include "mp/core/error.hpp"

namespace mp {

SystemInfo system_info() {
  SystemInfo s;
  s.version = "0.1.0";
  s.cpu = cpu_features();
  s.onednn_version = backend::cpu::onednn_version();
  auto impl = [](DType dt) {
    try {
      return backend::cpu::matmul_impl_info(backend::cpu::MatmulArgs::contiguous(1, 256, 256, 256, dt, DType::f32));
    } catch (const Error& e) {
      return std::string("unavailable: ") + e.what();
    }
  };
  s.onednn_f32_matmul_impl = impl(DType::f32);
  s.onednn_bf16_matmul_impl = impl(DType::bf16);
  s.bf16_path = backend::cpu::bf16_path_name(backend::cpu::bf16_path());
#if defined(MP_HAVE_CUDA)
  s.cuda_built = true;
  namespace cu = backend::cuda;
  auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
  const int driver = cu::driver_version();
  const std::string versions =
      "CUDA runtime " + version(cu::runtime_version()) + ", driver " + (driver > 0 ? version(driver) : "none");
  const int n = cu::device_count();
  if (n == 0) {
    s.cuda_status = "no CUDA device: " + cu::no_device_reason() + " (" + versions + ")";
  } else {
    s.cuda_status = std::to_string(n) + (n == 1 ? " device (" : " devices (") + versions + ")";
    for (int i = 0; i < n; ++i) {
      try {
        const cu::DeviceProperties& p = cu::device_properties(i);
        s.gpus.push_back({.index = i, .name = p.name, .cc_major = p.cc_major, .cc_minor = p.cc_minor,
                          .memory_gib = static_cast<double>(p.total_memory) / double(1 << 30),
                          .multiprocessors = p.multiprocessors});
      } catch (const Error& e) {
        s.cuda_status += "; cuda:" + std::to_string(i) + " could not be queried: " + e.what();
      }
    }
  }
#else
  s.cuda_built = false;
  s.cuda_status = "not built (configure with -DMP_CUDA=ON on a machine with nvcc)";
#endif
  return s;
}

PrecisionAdvice cpu_precision_advice(const CpuFeatures& cpu) {
  if (cpu.amx_bf16)
    return {DType::bf16, "AMX-BF16 tiles: bf16 matmul/convolution run several times faster than f32 "
                         "(f32 accumulation); bf16 keeps f32's range, so no loss scaling is needed"};
  if (cpu.avx512_bf16)
    // Measured on a Sapphire Rapids VM that hides AMX (bench/RESULTS.md): oneDNN 2.6's VDPBF16PS
    // convolutions ~1.8x slower per call than its f32 ones, so bf16 convolutions and matmuls run through f32
    // there (Note [bf16 through f32 without AMX]); a ResNet-18 bf16 O2 step then takes 1.02-1.06x f32's time
    // with 34% less peak memory.
    return {DType::f32, "AVX512-BF16 without AMX: VDPBF16PS has no throughput edge over two f32 FMA ports, so "
                        "bf16 matmuls and convolutions run through f32 here, at about f32's speed; bf16 saves "
                        "activation memory (use it for larger models or batches), f32 is as fast and more precise"};
  return {DType::f32, "no bf16 compute instructions: bf16/f16 on this CPU only save memory (storage-only, "
                      "computed through f32) and cost conversion time"};
}

PrecisionAdvice gpu_precision_advice(const GpuInfo& g) {
  const int cc = g.cc_major * 10 + g.cc_minor;
  if (cc >= 80)
    return {DType::bf16, "compute capability >= 8.0: bf16 and f16 tensor cores; prefer bf16 (f32 range, no loss "
                         "scaling)"};
  if (cc >= 70)
    return {DType::f16, "compute capability 7.x: f16 tensor cores (no bf16); use dynamic loss scaling"};
  return {DType::f16, "compute capability < 7.0: no tensor cores: f16 halves memory but gives no speed-up"};
}

Device device_from_flag(const std::string& value, const std::string& flag) {
  Device d;
  try {
    d = Device(value);
  } catch (const Error& e) {
    MP_FAIL(flag, " '", value, "': expected cpu, cuda or cuda:N (", e.what(), ")");
  }
  if (d.is_cuda()) backend::cuda::check_device(d, flag.c_str());
  return d;
}

void synchronize(Device d) {
  if (d.is_cuda()) backend::cuda::synchronize(d);
}

}  // namespace mp

#include "mp/system.hpp"

#include <functional>

#include "backend/cpu/bf16_policy.hpp"
#include "backend/cpu/kernel_paths.hpp"
#include "backend/cpu/onednn/matmul.hpp"
#include "backend/cuda/runtime.hpp"
#include "mp/core/error.hpp"
#include "mp/kernel_paths.hpp"
#include "mp/ops/ops.hpp"

namespace mp {
namespace {
// bf16 is advised where its GEMM beats f32 by the margin that makes the selector pick it.
constexpr double kReplaceFactorForAdvice = backend::cpu::kReplaceFactor;
}  // namespace

SystemInfo system_info() {
  SystemInfo s;
  s.version = "0.1.0";
  s.cpu = cpu_features();
  s.onednn_version = backend::cpu::onednn_version();
  auto impl = [](DType dt) {
    try {
      return backend::cpu::matmul_impl_info(backend::cpu::MatmulArgs::contiguous(1, 256, 256, 256, dt, DType::f32));
    } catch (const Error& e) { return std::string("unavailable: ") + e.what(); }
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
    s.cudnn_status = cu::cudnn_summary();
    for (int i = 0; i < n; ++i) {
      try {
        const cu::DeviceProperties& p = cu::device_properties(i);
        s.gpus.push_back({.index = i,
                          .name = p.name,
                          .cc_major = p.cc_major,
                          .cc_minor = p.cc_minor,
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

CudnnConvCounts cudnn_conv_counts() { return backend::cuda::cudnn_conv_counters(); }

int64_t cuda_host_syncs() { return backend::cuda::host_sync_count(); }

std::vector<KernelPathProbe> probe_kernel_paths() {
  const TensorOptions bf{.dtype = DType::bf16};
  auto act = [](const Shape& s, DType dt) {
    return full(s, 0.01, {.dtype = dt, .memory_format = MemoryFormat::channels_last}).requires_grad_();
  };
  auto conv = [&](int64_t c, int64_t hw, DType dt = DType::bf16) {
    const Tensor x = act({32, c, hw, hw}, dt), w = full({c, c, 3, 3}, 0.01, {.dtype = dt}).requires_grad_();
    sum(conv2d(x, w, Tensor(), {.padding = {1, 1}})).backward();
  };
  const std::vector<std::pair<std::string, std::function<void()>>> cases{
      {"matmul 512x784 x 784x2048 (an MLP layer)",
       [&] {
         (void)linear(full({512, 784}, 0.01, bf), full({2048, 784}, 0.01, bf));
       }},
      {"matmul 2048x2048 x 2048x2048",
       [&] {
         (void)matmul(full({2048, 2048}, 0.01, bf), full({2048, 2048}, 0.01, bf));
       }},
      {"matmul 20x650 x 650x2600 (an LSTM step)",
       [&] {
         (void)linear(full({20, 650}, 0.01, bf), full({2600, 650}, 0.01, bf));
       }},
      {"conv 3x3 64->64 32x32 batch 32 NHWC", [&] { conv(64, 32); }},
      {"conv 3x3 512->512 4x4 batch 32 NHWC", [&] { conv(512, 4); }},
      {"f32 conv 3x3 512->512 4x4 batch 32 NHWC", [&] { conv(512, 4, DType::f32); }},
  };
  std::vector<KernelPathProbe> probes;
  for (const auto& [what, run] : cases) {
    const std::map<std::string, std::string> before = kernel_path_record().choices;
    run();
    for (const auto& [key, path] : kernel_path_record().choices) {
      if (before.count(key) != 0) continue;
      const std::string pass = key.substr(0, key.find(' '));
      probes.push_back(
          {what + (pass == "matmul" ? "" : " (" + pass.substr(5) + ")"), key, path, kernel_path_timings(key)});
    }
  }
  return probes;
}

PrecisionAdvice cpu_precision_advice(const CpuFeatures& cpu, const std::vector<KernelPathProbe>& probes) {
  const char* no_scaling = "bf16 keeps f32's range, so no loss scaling is needed";
  if (!probes.empty() && probes[0].ms.count("native") != 0 && probes[0].ms.count("via_f32") != 0) {
    // Measured: the MLP layer's bf16 GEMM against the same GEMM through f32 (Note [kernel paths chosen by
    // measurement]).
    const double ratio = probes[0].ms.at("via_f32") / probes[0].ms.at("native");
    char buf[320];
    if (ratio >= kReplaceFactorForAdvice) {
      std::snprintf(buf, sizeof buf, "bf16 GEMMs measured %.2fx faster than through f32 on this CPU; %s", ratio,
                    no_scaling);
      return {DType::bf16, buf};
    }
    std::snprintf(buf, sizeof buf,
                  "bf16 GEMMs measured at %.2fx the speed of f32 ones on this CPU: bf16 saves "
                  "activation memory (larger models or batches) but not time; f32 is as fast and more precise",
                  ratio);
    return {DType::f32, buf};
  }
  if (cpu.amx_bf16)
    return {DType::bf16, std::string("AMX-BF16 tiles: bf16 matmul/convolution run several times faster than f32 "
                                     "(f32 accumulation); ") +
                             no_scaling};
  if (cpu.avx512_bf16)
    return {DType::bf16,
            "AVX512-BF16: bf16 kernels are often faster than f32 ones, but not on every such CPU; "
            "`mixprec info` measures them (pinned mode measures nothing)"};
  return {DType::f32,
          "no bf16 compute instructions: bf16/f16 on this CPU only save memory (computed through f32) "
          "and cost conversion time"};
}

std::string cpu_16bit_note(DType dt) {
  if (!is_low_precision(dt) || backend::cpu::onednn_has_native(dt)) return {};
  const std::string n = dtype_name(dt);
  return n + " computes through f32 on this CPU (its oneDNN has no " + n +
         " kernel here): a step takes about an fp32 step's time and saves activation memory only; fp32 is as fast "
         "and more precise (`mixprec info`, bench/RESULTS.md)";
}

PrecisionAdvice gpu_precision_advice(const GpuInfo& g) {
  const int cc = g.cc_major * 10 + g.cc_minor;
  if (cc >= 80)
    return {DType::bf16,
            "compute capability >= 8.0: bf16 and f16 tensor cores; prefer bf16 (f32 range, no loss "
            "scaling)"};
  if (cc >= 70) return {DType::f16, "compute capability 7.x: f16 tensor cores (no bf16); use dynamic loss scaling"};
  return {DType::f16, "compute capability < 7.0: no tensor cores: f16 halves memory but gives no speed-up"};
}

Device device_from_flag(const std::string& value, const std::string& flag) {
  Device d;
  try {
    d = Device(value);
  } catch (const Error& e) { MP_FAIL(flag, " '", value, "': expected cpu, cuda or cuda:N (", e.what(), ")"); }
  if (d.is_cuda()) backend::cuda::check_device(d, flag.c_str());
  return d;
}

void synchronize(Device d) {
  if (d.is_cuda()) backend::cuda::synchronize(d);
}

}  // namespace mp

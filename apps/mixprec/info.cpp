#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "mp/dist/nccl_group.hpp"
#include "mp/dist/process_group.hpp"
#include "mp/kernel_paths.hpp"
#include "mp/report/inspect.hpp"
#include "mp/system.hpp"
#include "mp/train/checkpoint.hpp"

namespace mixprec {

namespace {

// The measured kernel paths of representative shapes (timed now where this machine's cache has no entry) and
// what the cache file holds (Note [kernel paths chosen by measurement]).
void print_kernel_paths(const std::vector<mp::KernelPathProbe>& probes) {
  std::printf("  bf16 (and small f32) calls of representative shapes: the path taken, each candidate's median ms:\n");
  for (const mp::KernelPathProbe& p : probes) {
    std::string times;
    for (const auto& [path, ms] : p.ms) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%s %.2f", times.empty() ? "" : ", ", path.c_str(), ms);
      times += buf;
    }
    std::printf("    %-58s %-8s %s\n", p.what.c_str(), p.path.c_str(), times.c_str());
  }
  const mp::KernelPathRecord r = mp::kernel_path_record();
  std::printf("  kernel-path cache: %s (%s)\n", r.cache_file.c_str(), mp::kernel_path_cache_summary().c_str());
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info",
                                 "Show CPU/GPU features, library versions and the advised precision; "
                                 "with files, what each safetensors file or checkpoint holds");
  auto files = std::make_shared<std::vector<std::string>>();
  cmd->add_option("files", *files, "safetensors files or checkpoints to describe (their headers only are read)");
  cmd->callback([files] {
    if (!files->empty()) {
      for (const std::string& f : *files) std::printf("%s", mp::report::describe_safetensors_file(f).c_str());
      return;
    }
    const mp::SystemInfo s = mp::system_info();
    std::printf("mixprec %s\n\n", s.version.c_str());
    std::printf("CPU: %s (%d logical cores)\n", s.cpu.brand.c_str(), s.cpu.logical_cores);
    auto yn = [](bool b) { return b ? "yes" : "no"; };
    std::printf("  AVX-512F %s | AVX512-BF16 %s | AMX-BF16 %s | F16C %s | AVX512-FP16 %s\n", yn(s.cpu.avx512f),
                yn(s.cpu.avx512_bf16), yn(s.cpu.amx_bf16), yn(s.cpu.f16c), yn(s.cpu.avx512_fp16));
    std::printf("  oneDNN %s: f32 matmul kernel '%s', bf16 matmul kernel '%s'\n", s.onednn_version.c_str(),
                s.onednn_f32_matmul_impl.c_str(), s.onednn_bf16_matmul_impl.c_str());
    std::printf("  16-bit matmul/convolution paths: %s\n",
                s.bf16_path == "cpu_default"
                    ? ("chosen per shape by timing (" + std::string(mp::kernel_path_mode_name(mp::kernel_path_mode())) +
                       " mode)")
                          .c_str()
                    : ("forced by MP_BF16=" + s.bf16_path).c_str());
    const std::vector<mp::KernelPathProbe> probes = mp::probe_kernel_paths();
    print_kernel_paths(probes);
    const mp::PrecisionAdvice cpu = mp::cpu_precision_advice(s.cpu, probes);
    std::printf("  advised precision: %s — %s\n", mp::dtype_name(cpu.dtype), cpu.reason.c_str());
    std::printf("  f16 %s\n\n", s.cpu.avx512_fp16
                                    ? "has oneDNN's f16 kernels here (AVX512-FP16), measured against f32"
                                    : "computes through f32 here (oneDNN's f16 kernels need AVX512-FP16 or AMX-FP16)");
    std::printf("CUDA: %s\n", s.cuda_status.c_str());
    if (!s.cudnn_status.empty()) std::printf("  %s\n", s.cudnn_status.c_str());
    for (const auto& g : s.gpus) {
      const bool tensor_cores = g.cc_major >= 7;
      std::printf("  cuda:%d %s: compute capability %d.%d%s, %.1f GiB, %d SMs\n", g.index, g.name.c_str(), g.cc_major,
                  g.cc_minor, tensor_cores ? "" : " (no tensor cores: expect memory savings, no speed-up)",
                  g.memory_gib, g.multiprocessors);
      const mp::PrecisionAdvice a = mp::gpu_precision_advice(g);
      std::printf("    advised precision: %s — %s\n", mp::dtype_name(a.dtype), a.reason.c_str());
    }
    std::printf("Processes: %s%s%s\n", mp::dist::world().describe().c_str(),
                mp::dist::built_with_mpi() ? " (built with MPI: mpirun -np N runs N ranks)" : " (built without MPI)",
                mp::dist::built_with_nccl() ? "; GPU tensors through NCCL" : "; no NCCL (GPU collectives)");
  });
}

}  // namespace mixprec

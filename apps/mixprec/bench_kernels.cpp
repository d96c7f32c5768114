// `mixprec bench kernels`: the kernel-level numbers of issue 5 through the public ops, so they measure
// what a user's code gets (dispatch, plan caches and allocator included):
//   * GEMM TFLOP/s of matmul at M x N x K in each dtype (f32, f32 with TF32, f16, bf16);
//   * bandwidth GB/s of element-wise ops over large tensors (copy = clone, add, mul, relu, and the
//     f32 <-> bf16 casts), counting each element read and written once.
// bench/pytorch/bench_kernels.py prints the same rows for torch on the same device; the suite's
// report puts them side by side (issue 5: GEMM >= 90% of cuBLAS, element-wise >= 80% of copy bandwidth).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "mp/core/math_mode.hpp"
#include "mp/mp.hpp"
#include "mp/system.hpp"

namespace mixprec {
namespace {

using Json = nlohmann::ordered_json;
using namespace mp;

struct KernelBenchArgs {
  std::string device = "cpu";
  int64_t m = 0, n = 0, k = 0;  ///< GEMM sizes (0 = 8192 on a GPU, 1024 on the CPU)
  int64_t elements = 0;         ///< element-wise tensor size (0 = 2^28 on a GPU, 2^24 on the CPU)
  int64_t iters = 0;            ///< timed repetitions (0 = 20 on a GPU, 3 on the CPU)
  std::vector<std::string> dtypes{"f32", "tf32", "f16", "bf16"};
  std::string json;  ///< also write the JSON object to this file
};

// Median seconds of `iters` timed calls of f after one untimed call, synchronizing the device.
double time_median(Device d, int64_t iters, const std::function<void()>& f) {
  f();
  synchronize(d);
  std::vector<double> s;
  for (int64_t i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    synchronize(d);
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

Json run_kernels(const KernelBenchArgs& in) {
  KernelBenchArgs a = in;
  const Device d = device_from_flag(a.device, "bench kernels: --device");
  const SystemInfo s = system_info();
  const bool gpu = d.is_cuda();
  if (a.m == 0) a.m = gpu ? 8192 : 1024;
  if (a.n == 0) a.n = a.m;
  if (a.k == 0) a.k = a.m;
  if (a.elements == 0) a.elements = gpu ? (int64_t{1} << 28) : (int64_t{1} << 24);
  if (a.iters == 0) a.iters = gpu ? 20 : 3;
  MP_CHECK(a.m > 0 && a.n > 0 && a.k > 0 && a.elements > 0 && a.iters > 0,
           "bench kernels: --m/--n/--k/--elements/--iters must be positive");

  Json j;
  j["framework"] = "mixprec";
  j["version"] = s.version;
  j["device"] = d.str();
  if (gpu)
    for (const GpuInfo& g : s.gpus)
      if (g.index == d.index) j["device"] = d.str() + ": " + g.name;
  if (!gpu) j["device"] = "cpu: " + s.cpu.brand;

  Json gemm = Json::array();
  const Float32MatmulPrecision saved = float32_matmul_precision();
  for (const std::string& name : a.dtypes) {
    MP_CHECK(name == "f32" || name == "tf32" || name == "f16" || name == "bf16", "bench kernels: unknown dtype '", name,
             "' in --dtypes; expected f32, tf32, f16 or bf16");
    const DType dt = name == "f16" ? DType::f16 : name == "bf16" ? DType::bf16 : DType::f32;
    set_float32_matmul_precision(name == "tf32" ? Float32MatmulPrecision::high : Float32MatmulPrecision::highest);
    Json row{{"dtype", name}, {"m", a.m}, {"n", a.n}, {"k", a.k}};
    try {
      autograd::NoGradGuard ng;
      const Tensor x = randn({a.m, a.k}).to(dt).to(d);
      const Tensor w = randn({a.k, a.n}).to(dt).to(d);
      Tensor y;
      const double sec = time_median(d, a.iters, [&] { y = matmul(x, w); });
      row["ms"] = sec * 1e3;
      row["tflops"] = 2.0 * static_cast<double>(a.m) * static_cast<double>(a.n) * static_cast<double>(a.k) / sec / 1e12;
    } catch (const Error& e) { row["error"] = e.what(); }
    gemm.push_back(row);
  }
  set_float32_matmul_precision(saved);
  j["gemm"] = gemm;

  Json ew = Json::array();
  {
    autograd::NoGradGuard ng;
    const Tensor x = randn({a.elements}).to(d);
    const Tensor yv = randn({a.elements}).to(d);
    const Tensor xb = x.to(DType::bf16);
    const double n = static_cast<double>(a.elements);
    struct Op {
      const char* name;
      double bytes;
      std::function<Tensor()> f;
    };
    const std::vector<Op> ops = {
        {"copy f32", 8 * n, [&] { return x.clone(); }},
        {"add f32", 12 * n, [&] { return add(x, yv); }},
        {"mul f32", 12 * n, [&] { return mul(x, yv); }},
        {"relu f32", 8 * n, [&] { return relu(x); }},
        {"cast f32->bf16", 6 * n, [&] { return x.to(DType::bf16); }},
        {"cast bf16->f32", 6 * n, [&] { return xb.to(DType::f32); }},
        {"add bf16", 6 * n, [&] { return add(xb, xb); }},
    };
    for (const Op& op : ops) {
      Json row{{"op", op.name}, {"elements", a.elements}};
      try {
        Tensor r;
        const double sec = time_median(d, a.iters, [&] { r = op.f(); });
        row["ms"] = sec * 1e3;
        row["gbps"] = op.bytes / sec / 1e9;
      } catch (const Error& e) { row["error"] = e.what(); }
      ew.push_back(row);
    }
  }
  j["elementwise"] = ew;
  return j;
}

}  // namespace

void add_bench_kernels(CLI::App* bench) {
  auto a = std::make_shared<KernelBenchArgs>();
  auto* cmd = bench->add_subcommand("kernels",
                                    "GEMM TFLOP/s per dtype and element-wise bandwidth through the public "
                                    "ops (twin: bench/pytorch/bench_kernels.py)");
  cmd->add_option("--device", a->device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--m", a->m, "GEMM rows (0 = 8192 on a GPU, 1024 on the CPU)");
  cmd->add_option("--n", a->n, "GEMM columns (0 = m)");
  cmd->add_option("--k", a->k, "GEMM inner size (0 = m)");
  cmd->add_option("--elements", a->elements, "element-wise tensor size (0 = 2^28 on a GPU, 2^24 on the CPU)");
  cmd->add_option("--iters", a->iters, "timed repetitions, median reported (0 = 20 on a GPU, 3 on the CPU)");
  cmd->add_option("--dtypes", a->dtypes, "GEMM dtypes: f32, tf32, f16, bf16")->delimiter(',');
  cmd->add_option("--json", a->json, "also write the JSON object to this file");
  cmd->callback([a] {
    const std::string line = run_kernels(*a).dump();
    if (!a->json.empty()) {
      FILE* f = std::fopen(a->json.c_str(), "w");
      MP_CHECK(f != nullptr, "bench kernels: cannot write --json file '", a->json, "'");
      std::fprintf(f, "%s\n", line.c_str());
      std::fclose(f);
    }
    std::printf("%s\n", line.c_str());
  });
}

}  // namespace mixprec

// Throughput of the oneDNN CPU backend: square matmuls and ResNet-like conv2d passes, f32 against bf16,
// through the same raw-pointer API the Tensor layer calls (so conv timings include the reorders between the
// caller's plain NCHW/OIHW tensors and oneDNN's preferred layouts).
//
// Build: the bench_matmul_conv target, or by hand against the oneDNN 3.2 that scripts/setup.sh installs:
//          g++ -std=c++20 -O3 -fopenmp -Iinclude -Isrc -I.deps/onednn/include bench/bench_matmul_conv.cpp
//            src/backend/cpu/onednn/{common,matmul,conv}.cpp src/core/*.cpp -L.deps/onednn/lib -ldnnl
//            -Wl,-rpath,$PWD/.deps/onednn/lib -o bench_matmul_conv
// Run:   OMP_NUM_THREADS=2 ./bench_matmul_conv [matmul] [conv] [--filter NAME_PART] [--min-time SECONDS]
// Prints markdown tables of TFLOP/s (median over repeats after warm-up) and the bf16/f32 ratio.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/onednn/conv.hpp"
#include "backend/cpu/onednn/matmul.hpp"
#include "mp/core/half.hpp"

namespace {

using mp::DType;
using namespace mp::backend::cpu;

double g_min_time = 0.4;  // seconds of timed repeats per measurement (at least 5 repeats)
std::string g_filter;     // run only the rows whose name contains this
bool selected(const std::string& name) { return g_filter.empty() || name.find(g_filter) != std::string::npos; }

// Median seconds of f() after two warm-up calls (the first one builds and caches the primitives).
double median_seconds(const std::function<void()>& f) {
  f();
  f();
  std::vector<double> times;
  double total = 0;
  while (times.size() < 5 || (total < g_min_time && times.size() < 1000)) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    times.push_back(s);
    total += s;
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

// A buffer of `count` elements of `dtype` filled with small pseudo-random values.
std::vector<uint8_t> random_buffer(DType dtype, size_t count, uint32_t seed) {
  std::vector<uint8_t> bytes(count * mp::dtype_size(dtype));
  uint32_t state = seed * 2654435761u + 1;
  for (size_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    const float v = static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
    if (dtype == DType::bf16) {
      const mp::BFloat16 h(v);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    } else {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  }
  return bytes;
}

double tflops(double flops, double seconds) { return flops / seconds * 1e-12; }

void bench_matmul() {
  std::printf("\n### matmul C = A*B (square, contiguous; bf16 = bf16 inputs and output, f32 accumulation)\n\n");
  std::printf("| m=n=k | f32 TFLOP/s | bf16 TFLOP/s | bf16/f32 | f32 kernel | bf16 kernel |\n");
  std::printf("|---:|---:|---:|---:|---|---|\n");
  for (int64_t s : {256, 512, 1024, 2048}) {
    if (!selected(std::to_string(s))) continue;
    double t[2];
    std::string impl[2];
    int i = 0;
    for (DType dt : {DType::f32, DType::bf16}) {
      const MatmulArgs args = MatmulArgs::contiguous(1, s, s, s, dt, dt);
      const auto a = random_buffer(dt, s * s, 1), b = random_buffer(dt, s * s, 2);
      auto c = random_buffer(dt, s * s, 3);
      t[i] = tflops(2.0 * s * s * s, median_seconds([&] { matmul(args, a.data(), b.data(), c.data()); }));
      impl[i++] = matmul_impl_info(args);
    }
    std::printf("| %lld | %.3f | %.3f | %.2fx | %s | %s |\n", static_cast<long long>(s), t[0], t[1], t[1] / t[0],
                impl[0].c_str(), impl[1].c_str());
    std::fflush(stdout);
  }
}

struct ConvShape {
  const char* name;
  Conv2dArgs args;
};

Conv2dArgs conv(int64_t n, int64_t c, int64_t hw, int64_t oc, int64_t k, int64_t stride, int64_t pad) {
  Conv2dArgs a;
  a.n = n, a.c = c, a.h = a.w = hw, a.oc = oc, a.kh = a.kw = k;
  a.stride_h = a.stride_w = stride, a.pad_h = a.pad_w = pad;
  return a;
}

void bench_conv() {
  const ConvShape shapes[] = {
      {"stem 3->64, 32x32, 3x3", conv(32, 3, 32, 64, 3, 1, 1)},
      {"64->64, 32x32, 3x3", conv(32, 64, 32, 64, 3, 1, 1)},
      {"128->128, 16x16, 3x3", conv(32, 128, 16, 128, 3, 1, 1)},
      {"256->256, 8x8, 3x3", conv(32, 256, 8, 256, 3, 1, 1)},
      {"512->512, 4x4, 3x3", conv(32, 512, 4, 512, 3, 1, 1)},
      {"128->256, 16x16, 1x1 s2", conv(32, 128, 16, 256, 1, 2, 0)},
  };
  std::printf(
      "\n### conv2d, batch 32, NCHW/OIHW in and out (reorders included; bf16 = bf16 input, weight and "
      "output, f32 weight gradient)\n\n");
  std::printf("| shape | pass | f32 TFLOP/s | bf16 TFLOP/s | bf16/f32 | f32 kernel | bf16 kernel |\n");
  std::printf("|---|---|---:|---:|---:|---|---|\n");
  for (const ConvShape& shape : shapes) {
    if (!selected(shape.name)) continue;
    double t[2][4] = {};
    std::string impl[2][3];
    const Conv2dArgs& g = shape.args;
    const double flops = 2.0 * g.n * g.oc * g.out_h() * g.out_w() * (g.c / g.groups) * g.kh * g.kw;
    for (int d = 0; d < 2; ++d) {
      Conv2dArgs a = shape.args;
      a.src_dtype = a.dst_dtype = d == 0 ? DType::f32 : DType::bf16;
      const size_t src_n = a.n * a.c * a.h * a.w, dst_n = a.n * a.oc * a.out_h() * a.out_w();
      const size_t wei_n = a.oc * (a.c / a.groups) * a.kh * a.kw;
      const auto src = random_buffer(a.src_dtype, src_n, 1), wei = random_buffer(a.src_dtype, wei_n, 2);
      const auto bias = random_buffer(DType::f32, a.oc, 3), diff_dst = random_buffer(a.dst_dtype, dst_n, 4);
      auto dst = random_buffer(a.dst_dtype, dst_n, 5), diff_src = random_buffer(a.src_dtype, src_n, 6);
      auto diff_wei = random_buffer(DType::f32, wei_n, 7), diff_bias = random_buffer(DType::f32, a.oc, 8);
      auto fwd = [&] { conv2d_forward(a, src.data(), wei.data(), bias.data(), dst.data()); };
      auto bwd_d = [&] { conv2d_backward_data(a, diff_dst.data(), wei.data(), diff_src.data()); };
      auto bwd_w = [&] { conv2d_backward_weights(a, src.data(), diff_dst.data(), diff_wei.data(), diff_bias.data()); };
      t[d][0] = median_seconds(fwd);
      t[d][1] = median_seconds(bwd_d);
      t[d][2] = median_seconds(bwd_w);
      t[d][3] = median_seconds([&] { fwd(), bwd_d(), bwd_w(); });
      impl[d][0] = conv2d_impl_info(a, ConvPass::forward, true);
      impl[d][1] = conv2d_impl_info(a, ConvPass::backward_data);
      impl[d][2] = conv2d_impl_info(a, ConvPass::backward_weights, true);
    }
    const char* passes[] = {"forward", "backward data", "backward weights", "fwd+bwd total"};
    for (int p = 0; p < 4; ++p) {
      const double f = p == 3 ? 3 * flops : flops, t32 = tflops(f, t[0][p]), t16 = tflops(f, t[1][p]);
      std::printf("| %s | %s | %.3f | %.3f | %.2fx | %s | %s |\n", p == 0 ? shape.name : "", passes[p], t32, t16,
                  t16 / t32, p < 3 ? impl[0][p].c_str() : "", p < 3 ? impl[1][p].c_str() : "");
    }
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool run_matmul = false, run_conv = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "matmul") {
      run_matmul = true;
    } else if (arg == "conv") {
      run_conv = true;
    } else if (arg == "--filter" && i + 1 < argc) {
      g_filter = argv[++i];
    } else if (arg == "--min-time" && i + 1 < argc) {
      g_min_time = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [matmul] [conv] [--filter NAME_PART] [--min-time SECONDS]\n", argv[0]);
      return 2;
    }
  }
  if (!run_matmul && !run_conv) run_matmul = run_conv = true;
  const char* threads = std::getenv("OMP_NUM_THREADS");
  std::printf("# mixprec oneDNN CPU backend benchmark (OMP_NUM_THREADS=%s)\n", threads ? threads : "unset");
  try {
    if (run_matmul) bench_matmul();
    if (run_conv) bench_conv();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}

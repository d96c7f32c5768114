// CPU pooling and batch-norm kernels in GB/s against a plain copy (memcpy) of the input's bytes, measured in
// the same run and interleaved with each case (so machine load hits both alike; compare the ratios).
// Bytes counted = bytes read + bytes written, each tensor once (the minimum traffic of the op).
// Kernels are called through the backend slots on preallocated tensors (no allocation or autograd).
// Besides wall-clock time the process CPU time is measured: with OMP_NUM_THREADS=1 it is the time the kernel
// ran on a core, which other processes sharing the machine do not inflate (the "cpu" columns; with more
// threads it also counts OpenMP spin-waiting, so use the wall-clock columns on an idle machine).
// Usage: bench_pool_norm [repeats=21] [filter substring]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/norm_kernels.hpp"
#include "backend/pool_kernels.hpp"
#include "mp/mp.hpp"

using namespace mp;

namespace {

// Wall-clock and process CPU seconds of one call.
struct Times {
  double wall, cpu;
};

double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

Times time_once(const std::function<void()>& fn) {
  const double c0 = cpu_now();
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {wall, cpu_now() - c0};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median times of `fn` and of `ref`, run alternately `repeats` times after one warm-up of each.
std::pair<Times, Times> median_pair(const std::function<void()>& fn, const std::function<void()>& ref, int repeats) {
  fn();
  ref();
  std::vector<double> fw, fc, rw, rc;
  for (int r = 0; r < repeats; ++r) {
    const Times a = time_once(fn), b = time_once(ref);
    fw.push_back(a.wall);
    fc.push_back(a.cpu);
    rw.push_back(b.wall);
    rc.push_back(b.cpu);
  }
  return {{median(fw), median(fc)}, {median(rw), median(rc)}};
}

// Parallel memcpy of `bytes` bytes in chunks (like STREAM copy).
void parallel_copy(char* dst, const char* src, int64_t bytes) {
  constexpr int64_t kChunk = 1 << 16;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < bytes; i += kChunk)
    std::memcpy(dst + i, src + i, static_cast<size_t>(std::min(kChunk, bytes - i)));
}

std::string shape_text(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 21;
  const std::string filter = argc > 2 ? argv[2] : "";
  std::printf(
      "# pooling / batch-norm kernels: %d threads, median of %d, GB/s = (bytes read + written) / time;\n"
      "# 'copy' = memcpy of the input's bytes measured alternately with each case\n\n",
      omp_get_max_threads(), repeats);
  std::printf(
      "| kernel | shape | dtype | ms | GB/s | copy GB/s | %% of copy | cpu ms | %% of copy (cpu) |\n"
      "|---|---|---|---:|---:|---:|---:|---:|---:|\n");

  const std::vector<Shape> shapes = {{128, 32, 28, 28}, {128, 64, 14, 14}, {128, 256, 7, 7}};
  backend::Pool2dWindow w2;
  w2.kernel = {2, 2};
  w2.stride = {2, 2};
  const Device cpu = kCPU;
  manual_seed(1);
  for (const Shape& s : shapes) {
    const int64_t N = s[0], C = s[1], H = s[2], W = s[3];
    const int64_t numel = N * C * H * W, pooled = N * C * (H / 2) * (W / 2), planes = N * C;
    for (DType dt : {DType::f32, DType::bf16}) {
      const auto es = static_cast<double>(dtype_size(dt));
      const Tensor x = randn(s).to(dt), dy = randn(s).to(dt), dx = empty(s, {.dtype = dt});
      const Shape ps{N, C, H / 2, W / 2};
      const Tensor pout = empty(ps, {.dtype = dt}), pidx = empty(ps, {.dtype = DType::i32}), pdy = randn(ps).to(dt);
      const Tensor aout = empty({N, C, 1, 1}, {.dtype = dt}), ady = randn({N, C, 1, 1}).to(dt);
      const Tensor x3 = x.reshape({N, C, H * W}), dy3 = dy.reshape({N, C, H * W}), dx3 = dx.reshape({N, C, H * W});
      const Tensor y3 = empty({N, C, H * W}, {.dtype = dt});
      const Tensor mean = empty({C}), var = empty({C}), invstd = empty({C}), bw = rand({C}, {}, 0.5, 1.5),
                   bb = randn({C}), dw = empty({C}), db = empty({C});
      backend::max_pool2d_forward_kernel.get(cpu)(pout, pidx, x, w2);  // indices for the backward case
      backend::batch_norm_forward_kernel.get(cpu)(y3, mean, var, invstd, x3, bw, bb, true, 1e-5, Tensor(), false);
      std::vector<char> src(static_cast<size_t>(numel * es)), dst(src.size());
      std::memset(src.data(), 1, src.size());
      std::memset(dst.data(), 0, dst.size());
      const auto copy = [&] { parallel_copy(dst.data(), src.data(), static_cast<int64_t>(src.size())); };

      struct Case {
        std::string name;
        double bytes;
        std::function<void()> fn;
      };
      const double X = static_cast<double>(numel) * es, P = static_cast<double>(pooled) * es;
      const double A = static_cast<double>(planes) * es;
      const std::vector<Case> cases = {
          {"max_pool2d 2x2/2 fwd", X + P + 4.0 * static_cast<double>(pooled),
           [&] { backend::max_pool2d_forward_kernel.get(cpu)(pout, pidx, x, w2); }},
          {"max_pool2d 2x2/2 bwd", P + 4.0 * static_cast<double>(pooled) + X,
           [&] { backend::max_pool2d_backward_kernel.get(cpu)(dx, pdy, pidx); }},
          {"avg_pool2d 2x2/2 fwd", X + P, [&] { backend::avg_pool2d_forward_kernel.get(cpu)(pout, x, w2, true); }},
          {"avg_pool2d 2x2/2 bwd", P + X, [&] { backend::avg_pool2d_backward_kernel.get(cpu)(dx, pdy, w2, true); }},
          {"adaptive_avg_pool2d 1x1 fwd", X + A,
           [&] { backend::adaptive_avg_pool2d_forward_kernel.get(cpu)(aout, x); }},
          {"adaptive_avg_pool2d 1x1 bwd", A + X,
           [&] { backend::adaptive_avg_pool2d_backward_kernel.get(cpu)(dx, ady); }},
          {"batch_norm train fwd", 2 * X,
           [&] {
             backend::batch_norm_forward_kernel.get(cpu)(y3, mean, var, invstd, x3, bw, bb, true, 1e-5, Tensor(),
                                                         false);
           }},
          {"batch_norm train bwd", 3 * X,
           [&] {
             backend::batch_norm_backward_kernel.get(cpu)(dx3, dw, db, dy3, x3, mean, invstd, bw, true, Tensor(),
                                                          Tensor());
           }},
      };
      for (const Case& c : cases) {
        if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
        const auto [t, tc] = median_pair(c.fn, copy, repeats);
        const double gbs = c.bytes / t.wall / 1e9, copy_gbs = 2.0 * X / tc.wall / 1e9;
        const double cpu_ratio = (c.bytes / t.cpu) / (2.0 * X / tc.cpu);
        std::printf("| %s | %s | %s | %.3f | %.1f | %.1f | %.0f%% | %.3f | %.0f%% |\n", c.name.c_str(),
                    shape_text(s).c_str(), dtype_name(dt), t.wall * 1e3, gbs, copy_gbs, 100.0 * gbs / copy_gbs,
                    t.cpu * 1e3, 100.0 * cpu_ratio);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

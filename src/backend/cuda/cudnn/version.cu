// Which cuDNN this process runs (runtime.hpp: cudnn_summary): the version compiled against, the one
// loaded, the CUDA runtime that one was built for, and the folders its libraries were loaded from.
// Note [one cuDNN install]: cuDNN 9 dlopens its sub-libraries (libcudnn_engines_*, libcudnn_graph, ...)
// at run time; a toolkit copy and PyTorch's wheel copy side by side can mix, so the folders of every
// libcudnn*.so mapped into the process are listed and more than one is called out.
#include <atomic>
#include <set>
#include <string>

#include "backend/cuda/runtime.hpp"

#if defined(MP_HAVE_CUDNN)
#include <cudnn.h>

#include <fstream>
#endif

namespace mp::backend::cuda {

namespace {
std::atomic<int64_t> g_conv_calls{0}, g_conv_nhwc{0}, g_conv_fallbacks{0}, g_conv_graph{0};
}  // namespace

void count_cudnn_conv_call(bool nhwc, bool fallback, bool graph) {
  g_conv_calls.fetch_add(1, std::memory_order_relaxed);
  if (nhwc) g_conv_nhwc.fetch_add(1, std::memory_order_relaxed);
  if (fallback) g_conv_fallbacks.fetch_add(1, std::memory_order_relaxed);
  if (graph) g_conv_graph.fetch_add(1, std::memory_order_relaxed);
}

CudnnConvCounts cudnn_conv_counters() {
  return {g_conv_calls.load(std::memory_order_relaxed), g_conv_nhwc.load(std::memory_order_relaxed),
          g_conv_fallbacks.load(std::memory_order_relaxed), g_conv_graph.load(std::memory_order_relaxed)};
}

#if defined(MP_HAVE_CUDNN)
namespace {

std::string cudnn_version_str(size_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

// The folders of the libcudnn*.so files mapped into this process (from /proc/self/maps).
std::set<std::string> cudnn_library_dirs() {
  std::set<std::string> dirs;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const size_t base = path.rfind('/');
    if (path.compare(base + 1, 8, "libcudnn") == 0) dirs.insert(path.substr(0, base));
  }
  return dirs;
}

}  // namespace

std::string cudnn_summary() {
  const size_t loaded = cudnnGetVersion();
  std::string s = "cuDNN " + cudnn_version_str(loaded) + " loaded (built against " + cudnn_version_str(CUDNN_VERSION) +
                  "; its CUDA runtime " + std::to_string(cudnnGetCudartVersion() / 1000) + "." +
                  std::to_string(cudnnGetCudartVersion() % 1000 / 10) + ")";
  if (loaded < static_cast<size_t>(CUDNN_VERSION))
    s += "; OLDER than the headers mixprec was built with: put the newer libcudnn first on the library path";
  const std::set<std::string> dirs = cudnn_library_dirs();
  if (!dirs.empty()) {
    s += dirs.size() == 1 ? "; from " : "; from SEVERAL folders (Note [one cuDNN install]):";
    for (const std::string& d : dirs) s += (dirs.size() == 1 ? "" : " ") + d;
  }
  return s;
}
#else
std::string cudnn_summary() { return "not built with cuDNN (no cudnn.h at configure time): no convolution kernels"; }
#endif

}  // namespace mp::backend::cuda

// The CUDA caching allocator: every cuda tensor's bytes come from here.
//
// Note [CUDA caching allocator]: cudaMalloc/cudaFree are slow (cudaFree synchronises the whole
// device), so freed blocks are kept and handed to the next request of the same size class
// (allocator.hpp: 512 B steps below 1 MiB, 2 MiB steps above) on the same device. Blocks are never
// split or merged. Stream semantics: all of a device's work runs on its one stream (Note [one stream
// per device] in runtime.hpp), so a block freed on the host while kernels that use it are still
// queued may be reused at once: the new user's work is queued behind them. Code that ever queues
// work on another stream must synchronise before its tensors are freed (or this allocator must learn
// per-stream free lists).
//
// Statistics are exact and per device: `allocated` counts the bytes requested by live allocations,
// `reserved` the bytes obtained with cudaMalloc (live or cached). When cudaMalloc fails, the
// device's cached blocks are released and the request retried once before the out-of-memory error.
//
// Which device: the Allocator interface carries no device, so a request is served on the calling
// thread's current device (Tensor::to(Device) makes the target current with a DeviceGuard), and
// stats()/reset_peak_stats() report the current device. A freed block goes back to the device it
// came from whatever the current device is.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cuda/allocator.hpp"
#include "backend/cuda/runtime.hpp"
#include "mp/core/error.hpp"
#include "mp/memory/allocator.hpp"

namespace mp::backend::cuda {
namespace {

// "512 B", "1.50 KiB", "2.00 GiB".
std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024.0 && u < 6) {
    b /= 1024.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, units[u]);
  return buf;
}

class CachingAllocator final : public memory::Allocator {
 public:
  void* allocate(size_t bytes) override {
    MP_CHECK(device_count() > 0, "allocate on cuda: there is no CUDA device: ", no_device_reason(),
             ". Run on a machine with an NVIDIA GPU and driver, or keep tensors on the CPU");
    const int dev = current_device();
    std::lock_guard<std::mutex> lock(mu_);
    memory::MemoryStats& s = stats_of(dev);
    if (bytes > kMaxAllocation) throw_oom(dev, bytes);
    if (bytes == 0) {
      ++s.num_allocs;
      return nullptr;
    }
    const size_t size = round_allocation_size(bytes);
    void* p = nullptr;
    auto it = free_.find({dev, size});
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else {
      p = malloc_block(dev, size, bytes);
      s.reserved += static_cast<int64_t>(size);
      s.peak_reserved = std::max(s.peak_reserved, s.reserved);
    }
    live_[p] = Block{dev, size};
    s.allocated += static_cast<int64_t>(bytes);
    s.peak_allocated = std::max(s.peak_allocated, s.allocated);
    ++s.num_allocs;
    return p;
  }

  void deallocate(void* p, size_t bytes) override {
    if (p == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      // Called from destructors, so no exception: report the bug and leave the memory alone.
      std::fprintf(stderr,
                   "mixprec internal error (please report): CUDA allocator asked to free %p, which it "
                   "did not allocate\n",
                   p);
      return;
    }
    const Block b = it->second;
    live_.erase(it);
    free_[{b.device, b.size}].push_back(p);
    stats_of(b.device).allocated -= static_cast<int64_t>(bytes);
  }

  memory::MemoryStats stats() const override {
    if (device_count() == 0) return {};
    const int dev = current_device();
    std::lock_guard<std::mutex> lock(mu_);
    return dev < static_cast<int>(stats_.size()) ? stats_[static_cast<size_t>(dev)] : memory::MemoryStats{};
  }

  void reset_peak_stats() override {
    if (device_count() == 0) return;
    const int dev = current_device();
    std::lock_guard<std::mutex> lock(mu_);
    memory::MemoryStats& s = stats_of(dev);
    s.peak_allocated = s.allocated;
    s.peak_reserved = s.reserved;
  }

  void empty_cache() override {
    if (device_count() == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (int dev = 0; dev < device_count(); ++dev) release_cached(dev);
  }

 private:
  struct Block {
    int device;
    size_t size;
  };

  memory::MemoryStats& stats_of(int dev) {
    if (stats_.size() <= static_cast<size_t>(dev)) stats_.resize(static_cast<size_t>(dev) + 1);
    return stats_[static_cast<size_t>(dev)];
  }

  // cudaMalloc a block on the current device (== dev); on failure release the cache and retry once.
  // Called with mu_ held.
  void* malloc_block(int dev, size_t size, size_t requested) {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached(dev);
      e = cudaMalloc(&p, size);
    }
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw_oom(dev, requested);
    }
    if (e != cudaSuccess) throw_cuda_error(static_cast<int>(e), "cudaMalloc (caching allocator)", __FILE__, __LINE__);
    return p;
  }

  // cudaFree every cached block of dev. Called with mu_ held.
  void release_cached(int dev) {
    DeviceGuard g(Device(DeviceType::cuda, dev), "empty_cache");
    for (auto it = free_.begin(); it != free_.end();) {
      if (it->first.first != dev) {
        ++it;
        continue;
      }
      for (void* p : it->second) {
        MP_CUDA_CHECK(cudaFree(p));
        stats_of(dev).reserved -= static_cast<int64_t>(it->first.second);
      }
      it = free_.erase(it);
    }
  }

  // Called with mu_ held.
  [[noreturn]] void throw_oom(int dev, size_t requested) {
    const memory::MemoryStats& s = stats_of(dev);
    std::string device_mem;
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) {
      device_mem = " (" + format_bytes(static_cast<double>(free_b)) + " free of " +
                   format_bytes(static_cast<double>(total_b)) + ")";
    } else {
      (void)cudaGetLastError();
    }
    MP_FAIL("CUDA out of memory: tried to allocate ", format_bytes(static_cast<double>(requested)), " (allocated ",
            format_bytes(static_cast<double>(s.allocated)), ", reserved ",
            format_bytes(static_cast<double>(s.reserved)), ") on cuda:", dev, device_mem,
            "; use a smaller batch or model, or free tensors you no longer need");
  }

  mutable std::mutex mu_;
  std::vector<memory::MemoryStats> stats_;                     // per device index
  std::unordered_map<void*, Block> live_;                      // blocks in use
  std::map<std::pair<int, size_t>, std::vector<void*>> free_;  // cached blocks per (device, size)
};

// Registered at load time; constructing it touches no CUDA API (the driver is first asked on the
// first allocation). Leaked on purpose: tensors freed during static destruction still call it
// (Note [leaked runtime state] in runtime.cu).
const bool kRegistered = [] {
  memory::register_allocator(DeviceType::cuda, new CachingAllocator());
  return true;
}();

}  // namespace
}  // namespace mp::backend::cuda

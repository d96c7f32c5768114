#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "mp/core/error.hpp"
#include "mp/memory/allocator.hpp"

namespace mp::memory {
namespace {

// Note [CPU allocator]: small blocks (< kCacheMin) come from aligned_alloc, which glibc recycles
// well. Large blocks are cached: glibc hands them back to the kernel with munmap, so every fresh
// activation of a training step would page-fault its memory again (measured here: a 128 MiB
// element-wise op ran at ~25% of copy bandwidth from faults alone). Freed large blocks wait in
// per-size-class free lists (4 classes per power of two, so at most 25% slack) and are reused by
// the next request of the class. `allocated` counts requested bytes; `reserved` counts blocks held
// from the system, in use or cached. empty_cache() returns the cached ones.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kCacheMin = size_t{1} << 16;

  ~CpuAllocator() override { empty_cache(); }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    if (bytes >= kCacheMin) {
      const size_t cls = size_class(bytes);
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = free_.find(cls);
        if (it != free_.end() && !it->second.empty()) {
          p = it->second.back();
          it->second.pop_back();
          cached_ -= static_cast<int64_t>(cls);
        }
      }
      if (p == nullptr) {
        p = system_alloc(cls, bytes);
        update_peak(peak_reserved_, reserved_.fetch_add(static_cast<int64_t>(cls)) + static_cast<int64_t>(cls));
      }
    } else {
      const size_t rounded = (bytes + 63) / 64 * 64;
      p = rounded == 0 ? nullptr : system_alloc(rounded, bytes);
    }
    const int64_t now = allocated_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
    update_peak(peak_, now);
    num_allocs_.fetch_add(1, std::memory_order_relaxed);
    return p;
  }

  void deallocate(void* p, size_t bytes) override {
    allocated_.fetch_sub(static_cast<int64_t>(bytes));
    if (bytes >= kCacheMin) {
      const size_t cls = size_class(bytes);
      std::lock_guard<std::mutex> lock(mu_);
      free_[cls].push_back(p);
      cached_ += static_cast<int64_t>(cls);
      return;
    }
    std::free(p);
  }

  MemoryStats stats() const override {
    MemoryStats s;
    s.allocated = allocated_.load();
    s.peak_allocated = peak_.load();
    s.reserved = reserved_.load();
    s.peak_reserved = peak_reserved_.load();
    s.num_allocs = num_allocs_.load();
    return s;
  }

  void reset_peak_stats() override {
    peak_.store(allocated_.load());
    peak_reserved_.store(reserved_.load());
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [cls, blocks] : free_) {
      for (void* p : blocks) std::free(p);
      reserved_.fetch_sub(static_cast<int64_t>(cls) * static_cast<int64_t>(blocks.size()));
    }
    free_.clear();
    cached_ = 0;
  }

 private:
  // Round up to one of 4 classes per power of two (64-byte multiples).
  static size_t size_class(size_t bytes) {
    size_t pow2 = size_t{1} << (63 - __builtin_clzll(bytes));
    if (pow2 == bytes) return bytes;
    const size_t step = pow2 / 4;
    return (bytes + step - 1) / step * step;
  }
  void* system_alloc(size_t rounded, size_t requested) {
    void* p = std::aligned_alloc(64, rounded);
    MP_CHECK(p != nullptr, "out of host memory: could not allocate ", requested,
             " bytes (currently allocated: ", allocated_.load(), " bytes); use a smaller batch size or model");
    return p;
  }
  static void update_peak(std::atomic<int64_t>& peak, int64_t now) {
    int64_t old = peak.load(std::memory_order_relaxed);
    while (now > old && !peak.compare_exchange_weak(old, now)) {}
  }
  std::atomic<int64_t> allocated_{0}, peak_{0}, reserved_{0}, peak_reserved_{0}, num_allocs_{0};
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  int64_t cached_ = 0;
};

std::array<Allocator*, kNumDeviceTypes>& registry() {
  static CpuAllocator cpu;
  static std::array<Allocator*, kNumDeviceTypes> r{&cpu, nullptr};
  return r;
}

}  // namespace

Allocator& allocator(Device d) {
  Allocator* a = registry()[static_cast<int>(d.type)];
  MP_CHECK(a != nullptr, "no allocator for device ", d.str(),
           ": mixprec was built without that backend or no such device is present");
  return *a;
}

void register_allocator(DeviceType t, Allocator* a) { registry()[static_cast<int>(t)] = a; }

MemoryStats memory_stats(Device d) { return allocator(d).stats(); }
void reset_peak_memory_stats(Device d) { allocator(d).reset_peak_stats(); }

DataPtr::DataPtr(Device d, size_t bytes) : bytes_(bytes), device_(d) { ptr_ = allocator(d).allocate(bytes); }

DataPtr::DataPtr(Device d, void* external, size_t bytes, std::shared_ptr<void> keep_alive)
    : ptr_(external), bytes_(bytes), device_(d), external_(std::move(keep_alive)) {
  if (!external_) external_ = std::shared_ptr<void>(nullptr, [](void*) {});
}

DataPtr::DataPtr(DataPtr&& o) noexcept
    : ptr_(o.ptr_), bytes_(o.bytes_), device_(o.device_), external_(std::move(o.external_)) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

DataPtr& DataPtr::operator=(DataPtr&& o) noexcept {
  if (this != &o) {
    release();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    device_ = o.device_;
    external_ = std::move(o.external_);
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

DataPtr::~DataPtr() { release(); }

void DataPtr::release() {
  if (external_) {
    external_.reset();
  } else if (ptr_ != nullptr || bytes_ != 0) {
    allocator(device_).deallocate(ptr_, bytes_);
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace mp::memory

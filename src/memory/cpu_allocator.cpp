#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "mp/core/error.hpp"
#include "mp/memory/allocator.hpp"

namespace mp::memory {
namespace {

// Note [CPU allocator]: large host buffers come straight from aligned_alloc (glibc keeps big
// blocks in mmap and recycles small ones itself), so the CPU allocator only counts. The counters
// are atomics: allocation happens on data-loader threads too.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = rounded == 0 ? nullptr : std::aligned_alloc(64, rounded);
    MP_CHECK(rounded == 0 || p != nullptr, "out of host memory: could not allocate ", bytes,
             " bytes (currently allocated: ", allocated_.load(), " bytes); use a smaller batch size or model");
    const int64_t now = allocated_.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
    update_peak(peak_, now);
    num_allocs_.fetch_add(1, std::memory_order_relaxed);
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    std::free(p);
    allocated_.fetch_sub(static_cast<int64_t>(bytes));
  }
  MemoryStats stats() const override {
    MemoryStats s;
    s.allocated = allocated_.load();
    s.peak_allocated = peak_.load();
    s.reserved = s.allocated;
    s.peak_reserved = s.peak_allocated;
    s.num_allocs = num_allocs_.load();
    return s;
  }
  void reset_peak_stats() override { peak_.store(allocated_.load()); }
  void empty_cache() override {}

 private:
  static void update_peak(std::atomic<int64_t>& peak, int64_t now) {
    int64_t old = peak.load(std::memory_order_relaxed);
    while (now > old && !peak.compare_exchange_weak(old, now)) {
    }
  }
  std::atomic<int64_t> allocated_{0}, peak_{0}, num_allocs_{0};
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

#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "mp/core/device.hpp"

namespace mp::memory {

/// Byte counters of one device's allocator.
struct MemoryStats {
  int64_t allocated = 0;       ///< bytes held by live tensors now
  int64_t peak_allocated = 0;  ///< highest `allocated` since the last reset_peak_stats
  int64_t reserved = 0;        ///< bytes obtained from the system (>= allocated when caching)
  int64_t peak_reserved = 0;   ///< highest `reserved` since the last reset_peak_stats
  int64_t num_allocs = 0;      ///< allocations served since start
};

/// A per-device allocator. Every tensor byte goes through one, so peaks are exact.
class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Allocate `bytes` (64-byte aligned on CPU); throws mp::Error when out of memory.
  virtual void* allocate(size_t bytes) = 0;
  /// Return memory obtained from allocate(bytes).
  virtual void deallocate(void* p, size_t bytes) = 0;
  /// Current counters.
  virtual MemoryStats stats() const = 0;
  /// Set the peaks to the current values.
  virtual void reset_peak_stats() = 0;
  /// Give cached blocks back to the system.
  virtual void empty_cache() = 0;
};

/// The allocator of a device (CPU always; CUDA when the backend registered one).
Allocator& allocator(Device d);

/// Register the allocator of a device type (the CUDA backend calls this).
void register_allocator(DeviceType t, Allocator* a);

/// Shorthand: allocator(d).stats().
MemoryStats memory_stats(Device d = kCPU);
/// Shorthand: allocator(d).reset_peak_stats().
void reset_peak_memory_stats(Device d = kCPU);

/// Owning pointer to device bytes, released through the allocator it came from.
class DataPtr {
 public:
  DataPtr() = default;
  /// Allocate `bytes` on device d.
  DataPtr(Device d, size_t bytes);
  /// Wrap memory owned elsewhere (not freed by mixprec); `keep_alive` holds the owner.
  DataPtr(Device d, void* external, size_t bytes, std::shared_ptr<void> keep_alive);
  DataPtr(const DataPtr&) = delete;
  DataPtr& operator=(const DataPtr&) = delete;
  DataPtr(DataPtr&& o) noexcept;
  DataPtr& operator=(DataPtr&& o) noexcept;
  ~DataPtr();
  /// Raw pointer.
  void* get() const { return ptr_; }
  /// Size in bytes.
  size_t size() const { return bytes_; }
  /// Device of the memory.
  Device device() const { return device_; }

 private:
  void release();
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Device device_{};
  std::shared_ptr<void> external_;
};

}  // namespace mp::memory

#pragma once
// Shared oneDNN plumbing for the CPU backend: engine and stream, dtype mapping, error conversion,
// the primitive cache, per-thread scratch buffers and the record of which kernel oneDNN chose.

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "backend/key_hash.hpp"
#include "mp/core/dtype.hpp"
#include "mp/core/error.hpp"

static_assert(DNNL_VERSION_MAJOR == 3,
              "mixprec is written for the oneDNN 3.x API, and these oneDNN headers are another major version "
              "(Debian's libdnnl-dev is 2.6): run scripts/setup.sh, which installs oneDNN 3.2 into .deps/onednn, "
              "and configure again");

namespace mp::backend::cpu {

/// The process-wide oneDNN CPU engine (created on first use; initialisation is thread-safe).
dnnl::engine& onednn_engine();

/// The in-order oneDNN stream of the calling thread on onednn_engine(); see Note [one stream per thread].
dnnl::stream& onednn_stream();

/// oneDNN data type of a compute dtype: f32, bf16 and f16. Anything else throws mp::Error naming `op` and the
/// dtype. oneDNN 3.x has f16 matmul/convolution kernels only on CPUs with AVX512-FP16 or AMX-FP16 (elsewhere
/// primitive creation fails, or picks a reference kernel: see onednn_reference_impl()).
dnnl::memory::data_type to_dnnl(DType t, const char* op = "oneDNN");

/// The version of the oneDNN library loaded at run time, e.g. "3.2.0".
std::string onednn_version();

/// Whether `impl` (a primitive descriptor's impl_info_str()) names one of oneDNN's reference (slow, plain C++)
/// implementations: it starts with "ref" or contains "ref:" / "gemm:ref", e.g. "ref:any", "ref_int8:any",
/// "gemm:ref". For matmul and convolution; not for RNNs, whose gemm-based generic driver is also named "ref"
/// (oneDNN 3.2's f32 LSTM on AVX-512 says "ref" and runs on its jit sgemm).
bool onednn_reference_impl(const std::string& impl);

/// Throw mp::Error for a failed oneDNN call, naming the call, oneDNN's status and message and `context`.
[[noreturn]] void throw_onednn_error(const char* call, const dnnl::error& e, const std::string& context);

/// Run f() and return its result; a dnnl::error becomes mp::Error naming `call` and describe() (which is
/// only evaluated on failure, so building the shape string costs nothing on the fast path).
template <class D, class F>
decltype(auto) onednn_check(const char* call, D&& describe, F&& f) {
  try {
    return f();
  } catch (const dnnl::error& e) { throw_onednn_error(call, e, describe()); }
}

/// Remember `impl` (a primitive descriptor's impl_info_str()) as the newest primitive of kind `op`.
void record_onednn_impl(const std::string& op, const std::string& impl);

/// impl_info_str() of the most recently created primitive of kind `op` ("matmul", "conv_fwd", "conv_bwd_data",
/// "conv_bwd_weights"), e.g. "brg:avx512_core_amx"; "" when none was created yet.
std::string onednn_last_impl(const char* op);

/// Per-thread scratch buffer slots; a call uses each slot at most once at a time.
enum class ScratchSlot : int { scratchpad, input0, input1, output, staging, shared_input, count };

/// A 64-byte aligned per-thread buffer of at least `bytes` for `slot`: grow-only, reused across calls,
/// freed at thread exit. The pointer is valid until the next call for the same slot on this thread.
void* thread_scratch(ScratchSlot slot, size_t bytes);

/// Size in bytes of a oneDNN memory descriptor (0 for an empty one).
inline size_t md_bytes(const dnnl::memory::desc& md) { return md.get_size(); }

/// Wrap a caller-owned buffer (not copied, not owned) as dnnl::memory with descriptor `md`.
inline dnnl::memory wrap_memory(const dnnl::memory::desc& md, const void* ptr) {
  return dnnl::memory(md, onednn_engine(), const_cast<void*>(ptr));
}

/// Counters of a primitive cache (for tests and `mixprec info`).
struct CacheStats {
  size_t size = 0;    ///< plans held now
  size_t hits = 0;    ///< lookups that found a plan
  size_t misses = 0;  ///< lookups that built a plan
};

/// Default number of plans a PrimitiveCache keeps.
inline constexpr size_t kPrimitiveCacheCapacity = 512;

/// Thread-safe LRU cache of immutable plans (oneDNN primitive + descriptors + reorders) keyed by a POD key:
/// a plan is built once per key and shared; plans evicted while in use stay alive through shared_ptr.
template <class Key, class Plan, class Hash = KeyHash<Key>>
class PrimitiveCache {
 public:
  /// A cache keeping at most `capacity` plans, evicting the least recently used.
  explicit PrimitiveCache(size_t capacity = kPrimitiveCacheCapacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  /// The plan for `key`; on a miss make() builds it (outside the lock, so slow builds do not serialise
  /// lookups of other keys; if two threads race, the first plan inserted wins).
  template <class Make>
  std::shared_ptr<const Plan> get_or_create(const Key& key, Make&& make) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = index_.find(key); it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        ++hits_;
        return it->second->second;
      }
    }
    std::shared_ptr<const Plan> plan = std::make_shared<const Plan>(make());
    std::lock_guard<std::mutex> lock(mu_);
    ++misses_;
    if (auto it = index_.find(key); it != index_.end()) return it->second->second;
    lru_.emplace_front(key, std::move(plan));
    index_.emplace(key, lru_.begin());
    while (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return lru_.front().second;
  }

  /// Current counters.
  CacheStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return CacheStats{lru_.size(), hits_, misses_};
  }

  /// Drop every plan (plans in use stay alive until their users finish).
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    index_.clear();
    lru_.clear();
  }

 private:
  using Entry = std::pair<Key, std::shared_ptr<const Plan>>;
  mutable std::mutex mu_;
  size_t capacity_;
  size_t hits_ = 0;
  size_t misses_ = 0;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<Key, typename std::list<Entry>::iterator, Hash> index_;
};

}  // namespace mp::backend::cpu

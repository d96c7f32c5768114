#pragma once
// The hash of the backends' plan-cache keys (oneDNN primitives, cuBLASLt, cuDNN plans).
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace mp::backend {

/// Hash of a cache key's bytes. Keys must have no padding (e.g. std::array<int64_t, N> or structs of int64_t),
/// so equal keys hash equally.
template <class Key>
struct KeyHash {
  static_assert(std::has_unique_object_representations_v<Key>, "cache keys must not contain padding bytes");
  /// FNV-1a over the object representation.
  size_t operator()(const Key& key) const noexcept {
    const auto* p = reinterpret_cast<const unsigned char*>(&key);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < sizeof(Key); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

}  // namespace mp::backend

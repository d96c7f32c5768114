#include "mp/autocast/autocast.hpp"

#include <unordered_map>

#include "mp/autograd/node.hpp"

namespace mp::amp {
namespace {

struct CacheKey {
  const TensorImpl* impl;
  uint64_t version;
  DType dtype;
  bool operator==(const CacheKey& o) const { return impl == o.impl && version == o.version && dtype == o.dtype; }
};
struct CacheKeyHash {
  size_t operator()(const CacheKey& k) const {
    return std::hash<const void*>()(k.impl) ^ (k.version * 0x9e3779b97f4a7c15ULL) ^ static_cast<size_t>(k.dtype);
  }
};

struct State {
  AutocastOptions options{.dtype = DType::bf16, .enabled = false};
  int depth = 0;           // enabled guards currently open
  bool suspended = false;  // inside an op that already cast, or inside backward
  // Note [autocast cast cache]: an f32 parameter used by several ops in one forward pass is cast
  // once. The entry keeps the source alive (so the pointer key cannot be reused) and is keyed by
  // version, so an in-place update inside the region yields a fresh cast.
  std::unordered_map<CacheKey, std::pair<Tensor, Tensor>, CacheKeyHash> cache;
};

thread_local State t_state;

}  // namespace

Autocast::Autocast(const AutocastOptions& options) : prev_(t_state.options), prev_depth_(t_state.depth) {
  MP_CHECK(!options.enabled || is_low_precision(options.dtype), "Autocast: dtype must be f16 or bf16, got ",
           dtype_name(options.dtype), "; use enabled=false for an f32 region");
  t_state.options = options;
  if (options.enabled) ++t_state.depth;
}

Autocast::~Autocast() {
  t_state.options = prev_;
  t_state.depth = prev_depth_;
  if (t_state.depth == 0) t_state.cache.clear();
}

AutocastSuspend::AutocastSuspend() : prev_(t_state.suspended) { t_state.suspended = true; }
AutocastSuspend::~AutocastSuspend() { t_state.suspended = prev_; }

bool autocast_active(DeviceType device) {
  return t_state.options.enabled && !t_state.suspended && t_state.options.device == device;
}
bool autocast_active_any() { return t_state.options.enabled && !t_state.suspended; }
DType autocast_dtype() { return t_state.options.dtype; }
size_t autocast_cache_size() { return t_state.cache.size(); }

Tensor autocast_cast(const Tensor& t, DType target) {
  if (!t.defined() || t.dtype() == target || !is_floating(t.dtype())) return t;
  const bool cacheable = t_state.options.cache_enabled && t.is_leaf() && t.requires_grad() && t_state.depth > 0 &&
                         autograd::grad_mode_enabled();
  if (!cacheable) return t.to(target);
  const CacheKey key{t.impl_ptr().get(), t.version(), target};
  auto it = t_state.cache.find(key);
  if (it != t_state.cache.end()) return it->second.second;
  Tensor c = t.to(target);
  t_state.cache.emplace(key, std::make_pair(t, c));
  return c;
}

namespace detail {

DType autocast_target(CastPolicy p, DType low, DType widest) {
  switch (p) {
    case CastPolicy::lower: return low;
    case CastPolicy::fp32: return widest == DType::f64 ? DType::f64 : DType::f32;
    case CastPolicy::promote: return widest;
    case CastPolicy::none: return widest;
  }
  return widest;
}

}  // namespace detail

}  // namespace mp::amp

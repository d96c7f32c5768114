#pragma once
// Autocast: a thread-local, nestable guard under which the ops of include/mp/ops cast their inputs
// according to the policy table (mp/autocast/policy.hpp). This header depends only on the tensor layer so
// that ops/ can consult it (the higher amp pieces, GradScaler and initialize, live above nn/optim).
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "mp/autocast/policy.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::amp {

/// Options of an Autocast region (PyTorch's torch.autocast arguments).
struct AutocastOptions {
  DType dtype = DType::bf16;            ///< the low-precision type of "lower" ops: f16 or bf16
  bool enabled = true;                  ///< false switches a region back to plain dtypes (nestable)
  DeviceType device = DeviceType::cpu;  ///< which device's tensors are autocast
  bool cache_enabled = true;            ///< cache casts of f32 leaf parameters for the outermost region
};

/// RAII region in which ops autocast their inputs. Nestable: an inner guard may change dtype or
/// disable autocast; the cast cache lives until the outermost enabled guard ends (one cast of each
/// parameter per step, not per use).
class Autocast {
 public:
  explicit Autocast(const AutocastOptions& options = {});
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  AutocastOptions prev_;
  int prev_depth_;
};

/// RAII: autocast is off inside (ops do this while running after casting; backward does it too).
class AutocastSuspend {
 public:
  AutocastSuspend();
  ~AutocastSuspend();
  AutocastSuspend(const AutocastSuspend&) = delete;
  AutocastSuspend& operator=(const AutocastSuspend&) = delete;

 private:
  bool prev_;
};

/// Whether ops on `device` tensors should consult the policy on this thread now.
bool autocast_active(DeviceType device);
/// Whether any autocast region is active (and not suspended) on this thread.
bool autocast_active_any();
/// The low-precision dtype of the innermost active region.
DType autocast_dtype();
/// Number of cached parameter casts (for tests and diagnostics).
size_t autocast_cache_size();

/// Cast `t` to `target` for autocast: leaves requiring grad (parameters) go through the cache of the
/// outermost region, keyed by tensor and version; other tensors are cast directly. Non-floating
/// tensors and tensors already of `target` are returned unchanged.
Tensor autocast_cast(const Tensor& t, DType target);

namespace detail {

/// The dtype every floating tensor input of an op of class `p` should have, given the inputs' dtypes.
DType autocast_target(CastPolicy p, DType low, DType widest);

inline void widest_of(DType& w, bool& any, const Tensor& t) {
  if (t.defined() && is_floating(t.dtype())) {
    w = any ? promote_types(w, t.dtype()) : t.dtype();
    any = true;
  }
}
inline void widest_of(DType& w, bool& any, const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts) widest_of(w, any, t);
}
template <class T>
void widest_of(DType&, bool&, const T&) {}

inline bool eligible(CastPolicy p, DType dt) {
  // "lower" leaves f64 alone (as PyTorch: double is asked for explicitly); the others cast any float.
  return is_floating(dt) && !(p == CastPolicy::lower && dt == DType::f64);
}

inline Tensor cast_arg(CastPolicy p, DType target, const Tensor& t) {
  if (!t.defined() || !eligible(p, t.dtype())) return t;
  return autocast_cast(t, target);
}
inline std::vector<Tensor> cast_arg(CastPolicy p, DType target, const std::vector<Tensor>& ts) {
  std::vector<Tensor> r;
  r.reserve(ts.size());
  for (const Tensor& t : ts) r.push_back(cast_arg(p, target, t));
  return r;
}
template <class T>
const T& cast_arg(CastPolicy, DType, const T& v) {
  return v;
}

}  // namespace detail

/// Cast the Tensor (and std::vector<Tensor>) arguments for `op` per the policy and call
/// fn(args...) with autocast suspended, so nested ops run as written.
template <class Fn, class... Args>
decltype(auto) autocast_call(Op op, DeviceType device, Fn&& fn, const Args&... args) {
  const CastPolicy p = cast_policy(op, device);
  DType widest = DType::f32;
  bool any = false;
  (detail::widest_of(widest, any, args), ...);
  const DType target = detail::autocast_target(p, autocast_dtype(), any ? widest : DType::f32);
  auto casted = std::make_tuple(detail::cast_arg(p, target, args)...);
  AutocastSuspend suspend;
  return std::apply(fn, casted);
}

}  // namespace mp::amp

/// First statement of an op that consults the autocast policy: when autocast is active for the
/// device of `first_tensor`, re-enter the op (name `fn`) with cast arguments and return its result.
#define MP_AUTOCAST(op_enum, fn, first_tensor, ...)                                                                   \
  do {                                                                                                                \
    if ((first_tensor).defined() && ::mp::amp::autocast_active((first_tensor).device().type))                         \
      return ::mp::amp::autocast_call(                                                                                \
          op_enum, (first_tensor).device().type, [](const auto&... mp_args) { return fn(mp_args...); }, __VA_ARGS__); \
  } while (0)

#pragma once
#include <array>
#include <atomic>
#include <span>
#include <type_traits>
#include <vector>

#include "mp/core/device.hpp"
#include "mp/core/error.hpp"
#include "mp/core/profiler.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// Profiler label of a kernel call: the slot's name. Families whose first argument selects the op
/// (element-wise, reductions) overload this in their header, found by argument-dependent lookup.
template <class... A>
const char* kernel_label(const char* slot, const A&...) {
  return slot;
}

namespace kernel_call_detail {
inline double operand_bytes(const Tensor& t) {
  return t.defined() ? static_cast<double>(t.numel()) * static_cast<double>(t.element_size()) : 0.0;
}
inline double operand_bytes(std::span<const Tensor> ts) {
  double b = 0;
  for (const Tensor& t : ts) b += operand_bytes(t);
  return b;
}
inline double operand_bytes(const std::vector<Tensor>& ts) { return operand_bytes(std::span<const Tensor>(ts)); }
template <class T>
requires(!std::is_convertible_v<const T&, std::span<const Tensor>>) double operand_bytes(const T&) { return 0.0; }

/// Observer of kernel calls (installed by ObserveKernelCalls); nullptr: none.
using KernelObserver = void (*)(const char* op, const char* label, Device device);
inline std::atomic<KernelObserver> g_observer{nullptr};

// Closes a profiled region even when the kernel throws.
struct ProfileRegion {
  const char* label;
  double bytes;
  int64_t start = profiler::detail::begin();
  ~ProfileRegion() { profiler::detail::end(label, start, bytes); }
};

// The same for a kernel queued on a device: timed by timestamps on its stream (Note [device time in the
// profiler] in mp/core/profiler.hpp).
struct DeviceProfileRegion {
  const char* label;
  double bytes;
  uint64_t id;
  ~DeviceProfileRegion() { profiler::detail::end_device(label, id, bytes); }
};
}  // namespace kernel_call_detail

template <class Fn>
class KernelCall;

/// A kernel as returned by KernelSlot::get: calls the function, timing it when the profiler is on.
template <class R, class... A>
class KernelCall<R(A...)> {
 public:
  constexpr KernelCall(R (*f)(A...), const char* op, Device device = Device()) : f_(f), op_(op), device_(device) {}
  /// Run the kernel.
  R operator()(A... args) const {
    if (!profiler::enabled()) return f_(std::forward<A>(args)...);
    const char* label = kernel_label(op_, args...);
    if (const auto observe = kernel_call_detail::g_observer.load(std::memory_order_relaxed))
      observe(op_, label, device_);
    const double bytes = (0.0 + ... + kernel_call_detail::operand_bytes(args));
    if (!device_.is_cpu() && profiler::detail::has_device_timer()) {
      kernel_call_detail::DeviceProfileRegion region{label, bytes, profiler::detail::begin_device(device_.index)};
      return f_(std::forward<A>(args)...);
    }
    kernel_call_detail::ProfileRegion region{label, bytes};
    return f_(std::forward<A>(args)...);
  }
  /// The raw function.
  R (*function() const)(A...) { return f_; }

 private:
  R (*f_)(A...);
  const char* op_;
  Device device_;
};

/// One op family's kernels, one per device type. Constant-initialised (constexpr constructor, plain
/// pointer array), so backends may fill it from static registrars in any translation unit.
template <class Fn>
class KernelSlot {
 public:
  explicit constexpr KernelSlot(const char* op) : op_(op) {}
  /// Install the kernel for a device type.
  void set(DeviceType d, Fn* f) { fns_[static_cast<int>(d)] = f; }
  /// The kernel for device d (profiled when the profiler is on); throws naming op and device when
  /// none is registered.
  KernelCall<Fn> get(Device d) const {
    Fn* f = fns_[static_cast<int>(d.type)];
#if defined(MP_HAVE_CUDA)
    MP_CHECK(f != nullptr, "no kernel for op '", op_, "' on device ", d.str(),
             d.is_cuda() ? ": the CUDA backend has no kernel for this op yet (run it on the CPU)" : "");
#else
    MP_CHECK(f != nullptr, "no kernel for op '", op_, "' on device ", d.str(),
             d.is_cuda() ? ": mixprec was built without the CUDA backend (configure with -DMP_CUDA=ON)" : "");
#endif
    return KernelCall<Fn>(f, op_, d);
  }
  /// The raw function for device type d, or nullptr when none is registered (optional hooks). A hook found
  /// counts as a call for an observer (ObserveKernelCalls).
  Fn* find(DeviceType d) const {
    Fn* f = fns_[static_cast<int>(d)];
    if (f != nullptr && profiler::enabled())
      if (const auto observe = kernel_call_detail::g_observer.load(std::memory_order_relaxed))
        observe(op_, op_, Device(d));
    return f;
  }
  /// Op family name.
  const char* op() const { return op_; }

 private:
  const char* op_;
  std::array<Fn*, kNumDeviceTypes> fns_{};
};

/// One registration: a slot's op name and a device type it has a kernel for.
struct RegisteredKernel {
  const char* op;
  DeviceType device;
};

/// Every registration made by KernelRegistrar, in load order: complete once static initialisation is over
/// (before main). Tests enumerate it to check that every kernel has a case (tests/ops/test_op_table.cpp).
inline std::vector<RegisteredKernel>& registered_kernels() {
  static std::vector<RegisteredKernel> list;  // function-local: filled from static registrars in any order
  return list;
}

/// Registers a kernel at load time: `static KernelRegistrar r(slot, DeviceType::cpu, &fn);`.
struct KernelRegistrar {
  template <class Fn>
  KernelRegistrar(KernelSlot<Fn>& slot, DeviceType d, Fn* f) {
    slot.set(d, f);
    registered_kernels().push_back({slot.op(), d});
  }
};

/// RAII, for tests: while alive, `observe(op, label, device)` is called before every kernel call made through a
/// KernelSlot (op: the slot's name; label: the profiler's label, e.g. the element-wise op) and for every hook
/// found with find(). The observer is consulted on the profiled path only, so this turns the profiler on for
/// the scope (restoring its state after): an unobserved, unprofiled call still costs one relaxed atomic load.
/// One at a time; the observer may be called from any thread.
class ObserveKernelCalls {
 public:
  explicit ObserveKernelCalls(kernel_call_detail::KernelObserver observe) : profiling_(profiler::enabled()) {
    kernel_call_detail::g_observer.store(observe, std::memory_order_relaxed);
    profiler::enable(true);
  }
  ~ObserveKernelCalls() {
    profiler::enable(profiling_);
    kernel_call_detail::g_observer.store(nullptr, std::memory_order_relaxed);
  }
  ObserveKernelCalls(const ObserveKernelCalls&) = delete;
  ObserveKernelCalls& operator=(const ObserveKernelCalls&) = delete;

 private:
  bool profiling_;
};

}  // namespace mp::backend

#define MP_CONCAT_INNER(a, b) a##b
#define MP_CONCAT(a, b) MP_CONCAT_INNER(a, b)
/// Register kernel `fn` for `slot` on device type `dev` (in a backend .cpp/.cu file).
#define MP_REGISTER_KERNEL(slot, dev, fn) \
  static ::mp::backend::KernelRegistrar MP_CONCAT(mp_kernel_registrar_, __LINE__)(slot, dev, fn)

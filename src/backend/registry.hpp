#pragma once
#include <array>

#include "mp/core/device.hpp"
#include "mp/core/error.hpp"

namespace mp::backend {

/// One op family's kernels, one per device type. Constant-initialised (constexpr constructor, plain
/// pointer array), so backends may fill it from static registrars in any translation unit.
template <class Fn>
class KernelSlot {
 public:
  explicit constexpr KernelSlot(const char* op) : op_(op) {}
  /// Install the kernel for a device type.
  void set(DeviceType d, Fn* f) { fns_[static_cast<int>(d)] = f; }
  /// The kernel for device d; throws naming op and device when none is registered.
  Fn* get(Device d) const {
    Fn* f = fns_[static_cast<int>(d.type)];
    MP_CHECK(f != nullptr, "no kernel for op '", op_, "' on device ", d.str(),
             d.is_cuda() ? ": mixprec was built without the CUDA backend (configure with -DMP_CUDA=ON)" : "");
    return f;
  }
  /// Op family name.
  const char* op() const { return op_; }

 private:
  const char* op_;
  std::array<Fn*, kNumDeviceTypes> fns_{};
};

/// Registers a kernel at load time: `static KernelRegistrar r(slot, DeviceType::cpu, &fn);`.
struct KernelRegistrar {
  template <class Fn>
  KernelRegistrar(KernelSlot<Fn>& slot, DeviceType d, Fn* f) {
    slot.set(d, f);
  }
};

}  // namespace mp::backend

#define MP_CONCAT_INNER(a, b) a##b
#define MP_CONCAT(a, b) MP_CONCAT_INNER(a, b)
/// Register kernel `fn` for `slot` on device type `dev` (in a backend .cpp/.cu file).
#define MP_REGISTER_KERNEL(slot, dev, fn) \
  static ::mp::backend::KernelRegistrar MP_CONCAT(mp_kernel_registrar_, __LINE__)(slot, dev, fn)

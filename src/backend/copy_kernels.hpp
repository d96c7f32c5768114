#pragma once
#include <memory>

#include "backend/registry.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// dst = src byte for byte across devices (host<->device, device<->device). Both contiguous, same
/// dtype and element count, on different devices (or the same CUDA device). Registered by the
/// backend of the non-CPU side (CUDA: src/backend/cuda/copy.cu); Tensor::to(Device) calls the slot
/// of whichever device is CUDA. On return the host side is done: a copy to the CPU has completed;
/// a copy to a device no longer needs its source and is ordered before later work on that device.
using CopyBetweenDevicesKernel = void(const Tensor& dst, const Tensor& src);
inline constinit KernelSlot<CopyBetweenDevicesKernel> copy_between_devices_kernel{"copy_between_devices"};

/// Makes device d the calling thread's current device until the returned handle is released (then the
/// previous one is current again); throws naming `op` when d does not exist, with the reason (no device, or
/// a build without CUDA). Tensor::to(Device) holds one around its allocations and copies, since the CUDA
/// allocator serves the current device. A hook, not a kernel: called through find() (not profiled), and
/// registered for DeviceType::cuda in every build (src/backend/cuda/device_scope.cpp), so that the tensor
/// and ops layers need not include backend/cuda/runtime.hpp.
using DeviceScopeKernel = std::shared_ptr<void>(Device d, const char* op);
inline constinit KernelSlot<DeviceScopeKernel> device_scope_kernel{"device_scope"};

}  // namespace mp::backend

#pragma once
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

}  // namespace mp::backend

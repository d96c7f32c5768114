// The device_scope hook (copy_kernels.hpp): a DeviceGuard behind a type-erased handle. Compiled in every
// build: DeviceGuard is implemented by runtime.cu with the CUDA backend and by unavailable.cpp without it
// (which throws the reason), so the hook says the same as the guard would.
#include <memory>

#include "backend/copy_kernels.hpp"
#include "backend/cuda/runtime.hpp"

namespace mp::backend::cuda {
namespace {

std::shared_ptr<void> device_scope(Device d, const char* op) { return std::make_shared<DeviceGuard>(d, op); }

MP_REGISTER_KERNEL(device_scope_kernel, DeviceType::cuda, &device_scope);

}  // namespace
}  // namespace mp::backend::cuda

// The CUDA runtime layer of a build WITHOUT the CUDA backend (MP_CUDA=OFF, or no nvcc at configure
// time): there are no CUDA devices, and every request for one throws an mp::Error that says why.
// A CUDA "allocator" is registered too, so `empty(..., {.device = cuda})` gives that message rather
// than a generic "no allocator". CUDA builds compile runtime.cu and allocator.cu instead.
#if !defined(MP_HAVE_CUDA)

#include "backend/cuda/runtime.hpp"
#include "mp/core/error.hpp"
#include "mp/memory/allocator.hpp"

namespace mp::backend::cuda {
namespace {

constexpr const char* kReason =
    "mixprec was built without the CUDA backend (configured with -DMP_CUDA=OFF or without nvcc); rebuild "
    "with -DMP_CUDA=ON on a machine with the CUDA toolkit";

[[noreturn]] void fail(const std::string& what) { MP_FAIL(what, ": there is no CUDA device: ", kReason); }

// Every allocation fails with the reason; there is nothing to count or cache.
class UnavailableAllocator final : public memory::Allocator {
 public:
  void* allocate(size_t) override { fail("allocate on cuda"); }
  void deallocate(void*, size_t) override {}
  memory::MemoryStats stats() const override { return {}; }
  void reset_peak_stats() override {}
  void empty_cache() override {}
};

const bool kRegistered = [] {
  static UnavailableAllocator a;  // holds nothing: no tensor ever has memory from it
  memory::register_allocator(DeviceType::cuda, &a);
  return true;
}();

}  // namespace

int device_count() { return 0; }
std::string no_device_reason() { return kReason; }

void check_device(Device d, const char* op) {
  MP_CHECK(d.is_cuda(), op, ": expected a CUDA device, got ", d.str());
  MP_FAIL(op, ": ", d.str(), " requested, but there is no CUDA device: ", kReason);
}

CudnnConvCounts cudnn_conv_counters() { return {}; }
std::string sticky_device_error() { return ""; }

int runtime_version() { return 0; }
int driver_version() { return 0; }

const DeviceProperties& device_properties(int index) { fail("device_properties(cuda:" + std::to_string(index) + ")"); }
void synchronize(Device d) { check_device(d, "synchronize"); }
int current_device() { fail("current_device"); }
void set_device(int index) { fail("set_device(cuda:" + std::to_string(index) + ")"); }
void DeviceGuard::restore_device_noexcept(int) noexcept {}

}  // namespace mp::backend::cuda

#endif  // !MP_HAVE_CUDA

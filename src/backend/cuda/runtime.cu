// The CUDA runtime layer (see runtime.hpp): device discovery with a cached reason when there is
// none, properties, the per-device stream, the error messages of failed CUDA calls, and the
// profiler's CUDA-event timestamps.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/cuda/runtime.hpp"
#include "mp/core/error.hpp"
#include "mp/core/profiler.hpp"

namespace mp::backend::cuda {
namespace {

// "13.0" from 13000.
std::string version_str(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// What to do about a failed call, by error.
const char* remedy(cudaError_t e) {
  switch (e) {
    case cudaErrorMemoryAllocation:
      return "free tensors you no longer need, call empty_cache(), or use a smaller batch";
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
      return "install or update the NVIDIA driver (nvidia-smi must list the GPU), or keep tensors on the CPU";
    case cudaErrorInvalidDevice:
      return "use a device index below the number of visible GPUs (see `mixprec info`, CUDA_VISIBLE_DEVICES)";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorMisalignedAddress:
    case cudaErrorIllegalInstruction:
    case cudaErrorHardwareStackError:
      return "a kernel faulted and the CUDA context is unusable: restart the process; rerun with "
             "MP_CUDA_SYNC_CHECK=1 (names the kernel) or under compute-sanitizer to find it (please report it)";
    default:
      return "check the call's arguments; errors of asynchronous work surface at a later call, so rerun "
             "with MP_CUDA_SYNC_CHECK=1 to see where it starts";
  }
}

// Per-device state, created once with the device count. Note [leaked runtime state]: these objects
// (and the streams in them) are never destroyed: tensors released during static destruction still
// reach them, and the CUDA runtime may already be unloaded at that point; the driver reclaims
// everything when the process exits.
struct PendingCheck {
  const void* word;
  std::function<void(unsigned long long)> fail;
};

struct DeviceState {
  std::once_flag stream_once;
  cudaStream_t stream = nullptr;
  std::once_flag props_once;
  DeviceProperties props;
  std::mutex checks_mu;  // Note [deferred device checks]
  std::vector<PendingCheck> checks;
};

struct Runtime {
  int count = 0;
  std::string reason;
  std::vector<DeviceState*> devices;
};

const Runtime& runtime() {
  static const Runtime* rt = [] {
    auto* r = new Runtime();
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // an error here is not sticky: clear it so later calls start clean
      const std::string what = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
      if (e == cudaErrorInsufficientDriver) {
        r->reason =
            "no NVIDIA driver, or one older than the CUDA " + version_str(CUDART_VERSION) + " runtime (" + what + ")";
      } else if (e == cudaErrorNoDevice) {
        r->reason = "no CUDA-capable GPU is visible (" + what + "); check nvidia-smi and CUDA_VISIBLE_DEVICES";
      } else {
        r->reason = "cudaGetDeviceCount failed (" + what + ")";
      }
      n = 0;
    } else if (n == 0) {
      r->reason = "the CUDA runtime reports no GPU";
    }
    r->count = n;
    for (int i = 0; i < n; ++i) r->devices.push_back(new DeviceState());
    return r;
  }();
  return *rt;
}

DeviceState& state(int index) {
  check_device(Device(DeviceType::cuda, index), "cuda");
  return *runtime().devices[static_cast<size_t>(index)];
}

}  // namespace

void throw_cuda_error(int status, const char* call, const char* file, int line) {
  const auto e = static_cast<cudaError_t>(status);
  (void)cudaGetLastError();  // clear a non-sticky error so the next call does not report it again
  ::mp::detail::throw_error(file, line,
                            ::mp::detail::str_cat("CUDA call ", call, " failed: ", cudaGetErrorName(e), " (",
                                                  cudaGetErrorString(e), "); ", remedy(e)));
}

void sync_check(const char* what, const char* file, int line, const char* function) {
  const cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  ::mp::detail::throw_error(
      file, line,
      ::mp::detail::str_cat("CUDA sync check (MP_CUDA_SYNC_CHECK=1): the device failed in or before ", what, " at ",
                            file, ":", line, " in ", function, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
                            "); ", remedy(e)));
}

std::string sticky_device_error() {
  if (device_count() == 0) return "";
  const cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return "";
  (void)cudaGetLastError();
  // A non-sticky error is cleared by cudaGetLastError; a sticky one stays and fails this call again.
  if (cudaDeviceSynchronize() == cudaSuccess) return "";
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

int device_count() { return runtime().count; }

std::string no_device_reason() { return runtime().reason; }

void check_device(Device d, const char* op) {
  MP_CHECK(d.is_cuda(), op, ": expected a CUDA device, got ", d.str());
  const Runtime& rt = runtime();
  MP_CHECK(rt.count > 0, op, ": ", d.str(), " requested, but there is no CUDA device: ", rt.reason,
           ". Run on a machine with an NVIDIA GPU and driver, or keep tensors on the CPU");
  MP_CHECK(d.index >= 0 && d.index < rt.count, op, ": ", d.str(), " does not exist: this machine has ", rt.count,
           " CUDA device(s), cuda:0 to cuda:", rt.count - 1, " (see `mixprec info`)");
}

int runtime_version() {
  int v = 0;
  if (cudaRuntimeGetVersion(&v) != cudaSuccess) {
    (void)cudaGetLastError();
    return CUDART_VERSION;
  }
  return v;
}

int driver_version() {
  int v = 0;
  if (cudaDriverGetVersion(&v) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

const DeviceProperties& device_properties(int index) {
  DeviceState& s = state(index);
  std::call_once(s.props_once, [&] {
    cudaDeviceProp p{};
    MP_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
    s.props.index = index;
    s.props.name = p.name;
    s.props.cc_major = p.major;
    s.props.cc_minor = p.minor;
    s.props.total_memory = p.totalGlobalMem;
    s.props.multiprocessors = p.multiProcessorCount;
    s.props.l2_cache_bytes = static_cast<size_t>(p.l2CacheSize);
    s.props.shared_memory_per_block_optin = p.sharedMemPerBlockOptin;
  });
  return s.props;
}

int current_device() {
  MP_CHECK(device_count() > 0, "current_device: there is no CUDA device: ", no_device_reason(),
           ". Run on a machine with an NVIDIA GPU and driver, or keep tensors on the CPU");
  int d = 0;
  MP_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int index) {
  check_device(Device(DeviceType::cuda, index), "set_device");
  MP_CUDA_CHECK(cudaSetDevice(index));
}

void DeviceGuard::restore_device_noexcept(int index) noexcept {
  if (index < 0) return;
  if (cudaSetDevice(index) != cudaSuccess) (void)cudaGetLastError();
}

void synchronize(Device d) {
  DeviceGuard g(d, "synchronize");
  count_host_sync();
  MP_CUDA_CHECK(cudaDeviceSynchronize());
  run_deferred_checks(d.index);
}

void copy_to_host_now(void* host, const void* device_ptr, size_t bytes, cudaStream_t stream) {
  MP_CUDA_CHECK(cudaMemcpyAsync(host, device_ptr, bytes, cudaMemcpyDeviceToHost, stream));
  MP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void read_to_host(void* host, const void* device_ptr, size_t bytes, cudaStream_t stream) {
  count_host_sync();
  copy_to_host_now(host, device_ptr, bytes, stream);
  int device = 0;
  MP_CUDA_CHECK(cudaGetDevice(&device));
  run_deferred_checks(device);
}

void defer_device_check(int device, const void* word, std::function<void(unsigned long long)> fail) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.checks_mu);
  s.checks.push_back({word, std::move(fail)});
}

void run_deferred_checks(int device) {
  DeviceState& s = state(device);
  std::vector<PendingCheck> pending;
  {
    std::lock_guard<std::mutex> lock(s.checks_mu);
    pending.swap(s.checks);
  }
  if (pending.empty()) return;
  DeviceGuard g(Device(DeviceType::cuda, device), "deferred device checks");
  for (const PendingCheck& c : pending) {
    unsigned long long first_bad = 0;
    copy_to_host_now(&first_bad, c.word, sizeof(first_bad), current_stream(device));
    if (first_bad != ~0ULL) c.fail(first_bad);  // throws; the other pending checks are dropped with it
  }
}

cudaStream_t current_stream(int device) {
  DeviceState& s = state(device);
  std::call_once(s.stream_once, [&] {
    DeviceGuard g(Device(DeviceType::cuda, device), "current_stream");
    // Non-blocking: no implicit ordering with the legacy default stream (stream 0), so nothing of
    // mixprec's may use synchronous cudaMemcpy/cudaMemset (they run on stream 0): use *Async on this.
    MP_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  });
  return s.stream;
}

}  // namespace mp::backend::cuda

// ------------------------------------------------------------------ profiler timestamps
// Note [device time in the profiler] (mp/core/profiler.hpp): CUDA events recorded on the device's stream.
// Events are pooled (creating one per kernel call would cost more than many kernels) and, like the rest of
// the runtime state, never destroyed (Note [leaked runtime state]).
namespace mp::backend::cuda {
namespace {

struct TimedEvent {
  cudaEvent_t event = nullptr;
  int device = 0;
};

struct EventPool {
  std::mutex mu;
  std::vector<TimedEvent*> free;
};

EventPool& event_pool() {
  static EventPool* p = new EventPool;
  return *p;
}

void* record_event(int device) {
  TimedEvent* e = nullptr;
  {
    EventPool& p = event_pool();
    std::lock_guard lock(p.mu);
    for (size_t i = p.free.size(); i-- > 0;)
      if (p.free[i]->device == device) {
        e = p.free[i];
        p.free.erase(p.free.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
  }
  DeviceGuard g(Device(DeviceType::cuda, device), "profiler");
  if (e == nullptr) {
    e = new TimedEvent;
    e->device = device;
    MP_CUDA_CHECK(cudaEventCreate(&e->event));  // default flags: with timing
  }
  MP_CUDA_CHECK(cudaEventRecord(e->event, current_stream(device)));
  return e;
}

double event_elapsed_seconds(void* start, void* end) {
  auto* a = static_cast<TimedEvent*>(start);
  auto* b = static_cast<TimedEvent*>(end);
  DeviceGuard g(Device(DeviceType::cuda, b->device), "profiler");
  MP_CUDA_CHECK(cudaEventSynchronize(b->event));
  float ms = 0;
  MP_CUDA_CHECK(cudaEventElapsedTime(&ms, a->event, b->event));
  return static_cast<double>(ms) * 1e-3;
}

void release_event(void* handle) {
  EventPool& p = event_pool();
  std::lock_guard lock(p.mu);
  p.free.push_back(static_cast<TimedEvent*>(handle));
}

constexpr profiler::DeviceTimer kEventTimer{&record_event, &event_elapsed_seconds, &release_event};

// Installed when the library loads, whether or not a GPU is present: the timer is only used for kernels
// called for a CUDA device, which exist only when one is.
const bool g_event_timer_installed = (profiler::set_device_timer(&kEventTimer), true);

}  // namespace
}  // namespace mp::backend::cuda

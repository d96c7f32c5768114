// The CUDA runtime layer: device discovery, the current device, per-device streams, properties and
// error checking.
//
// Two parts. The first is device-neutral (no CUDA headers) and exists in every build, so tensor/,
// system.cpp and the tests can ask "is there a device, and if not why" without the CUDA toolkit:
// runtime.cu implements it in CUDA builds, unavailable.cpp in builds without CUDA (where
// device_count() is 0 and the reason says the backend was not built). The second part uses CUDA
// types and is visible only to sources compiled by nvcc (.cu).
//
// Note [no device is not a crash]: on machines without an NVIDIA driver or GPU, cudaGetDeviceCount
// answers an error (cudaErrorInsufficientDriver on the build machines, cudaErrorNoDevice when
// CUDA_VISIBLE_DEVICES hides every GPU). ANY error there means "no CUDA device": device_count() is
// 0, the reason is kept for messages, and every request for a cuda tensor throws an mp::Error that
// quotes it. The answer is computed once per process and cached.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mp/core/device.hpp"
#include "mp/system.hpp"

namespace mp::backend::cuda {

/// Bytes of one pinned host staging buffer; host<->device copies larger than this go in chunks
/// through two such buffers per device (double buffering).
inline constexpr size_t kStagingChunkBytes = size_t{8} << 20;

/// Number of usable CUDA devices: 0 when the build has no CUDA backend or the runtime reports any
/// error (no driver, no GPU). Cached after the first call; thread-safe.
int device_count();

/// Why device_count() is 0, e.g. "no NVIDIA driver, or one older than the CUDA 13.0 runtime
/// (cudaErrorInsufficientDriver: ...)"; empty when there are devices.
std::string no_device_reason();

/// Throws mp::Error naming `op` unless d is a CUDA device that exists (says why there is none, or
/// how many there are when the index is out of range).
void check_device(Device d, const char* op);

/// The T of `device` (0 <= device < device_count()): one per device, default-constructed with the others on
/// first use and never destroyed (Note [leaked runtime state] in runtime.cu). For the per-device caches,
/// buffers and handles of the CUDA sources.
template <class T>
T& per_device(int device) {
  static const std::vector<T*>* all = [] {
    auto* v = new std::vector<T*>();
    for (int i = 0; i < device_count(); ++i) v->push_back(new T());
    return v;
  }();
  check_device(Device(DeviceType::cuda, device), "per-device state");
  return *(*all)[static_cast<size_t>(device)];
}

/// Note [sync check]: MP_CUDA_SYNC_CHECK=1 makes the CUDA backend wait for the device after every kernel
/// launch and every cuBLASLt / cuDNN call, and throw naming that launch or call (its source file, line
/// and function) when the device reports an error. Without it a faulting kernel surfaces at the next
/// synchronisation, usually an unrelated device-to-host copy, which the message would then name. Slow:
/// for finding a faulting kernel (scripts/gpu-check's first pass runs with it), not for training.
/// Read once per process; "0" or unset is off, "1" is on, anything else is refused with a message.
bool sync_check_enabled();

/// The value of MP_CUDA_SYNC_CHECK `value` (may be null) as a switch; throws mp::Error naming the
/// variable, the value and the two accepted ones for anything but null, "", "0" and "1".
bool parse_sync_check(const char* value);

/// Note [conv layout counters]: cuDNN convolution calls of this process, and how many of the channels-last
/// (NHWC) ones ran in NCHW because cuDNN offered no usable NHWC algorithm (Note [cuDNN convolution
/// layouts] in conv.cu: two extra copies per call). A benchmark reports them, so that a channels-last
/// measurement cannot show NCHW speed unnoticed. Zero in builds without cuDNN. (mp::cudnn_conv_counts is
/// the public face.)
CudnnConvCounts cudnn_conv_counters();

/// Wait for cuda:0's work and return the text of the error it reports when the context is broken (a
/// sticky error: a kernel faulted; every later call of the process fails the same way), else "". For test
/// harnesses, which stop there instead of failing every later case for the same cause. "" without devices.
std::string sticky_device_error();

/// Note [host synchronisation counter]: every time the host waits for a device (a device-to-host copy
/// or read-back, synchronize(), a staging buffer still in flight) counts one; benchmarks report the
/// count per training step (target on the device path: one per optimizer step, the loss-scale check).
/// Process-wide, thread-safe; 0 in builds without CUDA.
void count_host_sync();
int64_t host_sync_count();

/// CUDA runtime version as major*1000 + minor*10 (13000 for 13.0); 0 in builds without CUDA.
int runtime_version();
/// Version of the installed driver's CUDA API, same encoding; 0 when no driver is installed.
int driver_version();

/// What `mixprec info` and kernel tuning need to know about one device.
struct DeviceProperties {
  int index = 0;                             ///< N of cuda:N
  std::string name;                          ///< e.g. "NVIDIA H100 80GB HBM3"
  int cc_major = 0, cc_minor = 0;            ///< compute capability (9.0 for Hopper)
  size_t total_memory = 0;                   ///< bytes of device memory
  int multiprocessors = 0;                   ///< SM count
  size_t l2_cache_bytes = 0;                 ///< L2 cache size
  size_t shared_memory_per_block_optin = 0;  ///< largest dynamic shared memory a block may opt in to
};

/// Properties of cuda:index (queried once, cached); throws when the device does not exist.
const DeviceProperties& device_properties(int index);

/// Wait until all work queued on device d has finished (cudaDeviceSynchronize on d).
void synchronize(Device d);

/// The calling thread's current CUDA device index; throws when there is no device.
int current_device();

/// Make cuda:index the calling thread's current device; throws when it does not exist.
void set_device(int index);

/// RAII: makes a CUDA device current for a scope and restores the previous one; a no-op for cpu.
/// Throws (naming `op`) when the device does not exist, so it doubles as the availability check.
class DeviceGuard {
 public:
  /// Switch to d (when d is a CUDA device).
  explicit DeviceGuard(Device d, const char* op = "cuda") {
    if (!d.is_cuda()) return;
    check_device(d, op);
    const int prev = current_device();
    if (prev != d.index) {
      set_device(d.index);
      prev_ = prev;
    }
  }
  ~DeviceGuard() { restore_device_noexcept(prev_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  // Set the device back without throwing (destructors must not throw); -1 means "unchanged".
  static void restore_device_noexcept(int index) noexcept;
  int prev_ = -1;
};

#if defined(MP_HAVE_CUDA)
/// Throw the mp::Error of a failed CUDA runtime call: names the call, the error (name and text)
/// and what to do. `status` is the cudaError_t value. Clears the thread's non-sticky error state.
[[noreturn]] void throw_cuda_error(int status, const char* call, const char* file, int line);

/// Count one cuDNN convolution call (Note [conv layout counters]): nhwc when asked for in NHWC, fallback
/// when that one ran in NCHW instead, graph when it ran through the graph API.
void count_cudnn_conv_call(bool nhwc, bool fallback, bool graph = false);

/// Which cuDNN runs: the loaded and the compiled version, its CUDA runtime and the folders of its
/// libraries (Note [one cuDNN install] in cudnn/version.cu), or why there is none.
std::string cudnn_summary();

/// Note [sync check]: wait for all work of the current device and throw mp::Error naming `what` (a
/// launch or library call) at file:line in `function` when the device reports an error. Call only
/// when sync_check_enabled().
void sync_check(const char* what, const char* file, int line, const char* function);
#endif

}  // namespace mp::backend::cuda

// The runtime API's part: for .cu files, and for host .cpp files that call the CUDA runtime themselves (the NCCL
// group), which define MP_CUDA_RUNTIME_API before including this header.
#if defined(MP_HAVE_CUDA) && (defined(__CUDACC__) || defined(MP_CUDA_RUNTIME_API))
#include <cuda_runtime_api.h>

#include <functional>

/// Check a CUDA runtime call; on failure throw mp::Error naming the call, the error and a remedy.
#define MP_CUDA_CHECK(call)                                                                                \
  do {                                                                                                     \
    const cudaError_t mp_cuda_status_ = (call);                                                            \
    if (mp_cuda_status_ != cudaSuccess) [[unlikely]]                                                       \
      ::mp::backend::cuda::throw_cuda_error(static_cast<int>(mp_cuda_status_), #call, __FILE__, __LINE__); \
  } while (0)

/// After a kernel launch: throw the launch's error, if any, and in sync-check mode (Note [sync check])
/// wait for the kernel and name it when it faulted.
#define MP_CUDA_CHECK_LAUNCH()                                                        \
  do {                                                                                \
    MP_CUDA_CHECK(cudaGetLastError());                                                \
    if (::mp::backend::cuda::sync_check_enabled()) [[unlikely]]                       \
      ::mp::backend::cuda::sync_check("kernel launch", __FILE__, __LINE__, __func__); \
  } while (0)

namespace mp::backend::cuda {

/// The stream mixprec queues work on for cuda:device: a non-blocking stream created on first use
/// and kept for the process. Note [one stream per device]: every kernel and copy of a device goes
/// to this one stream, so work is ordered and the caching allocator may hand a freed block to the
/// next request at once (its earlier uses are queued before any new one).
cudaStream_t current_stream(int device);

/// Copy `bytes` bytes of device memory to host memory and wait for them (and, by stream order, for the
/// work queued before): a counted host synchronisation (Note [host synchronisation counter]); then the
/// current device's deferred checks run (Note [deferred device checks]).
void read_to_host(void* host, const void* device_ptr, size_t bytes, cudaStream_t stream);

/// The same copy without counting it or running the deferred checks: for the checks' own `fail`.
void copy_to_host_now(void* host, const void* device_ptr, size_t bytes, cudaStream_t stream);

/// Note [deferred device checks]: an op that validates its inputs on the device (embedding indices,
/// class-loss targets) lets its kernels record the first bad flat position in a device word (ULLONG_MAX
/// when all are fine) and registers the word here instead of reading it back at once. The device's next
/// host synchronisation (read_to_host, a device-to-host copy, synchronize()) reads every pending word
/// once its stream has drained and calls the op's `fail` for the first hit, which throws the op's error
/// in the CPU's words. So a training step pays no synchronisation for these checks, and an error
/// surfaces at the step's next read (loss.item(), a copy to the host) before any result leaves the
/// device. `fail` captures what it reads (the word's and the indices' tensors), keeping them alive.
void defer_device_check(int device, const void* word, std::function<void(unsigned long long)> fail);

/// Run and clear the pending checks of `device` (its stream idle); throws the first failing op's error.
void run_deferred_checks(int device);

/// A CUDA event with timing, destroyed at scope exit (for measuring work on a stream).
struct TimingEvent {
  cudaEvent_t e = nullptr;
  TimingEvent() { MP_CUDA_CHECK(cudaEventCreate(&e)); }
  ~TimingEvent() {
    if (e != nullptr && cudaEventDestroy(e) != cudaSuccess) (void)cudaGetLastError();
  }
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;
};

}  // namespace mp::backend::cuda
#endif

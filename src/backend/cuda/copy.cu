// Copies between the host and CUDA devices (the copy_between_devices slot, copy_kernels.hpp).
//
// Note [pinned staging]: host tensors live in pageable memory, which the DMA engines cannot read;
// cudaMemcpy from pageable memory stages through a driver buffer anyway, synchronously. We stage
// explicitly through two pinned buffers per device of kStagingChunkBytes each (cudaHostAlloc,
// allocated on first use and kept), so a large copy is a pipeline: the host fills (or drains) one
// buffer while the DMA engine moves the other. Each buffer has an event recorded after the last
// transfer that used it; the host waits on it before touching the buffer again. Everything runs on
// the device's one stream (Note [one stream per device]), so copies are ordered with the device's
// kernels:
//   host -> device: returns when the last chunk is queued: the host source is no longer needed and
//     later work on the device is queued behind the copy; the staging events protect the buffers.
//   device -> host: returns when the data is in host memory (waits for earlier kernels too).
//   device -> other device: cudaMemcpyPeerAsync after the target's stream is idle (its block may
//     have been used by queued work), then waits for it.
// Note [small uploads do not wait]: a small host -> device copy (a scalar for fill_, an index table,
// the backward seed) goes through a ring of kSmallSlots pinned slots of kSmallCopyBytes, each with its
// event, and the slot index (like the large copies' buffer index) continues across calls. A slot is
// reused kSmallSlots uploads later, whose transfer has normally long finished: the host does not wait
// for the device. (With one buffer per call starting at index 0, every small upload waited for the
// previous one, and through stream order for every kernel queued before it: a host synchronisation per
// fill_.) Waits that do happen are counted (Note [host synchronisation counter] in runtime.hpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/copy_kernels.hpp"
#include "backend/cuda/runtime.hpp"
#include "mp/core/error.hpp"

namespace mp::backend::cuda {
namespace {

// Note [small uploads do not wait].
inline constexpr size_t kSmallCopyBytes = size_t{64} << 10;
inline constexpr size_t kSmallSlots = 32;

struct Staging {
  std::mutex mu;
  void* buf[2] = {nullptr, nullptr};
  cudaEvent_t done[2] = {nullptr, nullptr};
  size_t next_buf = 0;   // the large-copy buffer the next chunk uses
  char* ring = nullptr;  // kSmallSlots slots of kSmallCopyBytes
  cudaEvent_t ring_done[kSmallSlots] = {};
  size_t next_slot = 0;
};

// Wait until event e has happened; counts a host synchronisation only when it had not yet.
void wait_event(cudaEvent_t e) {
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaSuccess) return;
  if (q != cudaErrorNotReady) MP_CUDA_CHECK(q);
  count_host_sync();
  MP_CUDA_CHECK(cudaEventSynchronize(e));
}

// The staging state of each device; never destroyed (Note [leaked runtime state] in runtime.cu).
Staging& staging(int device) { return per_device<Staging>(device); }

// Allocate what is missing (a failed earlier attempt may have left part of it). Called with st.mu
// held and the device current.
void ensure_staging(Staging& st) {
  for (int b = 0; b < 2; ++b) {
    if (st.buf[b] == nullptr) MP_CUDA_CHECK(cudaHostAlloc(&st.buf[b], kStagingChunkBytes, cudaHostAllocPortable));
    if (st.done[b] == nullptr) MP_CUDA_CHECK(cudaEventCreateWithFlags(&st.done[b], cudaEventDisableTiming));
  }
  if (st.ring == nullptr) {
    void* p = nullptr;
    MP_CUDA_CHECK(cudaHostAlloc(&p, kSmallSlots * kSmallCopyBytes, cudaHostAllocPortable));
    st.ring = static_cast<char*>(p);
  }
  for (cudaEvent_t& e : st.ring_done)
    if (e == nullptr) MP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

void host_to_device(char* dst, const char* src, size_t n, int dev) {
  DeviceGuard g(Device(DeviceType::cuda, dev), "to");
  Staging& st = staging(dev);
  std::lock_guard<std::mutex> lock(st.mu);
  ensure_staging(st);
  cudaStream_t stream = current_stream(dev);
  if (n <= kSmallCopyBytes) {  // Note [small uploads do not wait]
    const size_t slot = st.next_slot;
    st.next_slot = (st.next_slot + 1) % kSmallSlots;
    wait_event(st.ring_done[slot]);  // the upload that used this slot kSmallSlots uploads ago
    char* buf = st.ring + slot * kSmallCopyBytes;
    std::memcpy(buf, src, n);
    MP_CUDA_CHECK(cudaMemcpyAsync(dst, buf, n, cudaMemcpyHostToDevice, stream));
    MP_CUDA_CHECK(cudaEventRecord(st.ring_done[slot], stream));
    return;
  }
  for (size_t off = 0; off < n; off += kStagingChunkBytes) {
    const size_t b = st.next_buf;
    st.next_buf ^= 1;
    const size_t len = std::min(kStagingChunkBytes, n - off);
    wait_event(st.done[b]);  // the transfer that last used this buffer is done
    std::memcpy(st.buf[b], src + off, len);
    MP_CUDA_CHECK(cudaMemcpyAsync(dst + off, st.buf[b], len, cudaMemcpyHostToDevice, stream));
    MP_CUDA_CHECK(cudaEventRecord(st.done[b], stream));
  }
}

void device_to_host(char* dst, const char* src, size_t n, int dev) {
  DeviceGuard g(Device(DeviceType::cuda, dev), "to");
  Staging& st = staging(dev);
  std::lock_guard<std::mutex> lock(st.mu);
  ensure_staging(st);
  cudaStream_t stream = current_stream(dev);
  count_host_sync();  // the host waits for the data, and through stream order for the work before it
  const size_t chunks = (n + kStagingChunkBytes - 1) / kStagingChunkBytes;
  // Queue chunk i, then drain chunk i-1 while it transfers. Buffer i&1 last held chunk i-2, which
  // was drained in the previous iteration, and stream order puts this transfer after any earlier
  // one that read the buffer.
  for (size_t i = 0; i <= chunks; ++i) {
    if (i < chunks) {
      const size_t off = i * kStagingChunkBytes;
      MP_CUDA_CHECK(cudaMemcpyAsync(st.buf[i & 1], src + off, std::min(kStagingChunkBytes, n - off),
                                    cudaMemcpyDeviceToHost, stream));
      MP_CUDA_CHECK(cudaEventRecord(st.done[i & 1], stream));
    }
    if (i > 0) {
      const size_t j = i - 1, off = j * kStagingChunkBytes;
      MP_CUDA_CHECK(cudaEventSynchronize(st.done[j & 1]));
      std::memcpy(dst + off, st.buf[j & 1], std::min(kStagingChunkBytes, n - off));
    }
  }
  run_deferred_checks(dev);  // Note [deferred device checks]: before the data is used
}

void device_to_device(char* dst, int dst_dev, const char* src, int src_dev, size_t n) {
  if (dst_dev == src_dev) {
    DeviceGuard g(Device(DeviceType::cuda, dst_dev), "to");
    MP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, current_stream(dst_dev)));
    return;
  }
  count_host_sync();
  {
    DeviceGuard g(Device(DeviceType::cuda, dst_dev), "to");
    MP_CUDA_CHECK(cudaStreamSynchronize(current_stream(dst_dev)));
  }
  DeviceGuard g(Device(DeviceType::cuda, src_dev), "to");
  cudaStream_t stream = current_stream(src_dev);
  MP_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, stream));
  MP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void copy_between_devices(const Tensor& dst, const Tensor& src) {
  MP_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel() && dst.is_contiguous() && src.is_contiguous(),
           "copy_between_devices: expected contiguous tensors of the same dtype and size, got ", dst.describe(),
           " and ", src.describe());
  const size_t n = static_cast<size_t>(dst.numel()) * dst.element_size();
  if (n == 0) return;
  auto* d = static_cast<char*>(dst.raw_data());
  const auto* s = static_cast<const char*>(src.raw_data());
  const Device dd = dst.device(), sd = src.device();
  if (sd.is_cpu() && dd.is_cuda()) {
    host_to_device(d, s, n, dd.index);
  } else if (sd.is_cuda() && dd.is_cpu()) {
    device_to_host(d, s, n, sd.index);
  } else if (sd.is_cuda() && dd.is_cuda()) {
    device_to_device(d, dd.index, s, sd.index, n);
  } else {
    MP_FAIL("copy_between_devices: expected a CUDA device on one side, got ", sd.str(), " -> ", dd.str());
  }
}

MP_REGISTER_KERNEL(copy_between_devices_kernel, DeviceType::cuda, &copy_between_devices);

}  // namespace
}  // namespace mp::backend::cuda

// A process group whose collectives take GPU tensors, through NCCL (include/mp/dist/nccl_group.hpp).
//
// Note [NCCL groups]
// One NCCL communicator per group, over the processes of an existing group (MPI's COMM_WORLD, or the single process):
// rank 0 makes the ncclUniqueId and broadcasts its 128 bytes over that group, then every rank joins with its own GPU
// (NCCL refuses two ranks on one GPU, so a machine with one GPU tests one rank only). Every collective is queued on
// the device's one stream (Note [one stream per device]), so it is ordered after the kernels that wrote its operands
// and before those that read its results, with no host wait; the host waits only in barrier() and Pending::wait().
// The semantics are ProcessGroup's, the same as MPI's on the CPU: all_reduce_mean sums in f32 (f64 for f64) whatever
// the tensor's dtype, divides by the rank count and rounds once; blocks of uneven size (reduce-scatter, all-gather,
// gather) are one grouped call of per-block reduces, broadcasts or send/receives, since NCCL's own reduce-scatter
// and all-gather take equal blocks only. Timeouts (--dist_timeout, Note [rank failures]) bound the host's waits
// (barrier, Pending::wait: polling the event and NCCL's async error); a collective queued on the stream that never
// completes is seen at the next such wait, or blocks the next host read of the stream's results.
#include "mp/dist/nccl_group.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dist/collective_checks.hpp"
#include "mp/autograd/node.hpp"
#include "mp/core/error.hpp"
#include "mp/ops/ops.hpp"

#if defined(MP_HAVE_NCCL)
#include <nccl.h>

#define MP_CUDA_RUNTIME_API 1
#include "backend/cuda/runtime.hpp"
#endif

namespace mp::dist {

#if defined(MP_HAVE_NCCL)

bool built_with_nccl() { return true; }

namespace {

void check_nccl(ncclResult_t rc, const char* call, ncclComm_t comm = nullptr) {
  if (rc == ncclSuccess) return;
  const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  throw Error(std::string("NCCL: ") + call + " failed: " + ncclGetErrorString(rc) +
              (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string()));
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    default: break;
  }
  throw Error(std::string("NCCL: no reduction type for ") + dtype_name(d));
}

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(ProcessGroup& world, Device device) : world_(world), device_(device) {
    MP_CHECK(device.is_cuda(), "dist::nccl_group: expected a CUDA device, got ", device.str());
    backend::cuda::check_device(device, "dist::nccl_group");
    backend::cuda::set_device(device.index);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (world.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    Tensor bytes = zeros({static_cast<int64_t>(sizeof id)}, {.dtype = DType::u8});
    std::memcpy(bytes.raw_data(), &id, sizeof id);
    const Tensor one[] = {bytes};
    world.broadcast(one, 0);
    std::memcpy(&id, bytes.raw_data(), sizeof id);
    check_nccl(ncclCommInitRank(&comm_, world.size(), id, world.rank()), "ncclCommInitRank");
    int version = 0;
    ncclGetVersion(&version);
    version_ = std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
               std::to_string(version % 100);
  }
  ~NcclGroup() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }
  std::string describe() const override {
    return "NCCL " + version_ + " on " + device_.str() + ", " + std::to_string(size()) + " ranks";
  }

  void all_reduce_mean(std::span<const Tensor> ts) override {
    for (const Tensor& t : ts) detail::check_operand(t, "all_reduce_mean", true, device_);
    autograd::NoGradGuard no_grad;
    // Sum in f32 (f64 for f64): a 16-bit tensor goes through an f32 copy, rounded once at the end.
    std::vector<Tensor> acc;
    for (const Tensor& t : ts) acc.push_back(t.dtype() == DType::f32 || t.dtype() == DType::f64 ? t : t.to(DType::f32));
    group_call("all_reduce_mean", [&] {
      for (const Tensor& a : acc)
        check_nccl(ncclAllReduce(a.raw_data(), a.raw_data(), static_cast<size_t>(a.numel()), nccl_type(a.dtype()),
                                 ncclSum, comm_, stream()),
                   "ncclAllReduce", comm_);
    });
    for (size_t i = 0; i < acc.size(); ++i) {
      Tensor t = ts[i];  // a handle of the caller's tensor
      t.copy_(mul(acc[i], 1.0 / static_cast<double>(size())));
    }
  }

  void all_reduce_mean_in(std::span<const Tensor> ts, DType wire) override {
    MP_CHECK(wire == DType::f32 || wire == DType::bf16 || wire == DType::f16,
             "dist::all_reduce_mean_in: expected f32, bf16 or f16 to send gradients in, got ", dtype_name(wire));
    if (wire == DType::f32) return all_reduce_mean(ts);
    for (const Tensor& t : ts) detail::check_operand(t, "all_reduce_mean_in", true, device_);
    autograd::NoGradGuard no_grad;
    // Note [16-bit gradient communication]: widened, divided by N in f32, rounded once to the wire, summed by NCCL
    // in the wire's dtype; f64 tensors keep f64.
    std::vector<Tensor> wide, narrow, bufs;
    for (const Tensor& t : ts) (t.dtype() == DType::f64 ? wide : narrow).push_back(t);
    if (!wide.empty()) all_reduce_mean(wide);
    for (const Tensor& t : narrow) bufs.push_back(mul(t.to(DType::f32), 1.0 / static_cast<double>(size())).to(wire));
    group_call("all_reduce_mean_in", [&] {
      for (const Tensor& b : bufs)
        check_nccl(ncclAllReduce(b.raw_data(), b.raw_data(), static_cast<size_t>(b.numel()), nccl_type(wire), ncclSum,
                                 comm_, stream()),
                   "ncclAllReduce", comm_);
    });
    for (size_t i = 0; i < narrow.size(); ++i) {
      Tensor t = narrow[i];  // a handle of the caller's tensor
      t.copy_(bufs[i]);
    }
  }

  std::unique_ptr<Pending> start_all_reduce_sum(const Tensor& buffer) override;

  void broadcast(std::span<const Tensor> ts, int root) override {
    for (const Tensor& t : ts) detail::check_operand(t, "broadcast", false, device_);
    group_call("broadcast", [&] {
      for (const Tensor& t : ts)
        check_nccl(
            ncclBroadcast(t.raw_data(), t.raw_data(), t.numel() * t.element_size(), ncclUint8, root, comm_, stream()),
            "ncclBroadcast", comm_);
    });
  }

  void reduce_scatter_sum(const Tensor& buffer, const Tensor& out, std::span<const int64_t> counts) override {
    detail::check_reduce_scatter(buffer, out, counts, rank(), size(), device_);
    // Block r is reduced to rank r; this rank's lands in `out` (a receive buffer is used only at the root).
    const size_t esize = buffer.element_size();
    group_call("reduce_scatter_sum", [&] {
      int64_t offset = 0;
      for (int r = 0; r < size(); ++r) {
        const int64_t n = counts[static_cast<size_t>(r)];
        const char* src = static_cast<const char*>(buffer.raw_data()) + offset * static_cast<int64_t>(esize);
        if (n > 0)
          check_nccl(ncclReduce(src, r == rank() ? out.raw_data() : nullptr, static_cast<size_t>(n),
                                nccl_type(buffer.dtype()), ncclSum, r, comm_, stream()),
                     "ncclReduce", comm_);
        offset += n;
      }
    });
  }

  void all_gather(const Tensor& buffer, std::span<const int64_t> counts) override {
    detail::check_operand(buffer, "all_gather", false, device_);
    detail::check_blocks(buffer, counts, size(), "all_gather");
    // Rank r broadcasts its block r in place.
    const size_t esize = buffer.element_size();
    group_call("all_gather", [&] {
      int64_t offset = 0;
      for (int r = 0; r < size(); ++r) {
        const int64_t n = counts[static_cast<size_t>(r)];
        char* block = static_cast<char*>(buffer.raw_data()) + offset * static_cast<int64_t>(esize);
        if (n > 0)
          check_nccl(ncclBroadcast(block, block, static_cast<size_t>(n) * esize, ncclUint8, r, comm_, stream()),
                     "ncclBroadcast", comm_);
        offset += n;
      }
    });
  }

  void gather(const Tensor& mine, const Tensor& out, std::span<const int64_t> counts, int root) override {
    detail::check_gather(mine, out, counts, rank(), size(), rank() == root, device_);
    const size_t esize = mine.element_size();
    const size_t bytes = static_cast<size_t>(mine.numel()) * esize;
    if (rank() != root) {
      group_call("gather", [&] {
        if (bytes > 0)
          check_nccl(ncclSend(mine.raw_data(), bytes, ncclUint8, root, comm_, stream()), "ncclSend", comm_);
      });
      return;
    }
    group_call("gather", [&] {
      int64_t offset = 0;
      for (int r = 0; r < size(); ++r) {
        const int64_t n = counts[static_cast<size_t>(r)];
        char* block = static_cast<char*>(out.raw_data()) + offset * static_cast<int64_t>(esize);
        if (n > 0 && r != root)
          check_nccl(ncclRecv(block, static_cast<size_t>(n) * esize, ncclUint8, r, comm_, stream()), "ncclRecv", comm_);
        offset += n;
      }
    });
    // The root's own block: a copy on the same stream.
    int64_t before = 0;
    for (int r = 0; r < root; ++r) before += counts[static_cast<size_t>(r)];
    if (mine.numel() > 0) out.reshape({-1}).narrow(0, before, mine.numel()).copy_(mine.reshape({-1}));
  }

  void barrier() override {
    const Tensor one = ones({1}, {.dtype = DType::f32, .device = device_});
    group_call("barrier", [&] {
      check_nccl(ncclAllReduce(one.raw_data(), one.raw_data(), 1, ncclFloat32, ncclSum, comm_, stream()),
                 "ncclAllReduce", comm_);
    });
    cudaEvent_t done = nullptr;
    MP_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    MP_CUDA_CHECK(cudaEventRecord(done, stream()));
    wait_for(done, "barrier");
    cudaEventDestroy(done);
  }

  void set_timeout(double seconds) override { timeout_ = seconds; }

  void abort(int status) override {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    world_.abort(status);
  }

  // Waits for `event` (recorded after a collective) within the timeout (Note [NCCL groups]): a rank that waits longer
  // says so, aborts the communicator and ends the run with kExitRankFailure, as the MPI group does.
  void wait_for(cudaEvent_t event, const char* what) {
    set_device();
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t rc = cudaEventQuery(event);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) MP_CUDA_CHECK(rc);
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError", comm_);
      if (async != ncclSuccess && async != ncclInProgress) check_nccl(async, what, comm_);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timeout_ > 0 && waited > timeout_) {
        std::fprintf(stderr,
                     "mixprec: rank %d of %d: error: waited %.0f s (--dist_timeout) in NCCL's %s on %s: a rank died "
                     "or hangs; the last checkpoint is intact (--resume continues from it)\n",
                     rank(), size(), waited, what, device_.str().c_str());
        abort(kExitRankFailure);
        std::_Exit(kExitRankFailure);  // a single process's abort returns
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  void set_device() const { backend::cuda::set_device(device_.index); }
  cudaStream_t stream() const { return backend::cuda::current_stream(device_.index); }
  // One grouped NCCL call (ncclGroupStart / End) around `body`, on this group's device.
  template <class Body>
  void group_call(const char* what, Body&& body) {
    set_device();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    try {
      body();
    } catch (...) {
      ncclGroupEnd();
      throw;
    }
    check_nccl(ncclGroupEnd(), what, comm_);
  }

  ProcessGroup& world_;
  Device device_;
  ncclComm_t comm_ = nullptr;
  std::string version_;
  double timeout_ = 0;  // seconds; 0: without bound
};

// A collective in flight: an event recorded on the stream after it, waited for within the group's timeout.
class NcclPending final : public Pending {
 public:
  NcclPending(NcclGroup& group, int device, cudaStream_t stream) : group_(group) {
    backend::cuda::set_device(device);
    MP_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    MP_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  ~NcclPending() override {
    if (!done_) {
      try {
        wait();
      } catch (...) {  // a destructor must not throw: the error was the collective's, reported by wait() elsewhere
      }
    }
    cudaEventDestroy(event_);
  }
  NcclPending(const NcclPending&) = delete;
  NcclPending& operator=(const NcclPending&) = delete;
  bool test() override {
    if (done_) return true;
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) return false;
    MP_CUDA_CHECK(rc);
    return done_ = true;
  }
  void wait() override {
    if (done_) return;
    group_.wait_for(event_, "all-reduce");
    done_ = true;
  }

 private:
  NcclGroup& group_;
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
};

std::unique_ptr<Pending> NcclGroup::start_all_reduce_sum(const Tensor& buffer) {
  detail::check_sum_buffer(buffer, device_);
  set_device();
  check_nccl(ncclAllReduce(buffer.raw_data(), buffer.raw_data(), static_cast<size_t>(buffer.numel()),
                           nccl_type(buffer.dtype()), ncclSum, comm_, stream()),
             "ncclAllReduce", comm_);
  return std::make_unique<NcclPending>(*this, device_.index, stream());
}

}  // namespace

std::unique_ptr<ProcessGroup> nccl_group(ProcessGroup& world, Device device) {
  return std::make_unique<NcclGroup>(world, device);
}

#else

bool built_with_nccl() { return false; }

std::unique_ptr<ProcessGroup> nccl_group(ProcessGroup& world, Device device) {
  throw Error("dist::nccl_group: this build of mixprec has no NCCL (collectives of " + device.str() +
              " tensors); build with the CUDA backend where nccl.h and libnccl are found (the CUDA toolkit, "
              "NCCL_ROOT, or PyTorch's nvidia-nccl wheel)");
}

#endif

}  // namespace mp::dist

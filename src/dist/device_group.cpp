// The process group of a data-parallel run on a device (include/mp/dist/device_group.hpp).
//
// Note [device groups]
// A data-parallel run exchanges two kinds of things: small host values (agreement on the loss, flags, sizes,
// configurations: CPU tensors) and the model's tensors (weights, gradients, optimizer state: on the run's device).
// On a GPU the second kind goes through NCCL, GPU to GPU, and the first through MPI as on the CPU: the group
// group_for_device() returns routes each collective by its operands' device, so DataParallel, the gradient buckets and
// the optimizer shards are written once against ProcessGroup. One process per GPU: a bare --device cuda under a
// launcher picks cuda:(local rank mod GPUs). NCCL refuses two ranks on one GPU and the GPU machines here have one,
// so the routed path has no multi-rank test here (its parts do: MPI on the CPU, NCCL on one rank).
#include "mp/dist/device_group.hpp"

#include <cstdlib>
#include <string>
#include <vector>

#include "mp/core/error.hpp"
#include "backend/cuda/runtime.hpp"
#include "mp/dist/nccl_group.hpp"

namespace mp::dist {
namespace {

// CPU tensors through `host`, the others through `device`.
class RoutedGroup final : public ProcessGroup {
 public:
  RoutedGroup(ProcessGroup& host, std::unique_ptr<ProcessGroup> device) : host_(host), device_(std::move(device)) {}

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string describe() const override { return host_.describe() + "; GPU tensors: " + device_->describe(); }

  void all_reduce_mean(std::span<const Tensor> ts) override {
    split(ts, [](ProcessGroup& g, std::span<const Tensor> part) { g.all_reduce_mean(part); });
  }
  void all_reduce_mean_in(std::span<const Tensor> ts, DType wire) override {
    split(ts, [wire](ProcessGroup& g, std::span<const Tensor> part) { g.all_reduce_mean_in(part, wire); });
  }
  std::unique_ptr<Pending> start_all_reduce_sum(const Tensor& buffer) override {
    return of(buffer).start_all_reduce_sum(buffer);
  }
  void broadcast(std::span<const Tensor> ts, int root) override {
    split(ts, [root](ProcessGroup& g, std::span<const Tensor> part) { g.broadcast(part, root); });
  }
  void reduce_scatter_sum(const Tensor& buffer, const Tensor& out, std::span<const int64_t> counts) override {
    of(buffer).reduce_scatter_sum(buffer, out, counts);
  }
  void all_gather(const Tensor& buffer, std::span<const int64_t> counts) override {
    of(buffer).all_gather(buffer, counts);
  }
  void gather(const Tensor& mine, const Tensor& out, std::span<const int64_t> counts, int root) override {
    of(mine).gather(mine, out, counts, root);
  }
  void barrier() override {
    device_->barrier();
    host_.barrier();
  }
  void set_timeout(double seconds) override {
    host_.set_timeout(seconds);
    device_->set_timeout(seconds);
  }
  void abort(int status) override { host_.abort(status); }

 private:
  ProcessGroup& of(const Tensor& t) { return t.defined() && !t.device().is_cpu() ? *device_ : host_; }
  // The CPU tensors in one call to the host group, the others in one to the device group (each only when there are
  // some: the ranks hold the same tensors, so they make the same calls).
  template <class Call>
  void split(std::span<const Tensor> ts, Call&& call) {
    std::vector<Tensor> cpu, dev;
    for (const Tensor& t : ts) (t.device().is_cpu() ? cpu : dev).push_back(t);
    if (!cpu.empty()) call(host_, std::span<const Tensor>(cpu));
    if (!dev.empty()) call(*device_, std::span<const Tensor>(dev));
  }

  ProcessGroup& host_;
  std::unique_ptr<ProcessGroup> device_;
};

}  // namespace

int local_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return std::atoi(v);
  return 0;
}

Device rank_device(Device device, bool named_index) {
  if (!device.is_cuda() || named_index || !launched_by_mpi()) return device;
  const int gpus = backend::cuda::device_count();
  return gpus > 0 ? Device{DeviceType::cuda, local_rank() % gpus} : device;
}

std::shared_ptr<ProcessGroup> group_for_device(ProcessGroup& world, Device device) {
  const std::shared_ptr<ProcessGroup> itself(std::shared_ptr<void>(), &world);  // not owned
  if (device.is_cpu() || world.size() == 1) return itself;
  MP_CHECK(built_with_nccl(), "data-parallel training on ", device.str(), " with ", world.size(),
           " ranks needs NCCL, and this build of mixprec has none: build the CUDA backend where nccl.h and libnccl "
           "are found (the CUDA toolkit, NCCL_ROOT, or PyTorch's nvidia-nccl wheel), or train on the CPU");
  return std::make_shared<RoutedGroup>(world, nccl_group(world, device));
}

}  // namespace mp::dist

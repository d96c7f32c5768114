#pragma once
// The data-parallel side of a training run (Note [data-parallel training] in data_parallel.cpp): what the ranks of
// `mpirun -np N mixprec train` agree on and exchange. Every member does nothing for a single process.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mp/amp/grad_scaler.hpp"
#include "mp/dist/process_group.hpp"
#include "mp/nn/module.hpp"
#include "mp/nn/sync_batch_norm.hpp"
#include "mp/train/checkpoint.hpp"
#include "train/grad_buckets.hpp"
#include "train/optimizer_shards.hpp"

namespace mp::train::detail {

/// The ranks of a training run and the collectives the training loops call on them.
class DataParallel {
 public:
  /// Over `world` (dist::world() for a run).
  explicit DataParallel(dist::ProcessGroup& world) : world_(world) {}
  /// This process's rank.
  int rank() const { return world_.rank(); }
  /// The number of ranks.
  int size() const { return world_.size(); }
  /// Whether there are several ranks.
  bool active() const { return world_.size() > 1; }
  /// Whether this rank writes the run's output (logs, progress, checkpoints): rank 0.
  bool writes() const { return world_.rank() == 0; }
  /// "rank R of N" for messages.
  std::string where() const;

  /// Compares `description` (a JSON object: the config, the data, the resume point) with rank 0's; when any rank's
  /// differs, throws on every rank, naming the ranks and the first differing entries of the first one.
  void check_same_run(const std::string& what, const std::string& description) const;
  /// Rank 0's parameters and buffers into every rank's `model`.
  void broadcast_model(const nn::Module& model) const;
  /// Rank 0's buffers (batch-norm running statistics: per rank while training) into every rank's `model`.
  void broadcast_buffers(const nn::Module& model) const;
  /// Every rank's `values` summed, on every rank (f64; integers below 2^53 / N stay exact up to rounding by N).
  std::vector<double> sum(const std::vector<double>& values) const;
  /// The part [begin, end) of `n` items that this rank takes when they are shared out in contiguous ranges.
  std::pair<int64_t, int64_t> share(int64_t n) const { return {n * rank() / size(), n * (rank() + 1) / size()}; }
  /// Rank 0's state of a resumed run on every rank: the model and the optimizer's state (masters, moments).
  void broadcast_state(const CheckpointRefs& refs) const;
  /// The size of what broadcast_state() sends, for check_same_run(): "tensors/values" of model and optimizer.
  static std::string state_signature(const CheckpointRefs& refs);
  /// Keys this rank's dropout draws by the global batch (Note [draws keyed by the global batch] in
  /// src/core/philox.cpp): the masks one process at N x B draws. Call after the model is built and a checkpoint, if
  /// any, restored.
  void shard_random_draws() const;
  /// Every rank's found-inf agree in `scaler` (any rank's inf/NaN skips everyone's step).
  void agree_on_found_inf(amp::GradScaler& scaler) const;

  /// What the ranks agree on at each optimizer step.
  struct StepAgreement {
    double loss = 0;               ///< the mean of the ranks' step losses (the global batch's loss)
    bool loss_nonfinite = false;   ///< some rank's loss was inf/NaN
    bool stop = false;             ///< some rank was asked to stop (a signal)
    int64_t grad_all_reduces = 0;  ///< all-reduces of gradients this step (buckets, or 1 without them)
    int64_t grad_bytes = 0;        ///< bytes of gradient values in this rank's messages this step (halved by a 16-bit
                                   ///< --grad_comm_dtype: Note [16-bit gradient communication])
    double comm_wait = 0;          ///< seconds from the end of backward until the gradients were averaged and the step
                                   ///< agreed (waiting for the slowest rank included)
    double comm_in_backward = 0;   ///< seconds the bucket hooks took inside backward (flatten, start, MPI_Test)
  };
  /// Before an optimizer step: replace every gradient of `params` by its mean over the ranks, then agree on the loss,
  /// non-finite losses and stop requests. With `buckets` armed for the backward just run, their all-reduces (started
  /// during it) are completed (Note [bucketed gradient all-reduce] in grad_buckets.cpp); without, one all-reduce
  /// averages every gradient. Throws when the ranks' gradients differ in which parameters have one.
  /// With `shards` (--shard_optimizer), one reduce-scatter leaves each rank the averages of its own parameters'
  /// gradients and drops the others' (Note [sharded optimizer state]). `wire` (--grad_comm_dtype) is what the
  /// one all-reduce sends gradients in (Note [16-bit gradient communication]); buckets have their own.
  StepAgreement average_gradients(const std::vector<Tensor>& params, double loss, bool loss_nonfinite, bool stop,
                                  GradBuckets* buckets = nullptr, const OptimizerShards* shards = nullptr,
                                  DType wire = DType::f32) const;
  /// Gradient buckets of `params` over this run's ranks, sent in `wire` (Note [bucketed gradient all-reduce]).
  std::unique_ptr<GradBuckets> gradient_buckets(const std::vector<Tensor>& params, double bucket_mb,
                                                DType wire = DType::f32) const {
    return std::make_unique<GradBuckets>(world_, params, bucket_mb, wire);
  }
  /// The optimizer's state sharded over this run's ranks (Note [sharded optimizer state]).
  std::unique_ptr<OptimizerShards> optimizer_shards(optim::Optimizer& opt) const {
    return std::make_unique<OptimizerShards>(world_, opt);
  }
  /// The sum over the ranks that batch norm over the global batch needs (--sync_batchnorm: Note [synchronised batch
  /// norm] in src/nn/batch_norm.cpp): in place, blocking, f64.
  nn::BatchNormAllReduce batch_norm_sum() const {
    return [w = &world_](const Tensor& t) { w->start_all_reduce_sum(t)->wait(); };
  }
  /// The concatenation along `dim` of every rank's `t` (same shape on every rank), in rank order, on every rank.
  Tensor all_gather(const Tensor& t, int64_t dim) const;

 private:
  /// Every rank gets `text` of rank `root`.
  std::string broadcast_string(const std::string& text, int root) const;
  /// Per rank, whether `flag` was set there.
  std::vector<bool> gather_flags(bool flag) const;

  dist::ProcessGroup& world_;
};

}  // namespace mp::train::detail

#pragma once
// Sharded optimizer state, ZeRO stage 1 (Note [sharded optimizer state] in optimizer_shards.cpp): what a data-parallel
// run does with --shard_optimizer.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "mp/dist/process_group.hpp"
#include "mp/nn/module.hpp"
#include "mp/optim/ema.hpp"
#include "mp/optim/optimizer.hpp"

namespace mp::train::detail {

/// The optimizer's parameters shared out over the ranks: each rank keeps the state (f32 masters, moments) of its own
/// parameters only, receives only their averaged gradients, updates only them, and sends them to the others.
class OptimizerShards {
 public:
  /// Assigns every parameter of `opt` to a rank and releases the state this rank keeps of the others' (call it after
  /// the optimizer state is complete: amp::initialize's masters made, a checkpoint loaded and broadcast).
  OptimizerShards(dist::ProcessGroup& world, optim::Optimizer& opt);

  /// The rank that updates `p` (one of the optimizer's parameters; throws naming it otherwise).
  int owner(const Tensor& p) const;
  /// Parameters (elements) per rank: what the partition gave each.
  const std::vector<int64_t>& numel_per_rank() const { return numel_; }

  /// Replaces the gradients of this rank's parameters by their mean over the ranks and drops the others' (one
  /// reduce-scatter, summed in f32 or f64 as ProcessGroup::all_reduce_mean sums, divided by the rank count and rounded
  /// once to the gradient's dtype). Every rank must hold gradients on the same parameters (checked by the caller).
  void reduce_scatter_gradients() const;
  /// After an applied update: every rank's parameters get the values their owner computed (one all-gather of the
  /// weights in their own dtypes: 16-bit under O2/O3, f32 at O0).
  void all_gather_weights() const;
  /// The sum over the ranks of `v` (the clipping norm's sum of squares, a count of non-finite gradients).
  double sum(double v) const;
  /// The optimizer's whole state dict on rank `root` (the other ranks' parameters' state gathered from them), the
  /// state dict of this rank's own parameters elsewhere: what a checkpoint saves.
  optim::OptimizerStateDict gather_state(int root) const;
  /// Every rank's weight averages of each parameter become its owner's (the owner averages the f32 master, which the
  /// others do not keep): before an evaluation with the averages and before a checkpoint.
  void all_gather_averages(const optim::ModelEma& ema, const nn::Module& model) const;

 private:
  dist::ProcessGroup& world_;
  optim::Optimizer& opt_;
  std::vector<Tensor> params_;  ///< the optimizer's parameters, in its state-dict order
  std::vector<int> owner_;      ///< per parameter
  std::vector<int64_t> numel_;  ///< per rank
  std::unordered_map<const TensorImpl*, size_t> index_;
};

/// The partition of Note [sharded optimizer state]: for parameters of `numels` elements (in the optimizer's order), the
/// rank of each among `ranks` (whole parameters, the largest first to the rank with the fewest elements so far).
std::vector<int> partition_by_numel(const std::vector<int64_t>& numels, int ranks);

}  // namespace mp::train::detail

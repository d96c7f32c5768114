#pragma once
// Gradients averaged over the ranks in buckets all-reduced during backward (Note [bucketed gradient all-reduce] in
// grad_buckets.cpp): what a data-parallel run does with --bucket_mb > 0.
#include <cstdint>
#include <memory>
#include <vector>

#include "mp/dist/process_group.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::train::detail {

/// The buckets of a model's gradients and their all-reduces in flight.
class GradBuckets {
 public:
  /// Buckets of about `bucket_mb` MiB of communicated values (f32: 4 bytes per element; f64 parameters 8) over the
  /// parameters of `params` that require grad, in reverse order (the order backward finalises them), a parameter
  /// larger than that alone in its bucket; a post-accumulate hook on each. Throws unless bucket_mb > 0. `wire` is the
  /// dtype the gradients travel and are summed in: f32, or bf16 / f16 (Note [16-bit gradient communication] in
  /// data_parallel.cpp: divided by the rank count before the sum; f64 parameters stay f64); the layout is the same.
  GradBuckets(dist::ProcessGroup& world, const std::vector<Tensor>& params, double bucket_mb, DType wire = DType::f32);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  /// The next backward pass is the optimizer step's last: each bucket is all-reduced as soon as its gradients are
  /// final. Other passes (earlier micro-batches, replays) communicate nothing.
  void arm();
  /// Whether arm() was called and finish() not yet.
  bool armed() const;
  /// After the armed backward: buckets still waiting for parameters that got no gradient in it are all-reduced with
  /// zeros for those; then waits for every bucket and writes the mean over the ranks into each gradient this rank has
  /// (a parameter without one keeps none).
  void finish();
  /// The indices into `params` of each bucket's parameters, in the order the buckets are all-reduced.
  std::vector<std::vector<size_t>> layout() const;

  /// What the buckets cost, summed over the run.
  struct Stats {
    int64_t all_reduces = 0;          ///< buckets all-reduced (one MPI_Iallreduce each)
    int64_t bytes = 0;                ///< of gradient values they sent (each rank's message sizes)
    int64_t started_in_backward = 0;  ///< of them, started by a hook during backward
    double hook_seconds = 0;          ///< time in the hooks: flattening, starting, MPI_Test
    double finish_seconds = 0;        ///< time in finish(): waiting, averaging, copying back
  };
  const Stats& stats() const;
  /// All-reduces started since the last call (since construction at the first): per optimizer step, the buckets.
  int64_t take_all_reduces();
  /// The bytes of those all-reduces' messages since the last call (since construction at the first).
  int64_t take_bytes();
  /// The hooks' time in the last armed backward pass.
  double pass_hook_seconds() const;

 private:
  struct State;
  std::shared_ptr<State> state_;  ///< the hooks hold it weakly: a hook outliving the buckets does nothing
};

}  // namespace mp::train::detail

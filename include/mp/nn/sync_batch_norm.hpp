#pragma once
// Batch norm over the global batch of a data-parallel run (Note [synchronised batch norm] in src/nn/batch_norm.cpp):
// the hook that makes this process's batch-norm layers share their statistics with the other processes.
#include <functional>

#include "mp/tensor/tensor.hpp"

namespace mp::nn {

/// Sums a contiguous f64 CPU tensor in place over every process of the run (each process calls it in the same order,
/// with the same shape): what a trainer passes from its process group. nn knows no process group.
using BatchNormAllReduce = std::function<void(const Tensor& values)>;

/// While alive, every batch-norm layer of this process that normalises with batch statistics in training mode uses
/// the statistics of the global batch (every process's examples), its backward the global sums, through `sum`
/// (Note [synchronised batch norm]). Layers in eval mode and every layer after the scope ends are unchanged. One scope
/// at a time; not thread-safe (the layers read it from the training thread).
class SyncBatchNormScope {
 public:
  /// Throws when `sum` is empty or another scope is alive.
  explicit SyncBatchNormScope(BatchNormAllReduce sum);
  ~SyncBatchNormScope();
  SyncBatchNormScope(const SyncBatchNormScope&) = delete;
  SyncBatchNormScope& operator=(const SyncBatchNormScope&) = delete;
};

}  // namespace mp::nn

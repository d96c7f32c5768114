#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "mp/data/dataset.hpp"

namespace mp::data {

/// Options of a DataLoader.
struct DataLoaderOptions {
  int64_t batch_size = 128;  ///< examples per batch
  bool shuffle = true;       ///< a new random order every epoch (else 0, 1, 2, ...)
  bool drop_last = false;    ///< drop the last batch when it has fewer than batch_size examples
  int num_workers = 2;       ///< worker threads; 0 = build batches on the calling thread
  int prefetch = 4;          ///< batches built ahead of the consumer (at least num_workers are in flight)
  uint64_t seed = 0;         ///< fixes the order and the transform draws of every epoch
  int rank = 0;              ///< this process's part of each global batch (Note [data-parallel batches])
  int world_size = 1;        ///< processes sharing each global batch of world_size * batch_size examples
};

/// Seed of the transforms of batch `batch` of epoch `epoch` (what the DataLoader passes to get_batch).
uint64_t batch_seed(uint64_t seed, int64_t epoch, int64_t batch);

/// The order of the examples of epoch `epoch`: a permutation of [0, n) drawn from (seed, epoch) alone
/// (Fisher-Yates over Rng draws), or the identity when !shuffle.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

/// Batches of a dataset, built by worker threads ahead of the consumer, delivered in order. The order of
/// epoch e is a permutation drawn from (seed, e) alone and batch b's transform seed from (seed, e, b), so
/// every run with the same seed sees the same batches whatever the thread count, and a resumed run can
/// start at (epoch, batch) exactly (what exact checkpoint resume needs). next(), start_epoch() and the
/// wait counters are for one consumer thread.
class DataLoader {
 public:
  /// A loader over `dataset` (not null); no thread starts before start_epoch().
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  /// Stops and joins the workers, also mid-epoch.
  ~DataLoader();
  /// Not copyable (it owns threads).
  DataLoader(const DataLoader&) = delete;
  /// Not copyable (it owns threads).
  DataLoader& operator=(const DataLoader&) = delete;

  /// Batches per epoch (this process's parts of global batches, with world_size > 1).
  int64_t num_batches() const;
  /// (Re)starts the workers for this epoch, delivering batches first_batch.. of it (0 <= first_batch <=
  /// num_batches()).
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  /// The next batch of the epoch in order; nullopt at the end of the epoch. An exception thrown by the
  /// dataset while building that batch is rethrown here (the loader then moves on to the next batch).
  std::optional<Batch> next();
  /// Total time next() blocked waiting for a batch (with num_workers 0: the time building them), seconds.
  double wait_seconds() const { return wait_seconds_; }
  /// Set wait_seconds() to 0.
  void reset_wait_seconds() { wait_seconds_ = 0.0; }
  /// The options.
  const DataLoaderOptions& options() const { return options_; }
  /// The dataset.
  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }
  /// The current epoch (-1 before the first start_epoch).
  int64_t epoch() const { return epoch_; }
  /// Index in the epoch of the batch the next call to next() returns.
  int64_t next_batch_index() const { return next_batch_; }

 private:
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  Batch build(int64_t b) const;
  void stop_workers();
  void worker_loop();

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
  int64_t next_batch_ = 0;
  double wait_seconds_ = 0.0;

  // Shared with the workers (guarded by mu_).
  std::mutex mu_;
  std::condition_variable work_cv_;   ///< workers wait here for room in the prefetch window
  std::condition_variable ready_cv_;  ///< the consumer waits here for its batch
  bool stop_ = false;
  int64_t to_claim_ = 0;   ///< next batch a worker will build
  int64_t delivered_ = 0;  ///< batches handed to the consumer (window start)
  std::map<int64_t, Slot> ready_;
  std::vector<std::thread> workers_;
};

}  // namespace mp::data

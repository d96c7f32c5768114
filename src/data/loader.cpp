// DataLoader: worker threads build batches ahead of the consumer, delivered in order.
//
// Note [deterministic loader]
// Batch b of epoch e holds examples order[b*B .. (b+1)*B) of epoch_order(n, seed, e) and is built with
// get_batch(indices, batch_seed(seed, e, b)). Neither depends on which thread builds the batch or
// when, so the batches are the same for any num_workers and a run resumed at (e, b) continues
// exactly. Workers claim batch numbers in increasing order from a shared counter, but only inside a
// window of max(prefetch, num_workers) batches past the last one delivered (bounded memory); the
// consumer takes them by number from a map, so a slow batch delays its successors' delivery but
// not their construction.
//
// Note [data-parallel batches]
// With world_size N > 1 (a data-parallel run: Note [data-parallel training] in src/train/data_parallel.cpp) the
// epoch is cut into global batches of N x batch_size examples of the same epoch_order a single process uses, and
// rank r takes positions [r*B, (r+1)*B) of each: rank r's batch b holds order[(b*N + r)*B ..  (b*N + r + 1)*B).
// Its transforms draw from batch_seed(seed, e, b) at sub-streams r*B + p, the streams a single process at batch
// N x B gives those examples. So N ranks at batch B see exactly the examples, and the augmentation draws, of one
// process at batch N x B, batch for batch, and a run resumed at batch b on any N with the same global batch
// continues the same order. Only whole global batches are cut (drop_last is required): a part that some rank
// would lack would leave the ranks with different step counts.
#include "mp/data/loader.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "mp/autograd/node.hpp"
#include "mp/core/error.hpp"

namespace mp::data {

namespace {

// SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Domain tags keep the order key and the batch seeds of one seed apart.
constexpr uint64_t kOrderTag = 0x6F72646572000000ull;  // "order"
constexpr uint64_t kBatchTag = 0x6261746368000000ull;  // "batch"

}  // namespace

uint64_t batch_seed(uint64_t seed, int64_t epoch, int64_t batch) {
  const uint64_t e = splitmix64(splitmix64(seed ^ kBatchTag) ^ static_cast<uint64_t>(epoch));
  return splitmix64(e ^ static_cast<uint64_t>(batch));
}

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  MP_CHECK(n >= 0 && n <= (int64_t{1} << 32), "epoch_order: expected 0 <= n <= 2^32 examples, got ", n);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  if (!shuffle) return order;
  Rng rng(splitmix64(seed ^ kOrderTag), static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i)  // Fisher-Yates
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(rng.randint(i + 1))]);
  return order;
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  MP_CHECK(dataset_ != nullptr, "DataLoader: expected a dataset, got null");
  MP_CHECK(options_.batch_size >= 1, "DataLoader: expected batch_size >= 1, got ", options_.batch_size);
  MP_CHECK(options_.num_workers >= 0, "DataLoader: expected num_workers >= 0 (0 = build on the calling thread), got ",
           options_.num_workers);
  MP_CHECK(options_.prefetch >= 0, "DataLoader: expected prefetch >= 0, got ", options_.prefetch);
  MP_CHECK(options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
           "DataLoader: expected 0 <= rank < world_size, got rank ", options_.rank, " of ", options_.world_size);
  MP_CHECK(options_.world_size == 1 || options_.drop_last, "DataLoader: a data-parallel loader (world_size ",
           options_.world_size, ") needs drop_last: every rank must get a whole part of every global batch");
}

DataLoader::~DataLoader() { stop_workers(); }

int64_t DataLoader::num_batches() const {
  const int64_t n = dataset_->size(), b = options_.batch_size * options_.world_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

Batch DataLoader::build(int64_t b) const {
  // Note [data-parallel batches]: this rank's part of global batch b (the whole batch when world_size is 1)
  const int64_t B = options_.batch_size, part = options_.rank * B;
  const int64_t n = static_cast<int64_t>(order_.size()), begin = b * B * options_.world_size + part;
  const int64_t count = std::min(B, n - begin);
  const std::span<const int64_t> indices(order_.data() + begin, static_cast<size_t>(count));
  return dataset_->get_batch(indices, batch_seed(options_.seed, epoch_, b), static_cast<uint64_t>(part));
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  std::lock_guard<std::mutex> lk(mu_);
  ready_.clear();
  stop_ = false;
}

void DataLoader::worker_loop() {
  autograd::NoGradGuard no_grad;  // workers make plain tensors, never graph nodes
  const int64_t nb = num_batches();
  const int64_t window = std::max<int64_t>({options_.prefetch, options_.num_workers, 1});
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    work_cv_.wait(lk, [&] { return stop_ || to_claim_ >= nb || to_claim_ < delivered_ + window; });
    if (stop_ || to_claim_ >= nb) return;
    const int64_t b = to_claim_++;
    lk.unlock();
    Slot slot;
    try {
      slot.batch = build(b);
    } catch (...) {
      slot.error = std::current_exception();  // rethrown by next() for this batch
    }
    lk.lock();
    if (stop_) return;
    try {
      ready_.emplace(b, std::move(slot));
    } catch (...) {  // out of memory for the map node: still deliver an error, never hang the consumer
      Slot failed;
      failed.error = std::current_exception();
      ready_[b] = std::move(failed);
    }
    ready_cv_.notify_all();
  }
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  const int64_t nb = num_batches();
  MP_CHECK(epoch >= 0, "DataLoader::start_epoch: expected epoch >= 0, got ", epoch);
  MP_CHECK(first_batch >= 0 && first_batch <= nb, "DataLoader::start_epoch: expected 0 <= first_batch <= ", nb,
           " (batches per epoch), got ", first_batch);
  stop_workers();
  order_ = epoch_order(dataset_->size(), options_.seed, epoch, options_.shuffle);
  epoch_ = epoch;
  next_batch_ = first_batch;
  to_claim_ = first_batch;
  delivered_ = first_batch;
  if (options_.num_workers == 0 || first_batch >= nb) return;
  const int64_t threads = std::min<int64_t>(options_.num_workers, nb - first_batch);
  workers_.reserve(static_cast<size_t>(threads));
  for (int64_t i = 0; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

std::optional<Batch> DataLoader::next() {
  MP_CHECK(epoch_ >= 0, "DataLoader::next: no epoch started; call start_epoch(epoch) before next()");
  if (next_batch_ >= num_batches()) {
    if (!workers_.empty()) stop_workers();  // all done: release the threads until the next epoch
    return std::nullopt;
  }
  using Clock = std::chrono::steady_clock;
  const int64_t b = next_batch_++;
  if (options_.num_workers == 0) {
    const auto t0 = Clock::now();
    struct AddWait {  // counts the build time even when build throws
      double& total;
      Clock::time_point t0;
      ~AddWait() { total += std::chrono::duration<double>(Clock::now() - t0).count(); }
    } add_wait{wait_seconds_, t0};
    autograd::NoGradGuard no_grad;
    return build(b);
  }
  Slot slot;
  {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = ready_.find(b);
    if (it == ready_.end()) {
      const auto t0 = Clock::now();
      ready_cv_.wait(lk, [&] { return (it = ready_.find(b)) != ready_.end(); });
      wait_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    }
    slot = std::move(it->second);
    ready_.erase(it);
    delivered_ = b + 1;
  }
  work_cv_.notify_all();
  if (slot.error) std::rethrow_exception(slot.error);
  return std::move(slot.batch);
}

}  // namespace mp::data

// DataLoader: coverage and order of epochs, determinism across thread counts, resume, worker errors,
// shutdown mid-epoch, the prefetch bound and the wait counter.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mp/data/loader.hpp"
#include "mp/mp.hpp"

using namespace mp;
using namespace mp::data;

namespace {

// Example i is the number i; target = the batch's transform seed (as i64) in every row, so a test can
// see which seed built each batch. Optionally sleeps per batch or throws for one batch.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t n, std::chrono::milliseconds delay = {}, int64_t throw_at_first = -1)
      : n_(n), delay_(delay), throw_at_first_(throw_at_first) {}
  int64_t size() const override { return n_; }
  Batch get_batch(std::span<const int64_t> indices, uint64_t seed, uint64_t /*first_stream*/ = 0) const override {
    builds_.fetch_add(1);
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (throw_at_first_ >= 0 && indices[0] == throw_at_first_)
      throw std::runtime_error("bad example " + std::to_string(indices[0]));
    std::vector<int64_t> v(indices.begin(), indices.end());
    const int64_t b = static_cast<int64_t>(v.size());
    return {from_vector<int64_t>(v, {b}), full({b}, static_cast<double>(seed % 1000003), {.dtype = DType::i64})};
  }
  mutable std::atomic<int64_t> builds_{0};

 private:
  int64_t n_;
  std::chrono::milliseconds delay_;
  int64_t throw_at_first_;
};

// All batches of one epoch as (indices, target) vectors.
std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> run_epoch(DataLoader& dl, int64_t epoch,
                                                                             int64_t first = 0) {
  std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out;
  dl.start_epoch(epoch, first);
  while (auto b = dl.next()) out.emplace_back(b->input.to_vector<int64_t>(), b->target.to_vector<int64_t>());
  EXPECT_FALSE(dl.next().has_value()) << "next() after the end stays at the end";
  return out;
}

TEST(DataLoader, EveryIndexOncePerEpoch) {
  auto ds = std::make_shared<IndexDataset>(103);
  for (bool drop_last : {false, true}) {
    DataLoader dl(ds, {.batch_size = 10, .drop_last = drop_last, .num_workers = 2, .seed = 5});
    EXPECT_EQ(dl.num_batches(), drop_last ? 10 : 11);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      const auto batches = run_epoch(dl, epoch);
      ASSERT_EQ(static_cast<int64_t>(batches.size()), dl.num_batches());
      std::vector<int64_t> all;
      for (size_t b = 0; b < batches.size(); ++b) {
        EXPECT_EQ(batches[b].first.size(), b == 10 ? 3u : 10u);
        all.insert(all.end(), batches[b].first.begin(), batches[b].first.end());
      }
      std::vector<int64_t> sorted = all;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_TRUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) << "an index repeats";
      if (!drop_last) {
        std::vector<int64_t> want(103);
        std::iota(want.begin(), want.end(), 0);
        EXPECT_EQ(sorted, want);
      } else {
        EXPECT_EQ(all.size(), 100u);
      }
    }
  }
}

TEST(DataLoader, SameBatchesForAnyWorkerCount) {
  auto ds = std::make_shared<IndexDataset>(257);
  std::vector<std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>> runs;
  for (int workers : {0, 1, 3}) {
    DataLoader dl(ds, {.batch_size = 16, .num_workers = workers, .prefetch = 2, .seed = 11});
    runs.push_back(run_epoch(dl, 0));
    auto e1 = run_epoch(dl, 1);
    runs.back().insert(runs.back().end(), e1.begin(), e1.end());
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
  // The target carries batch_seed(seed, epoch, batch).
  EXPECT_EQ(runs[0][3].second[0], static_cast<int64_t>(batch_seed(11, 0, 3) % 1000003));
}

TEST(DataLoader, OrderDependsOnEpochAndSeedOnly) {
  auto ds = std::make_shared<IndexDataset>(64);
  DataLoader dl(ds, {.batch_size = 64, .num_workers = 1, .seed = 3});
  const auto e0 = run_epoch(dl, 0), e1 = run_epoch(dl, 1), e0_again = run_epoch(dl, 0);
  EXPECT_NE(e0[0].first, e1[0].first);  // 64! orders: equal only by a bug
  EXPECT_EQ(e0, e0_again);
  EXPECT_EQ(e0[0].first, epoch_order(64, 3, 0, true));
  DataLoader other_seed(ds, {.batch_size = 64, .num_workers = 1, .seed = 4});
  EXPECT_NE(run_epoch(other_seed, 0)[0].first, e0[0].first);
  // No shuffle: 0, 1, 2, ... every epoch.
  DataLoader in_order(ds, {.batch_size = 64, .shuffle = false, .num_workers = 1});
  std::vector<int64_t> iota(64);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(run_epoch(in_order, 7)[0].first, iota);
}

TEST(DataLoader, ResumeAtBatchYieldsTheRestOfTheEpoch) {
  auto ds = std::make_shared<IndexDataset>(100);
  DataLoader dl(ds, {.batch_size = 7, .num_workers = 2, .seed = 9});
  const auto full = run_epoch(dl, 4);
  for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{6}, int64_t{14}, dl.num_batches()}) {
    const auto rest = run_epoch(dl, 4, k);
    ASSERT_EQ(rest.size(), full.size() - static_cast<size_t>(k));
    for (size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], full[static_cast<size_t>(k) + i]) << "k " << k;
  }
  // Restarting mid-epoch (batches still in flight) also works.
  dl.start_epoch(4);
  ASSERT_TRUE(dl.next().has_value());
  dl.start_epoch(4, 10);
  EXPECT_EQ(dl.next()->input.to_vector<int64_t>(), full[10].first);
  EXPECT_THROW(dl.start_epoch(4, dl.num_batches() + 1), Error);
  EXPECT_THROW(dl.start_epoch(-1), Error);
}

TEST(DataLoader, DatasetErrorsReachTheConsumer) {
  for (int workers : {0, 1, 3}) {
    // No shuffle: batch 3 starts with example 30 and throws.
    auto ds = std::make_shared<IndexDataset>(80, std::chrono::milliseconds(0), 30);
    DataLoader dl(ds, {.batch_size = 10, .shuffle = false, .num_workers = workers});
    dl.start_epoch(0);
    for (int b = 0; b < 3; ++b) ASSERT_TRUE(dl.next().has_value());
    try {
      dl.next();
      ADD_FAILURE() << "expected the dataset's error (workers " << workers << ")";
    } catch (const std::runtime_error& e) { EXPECT_STREQ(e.what(), "bad example 30"); }
    // The loader moves on: the next batch is batch 4.
    EXPECT_EQ(dl.next()->input.to_vector<int64_t>()[0], 40);
  }
}

TEST(DataLoader, DestroyMidEpochJoinsCleanly) {
  auto ds = std::make_shared<IndexDataset>(1000, std::chrono::milliseconds(2));
  {
    DataLoader dl(ds, {.batch_size = 4, .num_workers = 3, .prefetch = 8});
    dl.start_epoch(0);
    ASSERT_TRUE(dl.next().has_value());
    ASSERT_TRUE(dl.next().has_value());
  }  // workers are sleeping in get_batch or waiting for room: both must stop
  {
    DataLoader dl(ds, {.batch_size = 4, .num_workers = 2});
    dl.start_epoch(0);  // never consumed
  }
  {
    DataLoader dl(ds, {.batch_size = 4, .num_workers = 2});  // never started
  }
  EXPECT_GT(ds->builds_.load(), 0);
}

TEST(DataLoader, WorkersStayWithinThePrefetchWindow) {
  auto ds = std::make_shared<IndexDataset>(1000);
  DataLoader dl(ds, {.batch_size = 10, .num_workers = 2, .prefetch = 3});
  dl.start_epoch(0);
  // With no consumer the workers build batches 0..2 and then wait. Upper bound only: however the
  // threads are scheduled, a fourth build would be a bug.
  for (int i = 0; i < 500 && ds->builds_.load() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(ds->builds_.load(), 3);
  ASSERT_TRUE(dl.next().has_value());  // frees one slot
  for (int i = 0; i < 500 && ds->builds_.load() < 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(ds->builds_.load(), 4);
}

TEST(DataLoader, WaitSecondsGrowsWithASlowDataset) {
  auto ds = std::make_shared<IndexDataset>(50, std::chrono::milliseconds(20));
  // num_workers 0: next() builds the batch, so the wait is at least the 5 x 20 ms of sleep (sleep_for
  // never returns early): a lower bound that holds under any load.
  DataLoader sync(ds, {.batch_size = 10, .num_workers = 0});
  sync.start_epoch(0);
  while (sync.next()) {}
  EXPECT_GE(sync.wait_seconds(), 0.1);
  sync.reset_wait_seconds();
  EXPECT_EQ(sync.wait_seconds(), 0.0);
  // One worker, a consumer that does nothing else: it waits for nearly every batch. Only a consumer
  // descheduled for about 20 ms before each of the 5 calls could see no wait; 20 ms in total is a
  // 5x margin under the ~100 ms expected.
  DataLoader async(ds, {.batch_size = 10, .num_workers = 1, .prefetch = 1});
  async.start_epoch(0);
  while (async.next()) {}
  EXPECT_GT(async.wait_seconds(), 0.02);
}

TEST(DataLoader, ImageDatasetWithTransformsIsThreadCountInvariant) {
  std::vector<uint8_t> px(40 * 3 * 8 * 8);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 7 % 256);
  std::vector<int64_t> labels(40);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
  auto ds = std::make_shared<ImageDataset>(
      ImageData{from_vector<uint8_t>(px, {40, 3, 8, 8}), from_vector<int64_t>(labels, {40}), 10, {}},
      compose({random_crop(8, 2), random_horizontal_flip(), normalize({0.5f}, {0.25f})}));
  std::vector<std::vector<float>> first;
  for (int workers : {0, 3}) {
    DataLoader dl(ds, {.batch_size = 6, .num_workers = workers, .seed = 1});
    dl.start_epoch(2);
    std::vector<std::vector<float>> got;
    while (auto b = dl.next()) {
      EXPECT_EQ(b->input.size(1), 3);
      got.push_back(b->input.to_vector<float>());
    }
    if (first.empty())
      first = got;
    else
      EXPECT_EQ(got, first);
  }
  EXPECT_EQ(first.size(), 7u);
}

// Note [data-parallel batches]: ranks' parts of each global batch, with their augmentation draws, are exactly the
// slices of one process's batch of world_size x batch_size; a resume at batch b continues the same way.
TEST(DataLoader, RanksReadTheirPartOfEachGlobalBatch) {
  std::vector<uint8_t> px(50 * 1 * 6 * 6);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 13 % 256);
  std::vector<int64_t> labels(50);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
  auto ds = std::make_shared<ImageDataset>(
      ImageData{from_vector<uint8_t>(px, {50, 1, 6, 6}), from_vector<int64_t>(labels, {50}), 10, {}},
      compose({random_crop(6, 2), random_horizontal_flip(), normalize({0.5f}, {0.25f})}));
  for (const int world : {2, 3}) {
    const int64_t B = 4;
    DataLoader one(ds, {.batch_size = world * B, .shuffle = true, .drop_last = true, .num_workers = 0, .seed = 7});
    one.start_epoch(1, 1);
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.push_back(std::make_unique<DataLoader>(ds, DataLoaderOptions{.batch_size = B,
                                                                         .shuffle = true,
                                                                         .drop_last = true,
                                                                         .num_workers = r % 2,
                                                                         .seed = 7,
                                                                         .rank = r,
                                                                         .world_size = world}));
      EXPECT_EQ(ranks.back()->num_batches(), one.num_batches());
      ranks.back()->start_epoch(1, 1);  // resumed at global batch 1
    }
    int64_t batches = 0;
    while (auto whole = one.next()) {
      const std::vector<float> in = whole->input.to_vector<float>();
      const std::vector<int64_t> tgt = whole->target.to_vector<int64_t>();
      const size_t per = in.size() / static_cast<size_t>(world);
      for (int r = 0; r < world; ++r) {
        const std::optional<Batch> part = ranks[static_cast<size_t>(r)]->next();
        ASSERT_TRUE(part.has_value());
        const auto ur = static_cast<size_t>(r);
        EXPECT_EQ(part->input.to_vector<float>(),
                  std::vector<float>(in.begin() + ur * per, in.begin() + (ur + 1) * per))
            << "world " << world << " rank " << r << " batch " << batches;
        EXPECT_EQ(part->target.to_vector<int64_t>(),
                  std::vector<int64_t>(tgt.begin() + r * B, tgt.begin() + (r + 1) * B));
      }
      ++batches;
    }
    EXPECT_EQ(batches, 50 / (world * B) - 1);
    for (auto& r : ranks) EXPECT_FALSE(r->next().has_value());
  }
  auto idx = std::make_shared<IndexDataset>(10);
  EXPECT_THROW(DataLoader(idx, {.drop_last = true, .rank = 2, .world_size = 2}), Error);
  EXPECT_THROW(DataLoader(idx, {.drop_last = false, .rank = 0, .world_size = 2}), Error);  // parts would differ
}

TEST(DataLoader, UsageErrors) {
  auto ds = std::make_shared<IndexDataset>(10);
  DataLoader dl(ds, {.batch_size = 3});
  EXPECT_THROW(dl.next(), Error);  // no epoch started
  EXPECT_THROW(DataLoader(ds, {.batch_size = 0}), Error);
  EXPECT_THROW(DataLoader(ds, {.num_workers = -1}), Error);
  EXPECT_THROW(DataLoader(nullptr, {}), Error);
  // An empty dataset has no batches.
  DataLoader empty_dl(std::make_shared<IndexDataset>(0), {});
  EXPECT_EQ(empty_dl.num_batches(), 0);
  empty_dl.start_epoch(0);
  EXPECT_FALSE(empty_dl.next().has_value());
}

}  // namespace

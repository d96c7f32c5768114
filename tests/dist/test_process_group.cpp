// Process groups (Note [process groups]): the single process of an ordinary run, and, under
// `mpirun -np 2` (ctest's dist_two_ranks, MP_DIST_EXPECT_RANKS=2), the collectives across ranks and the
// data-parallel identity: the mean of the ranks' shard gradients is the full batch's gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "mp/mp.hpp"

using namespace mp;

namespace {

// The rank count this run must have (MP_DIST_EXPECT_RANKS), or 0 when any will do.
int expected_ranks() {
  const char* e = std::getenv("MP_DIST_EXPECT_RANKS");
  return e == nullptr ? 0 : std::atoi(e);
}

}  // namespace

TEST(Dist, TheRunHasTheRanksItWasStartedWith) {
  dist::ProcessGroup& w = dist::world();
  if (expected_ranks() > 0) {
    ASSERT_TRUE(dist::built_with_mpi()) << "MP_DIST_EXPECT_RANKS is set but this build has no MPI";
    ASSERT_TRUE(dist::launched_by_mpi()) << "MP_DIST_EXPECT_RANKS is set but no MPI launcher started this process";
    EXPECT_EQ(w.size(), expected_ranks()) << w.describe();
  } else if (!dist::launched_by_mpi()) {
    EXPECT_EQ(w.size(), 1);
    EXPECT_EQ(w.describe(), "single process");
  }
  EXPECT_GE(w.rank(), 0);
  EXPECT_LT(w.rank(), w.size());
}

TEST(Dist, AllReduceMeanAndBroadcast) {
  dist::ProcessGroup& w = dist::world();
  const double r = w.rank(), n = w.size();
  // Every dtype class: f32 and bf16 summed in f32, f64 in f64, in one message each.
  const Tensor a = full({5}, r + 1.0), b = full({2, 3}, 2.0 * (r + 1.0), {.dtype = DType::f64});
  const Tensor c = full({4}, r + 1.0, {.dtype = DType::bf16});
  const Tensor ts[3] = {a, b, c};
  w.all_reduce_mean(ts);
  const double mean = (n + 1.0) / 2.0;  // of 1..n
  for (float v : a.to_vector<float>()) EXPECT_FLOAT_EQ(v, static_cast<float>(mean));
  for (double v : b.to_vector<double>()) EXPECT_DOUBLE_EQ(v, 2.0 * mean);
  for (float v : c.to_vector<float>()) EXPECT_EQ(v, static_cast<float>(BFloat16(static_cast<float>(mean))));
  // Broadcast of any dtype from rank 0 (and from the last rank).
  const Tensor i = full({3}, 10.0 * (r + 1.0), {.dtype = DType::i64});
  const Tensor first[1] = {i};
  w.broadcast(first, 0);
  for (int64_t v : i.to_vector<int64_t>()) EXPECT_EQ(v, 10);
  const Tensor f = full({2}, r);
  const Tensor last[1] = {f};
  w.broadcast(last, w.size() - 1);
  for (float v : f.to_vector<float>()) EXPECT_EQ(v, static_cast<float>(n - 1));
  w.barrier();
}

TEST(Dist, ShardGradientsAveragedAreTheFullBatchGradient) {
  // A two-layer net in f64, the same weights on every rank (broadcast from rank 0 as a DDP start does) and the
  // same batch of 8; rank r takes its share of consecutive samples: with equal shards the mean of the shards' mean-loss
  // gradients is the full batch's mean-loss gradient, up to rounding.
  dist::ProcessGroup& w = dist::world();
  const int n = w.size();
  ASSERT_EQ(8 % n, 0) << "the test's batch of 8 needs a rank count that divides it";
  manual_seed(7 + static_cast<uint64_t>(w.rank()));  // different on each rank: the broadcast must fix it
  const Tensor w1 = randn({4, 6}, {.dtype = DType::f64}).requires_grad_();
  const Tensor w2 = randn({6, 3}, {.dtype = DType::f64}).requires_grad_();
  const Tensor params[2] = {w1, w2};
  w.broadcast(params, 0);
  manual_seed(11);
  const Tensor x = randn({8, 4}, {.dtype = DType::f64}), y = randn({8, 3}, {.dtype = DType::f64});
  auto loss_of = [&](const Tensor& xs, const Tensor& ys) {
    const Tensor d = sub(matmul(relu(matmul(xs, w1)), w2), ys);
    return mean(mul(d, d));
  };
  loss_of(x, y).backward();  // the full batch, on every rank
  const std::vector<double> full1 = w1.grad().to_vector<double>(), full2 = w2.grad().to_vector<double>();
  w1.set_grad(Tensor());
  w2.set_grad(Tensor());
  const int64_t k = 8 / n;
  loss_of(x.narrow(0, w.rank() * k, k), y.narrow(0, w.rank() * k, k)).backward();
  const Tensor grads[2] = {w1.grad(), w2.grad()};
  w.all_reduce_mean(grads);
  const std::vector<double> got1 = w1.grad().to_vector<double>(), got2 = w2.grad().to_vector<double>();
  for (size_t i = 0; i < full1.size(); ++i) EXPECT_NEAR(got1[i], full1[i], 1e-12 * (1 + std::abs(full1[i]))) << i;
  for (size_t i = 0; i < full2.size(); ++i) EXPECT_NEAR(got2[i], full2[i], 1e-12 * (1 + std::abs(full2[i]))) << i;
}

TEST(Dist, CollectivesRefuseWhatTheyCannotSend) {
  dist::ProcessGroup& w = dist::world();
  const Tensor ints[1] = {zeros({2}, {.dtype = DType::i64})};
  EXPECT_THROW(w.all_reduce_mean(ints), Error);
  const Tensor strided[1] = {zeros({4, 4}).transpose(0, 1)};
  EXPECT_THROW(w.all_reduce_mean(strided), Error);
  EXPECT_THROW(w.broadcast(strided, 0), Error);
  EXPECT_THROW(w.broadcast(ints, w.size()), Error);
}

// Process groups (Note [process groups]): the single process of an ordinary run, and, under
// `mpirun -np 2` (ctest's dist_two_ranks, MP_DIST_EXPECT_RANKS=2), the collectives across ranks and the
// data-parallel identity: the mean of the ranks' shard gradients is the full batch's gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"

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

namespace {

// x rounded to the wire dtype (round to nearest even), as a float.
float to_wire(float x, DType wire) {
  return wire == DType::bf16 ? static_cast<float>(BFloat16(x)) : static_cast<float>(Half(x));
}

// Rank r's value at element i: not representable in 16 bits, different on every rank.
double value_of(int r, int64_t i) { return (1.0 + 0.0137 * static_cast<double>(i + 1)) * (r + 1.0) / 3.0 - 0.4; }

}  // namespace

// Note [16-bit gradient communication]: all_reduce_mean_in divides each rank's value by N, rounds it once to the wire,
// sums in the wire (Note [16-bit sums in MPI]: f32 addition, rounded) and rounds to the tensor's dtype. With two
// ranks each element is one addition, so the result is known exactly; for any N it is within N roundings (u each:
// bf16 2^-8, f16 2^-11 relative) of the f32 mean: |got - mean| <= N u sum_r |v_r| / N, plus for bf16 tensors the last
// rounding to bf16 (2^-8 of the mean).
// A group of one sends nothing: the values stay as they are.
TEST(Dist, AllReduceMeanInSixteenBitsRoundsBeforeAndAfterTheSum) {
  dist::ProcessGroup& w = dist::world();
  const int n = w.size();
  const int64_t count = 64;
  for (const DType wire : {DType::bf16, DType::f16})
    for (const DType dt : {DType::f32, DType::bf16}) {
      std::vector<float> mine(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) mine[static_cast<size_t>(i)] = static_cast<float>(value_of(w.rank(), i));
      const Tensor t = from_vector<float>(mine, {count}).to(dt);
      const Tensor before = t.clone();
      const Tensor ts[1] = {t};
      w.all_reduce_mean_in(ts, wire);
      const std::vector<float> got = t.to(DType::f32).to_vector<float>();
      const double u = wire == DType::bf16 ? 0x1p-8 : 0x1p-11;
      const std::string what = std::string(dtype_name(dt)) + " sent in " + dtype_name(wire);
      if (n == 1) {
        EXPECT_TRUE(mp::test::bitwise_equal(t, before)) << what;
        continue;
      }
      for (int64_t i = 0; i < count; ++i) {
        // each rank's value as its tensor holds it (rounded to dt), then the arithmetic of the Note
        auto held = [&](int r) {
          const float v = static_cast<float>(value_of(r, i));
          return dt == DType::bf16 ? static_cast<float>(BFloat16(v)) : v;
        };
        double mean = 0, magnitude = 0;
        for (int r = 0; r < n; ++r) {
          mean += held(r) / static_cast<double>(n);
          magnitude += std::abs(held(r)) / static_cast<double>(n);
        }
        const float g = got[static_cast<size_t>(i)];
        EXPECT_LE(std::abs(g - mean), n * u * magnitude + (dt == DType::bf16 ? 0x1p-8 * std::abs(mean) : 0) + 1e-7)
            << what << ", element " << i;
        if (n != 2) continue;
        const float half = 1.0f / 2.0f;
        float want = to_wire(to_wire(held(0) * half, wire) + to_wire(held(1) * half, wire), wire);
        if (dt == DType::bf16) want = static_cast<float>(BFloat16(want));
        EXPECT_EQ(g, want) << what << ", element " << i;
      }
    }
  w.barrier();
}

// The division before the sum is what keeps f16 in range: every rank holds 40000 (f16's largest is 65504). Sent in
// f16, the mean is 40000; summed first (the f16 sum alone, start_all_reduce_sum) it is N x 40000: inf.
TEST(Dist, SixteenBitMeanDividesBeforeTheSumSoFp16DoesNotOverflow) {
  dist::ProcessGroup& w = dist::world();
  for (const DType dt : {DType::f32, DType::f16}) {
    const Tensor t = full({8}, 40000.0, {.dtype = dt});
    const Tensor ts[1] = {t};
    w.all_reduce_mean_in(ts, DType::f16);
    for (float v : t.to(DType::f32).to_vector<float>()) EXPECT_EQ(v, 40000.0f) << dtype_name(dt);
  }
  const Tensor summed = full({8}, 40000.0, {.dtype = DType::f16});
  w.start_all_reduce_sum(summed)->wait();
  for (float v : summed.to(DType::f32).to_vector<float>()) {
    if (w.size() > 1)
      EXPECT_TRUE(std::isinf(v)) << "a 16-bit sum of " << w.size() << " x 40000 should overflow f16, got " << v;
    else
      EXPECT_EQ(v, 40000.0f);
  }
  w.barrier();
}

TEST(Dist, AllReduceMeanInRefusesAWireThatIsNotF32Bf16OrF16) {
  const Tensor ts[1] = {zeros({2})};
  try {
    dist::world().all_reduce_mean_in(ts, DType::f64);
    ADD_FAILURE() << "f64 was accepted as a wire dtype";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected f32, bf16 or f16 to send gradients in, got f64"), std::string::npos)
        << e.what();
  }
}

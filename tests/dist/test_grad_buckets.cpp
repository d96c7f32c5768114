// Gradient buckets (Note [bucketed gradient all-reduce] in src/train/grad_buckets.cpp): their layout, and, under
// `mpirun -np 2` (ctest's dist_grad_buckets_two_ranks, MP_DIST_EXPECT_RANKS=2), that buckets all-reduced during
// backward give the gradients one all-reduce after it gives, for several bucket sizes and dtypes, with accumulation
// (one all-reduce per bucket per step) and with a parameter that gets no gradient (no hang). Run alone, the same tests
// check a group of one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"
#include "train/grad_buckets.hpp"

using namespace mp;
using mp::train::detail::GradBuckets;

namespace {

int expected_ranks() {
  const char* e = std::getenv("MP_DIST_EXPECT_RANKS");
  return e == nullptr ? 0 : std::atoi(e);
}

// Parameters of different sizes and dtypes (registration order), the second-to-last the largest.
std::vector<Tensor> make_params(DType dt) {
  manual_seed(3);
  std::vector<Tensor> ps;
  for (const Shape& s : std::vector<Shape>{{7}, {300, 40}, {5, 3}, {1000, 30}, {11}})
    ps.push_back(randn(s).to(dt).requires_grad_());
  return ps;
}

// A loss that gives every parameter (but `skip`, in the last pass only) a gradient that differs between the ranks and
// between passes.
Tensor loss_of(const std::vector<Tensor>& ps, int pass, int skip) {
  const double r = dist::world().rank() + 1;
  Tensor loss;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (static_cast<int>(i) == skip) continue;
    Tensor term = sum(mul(square(ps[i].to(DType::f32)), 0.37 * r + 0.11 * pass + 0.013 * static_cast<double>(i)));
    loss = loss.defined() ? add(loss, term) : term;
  }
  return loss;
}

// The gradients each parameter would get from one all-reduce after backward (ProcessGroup::all_reduce_mean).
// With a 16-bit `wire`, ProcessGroup::all_reduce_mean_in's (Note [16-bit gradient communication]).
std::vector<Tensor> reference(DType dt, int passes, int skip = -1, DType wire = DType::f32) {
  std::vector<Tensor> ps = make_params(dt);
  for (int pass = 0; pass < passes; ++pass) loss_of(ps, pass, pass == passes - 1 ? skip : -1).backward();
  std::vector<Tensor> grads;
  for (const Tensor& p : ps)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (wire == DType::f32)
    dist::world().all_reduce_mean(grads);
  else
    dist::world().all_reduce_mean_in(grads, wire);
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(p.grad());
  return out;
}

// The same through GradBuckets of `mb` MiB, armed for the last pass only; returns the gradients.
// `stats` (when given) gets the buckets' counters.
std::vector<Tensor> bucketed(DType dt, double mb, int passes, int skip = -1, GradBuckets::Stats* stats = nullptr,
                             DType wire = DType::f32) {
  std::vector<Tensor> ps = make_params(dt);
  GradBuckets buckets(dist::world(), ps, mb, wire);
  for (int pass = 0; pass < passes; ++pass) {
    if (pass == passes - 1) buckets.arm();
    loss_of(ps, pass, pass == passes - 1 ? skip : -1).backward();
  }
  buckets.finish();
  if (stats != nullptr) *stats = buckets.stats();
  std::vector<Tensor> out;
  for (const Tensor& p : ps) out.push_back(p.grad());
  return out;
}

void expect_same(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].defined(), want[i].defined()) << what << ": parameter " << i;
    if (!want[i].defined()) continue;
    // Bitwise: with two ranks each element's sum is one f32 addition whatever the bucket (Note [bucketed gradient
    // all-reduce] 4), and the division and rounding are the same operations.
    EXPECT_TRUE(mp::test::bitwise_equal(got[i], want[i])) << what << ": parameter " << i << " " << got[i].describe();
  }
}

}  // namespace

TEST(GradBuckets, TheRunHasTheRanksItWasStartedWith) {
  if (expected_ranks() > 0) { EXPECT_EQ(dist::world().size(), expected_ranks()) << dist::world().describe(); }
}

TEST(GradBuckets, LayoutIsReverseOrderCutAtTheSize) {
  const std::vector<Tensor> ps = make_params(DType::f32);  // 7, 12000, 15, 30000, 11 elements: x4 bytes
  using L = std::vector<std::vector<size_t>>;
  EXPECT_EQ(GradBuckets(dist::world(), ps, 25).layout(), (L{{4, 3, 2, 1, 0}}));
  // 0.05 MiB = 52428 bytes: 11 + 30000 elements (120044 bytes) exceed it, so the largest parameter is a bucket alone.
  EXPECT_EQ(GradBuckets(dist::world(), ps, 0.05).layout(), (L{{4}, {3}, {2, 1, 0}}));
  EXPECT_EQ(GradBuckets(dist::world(), ps, 1e-6).layout(), (L{{4}, {3}, {2}, {1}, {0}}));
  // A parameter that needs no gradient is in no bucket; an f64 one starts a bucket of its own dtype.
  std::vector<Tensor> mixed = make_params(DType::f32);
  mixed[2] = zeros({5, 3});
  mixed[1] = zeros({300, 40}, {.dtype = DType::f64}).requires_grad_();
  EXPECT_EQ(GradBuckets(dist::world(), mixed, 25).layout(), (L{{4, 3}, {1}, {0}}));
}

TEST(GradBuckets, RefusesASizeThatIsNotPositive) {
  const std::vector<Tensor> ps = make_params(DType::f32);
  EXPECT_THROW(GradBuckets(dist::world(), ps, 0), Error);
  train::TrainConfig c;
  c.bucket_mb = -1;
  try {
    train::validate(c);
    ADD_FAILURE() << "--bucket_mb -1 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--bucket_mb must be a size in MiB in [0, 8192]"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("got -1"), std::string::npos) << e.what();
  }
}

TEST(GradBuckets, SameGradientsAsOneAllReduceForEveryBucketSizeAndDtype) {
  for (const DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64})
    for (const double mb : {25.0, 0.05, 1e-6}) {
      const std::string what = std::string(dtype_name(dt)) + ", " + std::to_string(mb) + " MiB";
      expect_same(bucketed(dt, mb, 1), reference(dt, 1), what);
    }
}

TEST(GradBuckets, AccumulationCommunicatesOncePerStep) {
  // Three micro-batches, armed for the last: each bucket is all-reduced once, and the result is the mean of the sums.
  // Every bucket starts inside the last backward (by a hook), none after it.
  for (const double mb : {25.0, 0.05, 1e-6}) {
    GradBuckets::Stats stats;
    const std::vector<Tensor> got = bucketed(DType::f32, mb, 3, -1, &stats);
    expect_same(got, reference(DType::f32, 3), "3 micro-batches, " + std::to_string(mb) + " MiB");
    const std::vector<Tensor> ps = make_params(DType::f32);
    const auto buckets = static_cast<int64_t>(GradBuckets(dist::world(), ps, mb).layout().size());
    EXPECT_EQ(stats.all_reduces, buckets) << mb << " MiB";
    EXPECT_EQ(stats.started_in_backward, buckets) << mb << " MiB";
  }
}

TEST(GradBuckets, AParameterWithoutAGradientDoesNotHang) {
  // Parameter 3 (the largest: a bucket of its own at 0.05 MiB, in the one bucket at 25) gets no gradient in the armed
  // pass: its bucket and every later one start after backward with zeros in its place (ctest's timeout ends a hang).
  // Without an earlier micro-batch it keeps no gradient; with one, that gradient is final and averaged.
  for (const double mb : {25.0, 0.05, 1e-6}) {
    GradBuckets::Stats stats;
    const std::vector<Tensor> got = bucketed(DType::f32, mb, 1, 3, &stats);
    EXPECT_FALSE(got[3].defined());
    // Buckets are started in order: only those before parameter 3's start in backward ({4} when it is a bucket).
    EXPECT_EQ(stats.started_in_backward, mb == 25.0 ? 0 : 1) << mb << " MiB";
    expect_same(got, reference(DType::f32, 1, 3), "unused parameter, " + std::to_string(mb) + " MiB");
    const std::vector<Tensor> earlier = bucketed(DType::f32, mb, 2, 3);
    EXPECT_TRUE(earlier[3].defined());
    expect_same(earlier, reference(DType::f32, 2, 3), "unused in the last micro-batch, " + std::to_string(mb) + " MiB");
  }
}

// --grad_comm_dtype bf16 / fp16 (Note [16-bit gradient communication]): the buckets divide by N, round once to the
// wire, sum in it and widen back, the operations ProcessGroup::all_reduce_mean_in does in the same order, so with two
// ranks (one rounded addition per element) the gradients are bitwise those of the one all-reduce; the messages carry
// half the bytes of f32 ones. A group of one sends nothing and keeps the gradients as they are.
TEST(GradBuckets, SixteenBitWireMatchesTheOneAllReduceAndHalvesTheBytes) {
  const int64_t elements = 7 + 12000 + 15 + 30000 + 11;
  for (const DType wire : {DType::bf16, DType::f16})
    for (const DType dt : {DType::f32, DType::bf16, DType::f16})
      for (const double mb : {25.0, 0.05}) {
        const std::string what =
            std::string(dtype_name(dt)) + " sent in " + dtype_name(wire) + ", " + std::to_string(mb) + " MiB";
        GradBuckets::Stats stats, wide;
        const std::vector<Tensor> got = bucketed(dt, mb, 1, -1, &stats, wire);
        expect_same(got, reference(dt, 1, -1, wire), what);
        (void)bucketed(dt, mb, 1, -1, &wide);
        EXPECT_EQ(wide.bytes, 4 * elements) << what;
        EXPECT_EQ(stats.bytes, dist::world().size() > 1 ? 2 * elements : 4 * elements) << what;
        if (dist::world().size() == 1) expect_same(got, bucketed(dt, mb, 1), what + ", one process: unchanged");
      }
}

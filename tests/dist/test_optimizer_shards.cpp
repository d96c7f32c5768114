// Sharded optimizer state (Note [sharded optimizer state] in src/train/optimizer_shards.cpp): the partition, and, under
// `mpirun -np 2` and `-np 3` (ctest's dist_optimizer_shards_{two,three}_ranks, MP_DIST_EXPECT_RANKS), that a sharded
// step (reduce-scatter, each rank's update, all-gather) trains the weights the whole optimizer trains on the averaged
// gradients, that each rank keeps only its parameters' state, that rank 0 gathers the whole state dict, and that the
// weight averages gathered from the owners are the unsharded ones. Run alone, the same tests check a group of one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "mp/mp.hpp"
#include "test_util.hpp"
#include "train/optimizer_shards.hpp"

using namespace mp;
using mp::train::detail::OptimizerShards;
using mp::train::detail::partition_by_numel;

namespace {

int expected_ranks() {
  const char* e = std::getenv("MP_DIST_EXPECT_RANKS");
  return e == nullptr ? 0 : std::atoi(e);
}

// Three linear layers: six parameters of 1200, 30, 600, 20, 140 and 7 elements (on three ranks, whole parameters
// cannot be shared out evenly: 1200 | 600 + 20 + 7 | 140 + 30).
std::shared_ptr<nn::Sequential> make_model(DType dt) {
  manual_seed(21);
  auto m = std::make_shared<nn::Sequential>(std::make_shared<nn::Linear>(40, 30), std::make_shared<nn::Linear>(30, 20),
                                            std::make_shared<nn::Linear>(20, 7));
  if (dt != DType::f32) m->to(dt);
  return m;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const std::string& which, const std::vector<Tensor>& ps, DType dt) {
  std::unique_ptr<optim::Optimizer> o;
  if (which == "sgd")
    o = std::make_unique<optim::SGD>(ps, optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3});
  else
    o = std::make_unique<optim::AdamW>(ps, optim::AdamWOptions{.lr = 1e-2});
  o->set_master_weights(dt != DType::f32);
  return o;
}

// A loss whose gradient differs between the ranks and the steps.
void backward_of_rank(nn::Sequential& m, int step, int rank, DType dt) {
  manual_seed(100 + static_cast<uint64_t>(step) * 10 + static_cast<uint64_t>(rank));
  const Tensor x = randn({5, 40}).to(dt);
  const Tensor y = m(x).to(DType::f32);
  mul(sum(mul(y, y)), 0.1 * (rank + 1)).backward();
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double d = 0, s = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    d = std::max(d, std::abs(x[i] - y[i]));
    s = std::max(s, std::abs(y[i]));
  }
  return s > 0 ? d / s : d;
}

}  // namespace

TEST(OptimizerShards, TheRunHasTheRanksItWasStartedWith) {
  if (expected_ranks() > 0) { EXPECT_EQ(dist::world().size(), expected_ranks()) << dist::world().describe(); }
}

TEST(OptimizerShards, PartitionGivesWholeParametersLargestFirstToTheLightestRank) {
  const std::vector<int64_t> numels{1200, 30, 600, 20, 140, 7};
  EXPECT_EQ(partition_by_numel(numels, 1), (std::vector<int>{0, 0, 0, 0, 0, 0}));
  // 1200 -> 0; 600 -> 1; 140 -> 1 (740); 30 -> 1 (770); 20 -> 1 (790); 7 -> 1 (797)
  EXPECT_EQ(partition_by_numel(numels, 2), (std::vector<int>{0, 1, 1, 1, 1, 1}));
  // 1200 -> 0; 600 -> 1; 140 -> 2; 30 -> 2; 20 -> 2; 7 -> 2
  EXPECT_EQ(partition_by_numel(numels, 3), (std::vector<int>{0, 2, 1, 2, 2, 2}));
  // More ranks than parameters: some own nothing.
  EXPECT_EQ(partition_by_numel({5, 5}, 4), (std::vector<int>{0, 1}));
  // Balanced up to the largest parameter: equal sizes share out evenly.
  const std::vector<int> even = partition_by_numel(std::vector<int64_t>(12, 10), 3);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(std::count(even.begin(), even.end(), r), 4) << r;
  EXPECT_THROW(partition_by_numel(numels, 0), Error);
}

// What a sharded run does at each step, against the whole optimizer on every rank given the all-reduced gradients.
class ShardedStep : public ::testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(ShardedStep, TrainsTheWeightsAndStateOfTheWholeOptimizer) {
  const auto& [which, dt] = GetParam();
  dist::ProcessGroup& w = dist::world();
  const int n = w.size(), me = w.rank();
  const auto sharded = make_model(dt), whole = make_model(dt);
  const std::vector<Tensor> ps = sharded->parameters(), qs = whole->parameters();
  auto opt = make_optimizer(which, ps, dt), ref = make_optimizer(which, qs, dt);
  optim::ModelEma ema(*sharded, 0.5, opt.get()), ref_ema(*whole, 0.5, ref.get());
  // Under O2 the masters exist before the first step (amp::initialize sets them): a rank must drop the others'.
  if (dt != DType::f32)
    for (size_t i = 0; i < ps.size(); ++i) {
      opt->set_master(ps[i], ps[i].detach().to(DType::f32));
      ref->set_master(qs[i], qs[i].detach().to(DType::f32));
    }
  const OptimizerShards shards(w, *opt);
  int64_t mine = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const bool owned = shards.owner(ps[i]) == me;
    EXPECT_EQ(opt->state(ps[i]) != nullptr, owned && dt != DType::f32) << "parameter " << i;
    mine += owned ? ps[i].numel() : 0;
  }
  EXPECT_EQ(mine, shards.numel_per_rank()[static_cast<size_t>(me)]);
  // At step 1 parameter 1 (a bias) gets no gradient on any rank, as an unused parameter: it is left out of the
  // reduce-scatter (no hang), keeps no gradient and is not updated, as in the whole optimizer.
  const auto unused = [](const std::vector<Tensor>& xs, int step) {
    if (step == 1) xs[1].set_grad(Tensor());
  };
  for (int step = 0; step < 3; ++step) {
    backward_of_rank(*sharded, step, me, dt);
    unused(ps, step);
    shards.reduce_scatter_gradients();
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_EQ(ps[i].grad().defined(), shards.owner(ps[i]) == me && !(step == 1 && i == 1))
          << "step " << step << ", parameter " << i;
    opt->step();
    opt->zero_grad();
    shards.all_gather_weights();
    ema.update(*sharded, opt.get());

    backward_of_rank(*whole, step, me, dt);
    unused(qs, step);
    std::vector<Tensor> grads;
    for (const Tensor& q : qs)
      if (q.grad().defined()) grads.push_back(q.grad());
    w.all_reduce_mean(grads);
    ref->step();
    ref->zero_grad();
    ref_ema.update(*whole, ref.get());
  }
  // Two ranks add each element once, in either collective; three may add in another order (f32 rounding, ~1e-7 of a
  // value, then carried through three steps and, in bf16, possibly rounding a weight the other way: one bf16 ulp,
  // 2^-8 of its value).
  const double tol = n <= 2 ? 0.0 : (dt == DType::f32 ? 1e-5 : 1e-2);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_LE(max_rel_diff(ps[i], qs[i]), tol) << "weight " << i;
  // Each rank holds the state of its own parameters only; together they hold the whole optimizer's.
  int64_t held = 0, whole_held = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    const bool owned = shards.owner(ps[i]) == me;
    EXPECT_EQ(opt->state(ps[i]) != nullptr, owned) << "parameter " << i;
    if (const optim::ParamState* st = opt->state(ps[i]))
      for (const auto& [name, t] : st->buffers) held += t.numel();
    for (const auto& [name, t] : ref->state(qs[i])->buffers) whole_held += t.numel();
  }
  EXPECT_EQ(static_cast<int64_t>(shards.sum(static_cast<double>(held))), whole_held);
  // Rank 0 gathers the whole state dict: the same entries, steps and buffers as the whole optimizer's.
  const optim::OptimizerStateDict got = shards.gather_state(0), want = ref->state_dict();
  if (me == 0) {
    ASSERT_EQ(got.state.size(), want.state.size());
    for (const auto& [index, st] : want.state) {
      ASSERT_EQ(got.state.count(index), 1u) << index;
      const optim::ParamState& g = got.state.at(index);
      EXPECT_EQ(g.step, st.step) << index;
      ASSERT_EQ(g.buffers.size(), st.buffers.size()) << index;
      for (const auto& [name, t] : st.buffers)
        EXPECT_LE(max_rel_diff(g.buffers.at(name), t), n <= 2 ? 0.0 : 1e-4) << index << "." << name;
    }
  } else {
    EXPECT_LT(got.state.size(), want.state.size());  // this rank's own part
  }
  // The averages: after the all-gather every rank has the owners' (a master's average under O2, not of its rounding).
  shards.all_gather_averages(ema, *sharded);
  for (const auto& [name, a] : ref_ema.averages()) EXPECT_LE(max_rel_diff(*ema.averages().find(name), a), tol) << name;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ShardedStep,
                         ::testing::Combine(::testing::Values("sgd", "adamw"),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         [](const auto& i) { return std::get<0>(i.param) + "_" + dtype_name(std::get<1>(i.param)); });

TEST(OptimizerShards, ReduceScatterAllGatherAndGatherMoveTheirBlocks) {
  dist::ProcessGroup& w = dist::world();
  const int n = w.size(), me = w.rank();
  std::vector<int64_t> counts;  // uneven, one rank (of several) with an empty block
  for (int r = 0; r < n; ++r) counts.push_back(r % 2 == 1 ? 0 : r + 2);
  int64_t total = 0;
  std::vector<int64_t> start;
  for (const int64_t c : counts) {
    start.push_back(total);
    total += c;
  }
  // reduce_scatter_sum: rank r contributes (r + 1) * (j + 1) at element j; the sum is (j + 1) * n (n + 1) / 2.
  const Tensor buf = empty({total});
  for (int64_t j = 0; j < total; ++j) buf.data_ptr<float>()[j] = static_cast<float>((me + 1) * (j + 1));
  const Tensor out = empty({counts[static_cast<size_t>(me)]});
  w.reduce_scatter_sum(buf, out, counts);
  for (int64_t k = 0; k < out.numel(); ++k)
    EXPECT_EQ(out.data_ptr<float>()[k], static_cast<float>((start[static_cast<size_t>(me)] + k + 1) * n * (n + 1) / 2))
        << k;
  // all_gather: every rank's block r holds rank r's values.
  const Tensor all = full({total}, -1.0, {.dtype = DType::i64});
  for (int64_t k = 0; k < counts[static_cast<size_t>(me)]; ++k)
    all.data_ptr<int64_t>()[start[static_cast<size_t>(me)] + k] = 100 * me + k;
  w.all_gather(all, counts);
  for (int r = 0; r < n; ++r)
    for (int64_t k = 0; k < counts[static_cast<size_t>(r)]; ++k)
      EXPECT_EQ(all.data_ptr<int64_t>()[start[static_cast<size_t>(r)] + k], 100 * r + k) << r << ", " << k;
  // gather to the last rank: only it receives the whole.
  const int root = n - 1;
  const Tensor mine = empty({counts[static_cast<size_t>(me)]}, {.dtype = DType::bf16});
  for (int64_t k = 0; k < mine.numel(); ++k) mine.data_ptr<BFloat16>()[k] = BFloat16(static_cast<float>(me + k));
  const Tensor whole = me == root ? full({total}, -1.0, {.dtype = DType::bf16}) : Tensor();
  w.gather(mine, whole, counts, root);
  if (me == root) {
    for (int r = 0; r < n; ++r)
      for (int64_t k = 0; k < counts[static_cast<size_t>(r)]; ++k)
        EXPECT_EQ(static_cast<float>(whole.data_ptr<BFloat16>()[start[static_cast<size_t>(r)] + k]),
                  static_cast<float>(r + k));
  }
  // Refusals (before any message, on every rank alike): counts that do not cover the buffer, a 16-bit sum.
  std::vector<int64_t> short_counts = counts;
  short_counts[0] -= 1;
  EXPECT_THROW(w.reduce_scatter_sum(buf, out, short_counts), Error);
  EXPECT_THROW(w.all_gather(all, short_counts), Error);
  EXPECT_THROW(w.reduce_scatter_sum(buf.to(DType::bf16), out.to(DType::bf16), counts), Error);
  w.barrier();
}

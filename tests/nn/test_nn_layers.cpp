// Layer forwards against the functional ops and hand computations; modes; argument errors.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>

#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"
#include "mp/nn/nn.hpp"
#include "mp/nn/sync_batch_norm.hpp"
#include "mp/ops/ops.hpp"

using namespace mp;
using namespace mp::nn;

namespace {

// Max |a - b| over all elements (as double).
double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

}  // namespace

TEST(NnLayers, LinearMatchesHandComputation) {
  Linear fc(3, 2);
  {
    autograd::NoGradGuard ng;
    Tensor w = fc.weight(), b = fc.bias();
    w.copy_(from_vector<float>({1, 2, 3, -1, 0, 1}, {2, 3}));
    b.copy_(from_vector<float>({0.5f, -0.5f}, {2}));
  }
  Tensor y = fc.forward(from_vector<float>({1, 1, 1, 2, 0, -1}, {2, 3}));
  // [1,1,1]: 6 + 0.5, 0 - 0.5; [2,0,-1]: 2 - 3 + 0.5, -2 - 1 - 0.5.
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{6.5f, -0.5f, -0.5f, -3.5f}));
  EXPECT_EQ(fc(randn({4, 5, 3})).sizes(), (Shape{4, 5, 2}));  // leading dims pass through
  Linear no_bias(LinearOptions{.in_features = 3, .out_features = 2, .bias = false});
  EXPECT_FALSE(no_bias.bias().defined());
  EXPECT_EQ(no_bias.named_parameters().size(), 1u);
  EXPECT_THROW(fc.forward(randn({2, 4})), Error);
}

TEST(NnLayers, Conv2dAndPoolsMatchTheOps) {
  manual_seed(3);
  Conv2d conv(nn::Conv2dOptions{
      .in_channels = 2, .out_channels = 4, .kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}});
  Tensor x = randn({2, 2, 9, 9});
  Tensor y = conv.forward(x);
  EXPECT_EQ(y.sizes(), (Shape{2, 4, 5, 5}));
  const Tensor ref = conv2d(x, conv.weight(), conv.bias(), mp::Conv2dOptions{.stride = {2, 2}, .padding = {1, 1}});
  EXPECT_EQ(max_diff(y, ref), 0.0);  // the same op on the same data
  MaxPool2d mp2(Pool2dOptions{.kernel = {2, 2}});
  EXPECT_EQ(mp2.forward(y).sizes(), (Shape{2, 4, 2, 2}));
  AvgPool2d ap(Pool2dOptions{.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1}});
  EXPECT_EQ(ap.forward(y).sizes(), (Shape{2, 4, 5, 5}));
  AdaptiveAvgPool2d gap({1, 1});
  Tensor g = gap.forward(y);
  EXPECT_EQ(g.sizes(), (Shape{2, 4, 1, 1}));
  // A global average pool is the mean over H, W (f32 sums of 25 values: 1e-5 covers the rounding).
  EXPECT_LT(max_diff(g, mean(y, {2, 3}, true)), 1e-5);
  // A max pool of a known image.
  Tensor img = arange(16.0, {.dtype = DType::f32}).reshape({1, 1, 4, 4});
  EXPECT_EQ(mp2.forward(img).to_vector<float>(), (std::vector<float>{5, 7, 13, 15}));
  EXPECT_THROW(conv.forward(randn({2, 3, 9, 9})), Error);
  EXPECT_THROW(Conv2d(nn::Conv2dOptions{.in_channels = 3, .out_channels = 4, .groups = 2}), Error);
}

TEST(NnLayers, BatchNormTrainingUpdatesRunningStatsAndCounter) {
  BatchNorm1d bn(2);
  // Channel 0 values 1, 3 (mean 2, unbiased var 2); channel 1 values 0, 0 (mean 0, var 0).
  Tensor x = from_vector<float>({1, 0, 3, 0}, {2, 2});
  Tensor y = bn.forward(x);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 1);
  // running = 0.9 * old + 0.1 * batch.
  const auto rm = bn.running_mean().to_vector<float>(), rv = bn.running_var().to_vector<float>();
  EXPECT_NEAR(rm[0], 0.2, 1e-6);
  EXPECT_NEAR(rv[0], 0.9 + 0.1 * 2.0, 1e-6);
  EXPECT_NEAR(rv[1], 0.9, 1e-6);
  // Normalised with the biased batch variance 1: (1 - 2) / sqrt(1 + eps) ~ -1.
  EXPECT_NEAR(y.to_vector<float>()[0], -1.0, 1e-4);
  // Eval uses the running statistics and does not count.
  bn.eval();
  Tensor z = bn.forward(x);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 1);
  EXPECT_NEAR(z.to_vector<float>()[0], (1.0 - 0.2) / std::sqrt(1.1 + 1e-5), 1e-5);
  // momentum = nullopt: cumulative average of the batch statistics.
  BatchNorm2d cum(BatchNormOptions{.num_features = 1, .momentum = std::nullopt});
  cum.forward(full({2, 1, 2, 2}, 4.0));
  cum.forward(full({2, 1, 2, 2}, 2.0));
  EXPECT_NEAR(cum.running_mean().item<float>(), 3.0, 1e-6);
  EXPECT_EQ(cum.num_batches_tracked().item<int64_t>(), 2);
  // Without tracking: no buffers, batch statistics even in eval.
  BatchNorm2d untracked(BatchNormOptions{.num_features = 3, .affine = false, .track_running_stats = false});
  EXPECT_TRUE(untracked.named_buffers().empty());
  EXPECT_TRUE(untracked.named_parameters().empty());
  untracked.eval();
  Tensor u = untracked.forward(randn({4, 3, 2, 2}));
  EXPECT_LT(std::abs(mean(u).item<float>()), 1e-5);
  EXPECT_THROW(bn.forward(randn({2, 2, 2, 2})), Error);  // BatchNorm1d takes 2-D or 3-D
}

// Note [synchronised batch norm]: in a process that is the whole run (the sum over the processes is the identity) the
// f64 composite computes what the fused f32 kernels compute: the outputs, the gradients of x, weight, bias and the
// residual, the running statistics; the sum is called once forward and once backward per layer. Tolerance 1e-4: the
// values are O(1) (normalised; gradients of a random upstream gradient), the kernels' f32 statistics and products are
// within a few ulps (~1e-6) of the f64 ones; an error in the formula (biased/unbiased, a missing term) is >= 1e-2.
TEST(NnLayers, SyncBatchNormInOneProcessMatchesTheFusedKernels) {
  manual_seed(5);
  const Shape sh{6, 3, 4, 5};
  const Tensor x0 = (randn(sh) * 2.0 + 1.0).contiguous(MemoryFormat::channels_last),
               r0 = randn(sh).contiguous(MemoryFormat::channels_last), dy = randn(sh);
  struct Out {
    Tensor y, dx, dw, db, dr, rm, rv;
  };
  auto run = [&](bool sync, int* calls) {
    BatchNorm2d bn(3);
    {
      autograd::NoGradGuard ng;
      Tensor(bn.weight()).copy_(from_vector<float>({0.5f, 1.5f, -1.0f}, {3}));
      Tensor(bn.bias()).copy_(from_vector<float>({0.1f, -0.2f, 0.3f}, {3}));
    }
    std::optional<SyncBatchNormScope> scope;
    if (sync) scope.emplace([calls](const Tensor&) { ++*calls; });
    const Tensor x = x0.clone().requires_grad_(), r = r0.clone().requires_grad_();
    const Tensor y = bn.forward_add_relu(x, r);
    autograd::backward({y}, {dy});
    return Out{y.detach(),
               x.grad(),
               bn.weight().grad(),
               bn.bias().grad(),
               r.grad(),
               bn.running_mean().clone(),
               bn.running_var().clone()};
  };
  int calls = 0;
  const Out fused = run(false, &calls);
  EXPECT_EQ(calls, 0);
  const Out synced = run(true, &calls);
  EXPECT_EQ(calls, 2);  // forward's statistics, backward's sums
  EXPECT_LT(max_diff(synced.y, fused.y), 1e-4);
  EXPECT_LT(max_diff(synced.dx, fused.dx), 1e-4);
  EXPECT_LT(max_diff(synced.dw, fused.dw), 1e-4);
  EXPECT_LT(max_diff(synced.db, fused.db), 1e-4);
  EXPECT_LT(max_diff(synced.dr, fused.dr), 1e-4);
  EXPECT_LT(max_diff(synced.rm, fused.rm), 1e-5);
  EXPECT_LT(max_diff(synced.rv, fused.rv), 1e-5);
  // eval mode uses the running statistics: no sums
  BatchNorm2d bn(3);
  bn.eval();
  const SyncBatchNormScope scope([&calls](const Tensor&) { ++calls; });
  (void)bn.forward(x0);
  EXPECT_EQ(calls, 2);
  EXPECT_THROW(SyncBatchNormScope([](const Tensor&) {}), Error);  // one scope at a time
}

TEST(NnLayers, LayerNormEmbeddingDropoutFlattenActivations) {
  LayerNorm ln(Shape{6});
  Tensor y = ln.forward(randn({3, 6}) * 5.0 + 2.0);
  const auto m = mean(y, {1}).to_vector<float>();
  for (float v : m) EXPECT_NEAR(v, 0.0, 1e-5);

  Embedding emb(EmbeddingOptions{.num_embeddings = 5, .embedding_dim = 3, .padding_idx = 0});
  Tensor idx = from_vector<int64_t>({4, 0, 4, 2}, {2, 2});
  Tensor e = emb.forward(idx);
  EXPECT_EQ(e.sizes(), (Shape{2, 2, 3}));
  EXPECT_EQ(e.select(0, 0).select(0, 0).to_vector<float>(), emb.weight().select(0, 4).to_vector<float>());
  EXPECT_EQ(e.select(0, 0).select(0, 1).to_vector<float>(), std::vector<float>(3, 0.0f));

  Dropout drop(0.5);
  Tensor ones_in = ones({1000});
  const auto d = drop.forward(ones_in).to_vector<float>();
  int zeros_seen = 0;
  for (float v : d) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f);
    zeros_seen += v == 0.0f;
  }
  // Binomial(1000, 0.5): sd 15.8; +-100 is > 6 sd.
  EXPECT_NEAR(zeros_seen, 500, 100);
  drop.eval();
  EXPECT_EQ(drop.forward(ones_in).to_vector<float>(), ones_in.to_vector<float>());
  EXPECT_THROW(Dropout(1.5), Error);

  EXPECT_EQ(Flatten().forward(randn({2, 3, 4, 5})).sizes(), (Shape{2, 60}));
  EXPECT_EQ(Flatten(FlattenOptions{.start_dim = 0, .end_dim = 1}).forward(randn({2, 3, 4})).sizes(), (Shape{6, 4}));
  Tensor v = from_vector<float>({-1, 0, 2}, {3});
  EXPECT_EQ(ReLU().forward(v).to_vector<float>(), (std::vector<float>{0, 0, 2}));
  EXPECT_EQ(Tanh().forward(v).to_vector<float>(), tanh(v).to_vector<float>());
  EXPECT_EQ(Sigmoid().forward(v).to_vector<float>(), sigmoid(v).to_vector<float>());
  EXPECT_EQ(GELU().forward(v).to_vector<float>(), gelu(v).to_vector<float>());
  EXPECT_EQ(Identity().forward(v).to_vector<float>(), v.to_vector<float>());
}

TEST(NnLayers, SequentialChainsAndIndexes) {
  auto fc1 = std::make_shared<Linear>(4, 5), fc2 = std::make_shared<Linear>(5, 2);
  Sequential seq{fc1, std::make_shared<Tanh>(), fc2};
  Tensor x = randn({3, 4});
  EXPECT_EQ(max_diff(seq.forward(x), fc2->forward(tanh(fc1->forward(x)))), 0.0);
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq.at<Linear>(2), fc2);
  EXPECT_THROW(seq.at<Linear>(1), Error);
  EXPECT_THROW(seq[3], Error);
  seq.push_back("head", std::make_shared<Sigmoid>());
  EXPECT_EQ(seq.named_children().back().first, "head");
}

TEST(NnLayers, GradientsReachEveryParameter) {
  auto net = std::make_shared<Sequential>(
      std::make_shared<Conv2d>(nn::Conv2dOptions{.in_channels = 1, .out_channels = 2, .padding = {1, 1}}),
      std::make_shared<BatchNorm2d>(2), std::make_shared<ReLU>(), std::make_shared<Flatten>(),
      std::make_shared<Linear>(2 * 4 * 4, 3), std::make_shared<LayerNorm>(Shape{3}));
  sum(square(net->forward(randn({2, 1, 4, 4})))).backward();
  for (const auto& [name, p] : net->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().sizes(), p.sizes()) << name;
  }
}

// A few training steps of a small ResNet and of the word LM reduce the loss in f32, amp O1 (autocast
// to bf16 with f32 weights) and with the whole model converted to bf16; the residual blocks' gradients
// pass an f64 gradcheck.
//
// Each loss threshold is stated relative to the chance-level loss the model starts from (ln C for C
// classes) and to what the runs reach (noted per test): it fails when gradients, updates or the
// wiring are wrong and passes with margin when they are right, in every precision.
#include <gtest/gtest.h>

#include <cmath>

#include "mp/autocast/autocast.hpp"
#include "mp/autograd/gradcheck.hpp"
#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"
#include "mp/models/models.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/optim.hpp"

using namespace mp;
using namespace mp::models;

namespace {

enum class Precision { f32, amp_o1, bf16 };

const char* precision_name(Precision p) {
  return p == Precision::f32 ? "f32" : p == Precision::amp_o1 ? "amp O1 (bf16 autocast)" : "bf16 model";
}

// 8x8 images with C channels: a horizontal (class 0) or vertical (class 1) bar of 1s at a random
// position in every channel, plus N(0, 0.3) noise.
std::pair<Tensor, Tensor> bars(int64_t n, int64_t channels) {
  const std::vector<float> noise = randn({n, channels * 64}, {}, 0.0, 0.3).to_vector<float>();
  const std::vector<int64_t> pos = randint(0, 8, {n}).to_vector<int64_t>();
  std::vector<float> img(noise);
  std::vector<int64_t> y;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t cls = i % 2;
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t k = 0; k < 8; ++k)
        img[(i * channels + c) * 64 + (cls == 0 ? pos[i] * 8 + k : k * 8 + pos[i])] += 1.0f;
    y.push_back(cls);
  }
  return {from_vector<float>(img, {n, channels, 8, 8}), from_vector<int64_t>(y, {n})};
}

// Forward under the precision's rules; the loss is f32 in every case (cross_entropy computes in f32).
// The logits are bf16 under autocast (fc is a "lower" op) and for the bf16 model, f32 otherwise.
Tensor image_loss(nn::UnaryModule& model, const Tensor& x, const Tensor& y, Precision p) {
  Tensor logits;
  if (p == Precision::amp_o1) {
    amp::Autocast guard({.dtype = DType::bf16});
    logits = model.forward(x);
  } else {
    logits = model.forward(p == Precision::bf16 ? x.to(DType::bf16) : x);
  }
  EXPECT_EQ(logits.dtype(), p == Precision::f32 ? DType::f32 : DType::bf16) << precision_name(p);
  return cross_entropy(logits, y);
}

// Tokens of a stream in which each token determines the next: t_{i+1} = (5 t_i + 3) mod V (a single
// cycle through all V = 16 tokens), started at random points, so a model that learns the map predicts
// perfectly. Returns [T+1, B] so inputs are rows 0..T-1 and targets rows 1..T.
Tensor cyclic_stream(int64_t steps, int64_t batch, int64_t vocab) {
  const std::vector<int64_t> start = randint(0, vocab, {batch}).to_vector<int64_t>();
  std::vector<int64_t> v(static_cast<size_t>((steps + 1) * batch));
  for (int64_t b = 0; b < batch; ++b) {
    int64_t t = start[b];
    for (int64_t s = 0; s <= steps; ++s) {
      v[s * batch + b] = t;
      t = (5 * t + 3) % vocab;
    }
  }
  return from_vector<int64_t>(v, {steps + 1, batch});
}

}  // namespace

TEST(ModelsTrain, SmallResNetLearnsBarsInEveryPrecision) {
  for (Precision p : {Precision::f32, Precision::amp_o1, Precision::bf16}) {
    manual_seed(11);
    auto [x, y] = bars(32, 3);
    ResNet model({.depth = 8, .in_channels = 3, .num_classes = 2, .width = 8});
    if (p == Precision::bf16) model.to(DType::bf16);
    optim::Adam opt(model.parameters(), {.lr = 1e-2});
    double first = 0, last = 0;
    for (int step = 0; step < 12; ++step) {
      opt.zero_grad();
      Tensor loss = image_loss(model, x, y, p);
      EXPECT_EQ(loss.dtype(), DType::f32);
      loss.backward();
      opt.step();
      (step == 0 ? first : last) = loss.item<double>();
    }
    EXPECT_EQ(model.named_parameters()[0].second.dtype(), p == Precision::bf16 ? DType::bf16 : DType::f32);
    // Chance level is ln 2 = 0.69 (the first loss is 0.70 in every precision); after 12 Adam steps the
    // runs reach 0.0022-0.0023 in all three. < 0.1 (14% of chance, 40x what they reach) catches a net
    // that does not learn, and leaves bf16 rounding plenty of room.
    EXPECT_NEAR(first, std::log(2.0), 0.2) << precision_name(p);
    EXPECT_LT(last, 0.1) << precision_name(p);
  }
}

TEST(ModelsTrain, WordLmLearnsACyclicStreamWithTruncatedBptt) {
  const int64_t V = 16, T = 8, B = 8;
  for (const char* cell : {"lstm", "gru"}) {
    for (Precision p : {Precision::f32, Precision::amp_o1, Precision::bf16}) {
      if (std::string(cell) == "gru" && p != Precision::f32) continue;  // one cell covers the precisions
      manual_seed(12);
      WordLM lm({.vocab_size = V,
                 .embed_size = 32,
                 .hidden_size = 32,
                 .num_layers = 2,
                 .cell = cell,
                 .dropout = 0.0,
                 .tie_weights = true});
      if (p == Precision::bf16) lm.to(DType::bf16);
      optim::Adam opt(lm.parameters(), {.lr = 3e-2});
      const Tensor stream = cyclic_stream(T * 30, B, V);
      nn::LSTMState state;
      double first = 0, last = 0;
      for (int64_t i = 0; i < 30; ++i) {  // consecutive windows of one stream: the state carries over
        const Tensor input = stream.narrow(0, i * T, T), target = stream.narrow(0, i * T + 1, T).reshape({T * B});
        opt.zero_grad();
        state = WordLM::detach(state);  // truncated back-propagation through time
        Tensor loss;
        if (p == Precision::amp_o1) {
          amp::Autocast guard({.dtype = DType::bf16});
          auto [logits, next] = lm.forward(input, state);
          EXPECT_EQ(logits.dtype(), DType::bf16);  // the decoder ran in bf16
          loss = cross_entropy(logits, target);
          state = next;
        } else {
          auto [logits, next] = lm.forward(input, state);
          loss = cross_entropy(logits, target);
          state = next;
        }
        loss.backward();
        opt.step();
        (i == 0 ? first : last) = loss.item<double>();
      }
      // Chance level is ln 16 = 2.77 (the first loss is near it); the runs reach 0.26-0.37 after 30
      // windows in every precision (bf16 highest). < 0.8 (29% of chance) catches a model that does not
      // learn the map.
      EXPECT_NEAR(first, std::log(16.0), 0.3) << cell << " " << precision_name(p);
      EXPECT_LT(last, 0.8) << cell << " " << precision_name(p);
    }
  }
}

TEST(ModelsGradients, ResidualBlocksPassGradcheck) {
  // f64 blocks in training mode (batch statistics): input and every parameter against central differences.
  manual_seed(13);
  autograd::GradcheckOptions opt;
  opt.atol = 1e-6;  // f64 central differences with eps 1e-6 are accurate to ~1e-9 on these O(1) outputs
  auto check = [&](nn::UnaryModule& block, const Shape& in, const char* what) {
    block.to(DType::f64);
    Tensor x = randn(in, {.dtype = DType::f64});
    x.requires_grad_(true);
    std::vector<Tensor> inputs{x};
    for (const Tensor& p : block.parameters()) inputs.push_back(p);
    auto res = autograd::gradcheck(
        [&](const std::vector<Tensor>& v) { return std::vector<Tensor>{block.forward(v[0])}; }, inputs, opt);
    EXPECT_TRUE(res.ok) << what << ": " << res.message;
  };
  BasicBlock basic(2, 3, 2);  // projection shortcut (width and stride change)
  check(basic, {2, 2, 4, 4}, "BasicBlock");
  Bottleneck bottleneck(4, 1, 1);  // 4 -> 4 channels: identity shortcut
  check(bottleneck, {2, 4, 3, 3}, "Bottleneck");
  WideBasicBlock wide(2, 3, 2, 0.0);  // shortcut of the activated input
  check(wide, {2, 2, 4, 4}, "WideBasicBlock");
  EXPECT_NE(basic.downsample(), nullptr);
  EXPECT_EQ(bottleneck.downsample(), nullptr);
  EXPECT_NE(wide.shortcut(), nullptr);
}

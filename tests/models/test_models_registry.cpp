// mp::models image classifiers through the registry: parameter counts equal to PyTorch's, output
// shapes, parameter names (torchvision's for the ResNets), options errors and the initialisation.
//
// Every expected parameter count below was computed exactly with python3 torch 1.13 on the twin
// architectures of bench/pytorch/models.py (`python3 bench/pytorch/models.py` prints the 3-channel,
// 10-class table); bench/pytorch/check_names.py checks the names and shapes of all of them.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"
#include "mp/models/models.hpp"
#include "mp/ops/ops.hpp"
#include "test_util.hpp"

using namespace mp;
using namespace mp::models;
using mp::test::error_of;

namespace {

std::map<std::string, Shape> param_shapes(const nn::Module& m) {
  std::map<std::string, Shape> out;
  for (const auto& [n, p] : m.named_parameters()) out[n] = p.sizes();
  return out;
}

Shape output_shape(nn::UnaryModule& m, const Shape& input) {
  autograd::NoGradGuard ng;
  return m.forward(randn(input)).sizes();
}

}  // namespace

// Exact counts for 3 channels and 10 classes, from torch (see the file comment). The published ones:
// resnet20 "0.27M" (He et al. 2016, Table 6), WRN-28-10 "36.5M" (Zagoruyko & Komodakis 2016), and
// 11,173,962 for torchvision's resnet18 with a CIFAR stem and 10 classes.
const std::map<std::string, int64_t> kTorchCounts{
    {"mlp", 1841162},        {"resnet8", 78042},     {"resnet14", 175258},   {"resnet20", 272474},
    {"resnet32", 466906},    {"resnet44", 661338},   {"resnet56", 855770},   {"resnet110", 1730714},
    {"resnet18", 11173962},  {"resnet34", 21282122}, {"resnet50", 23520842}, {"resnet101", 42512970},
    {"resnet152", 58156618}, {"wrn-16-4", 2748890},  {"wrn-16-8", 10961370}, {"wrn-28-10", 36479194},
    {"wrn-40-4", 8949210}};

TEST(ModelsRegistry, ModelsUpTo12MParametersHavePyTorchsCountAndOutputShape) {
  // Building (initialising) a model costs ~50 ns per parameter, so the 21M-58M ResNets are checked
  // at width 8 below (their full-size names and shapes by bench/pytorch/check_names.py, see
  // NamesForThePyTorchCheck), and WRN-28-10 in its own test.
  const std::vector<std::string> names = image_model_names();
  ASSERT_EQ(names.size(), kTorchCounts.size());
  manual_seed(1);
  int checked = 0;
  for (const std::string& name : names) {
    ASSERT_TRUE(kTorchCounts.count(name)) << name;
    EXPECT_TRUE(is_image_model(name)) << name;
    if (kTorchCounts.at(name) > 12'000'000) continue;
    auto model = create_image_model(name, {.in_channels = 3, .image_size = 32, .num_classes = 10});
    EXPECT_EQ(model->num_parameters(), kTorchCounts.at(name)) << name;
    EXPECT_EQ(output_shape(*model, {2, 3, 32, 32}), (Shape{2, 10})) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

TEST(ModelsRegistry, WideResNet28x10Has36_5MParameters) {
  manual_seed(10);
  auto model = create_image_model("wrn-28-10", {});
  EXPECT_EQ(model->num_parameters(), kTorchCounts.at("wrn-28-10"));
  model->eval();  // one image: batch statistics of a single 8x8 map would be legal but meaningless
  EXPECT_EQ(output_shape(*model, {1, 3, 32, 32}), (Shape{1, 10}));
}

TEST(ModelsRegistry, GreyscaleImagesAndOtherClassCounts) {
  // Counts from torch for 1x28x28 inputs (Fashion-MNIST) and for 100 classes.
  const std::vector<std::tuple<std::string, ImageModelSpec, int64_t>> cases{
      {"mlp", {1, 28, 10}, 669706},       {"resnet8", {1, 28, 10}, 77754},    {"resnet20", {1, 28, 10}, 272186},
      {"wrn-16-4", {1, 28, 10}, 2748602}, {"resnet20", {3, 32, 100}, 278324}, {"wrn-16-4", {3, 32, 100}, 2772020}};
  manual_seed(2);
  for (const auto& [name, spec, count] : cases) {
    auto model = create_image_model(name, spec);
    EXPECT_EQ(model->num_parameters(), count) << name;
    EXPECT_EQ(output_shape(*model, {2, spec.in_channels, spec.image_size, spec.image_size}),
              (Shape{2, spec.num_classes}))
        << name;
  }
  // The convolutional nets take any image size (global average pool); the MLP only its own.
  auto r = create_image_model("resnet8", {.in_channels = 1, .image_size = 28});
  EXPECT_EQ(output_shape(*r, {2, 1, 9, 13}), (Shape{2, 10}));
  auto mlp = create_image_model("mlp", {.in_channels = 1, .image_size = 28});
  const std::string m = error_of([&] { output_shape(*mlp, {2, 1, 32, 32}); });
  for (const char* part : {"MLP::forward", "784"}) EXPECT_CONTAINS(m, part);
}

TEST(ModelsRegistry, TorchvisionDepthsAtWidth8) {
  // The layouts of resnet18..152 at width 8 (7 classes): exact torch counts and a full forward, training
  // mode, batch 2 of 16x16 images.
  const std::vector<std::pair<int64_t, int64_t>> cases{
      {18, 176207}, {34, 334959}, {50, 374991}, {101, 677455}, {152, 926927}};
  manual_seed(3);
  for (const auto& [depth, count] : cases) {
    ResNet m({.depth = depth, .in_channels = 3, .num_classes = 7, .width = 8});
    EXPECT_EQ(m.num_stages(), 4u);
    EXPECT_EQ(m.num_parameters(), count) << depth;
    EXPECT_EQ(output_shape(m, {2, 3, 16, 16}), (Shape{2, 7})) << depth;
  }
  WideResNet w({.depth = 28, .widen = 1, .in_channels = 1, .num_classes = 5, .dropout = 0.3});
  EXPECT_EQ(w.num_parameters(), 368885);
  EXPECT_EQ(output_shape(w, {2, 1, 12, 12}), (Shape{2, 5}));
}

TEST(ModelsRegistry, UnknownNamesAndBadSpecs) {
  for (const char* bad : {"resnet", "resnet19", "resnet020", "wrn-17-4", "wrn-16-0", "wrn-4-1", "wrn-16", "mlp2", "",
                          "wrn-16-4x", "vgg16"})
    EXPECT_FALSE(is_image_model(bad)) << bad;
  for (const char* good : {"wrn-10-1", "wrn-22-8", "resnet110", "mlp"}) EXPECT_TRUE(is_image_model(good)) << good;
  std::string m = error_of([] { create_image_model("resnet19", {}); });
  for (const char* part : {"create_image_model", "'resnet19'", "resnet20", "wrn-28-10", "mlp", "wrn-D-K"})
    EXPECT_CONTAINS(m, part);
  m = error_of([] { create_image_model("resnet20", {.in_channels = 0}); });
  for (const char* part : {"in_channels", "positive"}) EXPECT_CONTAINS(m, part);
  auto w = create_image_model("wrn-10-1", {});
  EXPECT_EQ(output_shape(*w, {2, 3, 8, 8}), (Shape{2, 10}));
}

TEST(ModelsRegistry, MlpWidthByLayers) {
  // "mlp-WxL": L hidden layers of width W on the flattened image. Counts from torch 1.13 on
  // bench/pytorch/models.py's MLP(784, [2048, 2048], 10), MLP(3072, [64, 64, 64], 100) and MLP(784, [5], 10).
  const std::vector<std::tuple<std::string, ImageModelSpec, int64_t, size_t>> cases{
      {"mlp-2048x2", {1, 28, 10}, 5824522, 5},
      {"mlp-64x3", {3, 32, 100}, 211492, 7},
      {"mlp-5x1", {1, 28, 10}, 3985, 3}};
  manual_seed(11);
  for (const auto& [name, spec, count, modules] : cases) {
    EXPECT_TRUE(is_image_model(name)) << name;
    auto model = create_image_model(name, spec);
    EXPECT_EQ(model->num_parameters(), count) << name;
    auto* mlp = dynamic_cast<MLP*>(model.get());
    ASSERT_NE(mlp, nullptr) << name;
    EXPECT_EQ(mlp->layers().size(), modules) << name;  // Linear, ReLU per hidden layer, then the classifier
    EXPECT_EQ(output_shape(*model, {3, spec.in_channels, spec.image_size, spec.image_size}),
              (Shape{3, spec.num_classes}))
        << name;
  }
  // 784-2048-2048-10, as the benchmark suite's MLP configuration (the PyTorch twin's names and shapes).
  auto shapes = param_shapes(*create_image_model("mlp-2048x2", {.in_channels = 1, .image_size = 28}));
  EXPECT_EQ(shapes.at("layers.0.weight"), (Shape{2048, 784}));
  EXPECT_EQ(shapes.at("layers.2.weight"), (Shape{2048, 2048}));
  EXPECT_EQ(shapes.at("layers.4.weight"), (Shape{10, 2048}));
  EXPECT_EQ(shapes.size(), 6u);
  for (const char* bad : {"mlp-", "mlp-2048", "mlp-2048x", "mlp-x2", "mlp-0x2", "mlp-2048x0", "mlp-02x2", "mlp-2048x2x",
                          "mlp-2048X2", "mlp--1x2", "mlp-2048x2 "})
    EXPECT_FALSE(is_image_model(bad)) << bad;
  const std::string m = error_of([] { create_image_model("mlp-0x2", {}); });
  for (const char* part : {"create_image_model", "'mlp-0x2'", "mlp-WxL"}) EXPECT_CONTAINS(m, part);
}

TEST(ModelsResNet, TorchvisionNames) {
  manual_seed(4);
  // resnet18's names at width 8 (the full-width shapes are these times 8; check_names.py checks them).
  auto shapes = param_shapes(ResNet({.depth = 18, .width = 8}));
  EXPECT_EQ(shapes.at("conv1.weight"), (Shape{8, 3, 3, 3}));  // CIFAR stem: 3x3, stride 1
  EXPECT_EQ(shapes.at("bn1.weight"), (Shape{8}));
  EXPECT_EQ(shapes.at("layer1.0.conv1.weight"), (Shape{8, 8, 3, 3}));
  EXPECT_EQ(shapes.at("layer1.1.bn2.bias"), (Shape{8}));
  EXPECT_EQ(shapes.count("layer1.0.downsample.0.weight"), 0u);  // same shape: identity shortcut
  EXPECT_EQ(shapes.at("layer2.0.conv1.weight"), (Shape{16, 8, 3, 3}));
  EXPECT_EQ(shapes.at("layer2.0.downsample.0.weight"), (Shape{16, 8, 1, 1}));
  EXPECT_EQ(shapes.at("layer2.0.downsample.1.weight"), (Shape{16}));
  EXPECT_EQ(shapes.count("layer2.1.downsample.0.weight"), 0u);
  EXPECT_EQ(shapes.at("layer4.1.conv2.weight"), (Shape{64, 64, 3, 3}));
  EXPECT_EQ(shapes.at("fc.weight"), (Shape{10, 64}));
  EXPECT_EQ(shapes.at("fc.bias"), (Shape{10}));
  EXPECT_EQ(shapes.count("conv1.bias"), 0u);  // convolutions have no bias

  ResNet r50({.depth = 50, .width = 8});
  auto s50 = param_shapes(r50);
  EXPECT_EQ(s50.at("layer1.0.conv3.weight"), (Shape{32, 8, 1, 1}));         // expansion 4
  EXPECT_EQ(s50.at("layer1.0.downsample.0.weight"), (Shape{32, 8, 1, 1}));  // width changes in stage 1
  EXPECT_EQ(s50.at("layer2.0.conv2.weight"), (Shape{16, 16, 3, 3}));        // stride on the 3x3 (v1.5)
  EXPECT_EQ(s50.at("layer4.2.bn3.weight"), (Shape{256}));
  EXPECT_EQ(s50.at("fc.weight"), (Shape{10, 256}));
  // Buffers too: the state dict is torchvision's.
  const nn::StateDict sd = r50.state_dict();
  for (const char* key :
       {"bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked", "layer3.0.downsample.1.running_var"})
    EXPECT_NE(sd.find(key), nullptr) << key;
}

TEST(ModelsResNet, CifarNetsHaveThreeStagesOfProjectionBlocks) {
  manual_seed(5);
  ResNet r20({.depth = 20});
  EXPECT_EQ(r20.options().family, ResNetFamily::cifar);
  EXPECT_EQ(r20.options().width, 16);
  EXPECT_EQ(r20.num_stages(), 3u);
  auto s = param_shapes(r20);
  EXPECT_EQ(s.count("layer4.0.conv1.weight"), 0u);
  EXPECT_EQ(s.at("layer1.2.conv2.weight"), (Shape{16, 16, 3, 3}));  // n = 3 blocks per stage
  EXPECT_EQ(s.count("layer1.3.conv1.weight"), 0u);
  EXPECT_EQ(s.at("layer2.0.downsample.0.weight"), (Shape{32, 16, 1, 1}));  // option B shortcuts
  EXPECT_EQ(s.at("layer3.0.downsample.0.weight"), (Shape{64, 32, 1, 1}));
  EXPECT_EQ(s.at("fc.weight"), (Shape{10, 64}));
  // 50 and 152 are both torchvision depths and 6n+2: the family option picks the CIFAR net (count from torch).
  ResNet c50({.depth = 50, .family = ResNetFamily::cifar});
  EXPECT_EQ(c50.num_parameters(), 758554);
  std::string m = error_of([] { ResNet({.depth = 20, .family = ResNetFamily::torchvision}); });
  for (const char* part : {"ResNet", "18, 34, 50, 101, 152", "got 20"}) EXPECT_CONTAINS(m, part);
  m = error_of([] { ResNet({.depth = 21}); });
  for (const char* part : {"ResNet", "6n+2", "got 21"}) EXPECT_CONTAINS(m, part);
}

TEST(ModelsResNet, Initialisation) {
  manual_seed(6);
  ResNet r({.depth = 20, .zero_init_residual = false});
  auto params = r.named_parameters();
  std::map<std::string, Tensor> p(params.begin(), params.end());
  // kaiming_normal_(fan_out, relu): std = sqrt(2 / (64 * 3 * 3)). With 36,864 samples the sample std
  // is within ~0.4% (one standard error) of it; 3% is > 7 standard errors.
  const Tensor w = p.at("layer3.0.conv2.weight");
  const double want = std::sqrt(2.0 / (64 * 9));
  EXPECT_NEAR(std::sqrt(var(w, {0, 1, 2, 3}).item<double>()), want, 0.03 * want);
  EXPECT_NEAR(mean(w).item<double>(), 0.0, 0.03 * want);
  for (const auto& [name, t] : params) {
    if (name.find("bn") != std::string::npos && name.ends_with(".weight")) {
      EXPECT_EQ(amin(t, {0}).item<float>(), 1.0f) << name;
    }
    if (name.find("bn") != std::string::npos && name.ends_with(".bias")) {
      EXPECT_EQ(amax(abs(t), {0}).item<float>(), 0.0f) << name;
    }
  }
  // fc keeps PyTorch's Linear default: |w| <= 1/sqrt(in_features).
  EXPECT_LE(amax(abs(p.at("fc.weight")), {0, 1}).item<double>(), 1.0 / 8.0 + 1e-7);

  ResNet z({.depth = 8, .width = 4, .zero_init_residual = true});
  for (const auto& [name, t] : z.named_parameters()) {
    if (name == "layer1.0.bn2.weight" || name == "layer3.0.bn2.weight") {
      EXPECT_EQ(amax(abs(t), {0}).item<float>(), 0.0f) << name;
    }
    if (name == "layer1.0.bn1.weight" || name == "layer2.0.downsample.1.weight") {
      EXPECT_EQ(amin(t, {0}).item<float>(), 1.0f) << name;
    }
  }
  ResNet zb({.depth = 50, .width = 4, .zero_init_residual = true});
  for (const auto& [name, t] : zb.named_parameters())
    if (name == "layer2.1.bn3.weight") { EXPECT_EQ(amax(abs(t), {0}).item<float>(), 0.0f) << name; }
}

TEST(ModelsWideResNet, NamesAndShortcuts) {
  manual_seed(7);
  WideResNet w({.depth = 16, .widen = 4});
  auto s = param_shapes(w);
  EXPECT_EQ(s.at("conv1.weight"), (Shape{16, 3, 3, 3}));
  EXPECT_EQ(s.at("layer1.0.bn1.weight"), (Shape{16}));  // pre-activation: BN of the block's input
  EXPECT_EQ(s.at("layer1.0.conv1.weight"), (Shape{64, 16, 3, 3}));
  EXPECT_EQ(s.at("layer1.0.shortcut.weight"), (Shape{64, 16, 1, 1}));  // width 16 -> 16k
  EXPECT_EQ(s.count("layer1.1.shortcut.weight"), 0u);                  // n = 2 blocks, the second identity
  EXPECT_EQ(s.at("layer2.0.shortcut.weight"), (Shape{128, 64, 1, 1}));
  EXPECT_EQ(s.at("layer3.1.conv2.weight"), (Shape{256, 256, 3, 3}));
  EXPECT_EQ(s.at("bn.weight"), (Shape{256}));
  EXPECT_EQ(s.at("fc.weight"), (Shape{10, 256}));
  EXPECT_EQ(s.count("layer3.2.conv1.weight"), 0u);
  // widen 1 keeps the first stage at 16 channels: no projection there.
  WideResNet w1({.depth = 10, .widen = 1});
  EXPECT_EQ(param_shapes(w1).count("layer1.0.shortcut.weight"), 0u);
  const std::string m = error_of([] { WideResNet({.depth = 18}); });
  for (const char* part : {"WideResNet", "6n+4", "got 18"}) EXPECT_CONTAINS(m, part);
}

TEST(ModelsWideResNet, DropoutOnlyWhenTraining) {
  manual_seed(8);
  WideResNet w({.depth = 10, .widen = 1, .num_classes = 3, .dropout = 0.5});
  const Tensor x = randn({2, 3, 8, 8});
  autograd::NoGradGuard ng;
  w.eval();
  const auto a = w.forward(x).to_vector<float>(), b = w.forward(x).to_vector<float>();
  EXPECT_EQ(a, b);  // eval: deterministic (running statistics, no dropout)
  w.train();
  // Training mode: two forwards draw different dropout masks.
  EXPECT_NE(w.forward(x).to_vector<float>(), w.forward(x).to_vector<float>());
}

TEST(ModelsMlp, NamesDropoutAndFlatten) {
  manual_seed(9);
  MLP m({.in_features = 12, .hidden = {8, 6}, .num_classes = 4});
  auto s = param_shapes(m);
  EXPECT_EQ(s.at("layers.0.weight"), (Shape{8, 12}));
  EXPECT_EQ(s.at("layers.2.weight"), (Shape{6, 8}));
  EXPECT_EQ(s.at("layers.4.bias"), (Shape{4}));
  EXPECT_EQ(m.layers().size(), 5u);
  MLP d({.in_features = 12, .hidden = {8, 6}, .num_classes = 4, .dropout = 0.2});
  EXPECT_EQ(param_shapes(d).at("layers.3.weight"), (Shape{6, 8}));  // Linear, ReLU, Dropout, Linear, ...
  EXPECT_EQ(output_shape(m, {5, 3, 2, 2}), (Shape{5, 4}));
  // Flattening: the result equals the layers applied to the [N, 12] view.
  const Tensor x = randn({5, 3, 2, 2});
  autograd::NoGradGuard ng;
  EXPECT_EQ(m.forward(x).to_vector<float>(), m.layers().forward(x.reshape({5, 12})).to_vector<float>());
  MLP linear({.in_features = 3, .num_classes = 2});
  EXPECT_EQ(linear.named_parameters().size(), 2u);  // no hidden layer: one Linear
  const std::string msg = error_of([&] { m.forward(randn({12})); });
  for (const char* part : {"MLP::forward", "batch"}) EXPECT_CONTAINS(msg, part);
}

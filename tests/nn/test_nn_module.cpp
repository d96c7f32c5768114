// nn::Module: names, traversal, modes, dtype conversion, state dicts, printing.
#include <gtest/gtest.h>

#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"
#include "mp/nn/nn.hpp"
#include "mp/ops/ops.hpp"

using namespace mp;
using namespace mp::nn;

namespace {

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> out;
  for (const auto& [n, t] : v) out.push_back(n);
  return out;
}

std::shared_ptr<Sequential> mlp_with_bn() {
  return std::make_shared<Sequential>(std::make_shared<Linear>(4, 8), std::make_shared<BatchNorm1d>(8),
                                      std::make_shared<ReLU>(), std::make_shared<Linear>(8, 2));
}

// A residual-style block with nested containers, to get names like "layer1.0.conv1.weight".
class Block : public UnaryModule {
 public:
  Block() : UnaryModule("Block") {
    conv1 = register_module("conv1", std::make_shared<Conv2d>(nn::Conv2dOptions{
                                         .in_channels = 3, .out_channels = 4, .padding = {1, 1}, .bias = false}));
    bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(4));
  }
  Tensor forward(const Tensor& x) override { return relu(bn1->forward(conv1->forward(x))); }
  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
};

class Net : public Module {
 public:
  Net() : Module("Net") {
    auto layer1 = std::make_shared<Sequential>();
    layer1->push_back(std::make_shared<Block>());
    register_module("layer1", layer1);
    fc = register_module("fc", std::make_shared<Linear>(4, 3));
  }
  std::shared_ptr<Linear> fc;
};

bool all_equal(const Tensor& a, const Tensor& b) {
  return a.sizes() == b.sizes() && a.to_vector<double>() == b.to_vector<double>();
}

bool throws_with(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      if (msg.find(p) == std::string::npos) {
        ADD_FAILURE() << "message lacks '" << p << "': " << msg;
        return false;
      }
    return true;
  }
  ADD_FAILURE() << "no mp::Error thrown";
  return false;
}

}  // namespace

TEST(NnModule, NamedParametersOfSequential) {
  auto m = mlp_with_bn();
  EXPECT_EQ(names_of(m->named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"}));
  EXPECT_EQ(names_of(m->named_buffers()),
            (std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"}));
  EXPECT_EQ(m->parameters().size(), 6u);
  EXPECT_EQ(m->num_parameters(), 4 * 8 + 8 + 8 + 8 + 8 * 2 + 2);
  EXPECT_EQ(m->parameters(false).size(), 0u);  // Sequential owns none itself
  for (const Tensor& p : m->parameters()) {
    EXPECT_TRUE(p.is_leaf());
    EXPECT_TRUE(p.requires_grad());
  }
  for (const Tensor& b : m->buffers()) EXPECT_FALSE(b.requires_grad());
}

TEST(NnModule, DottedNamesOfNestedModules) {
  Net net;
  EXPECT_EQ(names_of(net.named_parameters()), (std::vector<std::string>{"layer1.0.conv1.weight", "layer1.0.bn1.weight",
                                                                        "layer1.0.bn1.bias", "fc.weight", "fc.bias"}));
  std::vector<std::string> mods;
  for (auto& [n, m] : net.named_modules()) mods.push_back(n + ":" + m->type_name());
  EXPECT_EQ(mods, (std::vector<std::string>{":Net", "layer1:Sequential", "layer1.0:Block", "layer1.0.conv1:Conv2d",
                                            "layer1.0.bn1:BatchNorm2d", "fc:Linear"}));
  EXPECT_EQ(net.children().size(), 2u);
  EXPECT_EQ(net.state_dict().keys(),
            (std::vector<std::string>{"layer1.0.conv1.weight", "layer1.0.bn1.weight", "layer1.0.bn1.bias",
                                      "layer1.0.bn1.running_mean", "layer1.0.bn1.running_var",
                                      "layer1.0.bn1.num_batches_tracked", "fc.weight", "fc.bias"}));
  int visited = 0;
  net.apply([&](Module&) { ++visited; });
  EXPECT_EQ(visited, 6);
}

TEST(NnModule, RegistrationErrors) {
  Module m("Custom");
  m.register_parameter("w", ones({2}));
  EXPECT_TRUE(throws_with([&] { m.register_parameter("w", ones({2})); }, {"'w'", "already used"}));
  EXPECT_TRUE(throws_with([&] { m.register_buffer("a.b", ones({2})); }, {"'a.b'", "no '.'"}));
  EXPECT_TRUE(throws_with([&] { m.register_module("x", std::shared_ptr<Module>()); }, {"null"}));
  // An absent (undefined) parameter is skipped everywhere.
  m.register_parameter("bias", Tensor());
  EXPECT_EQ(m.named_parameters().size(), 1u);
  EXPECT_EQ(m.state_dict().size(), 1u);
}

TEST(NnModule, TiedParametersAppearOnce) {
  auto a = std::make_shared<Linear>(3, 3, false);
  Module outer("Tied");
  outer.register_module("a", a);
  auto b = std::make_shared<Module>("Holder");
  b->register_parameter("weight", a->weight());
  outer.register_module("b", b);
  EXPECT_EQ(outer.parameters().size(), 1u);
  // Tied parameters stay tied through a dtype conversion.
  outer.to(DType::bf16);
  EXPECT_EQ(outer.parameters().size(), 1u);
  EXPECT_TRUE(a->weight().impl_ptr() == b->named_parameters()[0].second.impl_ptr());
}

TEST(NnModule, TrainEvalAndZeroGrad) {
  auto m = mlp_with_bn();
  EXPECT_TRUE(m->is_training());
  m->eval();
  for (auto& [n, sub] : m->named_modules()) EXPECT_FALSE(sub->is_training()) << n;
  m->train();
  EXPECT_TRUE(m->at<BatchNorm1d>(1)->is_training());
  Tensor y = sum(m->forward(randn({5, 4})));
  y.backward();
  for (const Tensor& p : m->parameters()) EXPECT_TRUE(p.grad().defined());
  m->zero_grad();
  for (const Tensor& p : m->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(NnModule, ToBf16KeepsLeavesAndUpdatesLayers) {
  auto m = mlp_with_bn();
  sum(m->forward(randn({5, 4}))).backward();
  const Tensor w0 = m->at<Linear>(0)->weight().detach().clone();
  m->to(DType::bf16);
  for (const auto& [n, p] : m->named_parameters()) {
    EXPECT_EQ(p.dtype(), DType::bf16) << n;
    EXPECT_TRUE(p.is_leaf()) << n;
    EXPECT_TRUE(p.requires_grad()) << n;
    ASSERT_TRUE(p.grad().defined()) << n;
    EXPECT_EQ(p.grad().dtype(), DType::bf16) << n;
  }
  // The layer sees the converted tensor (the same one named_parameters lists).
  EXPECT_TRUE(m->at<Linear>(0)->weight().impl_ptr() == m->named_parameters()[0].second.impl_ptr());
  // Values are exactly the f32 ones rounded to bf16.
  EXPECT_EQ(m->at<Linear>(0)->weight().to_vector<float>(), w0.to(DType::bf16).to_vector<float>());
  // Floating buffers convert, the integer counter does not.
  auto bn = m->at<BatchNorm1d>(1);
  EXPECT_EQ(bn->running_mean().dtype(), DType::bf16);
  EXPECT_EQ(bn->num_batches_tracked().dtype(), DType::i64);
  // And it still runs, in bf16.
  EXPECT_EQ(m->forward(randn({5, 4}).to(DType::bf16)).dtype(), DType::bf16);
}

TEST(NnModule, ToWithPredicateKeepsBatchNormFp32) {
  auto m = mlp_with_bn();
  m->to(DType::bf16, [](const Module& mod) { return !is_batch_norm(mod); });
  EXPECT_EQ(m->at<Linear>(0)->weight().dtype(), DType::bf16);
  EXPECT_EQ(m->at<Linear>(3)->bias().dtype(), DType::bf16);
  auto bn = m->at<BatchNorm1d>(1);
  EXPECT_EQ(bn->weight().dtype(), DType::f32);
  EXPECT_EQ(bn->running_var().dtype(), DType::f32);
  EXPECT_THROW(m->to(DType::i64), Error);
}

TEST(NnModule, StateDictRoundTrip) {
  manual_seed(1);
  auto m = mlp_with_bn();
  m->forward(randn({6, 4}));  // moves the running statistics and the counter
  const StateDict saved = m->state_dict().clone();
  ASSERT_EQ(saved.size(), 9u);
  EXPECT_EQ(saved.at("1.num_batches_tracked").item<int64_t>(), 1);
  // Perturb every parameter and buffer, then restore.
  {
    autograd::NoGradGuard ng;
    for (Tensor p : m->parameters()) p.fill_(0.25);
    for (Tensor b : m->buffers()) b.fill_(7.0);
  }
  EXPECT_FALSE(all_equal(m->state_dict().at("0.weight"), saved.at("0.weight")));
  const LoadStateDictResult r = m->load_state_dict(saved);
  EXPECT_TRUE(r.missing_keys.empty() && r.unexpected_keys.empty());
  for (const auto& [name, t] : saved) EXPECT_TRUE(all_equal(m->state_dict().at(name), t)) << name;
  // A freshly initialised twin becomes identical, and computes the same outputs.
  manual_seed(2);
  auto twin = mlp_with_bn();
  twin->load_state_dict(saved);
  m->eval();
  twin->eval();
  Tensor x = randn({3, 4});
  EXPECT_TRUE(all_equal(m->forward(x), twin->forward(x)));
  // state_dict() aliases the live tensors (as PyTorch), clone() does not.
  StateDict live = m->state_dict();
  {
    autograd::NoGradGuard ng;
    m->at<Linear>(0)->weight().detach().fill_(3.0);
  }
  EXPECT_EQ(live.at("0.weight").to_vector<float>()[0], 3.0f);
  EXPECT_NE(saved.at("0.weight").to_vector<float>()[0], 3.0f);
}

TEST(NnModule, LoadStateDictConvertsFloatingDtypes) {
  auto m = mlp_with_bn();
  StateDict sd;
  for (const auto& [name, t] : m->state_dict())
    sd.insert(name, is_floating(t.dtype()) ? full(t.sizes(), 0.5, {.dtype = DType::f64}) : t.clone());
  m->load_state_dict(sd);
  EXPECT_EQ(m->at<Linear>(3)->weight().dtype(), DType::f32);
  EXPECT_EQ(m->at<Linear>(3)->weight().to_vector<float>()[0], 0.5f);
}

TEST(NnModule, LoadStateDictErrorsNameTheKeys) {
  auto m = mlp_with_bn();
  StateDict missing = m->state_dict().clone();
  missing.erase("3.bias");
  EXPECT_TRUE(throws_with([&] { m->load_state_dict(missing); }, {"missing keys", "'3.bias'"}));
  StateDict extra = m->state_dict().clone();
  extra.insert("4.weight", ones({2}));
  EXPECT_TRUE(throws_with([&] { m->load_state_dict(extra); }, {"unexpected keys", "'4.weight'"}));
  // Non-strict loading reports instead of throwing, and loads what matches.
  const float before = m->at<Linear>(0)->weight().to_vector<float>()[0];
  StateDict partial = m->state_dict().clone();
  partial.erase("3.bias");
  partial.insert("4.weight", ones({2}));
  partial.set("0.weight", full({8, 4}, 0.125));
  const LoadStateDictResult r = m->load_state_dict(partial, false);
  EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"3.bias"}));
  EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"4.weight"}));
  EXPECT_NE(before, 0.125f);
  EXPECT_EQ(m->at<Linear>(0)->weight().to_vector<float>()[0], 0.125f);
  // Shape mismatches throw even when not strict, naming both shapes; nothing is copied then.
  StateDict bad_shape = m->state_dict().clone();
  bad_shape.set("0.weight", zeros({4, 8}));
  bad_shape.set("3.bias", zeros({2}));
  EXPECT_TRUE(throws_with([&] { m->load_state_dict(bad_shape, false); }, {"'0.weight'", "[4, 8]", "[8, 4]"}));
  EXPECT_NE(m->at<Linear>(3)->bias().to_vector<float>()[0], 0.0f);
  // Floating into the integer counter is refused.
  StateDict bad_kind = m->state_dict().clone();
  bad_kind.set("1.num_batches_tracked", scalar_tensor(1.0));
  EXPECT_TRUE(throws_with([&] { m->load_state_dict(bad_kind); }, {"'1.num_batches_tracked'", "f32", "i64"}));
}

TEST(NnModule, Printing) {
  auto m = mlp_with_bn();
  EXPECT_EQ(m->to_string(),
            "Sequential(\n"
            "  (0): Linear(in_features=4, out_features=8, bias=true)\n"
            "  (1): BatchNorm1d(8, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)\n"
            "  (2): ReLU()\n"
            "  (3): Linear(in_features=8, out_features=2, bias=true)\n"
            ")");
  Net net;
  const std::string s = net.to_string();
  EXPECT_NE(s.find("  (layer1): Sequential(\n    (0): Block(\n      (conv1): Conv2d(3, 4, kernel_size=(3, 3), "
                   "stride=(1, 1), padding=(1, 1), bias=false)"),
            std::string::npos)
      << s;
}

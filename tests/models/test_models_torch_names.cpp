// Writes what bench/pytorch/check_names.py compares with the PyTorch twins of bench/pytorch/models.py:
// for every model, its parameter and state-dict names and shapes, in order; for a few tiny models also
// every state-dict value, an input and the outputs (training and eval mode), so the script can check
// that PyTorch computes the same function from the same weights.
//
// NamesForThePyTorchCheck writes the file (to MP_NAMES_OUT when set, else a scratch folder) and runs the check
// with Debian's python3-torch (Note [tests that need Python] in tests/test_util.hpp: it fails, not skips, under
// `make test` when torch is missing). By hand:
//
//   MP_NAMES_OUT=/tmp/mp_names.txt build/tests/test_models_torch_names
//   /usr/bin/python3 bench/pytorch/check_names.py /tmp/mp_names.txt
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"
#include "mp/models/models.hpp"
#include "mp/ops/ops.hpp"
#include "test_util.hpp"

using namespace mp;
using namespace mp::models;

namespace {

std::string shape_token(const Shape& s) {
  if (s.empty()) return "scalar";
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += 'x';
    out += std::to_string(s[i]);
  }
  return out;
}

// "model <kind> <args...>" then "param <name> <shape>" and "state <name> <shape>" lines.
void write_names(std::ostream& os, const std::string& header, const nn::Module& m) {
  os << "model " << header << "\n";
  for (const auto& [name, p] : m.named_parameters()) os << "param " << name << " " << shape_token(p.sizes()) << "\n";
  for (const auto& [name, t] : m.state_dict()) os << "state " << name << " " << shape_token(t.sizes()) << "\n";
}

void write_values(std::ostream& os, const std::string& tag, const std::string& name, const Tensor& t) {
  os << tag << " " << name << " " << shape_token(t.sizes()) << (is_floating(t.dtype()) ? " f32" : " i64");
  char buf[32];
  if (is_floating(t.dtype())) {
    for (float v : t.to(DType::f32).contiguous().to_vector<float>()) {
      std::snprintf(buf, sizeof buf, " %.9g", static_cast<double>(v));
      os << buf;
    }
  } else {
    for (int64_t v : t.to(DType::i64).contiguous().to_vector<int64_t>()) os << " " << v;
  }
  os << "\n";
}

// An image model: names, then (train-mode output, state after it, eval-mode output) for `x`.
void write_image_parity(std::ostream& os, const std::string& header, nn::UnaryModule& m, const Tensor& x) {
  write_names(os, header, m);
  autograd::NoGradGuard ng;
  m.train();
  const Tensor y_train = m.forward(x);  // updates the running statistics, which the state dict then carries
  for (const auto& [name, t] : m.state_dict()) write_values(os, "value", name, t);
  m.eval();
  const Tensor y_eval = m.forward(x);
  write_values(os, "input", "x", x);
  write_values(os, "output", "train", y_train);
  write_values(os, "output", "eval", y_eval);
}

std::string lm_header(const WordLMOptions& o) {
  std::ostringstream h;
  h << "wordlm " << o.vocab_size << " " << o.embed_size << " " << o.hidden_size << " " << o.num_layers << " " << o.cell
    << " " << o.dropout << " " << (o.tie_weights ? 1 : 0);
  return h.str();
}

// A word LM in eval mode (no dropout): logits and final state for tokens and a given initial state.
void write_lm_parity(std::ostream& os, WordLM& lm, const Tensor& tokens) {
  write_names(os, lm_header(lm.options()), lm);
  for (const auto& [name, t] : lm.state_dict()) write_values(os, "value", name, t);
  autograd::NoGradGuard ng;
  lm.eval();
  nn::LSTMState s0 = lm.init_state(tokens.size(1));
  s0.h = randn(s0.h.sizes(), {}, 0.0, 0.5);
  if (s0.c.defined()) s0.c = randn(s0.c.sizes(), {}, 0.0, 0.5);
  auto [logits, s1] = lm.forward(tokens, s0);
  write_values(os, "input", "tokens", tokens);
  write_values(os, "input", "h0", s0.h);
  if (s0.c.defined()) write_values(os, "input", "c0", s0.c);
  write_values(os, "output", "logits", logits);
  write_values(os, "output", "h", s1.h);
  if (s1.c.defined()) write_values(os, "output", "c", s1.c);
}

}  // namespace

TEST(ModelsTorchNames, WriterFormat) {
  manual_seed(1);
  MLP m({.in_features = 4, .hidden = {3}, .num_classes = 2});
  std::ostringstream os;
  write_image_parity(os, "mlp 4 3 2 0", m, randn({2, 1, 2, 2}));
  const std::string s = os.str();
  EXPECT_EQ(s.rfind("model mlp 4 3 2 0\nparam layers.0.weight 3x4\nparam layers.0.bias 3\n", 0), 0u) << s;
  EXPECT_NE(s.find("\nvalue layers.2.bias 2 f32 "), std::string::npos) << s;
  EXPECT_NE(s.find("\ninput x 2x1x2x2 f32 "), std::string::npos) << s;
  EXPECT_NE(s.find("\noutput eval 2x2 f32 "), std::string::npos) << s;
  std::ostringstream bn;
  write_names(bn, "resnet 8 1 2 1 cifar", ResNet({.depth = 8, .in_channels = 1, .num_classes = 2, .width = 1}));
  EXPECT_NE(bn.str().find("\nstate bn1.num_batches_tracked scalar\n"), std::string::npos) << bn.str();
}

TEST(ModelsTorchNames, NamesForThePyTorchCheck) {
  MP_SKIP_OR_FAIL_WITHOUT_PYTHON("torch");
  const char* env = std::getenv("MP_NAMES_OUT");
  const std::string path = env != nullptr && *env != '\0'
                               ? std::string(env)
                               : (mp::test::scratch_dir("models", "torch_names") / "names.txt").string();
  std::ofstream os(path);
  ASSERT_TRUE(os) << "cannot write " << path;
  manual_seed(2024);
  // Every registry model at full size, 3x32x32 and 10 classes; a few also for 1x28x28.
  for (const std::string& name : image_model_names())
    write_names(os, "image " + name + " 3 32 10", *create_image_model(name, {}));
  for (const char* name : {"mlp", "resnet20", "resnet18", "wrn-16-4"})
    write_names(os, std::string("image ") + name + " 1 28 10", *create_image_model(name, {1, 28, 10}));
  // The word LMs at the example's medium size.
  for (const char* cell : {"lstm", "gru", "rnn"})
    for (bool tie : {false, true}) {
      WordLM lm({.vocab_size = 10000, .cell = cell, .tie_weights = tie});
      write_names(os, lm_header(lm.options()), lm);
    }
  // Tiny models with values: PyTorch must compute the same outputs from the same weights.
  MLP mlp({.in_features = 16, .hidden = {8, 6}, .num_classes = 3});
  write_image_parity(os, "mlp 16 8,6 3 0", mlp, randn({2, 1, 4, 4}));
  for (int64_t depth : {8, 18, 50}) {
    ResNet r({.depth = depth, .in_channels = 3, .num_classes = 5, .width = 4});
    const std::string family = r.options().family == ResNetFamily::cifar ? "cifar" : "torchvision";
    write_image_parity(os, "resnet " + std::to_string(depth) + " 3 5 4 " + family, r, randn({3, 3, 16, 16}));
  }
  ResNet zero({.depth = 14, .in_channels = 2, .num_classes = 3, .width = 2, .zero_init_residual = true});
  write_image_parity(os, "resnet 14 2 3 2 cifar", zero, randn({2, 2, 6, 6}));
  WideResNet w({.depth = 10, .widen = 2, .in_channels = 3, .num_classes = 4});
  write_image_parity(os, "wrn 10 2 3 4 0", w, randn({3, 3, 8, 8}));
  for (const char* cell : {"lstm", "gru", "rnn"}) {
    WordLM lm({.vocab_size = 11,
               .embed_size = 6,
               .hidden_size = 6,
               .num_layers = 2,
               .cell = cell,
               .dropout = 0.2,
               .tie_weights = std::string(cell) == "lstm"});
    write_lm_parity(os, lm, randint(0, 11, {5, 3}));
  }
  os.close();
  ASSERT_TRUE(os.good());
  // PyTorch builds each twin, compares names and shapes in order, and for the tiny models loads the values
  // strictly and compares the outputs (its exit status is 1 when anything differs).
  const std::string cmd = mp::test::python_command() + " " MP_SOURCE_DIR "/bench/pytorch/check_names.py '" + path + "'";
  const mp::test::ShellResult r = mp::test::shell(cmd);
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.output;
}

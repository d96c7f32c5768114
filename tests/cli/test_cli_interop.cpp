// PyTorch interchange end to end: PyTorch (Debian's python3-torch, Python's safetensors: Note [tests that need
// Python]) writes a state dict, mixprec loads and evaluates it, `mixprec export` writes it back, and PyTorch
// loads that strictly and computes the same logits (tests/python/interop.py, which states the tolerance);
// likewise for a mixprec checkpoint with 16-bit weights. Then the CLI's --init_from, --init_from_partial and
// `eval --model` on bare files, which need no Python.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

#include "mp/autograd/node.hpp"
#include "mp/models/registry.hpp"
#include "mp/nn/batch_norm.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/train/interop.hpp"
#include "mp/train/safetensors.hpp"
#include "mp/train/trainer.hpp"
#include "test_util.hpp"
#include "train/trainer_fixtures.hpp"

namespace fs = std::filesystem;
using namespace mp;
using mp::test::scratch_dir;

namespace {

using Result = mp::test::ShellResult;
using mp::test::shell;

Result cli(const std::string& args) { return shell(std::string(MP_CLI_PATH) + " " + args); }

Result interop_py(const std::string& args) {
  return shell(mp::test::python_command() + " " MP_SOURCE_DIR "/tests/python/interop.py " + args);
}

std::shared_ptr<nn::UnaryModule> resnet8() {
  return models::create_image_model("resnet8", {.in_channels = 1, .image_size = 28, .num_classes = 10});
}

// mixprec's eval-mode logits of `m` for the input `x` of a file interop.py wrote, saved beside it for its check.
void write_logits(nn::UnaryModule& m, const std::string& io_in, const std::string& io_out) {
  const Tensor x = train::load_safetensors(io_in).tensors.at("x");
  autograd::NoGradGuard ng;
  m.eval();
  train::save_safetensors(io_out, {{"x", x}, {"logits", m.forward(x)}});
}

const char* kSpec = "resnet8 1 28 10 ";  // the model, its input channels and size, the classes (fashion-mnist's)

// The tiny IDX image set of the trainer tests (12x12, 384 train / 128 test images) in place of fashion-mnist's
// 10000 test images, which every evaluation would go through.
std::string small_data() { return " --dataset mnist --data_dir " + trainer_fixtures::image_data().string() + " "; }

}  // namespace

TEST(CliInterop, PyTorchStateDictRoundTrip) {
  MP_SKIP_OR_FAIL_WITHOUT_PYTHON("torch, safetensors.torch");
  const fs::path dir = scratch_dir("cli_interop", "torch");
  const std::string torch_sd = (dir / "torch.safetensors").string(), torch_io = (dir / "torch_io.safetensors").string();
  Result r = interop_py("write " + std::string(kSpec) + torch_sd + " " + torch_io);
  ASSERT_EQ(r.code, 0) << r.output;

  // mixprec loads PyTorch's file strictly (--init_from's loader) and computes logits for PyTorch's input.
  auto m = resnet8();
  const train::InitFromReport rep = train::init_from_file(*m, torch_sd, /*partial=*/false);
  EXPECT_TRUE(rep.diff.empty()) << rep.diff.describe();
  EXPECT_EQ(m->state_dict().at("bn1.num_batches_tracked").item<int64_t>(), 3);  // PyTorch's three forwards
  const std::string mp_io = (dir / "mp_io.safetensors").string();
  write_logits(*m, torch_io, mp_io);

  // export of the bare file; PyTorch loads it strictly, finds every tensor as it wrote it, and mixprec's logits
  // equal its own (within interop.py's tolerance).
  const std::string exported = (dir / "exported.safetensors").string();
  r = cli("export " + torch_sd + " " + exported);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "load_state_dict");
  r = interop_py("check " + std::string(kSpec) + exported + " " + mp_io + " --same-as " + torch_sd);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "max |torch - mixprec|");
  std::printf("%s", r.output.c_str());  // the measured difference, for the log

  // A mixprec checkpoint with bf16 weights (O2: batch norm f32): export keeps the stored dtypes, PyTorch's f32
  // twin loads them strictly and computes what mixprec computes from the same weights in f32.
  auto o2 = resnet8();
  train::init_from_file(*o2, torch_sd, false);
  o2->to(DType::bf16, [](const nn::Module& x) { return !nn::is_batch_norm(x); });
  const std::string ckpt = (dir / "ckpt.safetensors").string(), ckpt_sd = (dir / "ckpt_sd.safetensors").string();
  train::save_checkpoint(ckpt, {.model = o2.get()}, {.epoch = 1});
  r = cli("export " + ckpt + " " + ckpt_sd);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "of the checkpoint");
  const train::SafetensorsFile f = train::load_safetensors(ckpt_sd);
  EXPECT_EQ(f.tensors.keys(), o2->state_dict().keys());
  EXPECT_EQ(f.tensors.at("layer1.0.conv1.weight").dtype(), DType::bf16);
  EXPECT_EQ(f.tensors.at("layer1.0.bn1.weight").dtype(), DType::f32);
  auto f32 = resnet8();
  f32->load_state_dict(f.tensors, /*strict=*/true);  // bf16 -> f32 is exact
  const std::string ckpt_io = (dir / "ckpt_io.safetensors").string();
  write_logits(*f32, torch_io, ckpt_io);
  r = interop_py("check " + std::string(kSpec) + ckpt_sd + " " + ckpt_io);
  EXPECT_EQ(r.code, 0) << r.output;
  std::printf("%s", r.output.c_str());

  // `mixprec eval --model` evaluates PyTorch's file as it is.
  r = cli("eval --model resnet8 --num_workers 0" + small_data() + torch_sd);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "128 images");
}

TEST(CliInterop, BareStateDictInTrainAndEval) {
  const fs::path dir = scratch_dir("cli_interop", "bare");
  manual_seed(11);
  const std::string bare = (dir / "bare.safetensors").string();
  train::save_safetensors(bare, resnet8()->state_dict());
  const std::string run =
      " --model resnet8 --batch_size 64 --max_steps_per_epoch 1 --epochs 1 --no-augment --num_workers 0" + small_data();
  // A bare file needs --model to be evaluated; a wrong one is refused naming the differences.
  Result r = cli("eval" + small_data() + bare);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "is a bare state dict");
  EXPECT_CONTAINS(r.output, "--model NAME");
  r = cli("eval --model resnet14" + small_data() + bare);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "missing from the file (in the model): layer1.1.conv1.weight");
  // --init_from: exact, then refused with --resume, then a 5-class head: strict refuses, partial loads the rest.
  r = cli("train" + run + " --init_from " + bare);
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "initialised from " + bare + ": loaded ");
  r = cli("train" + run + " --init_from " + bare + " --resume --checkpoint_dir " + dir.string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "--init_from '" + bare + "' and --resume were both given");
  const std::string five = (dir / "five.safetensors").string();
  train::save_safetensors(
      five,
      models::create_image_model("resnet8", {.in_channels = 1, .image_size = 28, .num_classes = 5})->state_dict());
  r = cli("train" + run + " --quiet --init_from " + five);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_CONTAINS(r.output, "2 with another shape: fc.weight ([5, 64] in the file, [10, 64] in the model)");
  EXPECT_CONTAINS(r.output, "--init_from_partial");
  r = cli("train" + run + " --quiet --init_from " + five + " --init_from_partial --checkpoint_dir " + dir.string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "--init_from_partial; the others keep their initialisation");
  // The run's checkpoint exported is a bare file that eval reads with the run's config (no --model needed).
  const std::string exported = (dir / "exported.safetensors").string();
  r = cli("export " + (dir / "checkpoint.safetensors").string() + " " + exported + " --dtype bf16");
  EXPECT_EQ(r.code, 0) << r.output;
  r = cli("eval --num_workers 0 " + exported);  // the run's dataset (the small one), from its config
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "accuracy");
}

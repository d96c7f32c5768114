// PyTorch interchange in the library (no Python here; tests/cli/test_cli_interop.cpp has the round trip through
// PyTorch): init_from_file's strict and partial loads and their messages, export_state_dict's names, dtypes
// and exact round trip, and the --init_from / --resume refusal.
#include <gtest/gtest.h>

#include "mp/autograd/node.hpp"
#include "mp/models/registry.hpp"
#include "mp/nn/batch_norm.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/train/interop.hpp"
#include "mp/train/safetensors.hpp"
#include "mp/train/trainer.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace mp;
using namespace mp::train;
using mp::test::error_of;
using mp::test::scratch_dir;

namespace {

std::shared_ptr<nn::UnaryModule> model(const std::string& name, int64_t cin = 1, int64_t classes = 10) {
  return models::create_image_model(name, {.in_channels = cin, .image_size = 28, .num_classes = classes});
}

// Every tensor of a and b equal, dtype and order included.
void expect_same(const nn::StateDict& a, const nn::StateDict& b) {
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    EXPECT_EQ(t.dtype(), u.dtype()) << name;
    EXPECT_EQ(t.sizes(), u.sizes()) << name;
    EXPECT_EQ(t.contiguous().to(DType::f64).to_vector<double>(), u.contiguous().to(DType::f64).to_vector<double>())
        << name;
  }
}

// A model whose running statistics and num_batches_tracked are not their initial values.
std::shared_ptr<nn::UnaryModule> trained_a_little(const std::string& name) {
  manual_seed(5);
  auto m = model(name);
  autograd::NoGradGuard ng;
  m->train();
  m->forward(randn({4, 1, 28, 28}));
  return m;
}

}  // namespace

TEST(InitFrom, LoadsAnExactStateDictAndACheckpointsModel) {
  const fs::path dir = scratch_dir("interop", "exact");
  auto src = trained_a_little("resnet8");
  const std::string bare = (dir / "bare.safetensors").string(), ckpt = (dir / "ckpt.safetensors").string();
  save_safetensors(bare, src->state_dict());
  save_checkpoint(ckpt, {.model = src.get(), .generator = false}, {});
  for (const std::string& f : {bare, ckpt}) {
    manual_seed(99);
    auto dst = model("resnet8");
    const InitFromReport r = init_from_file(*dst, f, /*partial=*/false);
    EXPECT_TRUE(r.diff.empty()) << r.diff.describe();
    EXPECT_EQ(r.loaded, static_cast<int64_t>(src->state_dict().size()));
    expect_same(dst->state_dict(), src->state_dict());  // buffers too: num_batches_tracked is 1
    EXPECT_EQ(dst->state_dict().at("bn1.num_batches_tracked").item<int64_t>(), 1);
    EXPECT_CONTAINS(r.describe(f), "loaded " + std::to_string(r.loaded) + " of the model's");
  }
}

TEST(InitFrom, StrictRefusesListingTheDifferencesAndLoadsNothing) {
  const fs::path dir = scratch_dir("interop", "strict");
  // resnet14 for 3 channels and 5 classes into resnet8 (1 channel, 10 classes): conv1 and fc have other shapes,
  // layer*.1.* are unexpected (24 + ... of them: more than 10 are shown as a count), and a buffer removed from
  // the file is missing.
  manual_seed(1);
  nn::StateDict other = model("resnet14", 3, 5)->state_dict();
  other.erase("bn1.running_var");
  const std::string f = (dir / "other.safetensors").string();
  save_safetensors(f, other);
  manual_seed(2);
  auto dst = model("resnet8");
  const nn::StateDict before = dst->state_dict().clone();
  const std::string m = error_of([&] { init_from_file(*dst, f, /*partial=*/false); });
  EXPECT_CONTAINS(m, f);
  EXPECT_CONTAINS(m, "1 missing from the file (in the model): bn1.running_var");
  EXPECT_CONTAINS(m, "unexpected in the file (not in the model): layer1.1.conv1.weight, ");
  EXPECT_CONTAINS(m, " more");
  EXPECT_CONTAINS(m, "conv1.weight ([16, 3, 3, 3] in the file, [16, 1, 3, 3] in the model)");
  EXPECT_CONTAINS(m, "fc.weight ([5, 64] in the file, [10, 64] in the model)");
  EXPECT_CONTAINS(m, "--init_from_partial");
  expect_same(dst->state_dict(), before);  // nothing was loaded
  const StateDictDiff d = diff_state_dict(*dst, other);
  EXPECT_EQ(d.missing, std::vector<std::string>{"bn1.running_var"});
  EXPECT_EQ(d.mismatched.size(), 3u);  // conv1.weight, fc.weight, fc.bias
  EXPECT_GT(d.unexpected.size(), 10u);
  // At most 10 of each, then the count of the rest.
  EXPECT_CONTAINS(d.describe(), "... and " + std::to_string(d.unexpected.size() - 10) + " more");
}

TEST(InitFrom, PartialLoadsWhatMatchesAndSaysWhatWasLeftOut) {
  const fs::path dir = scratch_dir("interop", "partial");
  // The same network for 5 classes: every tensor but the classifier head fits.
  manual_seed(3);
  auto src = model("resnet8", 1, 5);
  const std::string f = (dir / "five.safetensors").string();
  save_safetensors(f, src->state_dict());
  manual_seed(4);
  auto dst = model("resnet8");
  const Tensor fc_before = dst->state_dict().at("fc.weight").clone();
  const InitFromReport r = init_from_file(*dst, f, /*partial=*/true);
  EXPECT_EQ(r.loaded, r.model_tensors - 2);
  EXPECT_EQ(r.diff.mismatched.size(), 2u);
  const std::string s = r.describe(f);
  EXPECT_CONTAINS(s, "loaded " + std::to_string(r.model_tensors - 2) + " of the model's " +
                         std::to_string(r.model_tensors) + " tensors");
  EXPECT_CONTAINS(s, "2 with another shape: fc.weight ([5, 64] in the file, [10, 64] in the model), fc.bias");
  EXPECT_EQ(dst->state_dict().at("conv1.weight").to_vector<float>(),
            src->state_dict().at("conv1.weight").to_vector<float>());
  EXPECT_EQ(dst->state_dict().at("fc.weight").to_vector<float>(), fc_before.to_vector<float>());
  // Nothing in common: refused even when partial.
  const std::string mlp = (dir / "mlp.safetensors").string();
  save_safetensors(mlp, model("mlp")->state_dict());
  EXPECT_CONTAINS(error_of([&] { init_from_file(*dst, mlp, true); }), "none of its");
}

TEST(Export, WritesTheBareStateDictInStoredDtypesExactly) {
  const fs::path dir = scratch_dir("interop", "export");
  auto m = trained_a_little("resnet8");
  m->to(DType::bf16, [](const nn::Module& x) { return !nn::is_batch_norm(x); });  // as O2 stores it
  TrainConfig c;
  c.model = "resnet8";
  const std::string ckpt = (dir / "ckpt.safetensors").string(), out = (dir / "out.safetensors").string();
  save_checkpoint(ckpt, {.model = m.get()}, {.epoch = 1}, {}, {{"config", config_to_json(c)}});
  const ExportStats s = export_state_dict(ckpt, out);
  EXPECT_TRUE(s.from_checkpoint);
  EXPECT_EQ(s.converted, 0);
  std::map<std::string, std::string> md;
  const std::vector<TensorInfo> h = read_safetensors_header(out, &md);
  const nn::StateDict want = m->state_dict();
  ASSERT_EQ(h.size(), want.size());  // the model only: no optimizer, rng or scaler
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(h[i].name, want.keys()[i]);
  EXPECT_EQ(md.at("format"), "pt");  // safetensors.torch's tag, not a checkpoint's
  EXPECT_EQ(md.at("config"), config_to_json(c));
  const SafetensorsFile f = load_safetensors(out);
  expect_same(f.tensors, want);  // stored dtypes: bf16 weights, f32 batch norm, i64 num_batches_tracked
  EXPECT_EQ(f.tensors.at("conv1.weight").dtype(), DType::bf16);
  EXPECT_EQ(f.tensors.at("bn1.running_mean").dtype(), DType::f32);
  EXPECT_EQ(f.tensors.at("bn1.num_batches_tracked").dtype(), DType::i64);
  // Exporting the export (a bare file) changes nothing; --dtype f32 widens the floating tensors only.
  const std::string again = (dir / "again.safetensors").string(), wide = (dir / "wide.safetensors").string();
  EXPECT_FALSE(export_state_dict(out, again).from_checkpoint);
  expect_same(load_safetensors(again).tensors, want);
  const ExportStats w = export_state_dict(out, wide, DType::f32);
  EXPECT_GT(w.converted, 0);
  const nn::StateDict wt = load_safetensors(wide).tensors;
  EXPECT_EQ(wt.at("conv1.weight").dtype(), DType::f32);
  EXPECT_EQ(wt.at("bn1.num_batches_tracked").dtype(), DType::i64);
  EXPECT_EQ(wt.at("conv1.weight").to_vector<float>(), want.at("conv1.weight").to_vector<float>());  // exact
  EXPECT_CONTAINS(error_of([&] { export_state_dict(out, wide, DType::i32); }), "--dtype must be floating");
  EXPECT_CONTAINS(error_of([] { floating_dtype_from_flag("f8"); }), "expected f32, f16, bf16 or f64, got 'f8'");
}

TEST(InitFrom, RefusedWithResumeAndPartialAlone) {
  TrainConfig c;
  c.checkpoint_dir = "/tmp/x";
  c.resume = true;
  c.init_from = "w.safetensors";
  EXPECT_CONTAINS(error_of([&] { validate(c); }), "--init_from 'w.safetensors' and --resume were both given");
  c.resume = false;
  validate(c);
  c.init_from.clear();
  c.init_from_partial = true;
  EXPECT_CONTAINS(error_of([&] { validate(c); }), "--init_from_partial needs --init_from");
}

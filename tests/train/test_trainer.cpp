// The training loop end to end on small generated datasets: learning, exact resume (bit-identical
// loss curves) in every precision, checkpoint evaluation, config round trip and validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "mp/core/error.hpp"
#include "mp/models/registry.hpp"
#include "mp/optim/optimizer.hpp"
#include "mp/report/inspect.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/train/run_log.hpp"
#include "mp/train/safetensors.hpp"
#include "mp/train/trainer.hpp"
#include "test_util.hpp"
#include "train/setup.hpp"
#include "trainer_fixtures.hpp"

namespace fs = std::filesystem;
using mp::test::scratch_dir;
using mp::train::RunSummary;
using mp::train::TrainConfig;

using namespace trainer_fixtures;

TEST(Trainer, ImageTaskLearnsInFp32AndBf16) {
  std::ostringstream sink;
  for (const char* p : {"fp32", "bf16"}) {
    const RunSummary s = mp::train::train(image_config(p), sink);
    EXPECT_EQ(s.metric_name, "accuracy");
    ASSERT_EQ(s.epochs.size(), 2u);
    EXPECT_GT(s.val_metric, 0.9) << p;  // 4 classes: chance is 0.25
    EXPECT_LT(s.epochs[1].train_loss, s.epochs[0].train_loss) << p;
    EXPECT_EQ(s.steps, 2 * (384 / 32));
    EXPECT_GT(s.peak_bytes, 0);
    EXPECT_EQ(s.skipped_steps, 0);
  }
}

TEST(Trainer, SaysWhenItsSixteenBitDtypeComputesThroughF32) {
  // A 16-bit run on a CPU where oneDNN has no kernel of that dtype (no AVX-512 for bf16; no AVX512-FP16 for f16)
  // says so before it starts, once (mp::cpu_16bit_note); fp32 runs and CPUs with the kernels say nothing.
  EXPECT_TRUE(mp::cpu_16bit_note(mp::DType::f32).empty());
  for (const char* p : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(p);
    TrainConfig c = image_config(p);
    c.model = "mlp";
    c.epochs = 1;
    c.train_subset = 64;
    c.quiet = false;
    std::ostringstream out;
    mp::train::train(c, out);
    const std::string note = mp::cpu_16bit_note(c.precision);
    EXPECT_EQ(note.empty(), std::string(p) == "fp32" || mp::backend::cpu::onednn_has_native(c.precision));
    const size_t at = out.str().find("note: " + note + "\n");
    if (note.empty()) {
      EXPECT_EQ(out.str().find("computes through f32"), std::string::npos) << out.str();
    } else {
      EXPECT_EQ(at, 0u) << out.str();
      EXPECT_EQ(out.str().find("computes through f32", at + note.size()), std::string::npos) << out.str();
    }
  }
}

TEST(Trainer, ExactResumeImageFp32MidEpoch) { expect_exact_resume(image_config("fp32"), 17, "img_fp32"); }

TEST(Trainer, ExactResumeImageBf16O2AtEpochBoundary) {
  expect_exact_resume(image_config("bf16"), 12, "img_bf16");  // masters live in the optimizer state
}

TEST(Trainer, ExactResumeImageFp16DynamicScale) {
  TrainConfig c = image_config("fp16");
  c.opt_level = mp::amp::OptLevel::O1;  // f16 on the CPU: autocast casts, the scaler runs (f16 is storage-only here)
  expect_exact_resume(c, 7, "img_fp16");
}

TEST(Trainer, ExactResumeWordLmWithDropoutMidEpoch) {
  expect_exact_resume(text_config("fp32"), 9, "lm_fp32");
  expect_exact_resume(text_config("bf16"), 9, "lm_bf16");
}

TEST(Trainer, ExactResumeWordLmOnTheLibraryLstm) {
  TrainConfig c = text_config("bf16");
  c.lstm_impl = "onednn";  // oneDNN's LSTM primitive (mp::lstm_layer_library), also through a checkpoint
  expect_exact_resume(c, 9, "lm_onednn");
}

// Note [gradient accumulation]: N batches of B per optimizer step take the same steps as one batch of
// N x B (a model without batch statistics, no augmentation: the loader's epoch permutation does not
// depend on the batch size). Not bit for bit: the f32 gradient sums run in another order, so the losses
// agree to ~1e-6 relative, and the tolerance is 1e-4 to leave room for 24 steps of SGD compounding that.
TEST(Trainer, AccumulatedBatchesMatchOneLargerBatch) {
  TrainConfig c = image_config("fp32");
  c.model = "mlp";
  c.augment = false;
  c.optimizer = "sgd";
  c.lr = 0.05;
  std::ostringstream sink;
  const RunSummary big = mp::train::train(c, sink);
  ASSERT_EQ(big.step_losses.size(), 24u);
  for (int64_t n : {2, 4}) {
    TrainConfig a = c;
    a.batch_size = c.batch_size / n;
    a.grad_accum = n;
    const RunSummary acc = mp::train::train(a, sink);
    EXPECT_EQ(acc.steps, big.steps) << n;
    ASSERT_EQ(acc.step_losses.size(), big.step_losses.size()) << n;
    for (size_t i = 0; i < big.step_losses.size(); ++i)
      EXPECT_NEAR(acc.step_losses[i], big.step_losses[i], 1e-4 * std::abs(big.step_losses[i])) << n << " step " << i;
    EXPECT_NEAR(acc.val_metric, big.val_metric, 1.0 / 128) << n;  // at most one test image of 128 flips
  }
  // Without accumulation the small batches take 4x the steps and another trajectory (the test can fail).
  TrainConfig small = c;
  small.batch_size = c.batch_size / 4;
  EXPECT_EQ(mp::train::train(small, sink).steps, 4 * big.steps);
}

// --no-decay_norm_and_bias: the 1-dim parameters (biases, batch-norm scales and shifts) get a group of
// their own without weight decay; the others keep it.
TEST(Trainer, NormAndBiasParametersCanBeExemptFromWeightDecay) {
  TrainConfig c = image_config("fp32");
  c.optimizer = "sgd";
  c.weight_decay = 5e-4;
  c.decay_norm_and_bias = false;
  auto model = mp::models::create_image_model("resnet8", {.in_channels = 1, .image_size = 12, .num_classes = 4});
  const std::vector<mp::Tensor> params = model->parameters();
  const auto opt = mp::train::make_optimizer(mp::train::with_task_defaults(c), params);
  ASSERT_EQ(opt->num_param_groups(), 2u);
  EXPECT_EQ(opt->group_options(0).at("weight_decay"), 5e-4);
  EXPECT_EQ(opt->group_options(1).at("weight_decay"), 0.0);
  for (const mp::Tensor& p : opt->group_params(0)) EXPECT_GE(p.dim(), 2);
  for (const mp::Tensor& p : opt->group_params(1)) EXPECT_EQ(p.dim(), 1);
  EXPECT_EQ(opt->group_params(0).size() + opt->group_params(1).size(), params.size());
  EXPECT_GT(opt->group_params(1).size(), 0u);
  c.decay_norm_and_bias = true;
  EXPECT_EQ(mp::train::make_optimizer(mp::train::with_task_defaults(c), params)->num_param_groups(), 1u);
  // End to end, in O2 (the optimizer's parameters are replaced by 16-bit ones group by group), through a
  // checkpoint and a resume.
  TrainConfig run = image_config("bf16");
  run.decay_norm_and_bias = false;
  expect_exact_resume(run, 5, "img_bf16_no_decay_norm_bias");
}

// --label_smoothing: the training loss is PyTorch's smoothed cross entropy; the run still learns, and the
// evaluation reports the plain cross entropy (a checkpoint evaluated alone gives the same loss).
TEST(Trainer, LabelSmoothingChangesTheTrainingLossOnly) {
  TrainConfig c = image_config("fp32");
  c.epochs = 1;
  std::ostringstream sink;
  const RunSummary plain = mp::train::train(c, sink);
  c.label_smoothing = 0.2;
  c.checkpoint_dir = scratch_dir("trainer", "label_smoothing").string();
  const RunSummary smooth = mp::train::train(c, sink);
  EXPECT_NE(smooth.step_losses.front(), plain.step_losses.front());
  EXPECT_GT(smooth.val_metric, 0.8);
  // The smoothed targets keep the loss away from 0: for 4 classes at e = 0.2 it cannot go below the
  // entropy of (0.85, 0.05, 0.05, 0.05), 0.587.
  for (double l : smooth.step_losses) ASSERT_GT(l, 0.587);
  const mp::train::EvalResult ev = mp::train::evaluate_checkpoint(
      (fs::path(c.checkpoint_dir) / "checkpoint.safetensors").string(), "test", nullptr, sink);
  EXPECT_EQ(ev.loss, smooth.val_loss);
  c.label_smoothing = 1.0;
  EXPECT_NE(mp::test::error_of([&] { mp::train::validate(c); }).find("--label_smoothing must be in [0, 1)"),
            std::string::npos);
}

TEST(Trainer, ExactResumeWithStochasticRounding) {
  // O3 bf16 without masters, rounded stochastically: the random bits follow from (seed, step, tensor,
  // element), so the resumed run draws what the uninterrupted one did.
  TrainConfig c = image_config("bf16");
  c.opt_level = mp::amp::OptLevel::O3;
  c.stochastic_rounding = true;
  expect_exact_resume(c, 7, "img_bf16_o3_sr");
  // ... and the rounding is in effect: the third step's loss differs from nearest-even rounding's.
  c.epochs = 1;
  c.max_steps_per_epoch = 3;
  std::ostringstream sink;
  const double with = mp::train::train(c, sink).step_losses.back();
  c.stochastic_rounding = false;
  EXPECT_NE(mp::train::train(c, sink).step_losses.back(), with);
}

// Apex's properties of O2/O3 (--keep_batchnorm_fp32, --master_weights) decide the dtypes of the trained
// weights and whether the optimizer keeps f32 masters: what the checkpoint holds shows both.
TEST(Trainer, KeepBatchnormFp32AndMasterWeightsChooseTheWeightsDtypes) {
  struct Case {
    std::string level, keep_bn, masters;
    const char *bn_dtype, *conv_dtype;
    bool has_masters;
    std::string label;
  };
  const Case cases[] = {
      {"O2", "", "", "F32", "BF16", true, "bf16 O2"},
      {"O2", "false", "false", "BF16", "BF16", false, "bf16 O2 BN-16 no-masters"},
      {"O3", "", "", "BF16", "BF16", false, "bf16 O3"},
      {"O3", "true", "", "F32", "BF16", false, "bf16 O3 BN-f32"},
      {"O3", "", "true", "BF16", "BF16", true, "bf16 O3 masters"},
  };
  for (const Case& k : cases) {
    TrainConfig c = image_config("bf16");
    c.opt_level = mp::train::FieldText<std::optional<mp::amp::OptLevel>>::parse(k.level, "opt_level");
    c.keep_batchnorm_fp32 = mp::train::FieldText<std::optional<bool>>::parse(k.keep_bn, "keep_batchnorm_fp32");
    c.master_weights = mp::train::FieldText<std::optional<bool>>::parse(k.masters, "master_weights");
    c.epochs = 1;
    c.max_steps_per_epoch = 2;
    c.checkpoint_dir = scratch_dir("trainer", "apex_properties").string();
    std::ostringstream sink;
    const RunSummary s = mp::train::train(c, sink);
    EXPECT_EQ(s.label, k.label);
    for (double l : s.step_losses) EXPECT_TRUE(std::isfinite(l)) << k.label;
    std::map<std::string, std::string> dtypes;
    int masters = 0;
    for (const auto& t :
         mp::train::read_safetensors_header((fs::path(c.checkpoint_dir) / "checkpoint.safetensors").string())) {
      dtypes[t.name] = mp::train::safetensors_dtype_name(t.dtype);
      if (t.name.starts_with("optimizer.") && t.name.ends_with(".master")) ++masters;
    }
    EXPECT_EQ(dtypes["model.bn1.weight"], k.bn_dtype) << k.label;
    EXPECT_EQ(dtypes["model.layer1.0.bn2.bias"], k.bn_dtype) << k.label;
    EXPECT_EQ(dtypes["model.conv1.weight"], k.conv_dtype) << k.label;
    EXPECT_EQ(masters > 0, k.has_masters) << k.label << ": " << masters << " masters";
    // evaluation of the checkpoint converts the model as the run did
    const mp::train::EvalResult ev = mp::train::evaluate_checkpoint(
        (fs::path(c.checkpoint_dir) / "checkpoint.safetensors").string(), "test", nullptr, sink);
    EXPECT_EQ(ev.loss, s.val_loss) << k.label;
    // ... and at another precision the level's own defaults apply (the trained run's properties belong
    // to its level: fp32 has none)
    mp::train::EvalOverrides fp32;
    fp32.values.precision = mp::DType::f32;
    fp32.values.model = c.model;  // an override names the checkpoint's model or none (it refuses another)
    fp32.given = {"precision", "model"};
    const mp::train::EvalResult f = mp::train::evaluate_checkpoint(
        (fs::path(c.checkpoint_dir) / "checkpoint.safetensors").string(), "test", &fp32, sink);
    EXPECT_GT(f.metric, 0.25) << k.label;  // 4 classes: better than chance
  }
}

// --save_best keeps the epoch with the best evaluation as best.safetensors, and a resumed process compares
// with the whole run's best (Note [the best epoch]).
TEST(Trainer, SaveBestKeepsTheBestEpochAcrossAResume) {
  TrainConfig c = image_config("fp32");
  c.epochs = 3;
  c.save_best = true;
  auto best_of = [](const fs::path& dir) {
    std::map<std::string, std::string> md;
    mp::train::read_safetensors_header((dir / "best.safetensors").string(), &md);
    return md["best"];
  };
  std::ostringstream sink;
  const fs::path whole = scratch_dir("trainer", "best_whole");
  c.checkpoint_dir = whole.string();
  const RunSummary s = mp::train::train(c, sink);
  ASSERT_EQ(s.epochs.size(), 3u);
  int64_t argmax = 1;
  for (const auto& e : s.epochs)
    if (e.val_metric > s.epochs[static_cast<size_t>(argmax - 1)].val_metric) argmax = e.epoch;
  EXPECT_EQ(s.best_epoch, argmax);
  EXPECT_EQ(s.best_val_metric, s.epochs[static_cast<size_t>(argmax - 1)].val_metric);
  EXPECT_EQ(s.best_checkpoint, (whole / "best.safetensors").string());
  const mp::train::EvalResult ev =
      mp::train::evaluate_checkpoint((whole / "best.safetensors").string(), "test", nullptr, sink);
  EXPECT_EQ(ev.metric, s.best_val_metric);
  EXPECT_NE(best_of(whole).find("\"epoch\":" + std::to_string(argmax)), std::string::npos) << best_of(whole);

  // The same run in two processes: the first ends inside epoch 2, having written best.safetensors at
  // epoch 1; the second must keep the first's best unless it beats it.
  const fs::path split = scratch_dir("trainer", "best_split");
  c.checkpoint_dir = split.string();
  c.stop_after_steps = 18;  // 12 steps per epoch
  mp::train::train(c, sink);
  EXPECT_NE(best_of(split).find("\"epoch\":1"), std::string::npos) << best_of(split);
  const fs::path unbeaten = scratch_dir("trainer", "best_unbeaten");
  fs::copy(split, unbeaten, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  c.stop_after_steps = 0;
  c.resume = true;
  const RunSummary r = mp::train::train(c, sink);
  EXPECT_EQ(r.best_epoch, argmax);
  EXPECT_EQ(r.best_val_metric, s.best_val_metric);
  EXPECT_EQ(best_of(split), best_of(whole));
  EXPECT_EQ(r.best_checkpoint, (split / "best.safetensors").string());
  EXPECT_EQ(mp::train::evaluate_checkpoint((split / "best.safetensors").string(), "test", nullptr, sink).metric,
            s.best_val_metric);
  // The resumed process compares with the best that the checkpoint carries: one no epoch can beat (100%)
  // keeps best.safetensors at epoch 1 ...
  const std::string ckpt = (unbeaten / "checkpoint.safetensors").string();
  mp::train::SafetensorsFile f = mp::train::load_safetensors(ckpt);
  f.metadata["best"] = R"({"epoch":1,"metric":"0x1p+0"})";
  mp::train::save_safetensors(ckpt, f.tensors, f.metadata);
  const std::string first = best_of(unbeaten);
  c.checkpoint_dir = unbeaten.string();
  const RunSummary u = mp::train::train(c, sink);
  EXPECT_EQ(u.best_epoch, 1);
  EXPECT_EQ(u.best_val_metric, 1.0);
  EXPECT_EQ(best_of(unbeaten), first);
  EXPECT_EQ(u.best_checkpoint, "");  // the file holds epoch 1's real metric, not the claimed best
  // ... and a damaged record is refused naming it.
  f.metadata["best"] = R"({"epoch":7,"metric":"0x1p-1"})";  // an epoch the checkpoint has not reached
  mp::train::save_safetensors(ckpt, f.tensors, f.metadata);
  const std::string m = mp::test::error_of([&] { mp::train::train(c, sink); });
  EXPECT_NE(m.find("metadata 'best': expected a finite metric of an epoch in 1..1"), std::string::npos) << m;

  // Perplexity: lower is better. Without --save_best the best epoch is still reported.
  TrainConfig t = text_config("fp32");
  t.epochs = 3;
  const RunSummary lm = mp::train::train(t, sink);
  double lowest = lm.epochs.front().val_metric;
  for (const auto& e : lm.epochs) lowest = std::min(lowest, e.val_metric);
  EXPECT_EQ(lm.best_val_metric, lowest);
  EXPECT_LT(lm.epochs.back().val_metric, lm.epochs.front().val_metric);  // it learns, so "lower" is tested
  t.save_best = true;
  EXPECT_NE(mp::test::error_of([&] { mp::train::validate(t); }).find("--save_best needs --checkpoint_dir"),
            std::string::npos);
}

// --ema_decay: an f32 moving average of the weights, evaluated beside the model each epoch, saved in the
// checkpoint (mixprec eval --ema), continued exactly by a resume.
TEST(Trainer, WeightAveragesAreEvaluatedSavedAndResumed) {
  TrainConfig c = image_config("bf16");  // O2: the masters are averaged
  c.ema_decay = 0.9;
  expect_exact_resume(c, 17, "img_bf16_ema");
  c.checkpoint_dir = scratch_dir("trainer", "ema").string();
  c.log = (fs::path(c.checkpoint_dir) / "log.jsonl").string();
  std::ostringstream sink;
  const RunSummary s = mp::train::train(c, sink);
  ASSERT_TRUE(s.ema_val_metric.has_value());
  EXPECT_GT(*s.ema_val_metric, 0.9);
  EXPECT_NE(*s.ema_val_loss, s.val_loss);  // other weights than the model's
  const std::string ckpt = (fs::path(c.checkpoint_dir) / "checkpoint.safetensors").string();
  std::map<std::string, std::string> dtypes;
  for (const auto& t : mp::train::read_safetensors_header(ckpt))
    dtypes[t.name] = mp::train::safetensors_dtype_name(t.dtype);
  EXPECT_EQ(dtypes["ema.conv1.weight"], "F32");
  EXPECT_EQ(dtypes["model.conv1.weight"], "BF16");
  EXPECT_EQ(dtypes["ema.num_updates"], "I64");
  const std::string described = mp::report::describe_safetensors_file(ckpt);
  EXPECT_NE(described.find("bf16 O2, resnet8 on mnist, 2 epochs of batch 32, adamw lr 0.003, weight EMA 0.9"),
            std::string::npos)
      << described;
  EXPECT_NE(described.find("stands at: 2 of 2 epochs done, 24 optimizer steps"), std::string::npos) << described;
  EXPECT_NE(described.find("\n  ema "), std::string::npos) << described;
  // pinned in the tests: every bf16 shape on oneDNN's kernels, recorded for a resume (a CPU without oneDNN's bf16
  // kernels, as AMD Zen 3, has one path, through f32, and no choice to record)
  if (mp::backend::cpu::onednn_has_native(mp::DType::bf16)) {
    EXPECT_NE(described.find("16-bit CPU kernel paths: native "), std::string::npos) << described;
  }
  const mp::train::EvalResult ev = mp::train::evaluate_checkpoint(ckpt, "test", nullptr, sink, /*ema=*/true);
  EXPECT_EQ(ev.metric, *s.ema_val_metric);
  EXPECT_EQ(ev.loss, *s.ema_val_loss);
  EXPECT_EQ(mp::train::evaluate_checkpoint(ckpt, "test", nullptr, sink).loss, s.val_loss);
  const auto records = mp::train::read_run_log(c.log);
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(std::get<double>(records.back().at("ema_val_accuracy")), *s.ema_val_metric);

  // A checkpoint without averages: resuming with --ema_decay and eval --ema are refused, naming the file.
  c.ema_decay = 0;
  c.log.clear();
  c.checkpoint_dir = scratch_dir("trainer", "no_ema").string();
  c.epochs = 1;
  mp::train::train(c, sink);
  const std::string plain = (fs::path(c.checkpoint_dir) / "checkpoint.safetensors").string();
  EXPECT_NE(mp::test::error_of([&] {
              mp::train::evaluate_checkpoint(plain, "test", nullptr, sink, true);
            }).find("holds no weight averages"),
            std::string::npos);
  c.ema_decay = 0.9;
  c.resume = true;
  c.epochs = 2;
  const std::string m = mp::test::error_of([&] { mp::train::train(c, sink); });
  EXPECT_NE(m.find("holds no weight averages (section 'ema.')"), std::string::npos) << m;
  c.ema_decay = 1;
  EXPECT_NE(mp::test::error_of([&] { mp::train::validate(c); }).find("--ema_decay must be in [0, 1)"),
            std::string::npos);

  // The word LM (lower perplexity is better) has them too.
  TrainConfig t = text_config("fp32");
  t.ema_decay = 0.5;
  const RunSummary lm = mp::train::train(t, sink);
  ASSERT_TRUE(lm.ema_val_metric.has_value());
  EXPECT_TRUE(std::isfinite(*lm.ema_val_metric));
  EXPECT_NE(*lm.ema_val_metric, lm.val_metric);
}

TEST(Trainer, ExactResumeWithGradientAccumulation) {
  TrainConfig c = image_config("bf16");  // O2: the 16-bit gradients accumulate in f32
  c.batch_size = 16;
  c.grad_accum = 2;
  expect_exact_resume(c, 5, "img_bf16_accum");
  TrainConfig t = text_config("fp32");
  t.grad_accum = 3;
  expect_exact_resume(t, 4, "lm_fp32_accum");
}

// A checkpoint's position is a batch count; resuming it with a --grad_accum that puts that position inside
// an optimizer step is refused naming the one it was written with. Other changed settings are reported.
TEST(Trainer, ResumeChecksTheCheckpointsSettings) {
  TrainConfig c = image_config("fp32");
  c.batch_size = 16;
  c.grad_accum = 2;
  c.stop_after_steps = 3;  // stands after batch 6 of epoch 1
  c.checkpoint_dir = scratch_dir("trainer", "resume_settings").string();
  std::ostringstream sink;
  mp::train::train(c, sink);
  c.stop_after_steps = 0;
  c.resume = true;
  c.grad_accum = 4;
  const std::string m = mp::test::error_of([&] { mp::train::train(c, sink); });
  EXPECT_NE(m.find("after batch 6 of epoch 1"), std::string::npos) << m;
  EXPECT_NE(m.find("written with --grad_accum 2"), std::string::npos) << m;
  c.grad_accum = 3;  // 6 batches are 2 steps of 3: allowed, and reported with the other change
  c.lr = 1e-3;
  c.num_workers = 0;  // not reported: the data do not depend on it
  c.stop_after_steps = 1;
  std::ostringstream out;
  const RunSummary r = mp::train::train(c, out);
  EXPECT_EQ(r.steps, 1);
  EXPECT_NE(out.str().find("grad_accum 2 -> 3"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("lr 0.003 -> 0.001"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("num_workers"), std::string::npos) << out.str();
  // An unchanged resume says nothing.
  std::ostringstream quiet;
  c.stop_after_steps = 0;
  mp::train::train(c, quiet);
  EXPECT_EQ(quiet.str().find("warning"), std::string::npos) << quiet.str();
}

TEST(Trainer, WordLmLearnsAndEvaluatesCheckpoint) {
  TrainConfig c = text_config("bf16");
  c.epochs = 3;
  const fs::path dir = scratch_dir("trainer", "lm_eval");
  c.checkpoint_dir = dir.string();
  c.log = (dir / "run.jsonl").string();
  std::ostringstream sink;
  const RunSummary s = mp::train::train(c, sink);
  EXPECT_EQ(s.metric_name, "perplexity");
  // 4 subjects x 4 verbs x 4 objects: a model that learned the structure is far below the vocabulary
  // size (~25 words) in perplexity; an unigram model would be near 15.
  EXPECT_LT(s.val_metric, 8.0);
  const mp::train::EvalResult r =
      mp::train::evaluate_checkpoint((dir / "checkpoint.safetensors").string(), "valid", nullptr, sink);
  EXPECT_NEAR(r.metric, s.val_metric, 1e-9 * s.val_metric);  // the same weights, state and windows
  const auto log = mp::train::read_run_log(c.log);
  int steps = 0, epochs = 0;
  for (const auto& rec : log) {
    const auto& t = std::get<std::string>(rec.at("type"));
    steps += t == "step";
    epochs += t == "epoch";
  }
  EXPECT_EQ(steps, s.steps);
  EXPECT_EQ(epochs, 3);
}

TEST(Trainer, EvaluateCheckpointMatchesFinalAccuracy) {
  TrainConfig c = image_config("bf16");
  c.epochs = 1;
  const fs::path dir = scratch_dir("trainer", "img_eval");
  c.checkpoint_dir = dir.string();
  std::ostringstream sink;
  const RunSummary s = mp::train::train(c, sink);
  const mp::train::EvalResult r =
      mp::train::evaluate_checkpoint((dir / "checkpoint.safetensors").string(), "test", nullptr, sink);
  EXPECT_EQ(r.examples, 128);
  EXPECT_DOUBLE_EQ(r.metric, s.val_metric);
}

TEST(Trainer, ConfigJsonRoundTrip) {
  TrainConfig c = text_config("fp16");
  c.opt_level = mp::amp::OptLevel::O3;
  c.loss_scale = mp::amp::LossScale::parse("128");
  c.seed = 1234567890123ull;
  const TrainConfig back = mp::train::config_from_json(mp::train::config_to_json(c));
  EXPECT_EQ(mp::train::config_to_json(back), mp::train::config_to_json(c));
  EXPECT_EQ(back.seed, c.seed);
  EXPECT_THROW(mp::train::config_from_json("{\"no_such_field\": 1}"), mp::Error);
  EXPECT_THROW(mp::train::config_from_json("{\"epochs\": \"three\"}"), mp::Error);
}

TEST(Trainer, ValidationNamesTheProblem) {
  auto message = [](const TrainConfig& c) { return mp::test::error_of([&] { mp::train::validate(c); }); };
  TrainConfig c = image_config("bf16");
  c.model = "resnet19";
  EXPECT_NE(message(c).find("resnet18"), std::string::npos) << message(c);  // lists the known models
  // Typed fields are parsed at the edge (flags, configs), naming the field and the valid values.
  const std::string fp8 = mp::test::error_of([] { mp::train::FieldText<mp::DType>::parse("fp8", "precision"); });
  EXPECT_NE(fp8.find("unknown --precision 'fp8': expected fp32, fp16 or bf16"), std::string::npos) << fp8;
  c = image_config("fp32");
  c.opt_level = mp::amp::OptLevel::O2;
  EXPECT_NE(message(c).find("O0 is fp32"), std::string::npos);
  c = image_config("bf16");
  c.resume = true;
  EXPECT_NE(message(c).find("--checkpoint_dir"), std::string::npos);
  c = text_config("fp32");
  c.model = "resnet20";
  EXPECT_NE(message(c).find("lstm, gru or rnn"), std::string::npos);
  c = image_config("fp32");
  c.dataset = "cifar10";
  c.data_dir.clear();
  EXPECT_NE(message(c).find("--data_dir"), std::string::npos);
  c = text_config("fp32");
  c.lstm_impl = "cudnn";  // the library LSTM of the other device
  EXPECT_NE(message(c).find("use --lstm_impl onednn"), std::string::npos) << message(c);
  c.lstm_impl = "persistent";
  EXPECT_NE(message(c).find("expected basic, fused, onednn"), std::string::npos) << message(c);
  c.lstm_impl = "basic";
  c.model = "gru";
  EXPECT_NE(message(c).find("applies to --model lstm"), std::string::npos) << message(c);
  c = image_config("bf16");
  c.stochastic_rounding = true;  // O2 (the default) keeps f32 masters
  EXPECT_NE(message(c).find("--stochastic_rounding needs 16-bit weights without f32 masters"), std::string::npos)
      << message(c);
  c.master_weights = false;  // ... unless told not to
  EXPECT_EQ(message(c), "(no error)");
  const std::string no =
      mp::test::error_of([] { mp::train::FieldText<std::optional<bool>>::parse("no", "master_weights"); });
  EXPECT_NE(no.find("--master_weights must be true or false, got 'no'"), std::string::npos) << no;
  c = image_config("bf16");
  c.opt_level = mp::amp::OptLevel::O1;
  c.keep_batchnorm_fp32 = true;
  EXPECT_NE(message(c).find("--keep_batchnorm_fp32 applies to O2 and O3"), std::string::npos) << message(c);
  c = image_config("fp32");
  c.master_weights = true;
  EXPECT_NE(message(c).find("O0 and O1 keep every weight in f32"), std::string::npos) << message(c);
  c = image_config("fp32");
  c.grad_accum = 0;
  EXPECT_NE(message(c).find("--grad_accum must be positive, got 0"), std::string::npos) << message(c);
  // More batches per step than an epoch has: refused when the run starts (384 images = 12 batches of 32).
  c.grad_accum = 13;
  std::ostringstream sink;
  const std::string m = mp::test::error_of([&] { mp::train::train(c, sink); });
  EXPECT_NE(m.find("fewer than one optimizer step of 13 batches of 32"), std::string::npos) << m;
}

// A run killed after its last checkpoint has logged steps that the resumed run does again: the resumed log
// lists each step and epoch once, in order, with the uninterrupted run's losses (Note [a resumed run's log]).
TEST(Trainer, ResumedLogDropsTheRecordsAfterTheCheckpoint) {
  TrainConfig c = image_config("fp32");  // 12 steps per epoch, 2 epochs
  const fs::path dir = scratch_dir("trainer", "resume_log");
  std::ostringstream sink;
  c.log = (dir / "full.jsonl").string();
  mp::train::train(c, sink);
  auto steps_and_epochs = [](const std::string& path) {
    std::vector<std::pair<std::string, double>> r;  // ("step", loss) and ("epoch", test accuracy), in file order
    for (const auto& rec : mp::train::read_run_log(path)) {
      const std::string type = std::get<std::string>(rec.at("type"));
      r.emplace_back(type + " " + std::to_string(std::get<int64_t>(rec.at(type == "step" ? "step" : "epoch"))),
                     std::get<double>(rec.at(type == "step" ? "loss" : "val_accuracy")));
    }
    return r;
  };
  const auto full = steps_and_epochs(c.log);
  ASSERT_EQ(full.size(), 24u + 2u);

  c.log = (dir / "resumed.jsonl").string();
  c.checkpoint_dir = (dir / "ckpt").string();
  const fs::path ckpt = dir / "ckpt" / "checkpoint.safetensors", kept = dir / "step10.safetensors";
  c.stop_after_steps = 10;
  mp::train::train(c, sink);  // steps 1-10, checkpoint at step 10
  fs::copy_file(ckpt, kept, fs::copy_options::overwrite_existing);
  c.resume = true;
  c.stop_after_steps = 5;
  mp::train::train(c, sink);  // steps 11-15 and the end of epoch 1 logged; then "killed": the last checkpoint
  fs::copy_file(kept, ckpt, fs::copy_options::overwrite_existing);  // the process died after step 10's
  ASSERT_EQ(steps_and_epochs(c.log).size(), 15u + 1u);
  c.stop_after_steps = 0;
  mp::train::train(c, sink);  // resumes at step 10: steps 11-24 and both epochs' ends again
  EXPECT_EQ(steps_and_epochs(c.log), full);
}

// request_stop() (the CLI's SIGINT/SIGTERM handler calls it) ends a run after its current step with a
// checkpoint, as stop_after_steps does; the request stands until cleared.
TEST(Trainer, RequestStopEndsTheRunAfterTheStepWithACheckpoint) {
  TrainConfig c = image_config("fp32");
  const fs::path dir = scratch_dir("trainer", "request_stop");
  c.checkpoint_dir = dir.string();
  std::ostringstream sink;
  struct Clear {
    ~Clear() { mp::train::clear_stop_request(); }
  } clear;
  mp::train::request_stop();
  const RunSummary s = mp::train::train(c, sink);
  EXPECT_TRUE(s.interrupted);
  EXPECT_TRUE(s.stopped_early);
  EXPECT_EQ(s.steps, 1);
  EXPECT_TRUE(s.epochs.empty());  // no evaluation
  const mp::train::SafetensorsFile f = mp::train::load_safetensors((dir / "checkpoint.safetensors").string());
  EXPECT_EQ(f.metadata.count("epoch_stats"), 1u);  // the position within epoch 1
  mp::train::clear_stop_request();
  c.resume = true;
  const RunSummary rest = mp::train::train(c, sink);
  EXPECT_FALSE(rest.interrupted);
  EXPECT_EQ(rest.steps, 2 * 12 - 1);
  EXPECT_EQ(rest.epochs.size(), 2u);
}

// A checkpoint stopped mid-epoch carries the epoch's statistics; damaged or inconsistent ones are refused
// on resume with the file and the key named.
TEST(Trainer, ResumedEpochStatisticsAreCheckedOnResume) {
  TrainConfig c = image_config("fp32");
  c.epochs = 1;
  c.max_steps_per_epoch = 4;
  c.stop_after_steps = 3;
  const fs::path dir = scratch_dir("trainer", "epoch_stats");
  c.checkpoint_dir = dir.string();
  std::ostringstream sink;
  mp::train::train(c, sink);
  const fs::path f = dir / "checkpoint.safetensors";
  const mp::train::SafetensorsFile good = mp::train::load_safetensors(f.string());
  ASSERT_EQ(good.metadata.count("epoch_stats"), 1u);
  const std::string stats = good.metadata.at("epoch_stats");
  EXPECT_NE(stats.find("\"steps\""), std::string::npos) << stats;
  c.stop_after_steps = 0;
  c.resume = true;
  auto refused_with = [&](const std::string& value, const std::string& fault) {
    std::map<std::string, std::string> md = good.metadata;
    md["epoch_stats"] = value;
    mp::train::save_safetensors(f.string(), good.tensors, md);
    try {
      mp::train::train(c, sink);
      ADD_FAILURE() << "accepted epoch_stats " << value;
    } catch (const mp::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(f.string()), std::string::npos) << m;
      EXPECT_NE(m.find("epoch_stats"), std::string::npos) << m;
      EXPECT_NE(m.find(fault), std::string::npos) << m;
    }
  };
  refused_with("{\"steps\": ", "not valid JSON");
  refused_with("[]", "expected the hex-float string 'epoch'");
  std::string wrong_batch = stats;
  const size_t at = wrong_batch.find("\"batch\":\"");
  ASSERT_NE(at, std::string::npos) << stats;
  wrong_batch.replace(at, std::string("\"batch\":\"").size(), "\"batch\":\"1");  // 0x1.8p+1 -> 10x1.8p+1
  refused_with(wrong_batch, "should be a number");
  std::string other_batch = stats;
  other_batch.replace(at, std::string("\"batch\":\"0x1.8p+1").size(), "\"batch\":\"0x1p+1");  // 3 -> 2
  refused_with(other_batch, "inconsistent");
  // The intact statistics resume; the epoch's record counts all 4 steps.
  mp::train::save_safetensors(f.string(), good.tensors, good.metadata);
  const RunSummary r = mp::train::train(c, sink);
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_EQ(r.step_losses.size(), 1u);
  EXPECT_TRUE(std::isfinite(r.epochs[0].train_loss));
}

TEST(Trainer, DamagedCheckpointIsRefusedOnResume) {
  TrainConfig c = image_config("fp32");
  c.epochs = 1;
  c.max_steps_per_epoch = 2;
  const fs::path dir = scratch_dir("trainer", "damaged");
  c.checkpoint_dir = dir.string();
  std::ostringstream sink;
  mp::train::train(c, sink);
  const fs::path f = dir / "checkpoint.safetensors";
  fs::resize_file(f, fs::file_size(f) / 2);
  c.resume = true;
  c.epochs = 2;
  try {
    mp::train::train(c, sink);
    FAIL() << "a truncated checkpoint was accepted";
  } catch (const mp::Error& e) { EXPECT_NE(std::string(e.what()).find(f.string()), std::string::npos) << e.what(); }
}

// `mpirun -np 2 mixprec train` (Note [data-parallel training] in src/train/data_parallel.cpp): two ranks at
// --batch_size B train the weights one process trains at 2B, only rank 0 writes, a stop on 2 ranks resumes on 1,
// and runs the ranks cannot share are refused. Real OpenMPI runs of the mixprec binary on Fashion-MNIST and a small
// text; skipped only in a build without MPI.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mp/train/safetensors.hpp"
#include "dist/mpi_cli.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using mp::test::scratch_dir;

namespace {

using mp::test::kHaveMpi;
using mp::test::kMixprec;
using mp::test::kMpiexec;

using Result = mp::test::ShellResult;
using mp::test::shell;

// One thread per process (two ranks share the two cores), kernel paths pinned as every test runs them; a run that
// hangs is ended by `timeout` (and fails the test) instead of hanging ctest.
const std::string kEnv = "OMP_NUM_THREADS=1 MP_KERNEL_PATHS=pinned timeout 120 ";

Result one_process(const std::string& args) { return shell(kEnv + kMixprec + " train " + args); }

Result ranks(int n, const std::string& args) {
  return shell(kEnv + kMpiexec + " --allow-run-as-root --oversubscribe -np " + std::to_string(n) + " " + kMixprec +
               " train " + args);
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The records of one type ("step", "epoch") of a run log.
std::vector<nlohmann::json> records_of(const fs::path& log, const std::string& type) {
  std::vector<nlohmann::json> out;
  std::ifstream is(log);
  for (std::string line; std::getline(is, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("type", "") == type) out.push_back(j);
  }
  return out;
}

// How far apart two checkpoints are: the largest ||a - b||_inf / ||b||_inf over the weights (the model's tensors and
// the optimizer's f32 masters) and over the other floating tensors (the optimizer's moments: sums of recent
// gradients), each with its tensor's name. Integer tensors (steps, trackers) and the loss scaler's state must be
// equal.
struct CheckpointDiff {
  double weights = 0, moments = 0;
  std::string worst_weight, worst_moment;
};

CheckpointDiff checkpoint_diff(const fs::path& a, const fs::path& b) {
  const mp::train::SafetensorsFile fa = mp::train::load_safetensors(a.string());
  const mp::train::SafetensorsFile fb = mp::train::load_safetensors(b.string());
  EXPECT_EQ(fa.tensors.size(), fb.tensors.size());
  CheckpointDiff d;
  for (const auto& [name, ta] : fa.tensors) {
    const mp::Tensor* tb = fb.tensors.find(name);
    if (tb == nullptr) {
      ADD_FAILURE() << name << " missing from " << b;
      continue;
    }
    EXPECT_EQ(ta.dtype(), tb->dtype()) << name;
    EXPECT_EQ(ta.sizes(), tb->sizes()) << name;
    if (!mp::is_floating(ta.dtype()) || name.rfind("scaler.", 0) == 0) {
      EXPECT_TRUE(mp::test::bitwise_equal(ta, *tb)) << name;
      continue;
    }
    const std::vector<double> x = ta.to_vector<double>(), y = tb->to_vector<double>();
    double diff = 0, scale = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      diff = std::max(diff, std::abs(x[i] - y[i]));
      scale = std::max(scale, std::abs(y[i]));
    }
    const double rel = scale > 0 ? diff / scale : diff;
    const bool weight = name.rfind("model.", 0) == 0 || name.find(".master") != std::string::npos;
    double& worst = weight ? d.weights : d.moments;
    if (!(rel <= worst)) {  // NaN counts as worst
      worst = rel;
      (weight ? d.worst_weight : d.worst_moment) = name;
    }
  }
  return d;
}

// checkpoint_diff of run `a`'s and run `b`'s checkpoint.safetensors within the tolerances (printed: the margins).
void expect_close(const fs::path& a, const fs::path& b, double weight_tol, double moment_tol, const std::string& what) {
  const CheckpointDiff d = checkpoint_diff(a / "checkpoint.safetensors", b / "checkpoint.safetensors");
  std::printf("%s: largest relative difference of the weights %.3g (%s), of the moments %.3g (%s)\n", what.c_str(),
              d.weights, d.worst_weight.c_str(), d.moments, d.worst_moment.c_str());
  EXPECT_LE(d.weights, weight_tol) << what << ": " << d.worst_weight;
  EXPECT_LE(d.moments, moment_tol) << what << ": " << d.worst_moment;
}

std::string fmnist(int64_t subset) {
  return "--dataset fashion-mnist --model mlp --train_subset " + std::to_string(subset) +
         " --eval_batch_size 1000 --num_workers 0 --quiet ";
}

struct Case {
  std::string name, flags;
  double weight_tol, moment_tol;  // checkpoint_diff's
  double accuracy_tol;            // of the test accuracy: predictions the weights' differences flip
  bool skips;                     // the run must skip steps (dynamic loss scaling finds overflows)
};

// Tolerances (checkpoint_diff: relative to a tensor's largest value). The ranks' average of two means over B equals
// the mean over 2B only up to rounding: the sums run in another order, and in O2 without accumulation each rank's
// 16-bit gradient is rounded before the average and again after it. f32: ~1e-7 per step, carried by 8 SGD steps ->
// 1e-5. 16-bit O2: a gradient rounded to bf16 (f16) differs by an ulp, 2^-8 (2^-11) of its value, and partial sums
// that cancel make that a larger share of the mean; the masters take lr x that, but an f32 master that moves by a hair
// can round its 16-bit copy the other way, so the next forward passes (in 16 bits) differ by an ulp of a weight and
// the gradients by more than their rounding. After 8 steps (measured, printed by the test): f32 2e-7; bf16 weights
// 9e-3 of their largest value, moments (sums of recent gradients) 0.10; f16 6e-3 and 0.03. The bounds leave ~2-3x.
// What they catch (checked by breaking the code when the test was written): gradients not averaged (each rank trains
// on its half) moved the weights by 0.3-0.96 of their largest value; gradients summed instead of averaged by 0.3-0.7
// (0.04 in the f16 case, where clipping to norm 1 absorbs most of the factor 2).
constexpr double kF32Tol = 1e-5;

class DataParallelTrainer : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelTrainer, TwoRanksAtBatchBTrainWhatOneProcessTrainsAtTwoB) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const Case& k = GetParam();
  const fs::path dir = scratch_dir("dp", k.name);
  const std::string common = fmnist(2048) + "--epochs 2 --max_steps_per_epoch 4 --seed 11 " + k.flags;
  const Result one = one_process(common + " --batch_size 64 --checkpoint_dir " + (dir / "one").string() + " --log " +
                                 (dir / "one.jsonl").string());
  ASSERT_EQ(one.code, 0) << one.output;
  const Result two = ranks(2, common + " --batch_size 32 --checkpoint_dir " + (dir / "two").string() + " --log " +
                                  (dir / "two.jsonl").string());
  ASSERT_EQ(two.code, 0) << two.output;

  // Rank 0 alone wrote: one summary, one checkpoint (no other file), one log of the run's steps.
  EXPECT_EQ(count(two.output, "summary: finished"), 1) << two.output;
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir / "two")) files.push_back(e.path().filename().string());
  EXPECT_EQ(files, std::vector<std::string>{"checkpoint.safetensors"});
  const std::vector<nlohmann::json> s1 = records_of(dir / "one.jsonl", "step"),
                                    s2 = records_of(dir / "two.jsonl", "step");
  ASSERT_EQ(s1.size(), 8u);
  ASSERT_EQ(s2.size(), s1.size());
  int skipped = 0;
  for (size_t i = 0; i < s1.size(); ++i) {
    EXPECT_NEAR(s2[i]["loss"].get<double>(), s1[i]["loss"].get<double>(), 1e-3) << "step " << i + 1;
    EXPECT_EQ(s2[i]["scale"], s1[i]["scale"]) << "step " << i + 1;
    EXPECT_EQ(s2[i]["skipped"], s1[i]["skipped"]) << "step " << i + 1;
    EXPECT_EQ(s2[i]["lr"], s1[i]["lr"]) << "step " << i + 1;
    skipped += s1[i]["skipped"].get<bool>() ? 1 : 0;
  }
  EXPECT_EQ(skipped > 0, k.skips) << skipped << " steps skipped";
  // The evaluation, sharded over the ranks and reduced, is the whole test set's: the same accuracy but for the few of
  // its 10000 images whose prediction the weights' differences flip (f32: 2 at most; 16-bit: up to 50).
  const std::vector<nlohmann::json> e1 = records_of(dir / "one.jsonl", "epoch"),
                                    e2 = records_of(dir / "two.jsonl", "epoch");
  ASSERT_EQ(e1.size(), 2u);
  ASSERT_EQ(e2.size(), e1.size());
  for (size_t i = 0; i < e1.size(); ++i) {
    EXPECT_NEAR(e2[i]["val_accuracy"].get<double>(), e1[i]["val_accuracy"].get<double>(), k.accuracy_tol)
        << "epoch " << i + 1;
    EXPECT_NEAR(e2[i]["val_loss"].get<double>(), e1[i]["val_loss"].get<double>(), 1e-2) << "epoch " << i + 1;
  }

  expect_close(dir / "two", dir / "one", k.weight_tol, k.moment_tol, k.name);
  // The same weights evaluated by one process give what the ranks reported (to the digits `eval` prints).
  const Result ev = shell(kEnv + kMixprec + " eval " + (dir / "two" / "checkpoint.safetensors").string() +
                          " --eval_batch_size 1000 --num_workers 0");
  ASSERT_EQ(ev.code, 0) << ev.output;
  double loss = 0, accuracy = 0;
  const size_t at = ev.output.find("images, loss ");
  ASSERT_NE(at, std::string::npos) << ev.output;
  ASSERT_EQ(std::sscanf(ev.output.c_str() + at, "images, loss %lf, accuracy %lf%%", &loss, &accuracy), 2) << ev.output;
  EXPECT_NEAR(loss, e2.back()["val_loss"].get<double>(), 5e-5 + 1e-9) << ev.output;
  EXPECT_NEAR(accuracy, 100 * e2.back()["val_accuracy"].get<double>(), 5e-3 + 1e-9) << ev.output;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Precisions, DataParallelTrainer,
    ::testing::Values(Case{"fp32", "--precision fp32", kF32Tol, kF32Tol, 2e-4, false},
                      Case{"bf16_O2", "--precision bf16 --opt_level O2", 2e-2, 0.25, 5e-3, false},
                      // dynamic scaling from 2^22, far above what these gradients take in f16: the first step overflows
                      // (on the ranks, one rank's overflow is enough) and is skipped everywhere; the scale then drops
                      // 64x, far enough below the overflow that a rank's half batch does not overflow either
                      Case{"fp16_O2_dynamic_accum_clip",
                           "--precision fp16 --opt_level O2 --init_scale 4194304 --backoff_factor 0.015625 "
                           "--grad_accum 2 --clip_grad_norm 1",
                           1.5e-2, 0.1, 5e-3, true}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// Bucketed all-reduce during backward (Note [bucketed gradient all-reduce] in src/train/grad_buckets.cpp) trains the
// weights one all-reduce after backward trains, bit for bit: with two ranks each gradient element is one f32 addition
// whichever message carries it, and the division and rounding are the same. Buckets of 25 MiB (one bucket), 0.5 MiB
// (four: mlp's two large weights, 1.0 and 1.5 MiB of f32, are buckets alone) and 1e-6 MiB (one per parameter); with
// --grad_accum 2 each step sends each bucket once, counted in the run log.
class BucketedGradients : public ::testing::TestWithParam<Case> {};

TEST_P(BucketedGradients, TrainTheWeightsOfOneAllReduceAfterBackward) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const Case& k = GetParam();
  const fs::path dir = scratch_dir("dp-buckets", k.name);
  const std::string common =
      fmnist(2048) + "--epochs 1 --max_steps_per_epoch 4 --seed 13 --batch_size 32 --grad_accum 2 " + k.flags;
  const std::vector<std::pair<std::string, int64_t>> sizes{{"0", 1}, {"25", 1}, {"0.5", 4}, {"1e-6", 6}};
  for (const auto& [mb, per_step] : sizes) {
    const fs::path run = dir / ("mb" + mb);
    const Result r = ranks(2, common + " --bucket_mb " + mb + " --checkpoint_dir " + run.string() + " --log " +
                                  (dir / ("mb" + mb + ".jsonl")).string());
    ASSERT_EQ(r.code, 0) << "--bucket_mb " << mb << ": " << r.output;
    const std::vector<nlohmann::json> steps = records_of(dir / ("mb" + mb + ".jsonl"), "step");
    ASSERT_EQ(steps.size(), 4u) << mb;
    for (const nlohmann::json& st : steps) {
      EXPECT_EQ(st["grad_all_reduces"].get<int64_t>(), per_step) << "--bucket_mb " << mb << ": " << st.dump();
      EXPECT_GE(st["comm_wait"].get<double>(), 0.0) << st.dump();
    }
    if (mb == "0") continue;
    expect_close(run, dir / "mb0", 0.0, 0.0, k.name + ", --bucket_mb " + mb + " against 0");
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Precisions, BucketedGradients,
                         ::testing::Values(Case{"fp32", "--precision fp32", 0, 0, 0, false},
                                           Case{"bf16_O2_clip", "--precision bf16 --opt_level O2 --clip_grad_norm 1", 0,
                                                0, 0, false},
                                           Case{"fp16_O2_dynamic", "--precision fp16 --opt_level O2", 0, 0, 0, false}),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// --grad_comm_dtype bf16 / fp16 (Note [16-bit gradient communication] in src/train/data_parallel.cpp): two ranks
// train close to what they train with f32 communication, the bucketed and the one-shot path agree bit for bit (the same
// roundings in the same order: Note [bucketed gradient all-reduce] 4), and each step's messages carry half the bytes.
// Tolerances (checkpoint_diff, relative to a tensor's largest value), from the roundings: with two ranks each averaged
// gradient element is within 2u of (|g_0| + |g_1|) / 2 of the f32 average (u = 2^-8 bf16, 2^-11 fp16: each pre-divided
// value and the sum rounded once), so each SGD update differs by at most 2u of the ranks' gradient magnitudes, and the
// weights by at most 2u of how far they moved (less than their largest value here), doubled for the gradients of later
// steps, computed at weights that already differ: weights 4u (bf16 1.6e-2, fp16 2e-3; measured 2.6e-3 and 1.4e-4). The
// moments (momentum: sums of recent gradients) are compared with their own largest value, while the bound is relative
// to (|g_0| + |g_1|) / 2, which is larger where the ranks' gradients cancel: measured 2.7 x 4u in bf16 (0.042), so
// 32u (bf16 0.125, fp16 0.016; fp16 measured 3.1e-4). fp16 O2's f16 gradients halve exactly and two of them add exactly
// in f32, so there the f16 sum rounds once, as the f32 path's final rounding does: measured equal. What they catch: a
// wire that sums instead of averaging moved the weights of these runs by ~0.3 (the bucketed test's figures above).
struct WireCase {
  std::string name, flags, wire;
  double weight_tol, moment_tol;
};

class GradCommDtype : public ::testing::TestWithParam<WireCase> {};

TEST_P(GradCommDtype, TwoRanksTrainCloseToF32CommunicationWithHalfTheBytes) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const WireCase& k = GetParam();
  const fs::path dir = scratch_dir("dp-wire", k.name);
  const std::string common =
      fmnist(2048) + "--epochs 1 --max_steps_per_epoch 6 --seed 17 --batch_size 32 " + k.flags + " ";
  auto run = [&](const std::string& name, const std::string& flags) {
    const Result r = ranks(2, common + flags + " --checkpoint_dir " + (dir / name).string() + " --log " +
                                  (dir / (name + ".jsonl")).string());
    EXPECT_EQ(r.code, 0) << name << ": " << r.output;
    return records_of(dir / (name + ".jsonl"), "step");
  };
  const std::vector<nlohmann::json> f32 = run("f32", "--bucket_mb 25");
  const std::vector<nlohmann::json> bucketed = run("bucketed", "--bucket_mb 25 --grad_comm_dtype " + k.wire);
  const std::vector<nlohmann::json> oneshot = run("oneshot", "--bucket_mb 0 --grad_comm_dtype " + k.wire);
  ASSERT_EQ(f32.size(), 6u);
  ASSERT_EQ(bucketed.size(), f32.size());
  ASSERT_EQ(oneshot.size(), f32.size());
  const int64_t wide = f32[0]["grad_bytes"].get<int64_t>();
  // mlp: 784x512 + 512 + 512x512 + 512 + 512x10 + 10 parameters, 4 bytes each in f32
  EXPECT_EQ(wide, 4 * (784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10));
  for (size_t i = 0; i < f32.size(); ++i) {
    EXPECT_EQ(f32[i]["grad_bytes"].get<int64_t>(), wide) << "step " << i + 1;
    EXPECT_EQ(bucketed[i]["grad_bytes"].get<int64_t>() * 2, wide) << "step " << i + 1;
    EXPECT_EQ(oneshot[i]["grad_bytes"].get<int64_t>() * 2, wide) << "step " << i + 1;
    EXPECT_EQ(bucketed[i]["skipped"], f32[i]["skipped"]) << "step " << i + 1;
    EXPECT_EQ(bucketed[i]["scale"], f32[i]["scale"]) << "step " << i + 1;
  }
  expect_close(dir / "oneshot", dir / "bucketed", 0.0, 0.0, k.name + ": one all-reduce against buckets");
  expect_close(dir / "bucketed", dir / "f32", k.weight_tol, k.moment_tol,
               k.name + ": " + k.wire + " against f32 communication");
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Wires, GradCommDtype,
    ::testing::Values(WireCase{"fp32_bf16", "--precision fp32", "bf16", 4 * 0x1p-8, 32 * 0x1p-8},
                      WireCase{"fp32_fp16", "--precision fp32", "fp16", 4 * 0x1p-11, 32 * 0x1p-11},
                      // the use fp16 communication is for: fp16 O2 gradients, loss-scaled, sent before unscaling
                      WireCase{"fp16_O2_fp16", "--precision fp16 --opt_level O2", "fp16", 4 * 0x1p-11, 32 * 0x1p-11}),
    [](const ::testing::TestParamInfo<WireCase>& i) { return i.param.name; });

// One process communicates nothing: --grad_comm_dtype changes no number and logs no gradient bytes. With
// --shard_optimizer (an f32 reduce-scatter) it is refused, saying what to do.
TEST(GradCommDtypeOneProcess, ChangesNothingAndIsRefusedWithShardOptimizer) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp-wire", "one");
  const std::string common = fmnist(512) + "--epochs 1 --max_steps_per_epoch 3 --seed 3 --batch_size 32 ";
  const Result plain = one_process(common + "--checkpoint_dir " + (dir / "plain").string());
  ASSERT_EQ(plain.code, 0) << plain.output;
  const Result wire = one_process(common + "--grad_comm_dtype fp16 --checkpoint_dir " + (dir / "wire").string() +
                                  " --log " + (dir / "wire.jsonl").string());
  ASSERT_EQ(wire.code, 0) << wire.output;
  expect_close(dir / "wire", dir / "plain", 0.0, 0.0, "one process, --grad_comm_dtype fp16 against none");
  for (const nlohmann::json& st : records_of(dir / "wire.jsonl", "step")) EXPECT_FALSE(st.contains("grad_bytes"));
  const Result sharded = one_process(common + "--grad_comm_dtype bf16 --shard_optimizer");
  EXPECT_NE(sharded.code, 0) << sharded.output;
  EXPECT_NE(sharded.output.find("--grad_comm_dtype bf16 applies to the gradient all-reduce, but --shard_optimizer "
                                "reduce-scatters the gradients in f32"),
            std::string::npos)
      << sharded.output;
  const Result bad = one_process(common + "--grad_comm_dtype f8");
  EXPECT_NE(bad.code, 0) << bad.output;
  EXPECT_NE(bad.output.find("unknown --grad_comm_dtype 'f8': expected fp32, fp16 or bf16"), std::string::npos)
      << bad.output;
  fs::remove_all(dir);
}

// --sync_batchnorm (Note [synchronised batch norm] in src/nn/batch_norm.cpp): ResNet-8 (batch norm after every
// convolution) on two ranks at batch 16 trains the weights and running statistics one process trains at 32, both with
// the flag (one process takes the same f64 composite, summing over itself: Note 5); without it each rank normalises
// with its own 16 examples, another function. One step: the two runs compute the same function up to rounding (the
// statistics' f64 sums split in two, convolutions at batch 16 against 32), measured 3.2e-6 of a weight tensor and
// 7.0e-5 of a momentum (conv1's) on AMD Zen 3; the bounds, 1e-4 and 1e-3, leave 14-30x. Not three steps: the
// batch-norm biases' gradients are sums of dy that nearly cancel (the next layer normalises again), so rounding is a
// large share of their small values and grows chaotically over the steps and with the CPU's convolution kernels
// (after 3 steps 4.9e-2 of a momentum on Zen 4, 0.22 on Zen 3: tests/models/test_models_batch_norm_accuracy.cpp).
// What it catches: the statistics per rank (the flag ignored) moved a running mean by 1.5 of its tensor and a
// momentum by 0.53 after the one step (the run without the flag, asserted > 10x the bounds).
TEST(SyncBatchNorm, TwoRanksTrainTheResnet8OfOneProcessAtTheGlobalBatch) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp-syncbn", "resnet8");
  // stopped after 1 step: the checkpoint is written, no evaluation runs (10000 test images on one thread)
  const std::string common =
      "--dataset fashion-mnist --model resnet8 --train_subset 1024 --num_workers 0 --quiet --epochs 1 "
      "--stop_after_steps 1 --seed 7 --precision fp32 ";
  const Result one =
      one_process(common + "--batch_size 32 --sync_batchnorm --checkpoint_dir " + (dir / "one").string());
  ASSERT_EQ(one.code, 0) << one.output;
  const Result synced =
      ranks(2, common + "--batch_size 16 --sync_batchnorm --checkpoint_dir " + (dir / "synced").string());
  ASSERT_EQ(synced.code, 0) << synced.output;
  const Result local = ranks(2, common + "--batch_size 16 --checkpoint_dir " + (dir / "local").string());
  ASSERT_EQ(local.code, 0) << local.output;
  const Result plain = one_process(common + "--batch_size 32 --checkpoint_dir " + (dir / "plain").string());
  ASSERT_EQ(plain.code, 0) << plain.output;
  constexpr double kWeightTol = 1e-4, kMomentTol = 1e-3;
  expect_close(dir / "synced", dir / "one", kWeightTol, kMomentTol,
               "resnet8, 2 ranks against 1, both --sync_batchnorm");
  const CheckpointDiff d =
      checkpoint_diff(dir / "local" / "checkpoint.safetensors", dir / "plain" / "checkpoint.safetensors");
  std::printf("resnet8, 2 ranks against 1, neither --sync_batchnorm: weights %.3g (%s), moments %.3g (%s)\n", d.weights,
              d.worst_weight.c_str(), d.moments, d.worst_moment.c_str());
  EXPECT_GT(d.weights, 10 * kWeightTol) << "per-rank batch statistics should train another function";
  EXPECT_GT(d.moments, 10 * kMomentTol) << "per-rank batch statistics should train another function";
  fs::remove_all(dir);
}

TEST(BucketedGradientsRefusals, ANegativeBucketSizeIsRefusedWithTheRange) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const Result r = one_process(fmnist(256) + "--epochs 1 --max_steps_per_epoch 1 --bucket_mb -1");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--bucket_mb must be a size in MiB in [0, 8192] (0 = one all-reduce after backward), got -1"),
            std::string::npos)
      << r.output;
}

// A run stopped on two ranks continues on one process at the same global batch as if it had never stopped: the
// data order and the state are the run's, not the ranks'.
TEST(DataParallelTrainerResume, StopOnTwoRanksResumeOnOne) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp", "resume");
  const std::string common = fmnist(2048) + "--epochs 2 --max_steps_per_epoch 4 --seed 5 --precision fp32 ";
  const Result whole = one_process(common + "--batch_size 64 --checkpoint_dir " + (dir / "whole").string());
  ASSERT_EQ(whole.code, 0) << whole.output;
  const std::string split = "--checkpoint_dir " + (dir / "split").string();
  const Result first = ranks(2, common + "--batch_size 32 --stop_after_steps 3 " + split);
  ASSERT_EQ(first.code, 0) << first.output;
  const Result rest = one_process(common + "--batch_size 64 --resume " + split);
  ASSERT_EQ(rest.code, 0) << rest.output;
  // the same global batch (2 x 32 = 1 x 64): nothing to warn about
  EXPECT_EQ(rest.output.find("settings that differ"), std::string::npos) << rest.output;
  expect_close(dir / "split", dir / "whole", kF32Tol, kF32Tol, "stopped on 2 ranks, resumed on 1");
  fs::remove_all(dir);
}

// The word LM: the text's 2B streams split between the ranks; the hidden state of all of them is checkpointed, so a
// stop on two ranks resumes on one. Dropout off: its masks are drawn per rank (Note [data-parallel training] 5).
TEST(DataParallelTrainerLm, TwoRanksTrainTheWordLmOfOneProcessAndResumeOnOne) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp", "lm");
  {
    std::ofstream os(dir / "text.txt");
    // pseudo-random sentences: no two streams of the text may repeat each other (then averaging would change nothing)
    const char* w[] = {"and", "the", "lord", "said", "unto", "moses", "go", "forth", "in", "land", "of", "egypt"};
    uint32_t x = 12345;
    for (int i = 0; i < 400; ++i) {
      for (int j = 0; j < 3; ++j) {
        x = x * 1664525u + 1013904223u;  // an LCG (Numerical Recipes)
        os << w[(x >> 16) % 12] << " ";
      }
      os << ".\n";
    }
  }
  const std::string common = "--dataset text --data_dir " + (dir / "text.txt").string() +
                             " --model lstm --bptt 10 --embed_size 16 --hidden_size 16 --dropout 0 --epochs 2 "
                             "--max_steps_per_epoch 5 --seed 2 --quiet --precision fp32 ";
  const Result one = one_process(common + "--batch_size 4 --checkpoint_dir " + (dir / "one").string());
  ASSERT_EQ(one.code, 0) << one.output;
  const Result two = ranks(2, common + "--batch_size 2 --checkpoint_dir " + (dir / "two").string());
  ASSERT_EQ(two.code, 0) << two.output;
  expect_close(dir / "two", dir / "one", kF32Tol, kF32Tol, "word LM on 2 ranks");  // clipped by the global norm
  // the same with the optimizer state sharded (Note [sharded optimizer state]): the LSTM's fused weights, clipping
  const Result sharded =
      ranks(2, common + "--batch_size 2 --shard_optimizer --checkpoint_dir " + (dir / "sharded").string());
  ASSERT_EQ(sharded.code, 0) << sharded.output;
  expect_close(dir / "sharded", dir / "one", kF32Tol, kF32Tol, "word LM on 2 sharded ranks");
  // stopped mid-epoch on two ranks (the hidden state of all 4 streams saved), finished on one
  const std::string split = "--checkpoint_dir " + (dir / "split").string();
  const Result first = ranks(2, common + "--batch_size 2 --stop_after_steps 7 " + split);
  ASSERT_EQ(first.code, 0) << first.output;
  const Result rest = one_process(common + "--batch_size 4 --resume " + split);
  ASSERT_EQ(rest.code, 0) << rest.output;
  expect_close(dir / "split", dir / "one", kF32Tol, kF32Tol, "word LM stopped on 2 ranks, resumed on 1");
  fs::remove_all(dir);
}

// The GPT on BPE tokens (Note [GPT training data]): the random windows of two ranks at batch 2 are those of one
// process at batch 4, so the weights agree; stopped on two ranks, finished on one.
TEST(DataParallelTrainerGpt, TwoRanksTrainTheGptOfOneProcessAndResumeOnOne) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp", "gpt");
  {
    std::ofstream os(dir / "text.txt");
    const char* w[] = {"And", "the", "LORD", "said", "unto", "Moses,", "go", "forth", "in", "land", "of", "Egypt."};
    uint32_t x = 54321;
    for (int i = 0; i < 300; ++i) {
      for (int j = 0; j < 5; ++j) {
        x = x * 1664525u + 1013904223u;
        os << w[(x >> 16) % 12] << (j < 4 ? " " : "\n");
      }
    }
  }
  const std::string common = "--dataset text --data_dir " + (dir / "text.txt").string() +
                             " --model gpt-nano --context 8 --max_vocab 300 --dropout 0.2 --epochs 2 "
                             "--max_steps_per_epoch 4 --seed 3 --quiet --precision fp32 --optimizer sgd --lr 0.5 ";
  // Dropout on: its masks are keyed by the global batch (Note [draws keyed by the global batch]), so 2 ranks at 2 draw
  // the masks one process at 4 draws, and a stop on 2 ranks resumes on 1 with the same stream.
  // SGD, not the gpt default AdamW: the key projection's bias has a gradient of exactly zero in exact arithmetic
  // (softmax ignores a constant per query), so what it gets is rounding noise, which Adam's normalised step turns
  // into lr-sized moves of either sign: one all-reduce's other summation order then moves that bias 3e-4 apart.
  const Result one = one_process(common + "--batch_size 4 --checkpoint_dir " + (dir / "one").string());
  ASSERT_EQ(one.code, 0) << one.output;
  const Result two = ranks(2, common + "--batch_size 2 --checkpoint_dir " + (dir / "two").string());
  ASSERT_EQ(two.code, 0) << two.output;
  expect_close(dir / "two", dir / "one", kF32Tol, kF32Tol, "gpt on 2 ranks");
  const std::string split = "--checkpoint_dir " + (dir / "split").string();
  const Result first = ranks(2, common + "--batch_size 2 --stop_after_steps 5 " + split);
  ASSERT_EQ(first.code, 0) << first.output;
  const Result rest = one_process(common + "--batch_size 4 --resume " + split);
  ASSERT_EQ(rest.code, 0) << rest.output;
  expect_close(dir / "split", dir / "one", kF32Tol, kF32Tol, "gpt stopped on 2 ranks, resumed on 1");
  fs::remove_all(dir);
}

// --shard_optimizer (Note [sharded optimizer state] in src/train/optimizer_shards.cpp): N = 2 and 3 ranks, each keeping
// its part of the optimizer state, train what the same ranks train without it and what one process trains at the
// global batch of 48, for SGD with momentum and AdamW, in fp32, bf16 O2 and fp16 O2, with clipping by the global norm
// (to 0.05: every step clips, so a rank that clipped by its own part's norm would scale its gradients differently),
// gradient accumulation and weight averages. The tolerances are DataParallelTrainer's, for the same reason: the ranks'
// sums run in another order than one process's (and a reduce-scatter's than an all-reduce's on three ranks, a norm's
// sum of squares over the shards than over the parameters), which f32 carries as ~1e-7 per step and 16-bit weights
// can turn into an ulp of a weight. Rank 0 writes the same checkpoint file as one process (checkpoint_diff compares
// every tensor's name, dtype and shape, and integer state such as the optimizer's steps exactly). AdamW in f32 needs
// more than kF32Tol: it divides each element's gradient by its running RMS, so an element whose gradient is of the
// order of the rounding noise of another summation order (a first-layer weight of a pixel that is rarely lit) moves by
// a noise-driven part of lr per step instead of a noise-sized amount (the GPT test below switched to SGD for this);
// measured after 4 steps at lr 1e-4 against one process: 1.7e-5 (2 ranks) and 7.5e-5 (3 ranks) of the largest weight,
// bound 2e-4. Two ranks with and without sharding add each gradient element once, in f32, in either collective, and
// round and update alike: the same bits (measured 0 in every case), asserted exactly.
constexpr double kAdamF32Tol = 2e-4;

struct ShardCase {
  std::string name, flags;
  double weight_tol, moment_tol;
  bool skips;
};

class ShardedOptimizer : public ::testing::TestWithParam<ShardCase> {};

TEST_P(ShardedOptimizer, TrainsWhatTheRanksTrainWithoutItAndOneProcessAtTheGlobalBatch) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const ShardCase& k = GetParam();
  const fs::path dir = scratch_dir("dp-shard", k.name);
  const std::string common = fmnist(2048) + "--epochs 1 --max_steps_per_epoch 4 --seed 17 " + k.flags;
  auto run = [&](int n, bool shard) {
    const std::string name = std::to_string(n) + (shard ? "-sharded" : "");
    const std::string args = common + " --batch_size " + std::to_string(48 / n) + (shard ? " --shard_optimizer" : "") +
                             " --checkpoint_dir " + (dir / name).string() + " --log " +
                             (dir / (name + ".jsonl")).string();
    const Result r = n == 1 ? one_process(args) : ranks(n, args);
    EXPECT_EQ(r.code, 0) << name << ": " << r.output;
    return r.code == 0;
  };
  ASSERT_TRUE(run(1, false));
  const std::vector<nlohmann::json> s1 = records_of(dir / "1.jsonl", "step");
  ASSERT_EQ(s1.size(), 4u);
  int skipped = 0;
  for (const nlohmann::json& st : s1) skipped += st["skipped"].get<bool>() ? 1 : 0;
  EXPECT_EQ(skipped > 0, k.skips) << skipped << " steps skipped";
  for (const int n : {2, 3}) {
    ASSERT_TRUE(run(n, false));
    ASSERT_TRUE(run(n, true));
    const std::string sharded = std::to_string(n) + "-sharded";
    const std::vector<nlohmann::json> sn = records_of(dir / (sharded + ".jsonl"), "step");
    ASSERT_EQ(sn.size(), s1.size());
    for (size_t i = 0; i < s1.size(); ++i) {  // the same steps skipped (found-inf agreed), the same scale
      EXPECT_NEAR(sn[i]["loss"].get<double>(), s1[i]["loss"].get<double>(), 1e-3) << sharded << " step " << i + 1;
      EXPECT_EQ(sn[i]["scale"], s1[i]["scale"]) << sharded << " step " << i + 1;
      EXPECT_EQ(sn[i]["skipped"], s1[i]["skipped"]) << sharded << " step " << i + 1;
      EXPECT_EQ(sn[i]["grad_all_reduces"].get<int64_t>(), 1) << "one reduce-scatter per step: " << sn[i].dump();
    }
    expect_close(dir / sharded, dir / std::to_string(n), n == 2 ? 0.0 : k.weight_tol, n == 2 ? 0.0 : k.moment_tol,
                 k.name + ": " + std::to_string(n) + " ranks sharded against not");
    expect_close(dir / sharded, dir / "1", k.weight_tol, k.moment_tol,
                 k.name + ": " + std::to_string(n) + " ranks sharded against one process");
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ShardedOptimizer,
    ::testing::Values(
        ShardCase{"sgd_fp32_clip", "--precision fp32 --optimizer sgd --momentum 0.9 --clip_grad_norm 0.05", kF32Tol,
                  kF32Tol, false},
        ShardCase{"adamw_fp32_accum_ema", "--precision fp32 --optimizer adamw --lr 1e-4 --grad_accum 2 --ema_decay 0.5",
                  kAdamF32Tol, kAdamF32Tol, false},
        ShardCase{"sgd_bf16_O2_accum_clip",
                  "--precision bf16 --opt_level O2 --optimizer sgd --momentum 0.9 --grad_accum 2 --clip_grad_norm 0.05",
                  2e-2, 0.25, false},
        ShardCase{"adamw_bf16_O2_accum_clip_ema",
                  "--precision bf16 --opt_level O2 --optimizer adamw --lr 1e-4 --grad_accum 2 --clip_grad_norm 0.05 "
                  "--ema_decay 0.5",
                  2e-2, 0.25, false},
        // the first step overflows at 2^22 (on one rank is enough) and is skipped on every rank
        ShardCase{"adamw_fp16_O2_dynamic",
                  "--precision fp16 --opt_level O2 --optimizer adamw --lr 1e-4 --init_scale 4194304 "
                  "--backoff_factor 0.015625",
                  1.5e-2, 0.1, true}),
    [](const ::testing::TestParamInfo<ShardCase>& i) { return i.param.name; });

// A run stopped on two sharded ranks (rank 0 gathered the state into the checkpoint) continues on one process without
// sharding and on three sharded ranks as if it had never stopped; the weight averages continue too.
TEST(ShardedOptimizerResume, StopOnTwoShardedRanksResumeOnOneAndOnThree) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp-shard", "resume");
  const std::string common = fmnist(2048) +
                             "--epochs 2 --max_steps_per_epoch 4 --seed 5 --precision fp32 --optimizer adamw --lr 1e-4 "
                             "--clip_grad_norm 0.05 --ema_decay 0.5 ";
  const Result whole = one_process(common + "--batch_size 48 --checkpoint_dir " + (dir / "whole").string());
  ASSERT_EQ(whole.code, 0) << whole.output;
  for (const int n : {1, 3}) {
    const fs::path split = dir / ("split" + std::to_string(n));
    const Result first =
        ranks(2, common + "--batch_size 24 --shard_optimizer --stop_after_steps 3 --checkpoint_dir " + split.string());
    ASSERT_EQ(first.code, 0) << first.output;
    const std::string rest_args =
        common + "--batch_size " + std::to_string(48 / n) + " --resume --checkpoint_dir " + split.string();
    const Result rest = n == 1 ? one_process(rest_args) : ranks(n, rest_args + " --shard_optimizer");
    ASSERT_EQ(rest.code, 0) << rest.output;
    EXPECT_EQ(rest.output.find("settings that differ"), std::string::npos) << rest.output;
    expect_close(split, dir / "whole", kAdamF32Tol, kAdamF32Tol,
                 "stopped on 2 sharded ranks, resumed on " + std::to_string(n) + (n == 1 ? "" : " sharded"));
  }
  fs::remove_all(dir);
}

// One process owns every parameter: --shard_optimizer changes nothing it computes (bit for bit).
TEST(ShardedOptimizerOneProcess, TrainsExactlyWhatItTrainsWithoutTheFlag) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp-shard", "one");
  const std::string common = fmnist(1024) +
                             "--epochs 1 --max_steps_per_epoch 3 --seed 9 --precision bf16 --opt_level O2 --optimizer "
                             "adamw --lr 1e-3 --clip_grad_norm 0.05 --ema_decay 0.5 --batch_size 32 --checkpoint_dir ";
  const Result plain = one_process(common + (dir / "plain").string());
  ASSERT_EQ(plain.code, 0) << plain.output;
  const Result flag = one_process(common + (dir / "flag").string() + " --shard_optimizer");
  ASSERT_EQ(flag.code, 0) << flag.output;
  expect_close(dir / "flag", dir / "plain", 0.0, 0.0, "one process with --shard_optimizer against without");
  fs::remove_all(dir);
}

// --shard_optimizer spreads what --numerics_every records whole: the pair is refused, naming both and the fix.
TEST(ShardedOptimizerRefusals, NumericsRecordingAndAutoPrecisionAreRefusedWithTheFix) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const Result r = one_process(fmnist(256) + "--epochs 1 --max_steps_per_epoch 1 --shard_optimizer --numerics_every 2");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("--numerics_every 2 records them whole; pass --numerics_every 0 with --shard_optimizer"),
            std::string::npos)
      << r.output;
  const Result a = one_process(
      fmnist(256) + "--epochs 1 --max_steps_per_epoch 1 --shard_optimizer --precision fp16 --auto_precision");
  EXPECT_NE(a.code, 0) << a.output;
  EXPECT_NE(a.output.find("keeps each master on one rank only; train with one of the two"), std::string::npos)
      << a.output;
}

// --auto_precision on two ranks (Note [automatic precision]): the ranks add up their overflow signs, so they move the
// layers one process moves at the global batch (an amax over the global batch is the larger of the two halves'),
// whichever rank saw the sign; the move reaches rank 0's log and checkpoint, and the stop resumes on one process. The
// threshold, 3.0 (4.58e-5 x 65504), lies between the first layer's output amax at step 1 (2.56) and at step 2 (3.09)
// at this seed; no other layer comes near it (at most 1.5).
TEST(DataParallelTrainerAutoPrecision, TwoRanksMoveTheLayersOneProcessMoves) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp", "auto_precision");
  const std::string common = fmnist(2048) +
                             "--epochs 1 --max_steps_per_epoch 6 --seed 5 --precision fp16 --auto_precision "
                             "--auto_precision_every 1 --auto_precision_patience 1 --auto_precision_overflow 4.58e-5 ";
  const Result one = one_process(common + "--batch_size 64 --log " + (dir / "one.jsonl").string());
  ASSERT_EQ(one.code, 0) << one.output;
  const std::string split = "--checkpoint_dir " + (dir / "split").string();
  const Result two =
      ranks(2, common + "--batch_size 32 --stop_after_steps 4 --log " + (dir / "two.jsonl").string() + " " + split);
  ASSERT_EQ(two.code, 0) << two.output;
  auto moves = [](const fs::path& log) {
    std::vector<std::pair<std::string, int64_t>> m;
    for (const auto& r : records_of(log, "precision"))
      m.emplace_back(r.at("module").get<std::string>(), r.at("step").get<int64_t>());
    return m;
  };
  const auto expected = std::vector<std::pair<std::string, int64_t>>{{"layers.0", 2}};
  EXPECT_EQ(moves(dir / "one.jsonl"), expected) << one.output;
  EXPECT_EQ(moves(dir / "two.jsonl"), expected) << two.output;
  EXPECT_EQ(count(two.output, "auto precision: step 2: layers.0 (Linear) f16 -> f32"), 1) << two.output;
  std::map<std::string, std::string> md;
  for (const auto& t : mp::train::read_safetensors_header((dir / "split" / "checkpoint.safetensors").string(), &md))
    if (t.name == "model.layers.0.weight") { EXPECT_EQ(t.dtype, mp::DType::f32); }
  EXPECT_NE(md["auto_precision"].find("\"module\":\"layers.0\""), std::string::npos) << md["auto_precision"];
  const Result rest = one_process(common + "--batch_size 64 --resume " + split);
  ASSERT_EQ(rest.code, 0) << rest.output;
  EXPECT_NE(rest.output.find("auto precision: resumed with 1 layer moved to f32 (layers.0)"), std::string::npos)
      << rest.output;
  fs::remove_all(dir);
}

// Ranks started with different settings are refused at start, on every rank, naming the setting; so is a global
// batch the data cannot fill; a rank that fails alone (here: a data folder that only it lacks) ends the whole run
// instead of leaving the other waiting.
TEST(DataParallelTrainerRefusals, MismatchedConfigsAndBatchesThatDoNotFit) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const std::string args = fmnist(256) + "--epochs 1 --max_steps_per_epoch 1 --batch_size 32 ";
  const std::string head = kEnv + kMpiexec + " --allow-run-as-root --oversubscribe ";
  const Result mismatch = shell(head + "-np 1 " + kMixprec + " train " + args + "--lr 0.1 : -np 1 " + kMixprec +
                                " train " + args + "--lr 0.2");
  EXPECT_NE(mismatch.code, 0) << mismatch.output;
  EXPECT_NE(mismatch.output.find("every rank must run the same configuration"), std::string::npos) << mismatch.output;
  EXPECT_NE(mismatch.output.find("/config/lr: 0.1 on rank 0, 0.2 on rank 1"), std::string::npos) << mismatch.output;

  const Result too_big = ranks(2, fmnist(50) + "--epochs 1 --batch_size 32");
  EXPECT_NE(too_big.code, 0) << too_big.output;
  EXPECT_NE(too_big.output.find("fewer than one global batch of 2 ranks x 32"), std::string::npos) << too_big.output;

  const Result alone = shell(head + "-np 1 " + kMixprec + " train " + args + ": -np 1 " + kMixprec + " train " + args +
                             "--data_dir /nonexistent/fmnist");
  EXPECT_NE(alone.code, 0) << alone.output;
  EXPECT_NE(alone.code, 124) << "the run hung (timeout)\n" << alone.output;
  EXPECT_NE(alone.output.find("rank 1 of 2: error:"), std::string::npos) << alone.output;
}

}  // namespace

// The mixprec binary: mistakes exit non-zero with a message naming the problem; small real runs of
// train / eval / convert / compare / plot work end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>
#include <regex>

#include "mp/amp/diagnostics.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/train/run_log.hpp"
#include "mp/train/safetensors.hpp"
#include "cli/cli_util.hpp"
#include "test_util.hpp"
#include "train/trainer_fixtures.hpp"

namespace fs = std::filesystem;
using mp::test::scratch_dir;
using namespace mp::test::cli;

TEST(Cli, MistakesExitNonZeroWithAClearMessage) {
  expect_failure("train --model resnet19 --dataset fashion-mnist", "resnet18");
  expect_failure("train --precision fp8", "fp8");
  expect_failure("train --epochs three", "epochs");
  expect_failure("train --epochs -1", "--epochs must be positive");
  expect_failure("train --dataset cifar10", "--data_dir");
  expect_failure("train --dataset fashion-mnist --data_dir /nonexistent/fmnist", "dataset-fashion-mnist");
  expect_failure("train --no_such_flag 1", "no_such_flag");
  expect_failure("train --dataset text --model lstm", "--data_dir");
  expect_failure("eval /nonexistent/checkpoint.safetensors", "/nonexistent/checkpoint.safetensors");
  expect_failure("convert /nonexistent/a.safetensors /tmp/b.safetensors --dtype bf16", "/nonexistent/a.safetensors");
  expect_failure("convert a b --dtype int3", "int3");
  expect_failure("info /nonexistent/x.safetensors", "/nonexistent/x.safetensors");
  expect_failure("compare --runs fp32,fp12", "fp12");
  expect_failure("compare --runs bf16:O3+bn32+bn16", "sets one property twice (+bn16 after its opposite)");
  expect_failure("train --device gpu", "expected cpu, cuda or cuda:N");
  expect_failure("bench step --device tpu", "expected cpu, cuda or cuda:N");
  // No machine has 64 GPUs: refused either for lack of a device (naming why) or for the index.
  expect_failure("train --device cuda:63 --epochs 1", "cuda");
  expect_failure("bench step --device cuda:63", "cuda");
  expect_failure("", "");  // no subcommand: usage and a non-zero exit
}

// Note [exit statuses]: usage errors 2, input errors 1, numerical failures 3, each with its message.
TEST(Cli, ExitStatusesSayHowARunEnded) {
  const std::string lm = "train --dataset text --data_dir " + corpus().string() +
                         " --model lstm --embed_size 16 --hidden_size 16 --batch_size 4 --bptt 8 --epochs 1 --quiet";
  Result r = run("train --no-such-flag 3");
  EXPECT_EQ(r.code, 2) << r.output;
  r = run("train --epochs three");
  EXPECT_EQ(r.code, 2) << r.output;  // a value of the wrong form: CLI11's message
  r = run("train --precision fp8");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("fp8"), std::string::npos) << r.output;
  // A learning rate of 1e38 sends the weights, then the loss, to inf/NaN: a numerical failure, said as such (its
  // last-good file goes to $TMPDIR: Note [stopping on a numerical failure]).
  const fs::path tmp = scratch_dir("cli", "exit_statuses");
  r = run(lm + " --lr 1e38 --clip_grad_norm 0", "TMPDIR=" + tmp.string());
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("numerical failure"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("DIVERGED"), std::string::npos) << r.output;
  r = run(lm);
  EXPECT_EQ(r.code, 0) << r.output;
}

// Note [stopping on a numerical failure]: each way a run fails numerically exits 3 with a message that says what
// happened, names the first non-finite module (the overflow finder on the failing step) and the last-good
// checkpoint, written under its own name, which loads and holds finite tensors at the failing step's start.
TEST(Cli, NumericalFailuresNameTheModuleAndLeaveTheLastGoodState) {
  const std::string lm = "train --dataset text --data_dir " + corpus().string() +
                         " --model lstm --embed_size 16 --hidden_size 16 --batch_size 4 --bptt 8 --epochs 1 --quiet";
  const std::string images = "train --model resnet8 --dataset mnist --data_dir " +
                             trainer_fixtures::image_data().string() +
                             " --batch_size 32 --epochs 1 --eval_batch_size 64 --num_workers 0 --quiet";
  // "First non-finite: layer1.0.bn1 (BatchNorm2d), forward output": a module of the model, by name and type.
  const std::regex module_named(R"(First non-finite: [A-Za-z0-9_.]+ \([A-Za-z0-9]+\), (forward output|gradient))");
  // The last-good file: a training checkpoint at the failing step's start whose every tensor is finite.
  auto expect_last_good = [](const fs::path& file, int64_t failing_step) {
    ASSERT_TRUE(fs::exists(file)) << file;
    std::map<std::string, std::string> md;
    const mp::nn::StateDict model = mp::train::read_model_state(file.string(), &md);
    EXPECT_EQ(md["format"], mp::train::kCheckpointFormat);
    EXPECT_EQ(md["global_step"], std::to_string(failing_step - 1)) << file;
    EXPECT_GT(model.size(), 0u);
    const mp::train::SafetensorsFile all = mp::train::load_safetensors(file.string());
    for (const auto& [name, t] : all.tensors) EXPECT_FALSE(mp::amp::any_nonfinite({t})) << file << ": " << name;
  };

  {  // fp32, no loss scaling: the loss turns NaN (a batch norm's output first); checkpoint.safetensors is the
     // last periodic checkpoint, untouched, and the batch-norm running statistics are those before the failure
    const fs::path dir = scratch_dir("cli", "fail_fp32");
    const Result r = run(images + " --lr 1e20 --checkpoint_every 1 --checkpoint_dir " + dir.string());
    EXPECT_EQ(r.code, 3) << r.output;
    EXPECT_CONTAINS(r.output, "numerical failure: the loss became inf/NaN at step 2 with no loss scaling");
    EXPECT_CONTAINS(r.output, "lower --lr");
    EXPECT_TRUE(std::regex_search(r.output, module_named)) << r.output;
    EXPECT_CONTAINS(r.output, "Wrote the last good state");
    EXPECT_CONTAINS(r.output, (dir / "last-good.safetensors").string());
    expect_last_good(dir / "last-good.safetensors", 2);
    std::map<std::string, std::string> md;
    (void)mp::train::read_safetensors_header((dir / "checkpoint.safetensors").string(), &md);
    EXPECT_EQ(md["global_step"], "1");  // the periodic checkpoint of step 1, not one after the failure
  }
  {  // bf16 O2: the same check runs where no scaler looks; the gradients of a finite loss go first here
    const fs::path dir = scratch_dir("cli", "fail_bf16");
    const Result r = run(images + " --precision bf16 --lr 1e10 --checkpoint_dir " + dir.string());
    EXPECT_EQ(r.code, 3) << r.output;
    EXPECT_CONTAINS(r.output, "numerical failure: the ");
    EXPECT_CONTAINS(r.output, "became inf/NaN at step");
    EXPECT_TRUE(std::regex_search(r.output, module_named)) << r.output;
    std::smatch step;
    ASSERT_TRUE(std::regex_search(r.output, step, std::regex("inf/NaN at step ([0-9]+)"))) << r.output;
    expect_last_good(dir / "last-good.safetensors", std::stoll(step[1]));
    EXPECT_FALSE(fs::exists(dir / "checkpoint.safetensors"));  // no periodic checkpoint was due before it
  }
  {  // fp16, static scale: too many skipped steps in a row; no --checkpoint_dir: the file goes beside --log
    const fs::path dir = scratch_dir("cli", "fail_static");
    const Result r =
        run(lm + " --precision fp16 --loss_scale 1e30 --max_consecutive_skips 3 --log " + (dir / "run.jsonl").string());
    EXPECT_EQ(r.code, 3) << r.output;
    EXPECT_CONTAINS(r.output, "3 consecutive steps were skipped for inf/NaN gradients at the static loss scale");
    EXPECT_CONTAINS(r.output, "First non-finite: decoder (Linear), gradient of its output");
    EXPECT_CONTAINS(r.output, (dir / "run.last-good.safetensors").string());
    expect_last_good(dir / "run.last-good.safetensors", 3);
    EXPECT_EQ(run("eval " + (dir / "run.last-good.safetensors").string()).code, 0);
  }
  {  // fp16, dynamic scale stuck at its minimum; neither --checkpoint_dir nor --log: a temporary file, named
    const fs::path dir = scratch_dir("cli", "fail_dynamic");
    const Result r = run(lm + " --precision fp16 --init_scale 1e30 --min_scale 1e30 --max_scale 1e30 "
                              "--max_overflows_at_min_scale 2",
                         "TMPDIR=" + dir.string());
    EXPECT_EQ(r.code, 3) << r.output;
    EXPECT_CONTAINS(r.output, "the loss scale is stuck at its minimum");
    EXPECT_TRUE(std::regex_search(r.output, module_named)) << r.output;
    std::smatch file;
    ASSERT_TRUE(std::regex_search(r.output, file, std::regex("to (/[^ :]+last-good\\.safetensors)"))) << r.output;
    EXPECT_EQ(fs::path(file[1].str()).parent_path(), dir);
    expect_last_good(file[1].str(), 2);
  }
  {  // an update beyond f32's range makes the weights themselves non-finite: found before the next update,
     // said as such, and no last-good file (the finite weights are gone)
    const fs::path dir = scratch_dir("cli", "fail_weights");
    const Result r = run(lm + " --lr 1e39 --clip_grad_norm 0 --checkpoint_dir " + dir.string());
    EXPECT_EQ(r.code, 3) << r.output;
    EXPECT_CONTAINS(r.output, "The weights were already non-finite when step 2 began (first: 'encoder.weight')");
    EXPECT_CONTAINS(r.output, "First non-finite: encoder (Embedding), forward output");
    EXPECT_CONTAINS(r.output, "no last-good file was written");
    EXPECT_FALSE(fs::exists(dir / "last-good.safetensors"));
  }
}

// A warm-up as long as the run leaves the decay nothing: refused naming both flags and the fixes.
TEST(Cli, WarmupLongerThanTheRunIsRefused) {
  const std::string lm = "train --dataset text --data_dir " + corpus().string() +
                         " --model lstm --embed_size 16 --hidden_size 16 --batch_size 4 --bptt 8 --quiet";
  expect_failure(lm + " --warmup_epochs 1 --epochs 1", "--warmup_epochs 1 covers the whole run (--epochs 1)");
  expect_failure(lm + " --warmup_epochs 1 --epochs 1", "--schedule constant");
  const Result r = run(lm + " --warmup_epochs 1 --epochs 1 --schedule constant");
  EXPECT_EQ(r.code, 0) << r.output;
}

// Note [a run described in a file]: --print_config writes the settings, --config reads them back, and flags
// on the command line win over the file.
TEST(Cli, ARunDescribedInAFileWithFlagsOverIt) {
  const fs::path dir = scratch_dir("cli", "config");
  const std::string data = "--dataset text --data_dir " + corpus().string();
  Result r = run("train " + data + " --model lstm --print_config --epochs 3 --precision bf16 --no-augment");
  ASSERT_EQ(r.code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["epochs"], 3);
  EXPECT_EQ(j["precision"], "bf16");
  EXPECT_EQ(j["augment"], false);
  EXPECT_EQ(j["batch_size"], 128);  // a default, written out
  const fs::path file = dir / "run.json";
  std::ofstream(file) << r.output;

  r = run("train --config " + file.string() + " --print_config --batch_size 7 --augment");
  ASSERT_EQ(r.code, 0) << r.output;
  j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["epochs"], 3);          // from the file
  EXPECT_EQ(j["precision"], "bf16");  // from the file
  EXPECT_EQ(j["batch_size"], 7);      // the flag wins
  EXPECT_EQ(j["augment"], true);      // the flag wins

  // The file runs: a short word-LM job from a file alone.
  j["epochs"] = 1;
  j["embed_size"] = 16;
  j["hidden_size"] = 16;
  j["batch_size"] = 4;
  j["bptt"] = 8;
  j["quiet"] = true;
  std::ofstream(file) << j.dump();
  r = run("train --config " + file.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("bf16 O2 summary: finished"), std::string::npos) << r.output;

  // Mistakes name the file and the field.
  expect_failure("train --config " + (dir / "missing.json").string(), "cannot read");
  std::ofstream(dir / "typo.json") << R"({"epoch": 3})";
  expect_failure("train --config " + (dir / "typo.json").string(), "unknown field 'epoch'");
  std::ofstream(dir / "type.json") << R"({"epochs": "three"})";
  expect_failure("train --config " + (dir / "type.json").string(), "field 'epochs' expected an integer");
  std::ofstream(dir / "value.json") << R"({"precision": "fp8"})";
  expect_failure("train --config " + (dir / "value.json").string() + " --print_config", "fp8");
  std::ofstream(dir / "broken.json") << "{";
  expect_failure("train --config " + (dir / "broken.json").string(), "not valid JSON");
}

TEST(Cli, TrainEvalConvertCompareAndPlotAWordLm) {
  const fs::path dir = scratch_dir("cli", "lm");
  const std::string common = "--dataset text --data_dir " + corpus().string() +
                             " --model lstm --embed_size 16 --hidden_size 16 --batch_size 4 --bptt 8 --quiet";
  Result r = run("train " + common + " --epochs 1 --checkpoint_dir " + dir.string() + " --log " +
                 (dir / "run.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("valid perplexity"), std::string::npos) << r.output;
  const fs::path ckpt = dir / "checkpoint.safetensors";
  ASSERT_TRUE(fs::exists(ckpt));

  r = run("eval " + ckpt.string() + " --split valid");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("perplexity"), std::string::npos) << r.output;

  const fs::path half = dir / "bf16.safetensors";
  r = run("convert " + ckpt.string() + " " + half.string() + " --dtype bf16");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_LT(fs::file_size(half), fs::file_size(ckpt));
  r = run("info " + ckpt.string() + " " + half.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, ckpt.string() + ": mixprec training checkpoint");
  EXPECT_CONTAINS(r.output, "run: fp32, lstm on text, 1 epochs of batch 4");
  EXPECT_CONTAINS(r.output, "stands at: 1 of 1 epochs done");
  EXPECT_CONTAINS(r.output, "  optimizer ");
  EXPECT_CONTAINS(r.output, half.string() + ": ");
  EXPECT_CONTAINS(r.output, "BF16 x");

  const fs::path report = dir / "report";
  r = run("compare " + common + " --epochs 1 --ema_decay 0.5 --runs fp32,bf16:O1,bf16:O3+bn32+sr --report " +
          report.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "| EMA valid perplexity |");
  EXPECT_NE(r.output.find("| fp32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| bf16 O1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("| bf16 O3 BN-f32 SR"), std::string::npos) << r.output;
  const Result bad = run("compare " + common + " --epochs 1 --runs bf16:O3+rs");
  EXPECT_NE(bad.code, 0);
  EXPECT_CONTAINS(bad.output, "unknown suffix '+rs' in 'bf16:O3+rs'; expected +sr");
  EXPECT_TRUE(fs::exists(report / "compare.md"));
  EXPECT_TRUE(fs::exists(report / "compare.json"));
  EXPECT_TRUE(fs::exists(report / "fp32.jsonl"));

  if (std::system("gnuplot --version >/dev/null 2>&1") == 0) {
    EXPECT_TRUE(fs::exists(report / "loss.png"));
    r = run("plot " + (dir / "run.jsonl").string() + " --out " + (dir / "plots").string());
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(fs::exists(dir / "plots" / "loss.png"));
    // Two runs' logs with one file name are told apart by their folders, and steps that a resumed run of
    // an older mixprec logged twice are plotted once (the replay wins).
    for (const char* run_dir : {"run-a", "run-b"}) {
      fs::create_directories(dir / run_dir);
      std::ofstream(dir / run_dir / "log.jsonl") << "{\"type\":\"step\",\"step\":1,\"loss\":2.0,\"scale\":1}\n"
                                                 << "{\"type\":\"step\",\"step\":2,\"loss\":1.5,\"scale\":1}\n"
                                                 << "{\"type\":\"step\",\"step\":2,\"loss\":1.25,\"scale\":1}\n";
    }
    r = run("plot " + (dir / "run-a" / "log.jsonl").string() + " " + (dir / "run-b" / "log.jsonl").string() +
            " --out " + (dir / "plots2").string());
    ASSERT_EQ(r.code, 0) << r.output;
    std::stringstream gp, dat;
    gp << std::ifstream(dir / "plots2" / "loss.gp").rdbuf();
    dat << std::ifstream(dir / "plots2" / "loss.dat").rdbuf();
    EXPECT_CONTAINS(gp.str(), "title 'run-a'");
    EXPECT_CONTAINS(gp.str(), "title 'run-b'");
    EXPECT_EQ(dat.str().find("1.5"), std::string::npos) << dat.str();
    EXPECT_CONTAINS(dat.str(), "1.25");
  }
}

// Note [stopping a training run with a signal] in apps/mixprec/train_cmd.cpp: SIGTERM mid-run stops after the
// step, checkpoints there and exits 128 + 15; --resume then finishes the run, its log listing each step once.
TEST(Cli, SigtermStopsAfterTheStepWithACheckpointThatResumes) {
  const fs::path dir = scratch_dir("cli", "sigterm");
  const fs::path log = dir / "run.jsonl";
  const std::string train = std::string(MP_CLI_PATH) + " train --dataset text --data_dir " + corpus().string() +
                            " --model lstm --embed_size 16 --hidden_size 16 --batch_size 4 --bptt 8 --epochs 100" +
                            " --max_steps_per_epoch 20 --quiet --checkpoint_dir " + dir.string() + " --log " +
                            log.string();
  // Start it, wait (at most ~60 s) until it has logged 5 steps, then SIGTERM; the script prints the exit status.
  const fs::path script = dir / "stop.sh";
  std::ofstream(script) << train << " > " << (dir / "out.txt").string() << " 2>&1 &\n"
                        << "pid=$!; i=0\n"
                        << "while [ \"$(cat " << log.string()
                        << " 2>/dev/null | grep -c '\"type\":\"step\"')\" -lt 5 ] && "
                        << "[ $i -lt 3000 ]; do sleep 0.02; i=$((i + 1)); done\n"
                        << "kill -TERM $pid; wait $pid; echo rc=$?\n";
  const std::string shell_out = mp::test::shell("sh " + script.string()).output;
  std::stringstream out;
  out << std::ifstream(dir / "out.txt").rdbuf();
  EXPECT_CONTAINS(shell_out, "rc=143");
  EXPECT_CONTAINS(out.str(), "stopping after this step");
  EXPECT_CONTAINS(out.str(), "summary: stopped by");
  EXPECT_CONTAINS(out.str(), "--resume");
  ASSERT_TRUE(fs::exists(dir / "checkpoint.safetensors")) << out.str();

  const Result r = run(train.substr(std::string(MP_CLI_PATH).size() + 1) + " --resume");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "summary: finished");
  std::vector<int64_t> steps, epochs;
  for (const auto& rec : mp::train::read_run_log(log.string())) {
    const std::string type = std::get<std::string>(rec.at("type"));
    (type == "step" ? steps : epochs).push_back(std::get<int64_t>(rec.at(type == "step" ? "step" : "epoch")));
  }
  ASSERT_EQ(steps.size(), 2000u);  // 100 epochs of 20 steps: it cannot end before the signal comes
  for (size_t i = 0; i < steps.size(); ++i) ASSERT_EQ(steps[i], static_cast<int64_t>(i + 1));
  ASSERT_EQ(epochs.size(), 100u);
  for (size_t i = 0; i < epochs.size(); ++i) ASSERT_EQ(epochs[i], static_cast<int64_t>(i + 1));
}

TEST(Cli, BenchStepPrintsJsonAndRefusesBadFlags) {
  Result r =
      run("bench step --model mlp --image_size 8 --in_channels 1 --batch_size 8 --warmup 1 --steps 2 "
          "--precision bf16");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* key : {"\"median_ms\"", "\"throughput\"", "\"peak_bytes\"", "\"opt_level\":\"O2\""})
    EXPECT_CONTAINS(r.output, key);
  r =
      run("bench step --model lstm --vocab_size 50 --embed_size 8 --hidden_size 8 --bptt 4 --batch_size 2 "
          "--warmup 1 --steps 1");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(r.output, "\"tok/s\"");
  expect_failure("bench step --precision fp8", "fp8");
  expect_failure("bench step --model resnet19", "resnet18");
  expect_failure("bench step --steps 0", "steps");
  EXPECT_CONTAINS(r.output, "\"cpu_median_ms\"");  // process CPU time per step beside wall time
  expect_failure("bench step --model lstm --lstm_impl cudnn", "use --lstm_impl onednn");
  expect_failure("train --dataset kjv --model lstm --lstm_impl fast", "expected basic, fused, onednn");
}

TEST(Cli, BenchSuitesWriteReports) {
  const fs::path dir = scratch_dir("cli", "suites");
  auto text = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  // op-breakdown: a per-kernel table with matmul in it, fp32 and bf16 JSON with the op lists.
  Result r =
      run("bench op-breakdown --model mlp --batch_size 8 --warmup 0 --steps 1 --report " + (dir / "ob").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(text(dir / "ob" / "op-breakdown.md"), "| matmul");
  EXPECT_CONTAINS(text(dir / "ob" / "op-breakdown.md"), "whole step");
  EXPECT_CONTAINS(text(dir / "ob" / "op-breakdown.json"), "\"kernel_ms\"");
  // lstm-impl (quick: two sizes x two precisions x basic/fused).
  r = run("bench lstm-impl --quick --warmup 0 --steps 1 --report " + (dir / "li").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(text(dir / "li" / "lstm-impl.md"), "fused speed-up");
  // lstm-sweep on one tiny configuration: TFLOP/s columns filled.
  r =
      run("bench lstm-sweep --layers 1 --batches 4 --cells 16 --vocab_size 50 --warmup 0 --steps 1 --pytorch off "
          "--report " +
          (dir / "ls").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(text(dir / "ls" / "lstm-sweep.json"), "\"tflops\"");
  EXPECT_CONTAINS(text(dir / "ls" / "lstm-sweep.md"), "|      1 |     4 |    16 |");
  // resnets with a budget: the max-batch search runs real steps and records its trials.
  r =
      run("bench resnets --models resnet18 --batch_size 2 --warmup 0 --steps 1 --memory_budget_gib 0.15 "
          "--pytorch off --report " +
          (dir / "rn").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_CONTAINS(text(dir / "rn" / "resnets.json"), "\"max_batch_trials\"");
  EXPECT_CONTAINS(text(dir / "rn" / "resnets.md"), "| resnet18 |");
  // Mistakes.
  expect_failure("bench resnets --models vgg16 --pytorch off", "resnet");
  expect_failure("bench lstm-sweep --cells 0", "positive");
  expect_failure("bench resnets --pytorch maybe --models resnet18", "auto, on or off");
}

// The loss scaler's settings on the command line (issue 25, item 4): a flag per amp::GradScalerOptions field,
// named as the field; each reaches the scaler (seen in the run log's scale); bad values and conflicting
// combinations are refused naming the flags; a config file carries them; checkpoints written before the flags
// existed still resume.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_util.hpp"
#include "mp/train/run_log.hpp"
#include "mp/train/safetensors.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using mp::test::scratch_dir;
using namespace mp::test::cli;

namespace {

// The "scale" and "skipped" of each step record of a run log.
struct Steps {
  std::vector<double> scale;
  std::vector<bool> skipped;
};
Steps steps_of(const fs::path& log) {
  Steps s;
  for (const auto& rec : mp::train::read_run_log(log.string())) {
    if (std::get<std::string>(rec.at("type")) != "step") continue;
    s.scale.push_back(std::get<double>(rec.at("scale")));
    s.skipped.push_back(std::get<bool>(rec.at("skipped")));
  }
  return s;
}

// A 4-step fp16 run with `flags`; the steps it logged.
Steps run_steps(const std::string& name, const std::string& flags, int expect_code = 0) {
  const fs::path log = scratch_dir("cli_scaler", name) / "run.jsonl";
  const Result r = run(tiny_lm() + " --precision fp16 --max_steps_per_epoch 4 --log " + log.string() + " " + flags);
  EXPECT_EQ(r.code, expect_code) << flags << "\n" << r.output;
  return steps_of(log);
}

}  // namespace

// Each value out of range is refused (exit status 1) naming the flag, what was got and what to do.
TEST(CliLossScaler, BadValuesAreRefusedNamingTheFlag) {
  const std::string fp16 = tiny_lm() + " --precision fp16 ";
  struct Case {
    std::string flags;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases{
      {"--init_scale 0", {"--init_scale must be positive and finite, got 0", "the default is 65536"}},
      {"--init_scale -8", {"--init_scale must be positive and finite, got -8"}},
      {"--growth_factor 1", {"--growth_factor must be > 1 and finite, got 1", "--loss_scale N"}},
      {"--growth_factor 0.5", {"--growth_factor must be > 1"}},
      {"--backoff_factor 1", {"--backoff_factor must be in (0, 1), got 1", "halves the scale"}},
      {"--backoff_factor 2", {"--backoff_factor must be in (0, 1), got 2"}},
      {"--backoff_factor 0", {"--backoff_factor must be in (0, 1), got 0"}},
      {"--growth_interval 0", {"--growth_interval must be positive, got 0", "default 2000"}},
      {"--growth_interval -3", {"--growth_interval must be positive, got -3"}},
      {"--hysteresis 0", {"--hysteresis must be >= 1", "got 0"}},
      {"--min_scale 0", {"--min_scale and --max_scale: expected 0 < min_scale <= max_scale", "got 0 and"}},
      {"--min_scale -1", {"--min_scale and --max_scale", "got -1 and"}},
      {"--min_scale 4 --max_scale 2 --init_scale 3", {"0 < min_scale <= max_scale (finite), got 4 and 2"}},
      {"--max_scale 0", {"--min_scale and --max_scale", "and 0"}},
      {"--max_overflows_at_min_scale -1", {"--max_overflows_at_min_scale must be >= 0"}},
      // The scaler would clamp the starting scale silently: refused instead.
      {"--init_scale 1e9", {"--init_scale 1e+09 lies outside [--min_scale, --max_scale] = [1, 16777216]"}},
      {"--max_scale 1024", {"--init_scale 65536 (the default) lies outside", "give an --init_scale within"}},
      {"--init_scale 0.5", {"--init_scale 0.5 lies outside [--min_scale, --max_scale]", "or widen them"}},
  };
  for (const Case& c : cases) {
    const Result r = run(fp16 + c.flags);
    EXPECT_EQ(r.code, 1) << c.flags << "\n" << r.output;
    for (const std::string& s : c.says) EXPECT_CONTAINS(r.output, s) << c.flags;
  }
}

// The dynamic scale's settings where a static scale or no scaling runs, and the static scale's limit where a
// dynamic scale or none runs, are refused naming the flags and the fix. Moved from test_cli.cpp.
TEST(CliLossScaler, ConflictingCombinationsAreRefused) {
  const std::string lm = tiny_lm();
  Result r = run(lm + " --precision fp16 --init_scale 1024 --growth_interval 3 --hysteresis 2 --print_config");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["init_scale"], 1024.0);
  EXPECT_EQ(j["growth_interval"], 3);
  EXPECT_EQ(j["hysteresis"], 2);
  EXPECT_EQ(j["max_scale"], 16777216.0);  // amp::GradScalerOptions' default
  expect_failure(lm + " --precision fp16 --loss_scale 128 --init_scale 64",
                 "--init_scale set dynamic loss scaling, but this run has a static loss scale (--loss_scale 128); for "
                 "a scale that starts at 128 and adapts use --loss_scale dynamic --init_scale 128");
  expect_failure(lm + " --precision fp16 --loss_scale 128 --growth_interval 10 --backoff_factor 0.25",
                 "--backoff_factor, --growth_interval set dynamic loss scaling, but this run has a static loss scale");
  expect_failure(lm + " --precision fp16 --loss_scale none --min_scale 2", "no loss scaling");
  expect_failure(lm + " --precision bf16 --growth_interval 10", "add --loss_scale dynamic, or drop --growth_interval");
  expect_failure(lm + " --precision fp32 --hysteresis 2", "no loss scaling (--precision fp32");
  // The static scale's limit is refused where no static scale runs.
  expect_failure(lm + " --precision fp16 --max_consecutive_skips 5", "dynamic loss scaling, which stops by");
  expect_failure(lm + " --precision bf16 --max_consecutive_skips 5", "no loss scaling, which stops at the first");
  expect_failure(lm + " --precision fp16 --loss_scale 128 --max_consecutive_skips -1",
                 "--max_consecutive_skips must be >= 0");
  r = run(lm + " --precision fp16 --loss_scale 128 --max_consecutive_skips 5 --print_config");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["max_consecutive_skips"], 5);
  // bf16 with an explicit dynamic scale takes them.
  EXPECT_EQ(run(lm + " --precision bf16 --loss_scale dynamic --init_scale 256 --max_steps_per_epoch 2").code, 0);
}

// Each flag reaches the scaler: the step records' scale (after each step's update) follows the settings.
TEST(CliLossScaler, EachFlagReachesTheScaler) {
  // --init_scale and --growth_interval 1: the scale starts at 1024 and doubles after every finite step.
  Steps s = run_steps("grow", "--init_scale 1024 --growth_interval 1");
  EXPECT_EQ(s.scale, (std::vector<double>{2048, 4096, 8192, 16384}));
  EXPECT_EQ(s.skipped, (std::vector<bool>{false, false, false, false}));
  // --growth_factor, --growth_interval 2
  s = run_steps("factor", "--init_scale 1024 --growth_interval 2 --growth_factor 4");
  EXPECT_EQ(s.scale, (std::vector<double>{1024, 4096, 4096, 16384}));
  // --max_scale caps the growth
  s = run_steps("max", "--init_scale 1024 --growth_interval 1 --max_scale 4096");
  EXPECT_EQ(s.scale, (std::vector<double>{2048, 4096, 4096, 4096}));
  // Without the flags: PyTorch's defaults (65536, no growth within 2000 steps).
  s = run_steps("default", "");
  EXPECT_EQ(s.scale, (std::vector<double>{65536, 65536, 65536, 65536}));
  // A scale of 1e30 overflows f16 at every step: --backoff_factor 0.25 divides it by 4 per skipped step.
  s = run_steps("backoff", "--init_scale 1e30 --max_scale 1e30 --backoff_factor 0.25");
  EXPECT_EQ(s.scale, (std::vector<double>{2.5e29, 6.25e28, 1.5625e28, 3.90625e27}));
  EXPECT_EQ(s.skipped, (std::vector<bool>{true, true, true, true}));
  // --hysteresis 2: two overflows per backoff.
  s = run_steps("hysteresis", "--init_scale 1e30 --max_scale 1e30 --hysteresis 2");
  EXPECT_EQ(s.scale, (std::vector<double>{1e30, 5e29, 5e29, 2.5e29}));
  // --min_scale: the backoff stops there.
  s = run_steps("min", "--init_scale 1e30 --max_scale 1e30 --min_scale 3e29 --backoff_factor 0.25");
  EXPECT_EQ(s.scale, (std::vector<double>{3e29, 3e29, 3e29, 3e29}));
  // --max_overflows_at_min_scale 2: the second overflow at the minimum stops the run (exit status 3).
  // (5e29, then 3e29 at the minimum: overflows there count 1 at step 3 and 2 at step 4, which logs nothing)
  const fs::path failed = scratch_dir("cli_scaler", "give_up_ckpt");
  s = run_steps("give_up",
                "--init_scale 1e30 --max_scale 1e30 --min_scale 3e29 --max_overflows_at_min_scale 2 "
                "--checkpoint_dir " +
                    failed.string(),
                3);
  EXPECT_EQ(s.scale, (std::vector<double>{5e29, 3e29, 3e29}));
  // --loss_scale N stays the static shorthand.
  s = run_steps("static", "--loss_scale 128");
  EXPECT_EQ(s.scale, (std::vector<double>{128, 128, 128, 128}));
}

// Note [a run described in a file]: the scaler's settings go through --print_config and --config unchanged, and
// the run from the file uses them.
TEST(CliLossScaler, ConfigFileRoundTrip) {
  const fs::path dir = scratch_dir("cli_scaler", "config");
  const std::string flags =
      " --precision fp16 --init_scale 512 --growth_factor 4 --backoff_factor 0.125 --growth_interval 1 "
      "--hysteresis 3 --min_scale 2 --max_scale 8192 --max_overflows_at_min_scale 7 --max_steps_per_epoch 3";
  Result r = run(tiny_lm() + flags + " --print_config");
  ASSERT_EQ(r.code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["init_scale"], 512.0);
  EXPECT_EQ(j["growth_factor"], 4.0);
  EXPECT_EQ(j["backoff_factor"], 0.125);
  EXPECT_EQ(j["growth_interval"], 1);
  EXPECT_EQ(j["hysteresis"], 3);
  EXPECT_EQ(j["min_scale"], 2.0);
  EXPECT_EQ(j["max_scale"], 8192.0);
  EXPECT_EQ(j["max_overflows_at_min_scale"], 7);
  const fs::path file = dir / "run.json";
  std::ofstream(file) << r.output;
  r = run("train --config " + file.string() + " --print_config");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output), j);
  r = run("train --config " + file.string() + " --log " + (dir / "run.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(steps_of(dir / "run.jsonl").scale, (std::vector<double>{2048, 8192, 8192}));
  // A bad value in the file is refused as the flag would be.
  nlohmann::json bad = j;
  bad["backoff_factor"] = 1.5;
  std::ofstream(dir / "bad.json") << bad.dump();
  expect_failure("train --config " + (dir / "bad.json").string(), "--backoff_factor must be in (0, 1), got 1.5");
}

// A checkpoint whose stored config predates the scaler's flags (no such keys) resumes without a warning: the
// absent keys take the defaults the run had then, and the scaler's state comes from the checkpoint's tensors.
TEST(CliLossScaler, CheckpointsWithoutTheFieldsResume) {
  const fs::path dir = scratch_dir("cli_scaler", "old_checkpoint");
  const std::string job = tiny_lm() + " --precision fp16 --max_steps_per_epoch 4 --checkpoint_dir " + dir.string() +
                          " --log " + (dir / "run.jsonl").string();
  Result r = run(job + " --stop_after_steps 2");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string ckpt = (dir / "checkpoint.safetensors").string();
  mp::train::SafetensorsFile f = mp::train::load_safetensors(ckpt);
  nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(f.metadata.at("config"));
  for (const char* k : {"init_scale", "growth_factor", "backoff_factor", "growth_interval", "hysteresis", "min_scale",
                        "max_scale", "max_overflows_at_min_scale", "max_consecutive_skips"})
    ASSERT_EQ(cfg.erase(k), 1u) << k;
  f.metadata["config"] = cfg.dump();
  mp::train::save_safetensors(ckpt, f.tensors, f.metadata);
  r = run(job + " --resume");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
  const Steps s = steps_of(dir / "run.jsonl");
  EXPECT_EQ(s.scale, (std::vector<double>{65536, 65536, 65536, 65536}));
}

// Note: the loss scaler resumes with its saved state and settings, so a scaler flag changed on --resume does not
// apply; the warning says which ones keep the checkpoint's value, and the scale goes on as saved.
TEST(CliLossScaler, ResumeKeepsTheSavedScalerSettingsAndSaysSo) {
  const fs::path dir = scratch_dir("cli_scaler", "resume_changed");
  const std::string job = tiny_lm() + " --precision fp16 --max_steps_per_epoch 4 --checkpoint_dir " + dir.string() +
                          " --log " + (dir / "run.jsonl").string();
  Result r = run(job + " --growth_interval 1 --stop_after_steps 2");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(job + " --resume");  // the default growth interval (2000) asked for
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("growth_interval 1 -> 2000"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("so growth_interval keeps the checkpoint's value"), std::string::npos) << r.output;
  const Steps s = steps_of(dir / "run.jsonl");
  ASSERT_EQ(s.scale.size(), 4u);
  EXPECT_GT(s.scale[3], s.scale[2]) << "the saved growth interval of 1 still applies after the resume";
}

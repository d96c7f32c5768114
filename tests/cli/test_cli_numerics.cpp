// Per-layer numerics in the run log (--numerics_every, docs/RUN_LOG.md "numerics"): the records appear every
// N optimizer steps, one per module with parameters, named as in the state dict, with the documented fields;
// none when off; `mixprec plot` draws them as heat maps; bad values are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cli/cli_util.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/report/plot.hpp"
#include "mp/train/run_log.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using mp::test::scratch_dir;
using namespace mp::test::cli;
using Record = std::map<std::string, mp::train::LogValue>;

namespace {

std::vector<Record> records_of(const fs::path& log, const std::string& type) {
  std::vector<Record> out;
  for (auto& rec : mp::train::read_run_log(log.string()))
    if (std::get<std::string>(rec.at("type")) == type) out.push_back(std::move(rec));
  return out;
}

double num(const Record& r, const std::string& key) {
  const mp::train::LogValue& v = r.at(key);
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return std::get<double>(v);
}

}  // namespace

TEST(CliNumerics, RecordsEveryNStepsPerModuleNamedAsInTheStateDict) {
  const fs::path dir = scratch_dir("cli_numerics", "every");
  const Result r = run(tiny_lm() + " --precision fp16 --max_steps_per_epoch 7 --numerics_every 3 --log " +
                       (dir / "run.jsonl").string() + " --checkpoint_dir " + dir.string());
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<Record> recs = records_of(dir / "run.jsonl", "numerics");
  // Modules with parameters of their own: each name is the prefix of its tensors in the checkpoint's model.
  std::map<std::string, std::string> md;
  const mp::nn::StateDict model = mp::train::read_model_state((dir / "checkpoint.safetensors").string(), &md);
  std::set<std::string> modules;
  std::set<int64_t> steps;
  for (const Record& rec : recs) {
    steps.insert(std::get<int64_t>(rec.at("step")));
    const std::string m = std::get<std::string>(rec.at("module"));
    modules.insert(m);
    bool prefix = false;
    for (const auto& [name, t] : model) prefix = prefix || name.rfind(m + ".", 0) == 0;
    EXPECT_TRUE(prefix) << m << " names no tensor of the state dict";
    for (const char* k : {"epoch", "kind", "dtype", "scale", "act_amax", "grad_amax", "grad_values", "grad_underflow",
                          "grad_underflow_unscaled", "grad_zero", "update_lost"})
      EXPECT_EQ(rec.count(k), 1u) << m << " lacks " << k;
    EXPECT_EQ(num(rec, "scale"), 65536.0);
    EXPECT_GT(num(rec, "act_amax"), 0.0) << m;
    EXPECT_GT(num(rec, "grad_amax"), 0.0) << m;
    EXPECT_GT(num(rec, "grad_values"), 0.0) << m;
    for (const char* k : {"grad_underflow", "grad_underflow_unscaled", "grad_zero", "update_lost"}) {
      EXPECT_GE(num(rec, k), 0.0) << m << " " << k;
      EXPECT_LE(num(rec, k), 1.0) << m << " " << k;
    }
    EXPECT_EQ(std::get<std::string>(rec.at("dtype")), "f16") << m;  // O2: every layer of the LM is 16-bit
  }
  EXPECT_EQ(steps, (std::set<int64_t>{3, 6}));
  EXPECT_EQ(modules, (std::set<std::string>{"encoder", "rnn", "decoder"}));
  EXPECT_EQ(recs.size(), 6u);
  // Every record follows the step record it belongs to.
  const auto all = mp::train::read_run_log((dir / "run.jsonl").string());
  int64_t last_step = 0;
  for (const Record& rec : all) {
    const std::string type = std::get<std::string>(rec.at("type"));
    if (type == "step") last_step = std::get<int64_t>(rec.at("step"));
    if (type == "numerics") { EXPECT_EQ(std::get<int64_t>(rec.at("step")), last_step); }
  }
}

// Off (the default) writes no numerics record, and recording changes nothing the run computes: the same losses
// and scales bit for bit with and without it.
TEST(CliNumerics, OffWritesNothingAndOnChangesNoStep) {
  const fs::path dir = scratch_dir("cli_numerics", "off");
  const std::string job = tiny_lm() + " --precision fp16 --max_steps_per_epoch 5 --seed 4";
  Result r = run(job + " --log " + (dir / "off.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.output;
  r = run(job + " --numerics_every 1 --log " + (dir / "on.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(records_of(dir / "off.jsonl", "numerics").empty());
  EXPECT_EQ(records_of(dir / "on.jsonl", "numerics").size(), 15u);  // 5 steps x 3 modules
  const std::vector<Record> off = records_of(dir / "off.jsonl", "step"), on = records_of(dir / "on.jsonl", "step");
  ASSERT_EQ(off.size(), on.size());
  for (size_t i = 0; i < off.size(); ++i) {
    EXPECT_EQ(num(off[i], "loss"), num(on[i], "loss")) << "step " << i + 1;
    EXPECT_EQ(num(off[i], "scale"), num(on[i], "scale")) << "step " << i + 1;
  }
  const std::vector<Record> eo = records_of(dir / "off.jsonl", "epoch"), en = records_of(dir / "on.jsonl", "epoch");
  ASSERT_EQ(eo.size(), 1u);
  ASSERT_EQ(en.size(), 1u);
  EXPECT_EQ(num(eo[0], "val_loss"), num(en[0], "val_loss"));
}

TEST(CliNumerics, BadValuesAreRefused) {
  const std::string log = " --log " + (scratch_dir("cli_numerics", "bad") / "run.jsonl").string();
  expect_failure(tiny_lm() + " --numerics_every -1" + log, "--numerics_every must be >= 0, got -1");
  expect_failure(tiny_lm() + " --numerics_every 5",
                 "--numerics_every 5 writes per-layer numerics into the run log, but no --log was given: add --log");
  const Result r = run(tiny_lm() + " --numerics_every often" + log);
  EXPECT_EQ(r.code, 2) << r.output;  // not a number: a usage error
  EXPECT_CONTAINS(r.output, "numerics_every");
}

// `mixprec plot` draws a heat map per metric from a log with numerics records.
TEST(CliNumerics, PlotDrawsHeatMaps) {
  if (!mp::report::gnuplot_available()) GTEST_SKIP() << "gnuplot is not installed (apt-get install gnuplot-nox)";
  const fs::path dir = scratch_dir("cli_numerics", "plot");
  const fs::path log = dir / "run.jsonl";
  Result r = run(tiny_lm() + " --precision fp16 --max_steps_per_epoch 6 --numerics_every 2 --log " + log.string());
  ASSERT_EQ(r.code, 0) << r.output;
  r = run("plot " + log.string() + " --out " + (dir / "plots").string());
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* m :
       {"act_amax", "grad_amax", "grad_underflow", "grad_underflow_unscaled", "grad_zero", "update_lost"}) {
    const fs::path png = dir / "plots" / (std::string("numerics_") + m + ".png");
    ASSERT_TRUE(fs::exists(png)) << png << "\n" << r.output;
    EXPECT_EQ(mp::test::read_file(png).substr(1, 3), "PNG") << png;
    EXPECT_CONTAINS(r.output, std::string("numerics_") + m + ".png");
    // the data behind it: one row per module, one cell per recorded step (3 steps x 3 modules)
    std::ifstream dat(fs::path(png).replace_extension(".dat"));
    std::string line;
    int cells = 0;
    while (std::getline(dat, line)) cells += !line.empty() && line[0] != '#';
    if (std::string(m) == "act_amax" || std::string(m) == "grad_amax") { EXPECT_EQ(cells, 9) << m; }
  }
  // a log without numerics records draws no heat map
  const fs::path plain = dir / "plain.jsonl";
  ASSERT_EQ(run(tiny_lm() + " --max_steps_per_epoch 2 --log " + plain.string()).code, 0);
  r = run("plot " + plain.string() + " --out " + (dir / "plain").string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.find(" numerics_"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "plain" / "numerics_act_amax.png"));
}

// --auto_precision end to end (Note [automatic precision] in src/amp/auto_precision.cpp) on the small generated image
// task: a layer whose telemetry crosses the overflow threshold moves to f32, the move is printed, logged and
// checkpointed, the rule's decisions are those of the logged telemetry, evaluation keeps the moved layers in f32, and a
// resumed run (before and after a move) equals the uninterrupted one bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "mp/amp/auto_precision.hpp"
#include "mp/core/error.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/train/run_log.hpp"
#include "mp/train/safetensors.hpp"
#include "mp/train/trainer.hpp"
#include "test_util.hpp"
#include "train/precision_moves.hpp"
#include "trainer_fixtures.hpp"

namespace fs = std::filesystem;
using mp::test::scratch_dir;
using mp::train::RunSummary;
using mp::train::TrainConfig;
using namespace trainer_fixtures;

namespace {

double number(const mp::train::LogValue& v) {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return std::nan("");  // null (a NaN or inf written by the log)
}

std::string text(const std::map<std::string, mp::train::LogValue>& r, const std::string& k) {
  return std::get<std::string>(r.at(k));
}

// fp16 O2 resnet8 on the generated digits, every step observed and logged. The threshold, 1.2e-4 x 65504 = 7.9, lies
// inside the range of the convolutions' output amax at this seed (about 2 to 10): some layers cross it, others never.
TrainConfig auto_config() {
  TrainConfig c = image_config("fp16");
  c.epochs = 1;  // 12 steps
  c.auto_precision = true;
  c.auto_precision_every = 1;
  c.auto_precision_patience = 2;
  c.auto_precision_overflow = 1.2e-4;
  return c;
}

}  // namespace

// The moves follow from the logged telemetry by the rule, are applied (the layer's later records are f32), printed,
// logged and checkpointed (f32 weights, the decisions in the metadata); `mixprec eval` of the checkpoint keeps them.
TEST(AutoPrecisionRun, MovesTheLayersWhoseTelemetryOverflowsAndRecordsIt) {
  TrainConfig c = auto_config();
  const fs::path dir = scratch_dir("auto_precision", "moves");
  c.log = (dir / "run.jsonl").string();
  c.checkpoint_dir = (dir / "ckpt").string();
  c.numerics_every = 1;
  std::ostringstream sink;
  const RunSummary s = mp::train::train(c, sink);
  ASSERT_EQ(s.steps, 12);

  // Replay the rule on the logged telemetry (no output went non-finite here: amax is logged as a number).
  mp::amp::AutoPrecision rule({.overflow = c.auto_precision_overflow,
                               .underflow = c.auto_precision_underflow,
                               .patience = c.auto_precision_patience});
  std::map<int64_t, std::vector<mp::amp::LayerNumerics>> by_step;
  std::map<int64_t, double> scale;
  std::vector<std::pair<std::string, int64_t>> logged_moves;
  std::map<std::string, std::map<int64_t, std::string>> dtype_at;  // module -> step -> dtype in its record
  for (const auto& r : mp::train::read_run_log(c.log)) {
    const std::string type = text(r, "type");
    if (type == "numerics") {
      const auto step = static_cast<int64_t>(number(r.at("step")));
      ASSERT_TRUE(std::isfinite(number(r.at("act_amax")))) << text(r, "module") << " step " << step;
      by_step[step].push_back({.module = text(r, "module"),
                               .type = text(r, "kind"),
                               .dtype = text(r, "dtype"),
                               .act_amax = number(r.at("act_amax")),
                               .grad_amax = number(r.at("grad_amax")),
                               .grad_values = static_cast<int64_t>(number(r.at("grad_values"))),
                               .grad_underflow = number(r.at("grad_underflow"))});
      dtype_at[text(r, "module")][step] = text(r, "dtype");
      scale[step] = number(r.at("scale"));
    } else if (type == "precision") {
      logged_moves.emplace_back(text(r, "module"), static_cast<int64_t>(number(r.at("step"))));
      EXPECT_EQ(text(r, "from"), "f16");
      EXPECT_EQ(text(r, "to"), "f32");
      EXPECT_EQ(text(r, "reason").rfind("overflow in 2 consecutive observations: forward output amax", 0), 0u)
          << text(r, "reason");
    }
  }
  ASSERT_EQ(by_step.size(), 12u);
  std::vector<std::pair<std::string, int64_t>> expected;
  for (const auto& [step, layers] : by_step) {
    std::vector<mp::amp::LayerSign> signs;
    for (const auto& l : layers) signs.push_back(mp::amp::assess(l, rule.options(), scale.at(step)));
    for (const auto& m : rule.observe(layers, signs, step)) expected.emplace_back(m.module, m.step);
  }
  ASSERT_FALSE(expected.empty()) << "no layer crossed the threshold: the test's premise (auto_config) no longer holds";
  EXPECT_EQ(logged_moves, expected);
  // Applied: 16-bit up to the deciding step, f32 after; some layers never crossed and stay 16-bit.
  std::set<std::string> moved;
  for (const auto& [module, step] : logged_moves) {
    moved.insert(module);
    EXPECT_EQ(dtype_at[module][step], "f16") << module;
    for (int64_t later = step + 1; later <= 12; ++later) EXPECT_EQ(dtype_at[module][later], "f32") << module;
    EXPECT_NE(sink.str().find("auto precision: step " + std::to_string(step) + ": " + module + " (Conv2d) f16 -> f32"),
              std::string::npos)
        << sink.str();
  }
  int64_t stayed = 0;
  for (const auto& [module, steps] : dtype_at) stayed += steps.at(12) == "f16" ? 1 : 0;
  EXPECT_GE(stayed, 1);

  // The checkpoint: moved layers' weights in f32, the others' in f16; the decisions in the metadata.
  const std::string ckpt = (dir / "ckpt" / "checkpoint.safetensors").string();
  std::map<std::string, std::string> md;
  std::map<std::string, mp::DType> stored;
  for (const auto& t : mp::train::read_safetensors_header(ckpt, &md)) stored[t.name] = t.dtype;
  for (const auto& [module, steps] : dtype_at) {
    if (steps.at(12) == "f32" && moved.count(module) == 0) continue;  // batch norm: f32 from the start
    EXPECT_EQ(stored.at("model." + module + ".weight"), moved.count(module) ? mp::DType::f32 : mp::DType::f16)
        << module;
  }
  ASSERT_EQ(md.count("auto_precision"), 1u);
  const nlohmann::json j = nlohmann::json::parse(md.at("auto_precision"));
  std::vector<std::pair<std::string, int64_t>> saved;
  for (const auto& m : j.at("moves"))
    saved.emplace_back(m.at("module").get<std::string>(), m.at("step").get<int64_t>());
  EXPECT_EQ(saved, logged_moves);

  // Evaluation of the checkpoint runs the moved layers in f32, as the run's own evaluation did.
  const mp::train::EvalResult r = mp::train::evaluate_checkpoint(ckpt, "test", nullptr, sink);
  EXPECT_DOUBLE_EQ(r.metric, s.val_metric);
  EXPECT_DOUBLE_EQ(r.loss, s.val_loss);
}

// The weight averages of an --auto_precision run evaluate as the run evaluated them (moved layers in f32, the others
// rounded to f16); another precision for the evaluation takes the layers with it.
TEST(AutoPrecisionRun, EvaluatingTheAveragesAndAtAnotherPrecision) {
  TrainConfig c = auto_config();
  c.ema_decay = 0.9;
  const fs::path dir = scratch_dir("auto_precision", "ema");
  c.checkpoint_dir = dir.string();
  std::ostringstream sink;
  const RunSummary s = mp::train::train(c, sink);
  ASSERT_NE(sink.str().find("auto precision: step"), std::string::npos);
  ASSERT_TRUE(s.ema_val_metric.has_value());
  const std::string ckpt = (dir / "checkpoint.safetensors").string();
  const mp::train::EvalResult e = mp::train::evaluate_checkpoint(ckpt, "test", nullptr, sink, /*ema=*/true);
  EXPECT_DOUBLE_EQ(e.metric, *s.ema_val_metric);
  EXPECT_DOUBLE_EQ(e.loss, *s.ema_val_loss);
  mp::train::EvalOverrides fp32;
  fp32.values.precision = mp::DType::f32;
  fp32.given = {"precision"};
  const mp::train::EvalResult f = mp::train::evaluate_checkpoint(ckpt, "test", &fp32, sink);
  EXPECT_EQ(f.examples, 128);
}

// A resume in the middle of a streak (step 1: one observation of 2 made) and after the moves (step 7): the streaks and
// the moved layers' f32 weights come back, and the run continues bit for bit.
TEST(AutoPrecisionRun, ExactResumeKeepsTheDecisions) {
  expect_exact_resume(auto_config(), 1, "auto_mid_streak");
  expect_exact_resume(auto_config(), 7, "auto_after_moves");
}

// The flag off changes nothing; a resumed run holds its moves even when --auto_precision is dropped.
TEST(AutoPrecisionRun, OffChangesNothingAndMovesSurviveAResumeWithoutTheFlag) {
  TrainConfig off = image_config("fp16");
  off.epochs = 1;
  TrainConfig on_never = off;  // on, with a threshold nothing reaches: the same run
  on_never.auto_precision = true;
  on_never.auto_precision_every = 1;
  std::ostringstream sink;
  const RunSummary a = mp::train::train(off, sink), b = mp::train::train(on_never, sink);
  EXPECT_EQ(a.step_losses, b.step_losses);
  EXPECT_EQ(a.val_metric, b.val_metric);
  EXPECT_EQ(sink.str().find("auto precision:"), std::string::npos);

  TrainConfig c = auto_config();
  const fs::path dir = scratch_dir("auto_precision", "resume_without_flag");
  c.checkpoint_dir = dir.string();
  c.stop_after_steps = 4;
  (void)mp::train::train(c, sink);
  c.stop_after_steps = 0;
  c.resume = true;
  c.auto_precision = false;
  std::ostringstream out;
  (void)mp::train::train(c, out);
  EXPECT_NE(out.str().find("auto precision: resumed with 5 layers moved to f32"), std::string::npos) << out.str();
  std::map<std::string, mp::DType> stored;
  for (const auto& t : mp::train::read_safetensors_header((dir / "checkpoint.safetensors").string()))
    stored[t.name] = t.dtype;
  EXPECT_EQ(stored.at("model.layer1.0.conv2.weight"), mp::DType::f32);  // moved at step 2, kept to the end
}

// The checkpoint metadata round-trips the decisions; a damaged one is refused naming the file's key and what it
// expects.
TEST(AutoPrecisionRun, MetadataRoundTripsAndDamageIsRefused) {
  mp::amp::AutoPrecision ap({});
  ap.restore({{.module = "layer1.0.conv1", .type = "Conv2d", .from = mp::DType::f16, .step = 12, .reason = "r"}},
             {{"fc", {.overflow = 0, .underflow = 1}}});
  const std::string json = mp::train::detail::precision_state_json(ap, true);
  mp::amp::AutoPrecision back({});
  bool next = false;
  mp::train::detail::restore_precision_state(json, "ckpt 'x': metadata 'auto_precision'", back, next);
  EXPECT_TRUE(next);
  ASSERT_EQ(back.moves().size(), 1u);
  EXPECT_EQ(back.moves()[0].module, "layer1.0.conv1");
  EXPECT_EQ(back.moves()[0].step, 12);
  EXPECT_EQ(back.moves()[0].to, mp::DType::f32);
  EXPECT_EQ(back.streaks(), ap.streaks());
  for (const std::string& bad : {std::string("{"), std::string("{\"moves\": 3}"),
                                 std::string("{\"moves\": [], \"streaks\": {\"fc\": [1]}, \"observe_next\": false}"),
                                 std::string("{\"moves\": [{\"module\": \"fc\", \"type\": \"Linear\", \"from\": "
                                             "\"f32\", \"to\": \"f16\", \"step\": 1, \"reason\": \"\"}], "
                                             "\"streaks\": {}, \"observe_next\": false}")}) {
    try {
      mp::train::detail::restore_precision_state(bad, "ckpt 'x': metadata 'auto_precision'", back, next);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const mp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("ckpt 'x': metadata 'auto_precision'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("resume from another checkpoint"), std::string::npos) << e.what();
    }
  }
}

TEST(AutoPrecisionRun, ValidationNamesTheProblem) {
  auto refused = [](TrainConfig c, const std::string& needle) {
    try {
      mp::train::validate(c);
    } catch (const mp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted; expected a refusal mentioning " << needle;
  };
  TrainConfig c = image_config("fp32");
  c.auto_precision = true;
  refused(c, "--auto_precision moves layers of an O2 model from 16-bit to f32, but got --precision fp32");
  c = image_config("bf16");
  c.auto_precision = true;
  c.opt_level = mp::amp::OptLevel::O3;
  refused(c, "--opt_level O3");
  c.opt_level = mp::amp::OptLevel::O2;
  EXPECT_NO_THROW(mp::train::validate(c));
  c.auto_precision_overflow = 0;
  refused(c, "--auto_precision_overflow must be in (0, 1]");
  c.auto_precision_overflow = 0.5;
  c.auto_precision_underflow = 1.5;
  refused(c, "--auto_precision_underflow must be in (0, 1]");
  c.auto_precision_underflow = 0.5;
  c.auto_precision_every = 0;
  refused(c, "--auto_precision_every must be at least 1");
  c.auto_precision_every = 1;
  c.auto_precision_patience = 0;
  refused(c, "--auto_precision_patience must be at least 1");
}

// An underflow move in a run without a dynamic loss scaler advises dynamic scaling, once; with one, nothing is added
// (underflow threshold 1: every f16 layer's gradient amax at scale 1 is below it, so layers move at the first
// observation).
TEST(AutoPrecisionRun, UnderflowWithoutDynamicScalingAdvisesItOnce) {
  const std::string hint = "dynamic loss scaling (--loss_scale dynamic";
  auto count = [](const std::string& s, const std::string& what) {
    int64_t n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
    return n;
  };
  TrainConfig c = image_config("fp16");
  c.epochs = 1;
  c.stop_after_steps = 3;
  c.auto_precision = true;
  c.auto_precision_every = 1;
  c.auto_precision_patience = 1;
  c.auto_precision_underflow = 1.0;
  c.loss_scale = mp::amp::LossScale{.kind = mp::amp::LossScale::Kind::none};
  std::ostringstream none;
  (void)mp::train::train(c, none);
  ASSERT_NE(none.str().find("underflow in 1 consecutive observation"), std::string::npos) << none.str();
  EXPECT_EQ(count(none.str(), hint), 1) << none.str();
  c.loss_scale = mp::amp::LossScale{.kind = mp::amp::LossScale::Kind::dynamic};
  c.init_scale = 1;  // the same moves, now under a dynamic scaler
  std::ostringstream dynamic;
  (void)mp::train::train(c, dynamic);
  ASSERT_NE(dynamic.str().find("auto precision: step"), std::string::npos) << dynamic.str();
  EXPECT_EQ(count(dynamic.str(), hint), 0) << dynamic.str();
}

// Note [recorded runs]: a refactoring must not change what a run computes. Six short fixed-seed runs (resnet8
// on a generated image set and a 2-layer LSTM word LM, each in fp32, bf16 O2 and fp16 O2, two threads, kernel
// paths pinned) write their run logs; the deterministic fields (every step's loss, learning rate, loss scale and
// skip flag; every epoch's losses, metric, skip count and scale) are compared with the logs recorded before, in
// tests/train/recorded_runs/<machine>.jsonl.
//
// Bitwise results depend on the CPU (oneDNN and our kernels pick instruction sets by cpuid), so a recording is
// keyed by the CPU's brand and features: on a machine with its own recording the comparison is byte for byte;
// on any other machine the runs are compared with every recording within the tolerances below. A change that
// is meant to change the numbers re-records (MP_RECORD_RUNS=1 writes this machine's file) and says why in its
// commit.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "mp/core/cpu_features.hpp"
#include "mp/train/trainer.hpp"
#include "test_util.hpp"
#include "trainer_fixtures.hpp"

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using mp::train::TrainConfig;

// The runs, as JSON configs over the fixture data (a config in JSON keeps meaning the same run when the
// TrainConfig struct is reorganised).
struct RecordedRun {
  const char* name;
  const char* config;
};
const RecordedRun kRuns[] = {
    {"resnet8_fp32", R"({"model":"resnet8","precision":"fp32"})"},
    {"resnet8_bf16_O2", R"({"model":"resnet8","precision":"bf16","opt_level":"O2"})"},
    {"resnet8_fp16_O2", R"({"model":"resnet8","precision":"fp16","opt_level":"O2"})"},
    {"lstm_fp32", R"({"model":"lstm","precision":"fp32"})"},
    {"lstm_bf16_O2", R"({"model":"lstm","precision":"bf16","opt_level":"O2"})"},
    {"lstm_fp16_O2", R"({"model":"lstm","precision":"fp16","opt_level":"O2"})"},
};

TrainConfig config_of(const RecordedRun& r) {
  const Json j = Json::parse(r.config);
  const std::string precision = j.at("precision").get<std::string>();
  Json c = Json::parse(mp::train::config_to_json(j.at("model") == "lstm" ? trainer_fixtures::text_config(precision)
                                                                         : trainer_fixtures::image_config(precision)));
  for (const auto& [k, v] : j.items()) c[k] = v;
  TrainConfig out = mp::train::config_from_json(c.dump());
  out.num_workers = 0;
  out.max_steps_per_epoch = 12;  // a few dozen steps per run: 2 epochs of 12
  return out;
}

// The deterministic fields of a run log's records, one compact JSON line each, prefixed by the run's name.
std::vector<std::string> deterministic_records(const std::string& run, const fs::path& log) {
  static const char* kStep[] = {"epoch", "step", "loss", "lr", "scale", "skipped"};
  static const char* kEpoch[] = {"epoch",          "train_loss",    "val_loss", "val_accuracy",
                                 "val_perplexity", "skipped_total", "scale"};
  std::vector<std::string> out;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    const Json rec = Json::parse(line);
    const std::string type = rec.at("type").get<std::string>();
    Json kept{{"run", run}, {"type", type}};
    auto keep = [&](auto& fields) {
      for (const char* f : fields)
        if (rec.contains(f)) kept[f] = rec.at(f);
    };
    if (type == "step")
      keep(kStep);
    else if (type == "epoch")
      keep(kEpoch);
    else
      continue;
    out.push_back(kept.dump());
  }
  return out;
}

std::string machine_key() {
  const mp::CpuFeatures& f = mp::cpu_features();
  std::string key = f.brand + " | " + mp::cpu_features_string();
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64 bits: a stable file name
  for (unsigned char ch : key) h = (h ^ ch) * 1099511628211ull;
  char name[32];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(h));
  return name;
}

fs::path recordings_dir() { return fs::path(MP_SOURCE_DIR) / "tests" / "train" / "recorded_runs"; }

// Records of a recording file (its first line names the machine).
std::vector<std::string> read_recording(const fs::path& p) {
  std::vector<std::string> out;
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);  // {"machine": ...}
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(line);
  return out;
}

// Tolerances for another machine's recording, relative to the recorded value. Their reason: another CPU's kernels
// sum in another order (other vector widths, AMX tiles, other GEMM blockings), and the difference grows through
// the steps of training. Measured here as the gap between 1, 2 and 3 threads (which reorders oneDNN's sums too):
// fp32 <= 2.7e-5, bf16 and fp16 <= 4.7e-3 on losses; the tolerances are ~10x that. Accuracies are counts over 128
// test images (steps of 1/128; one or two flipped there), so they get an absolute 0.05. A changed default
// (learning rate, initialisation, schedule, data order) moves these numbers by far more.
double tolerance(const std::string& run) { return run.find("fp32") != std::string::npos ? 3e-4 : 5e-2; }
constexpr double kAccuracyTolerance = 0.05;

bool close_records(const std::string& a, const std::string& b, double rtol, std::string* why) {
  const Json x = Json::parse(a), y = Json::parse(b);
  if (x.size() != y.size()) return *why = "different fields", false;
  for (const auto& [k, v] : x.items()) {
    if (!y.contains(k)) return *why = "no field " + k, false;
    const Json& w = y.at(k);
    if (v.is_number_float() || w.is_number_float()) {
      const double p = v.get<double>(), q = w.get<double>();
      const double allowed =
          k.find("accuracy") != std::string::npos ? kAccuracyTolerance : rtol * std::max(std::abs(p), std::abs(q));
      if (!(std::abs(p - q) <= allowed)) {
        *why = k + ": " + std::to_string(p) + " vs " + std::to_string(q);
        return false;
      }
    } else if (v != w) {
      return *why = k + " differs", false;
    }
  }
  return true;
}

TEST(RecordedRuns, ARefactoringComputesWhatTheRecordedRunsComputed) {
  const int threads_before = omp_get_max_threads();
  const char* t = std::getenv("MP_RECORD_RUNS_THREADS");  // calibration of the tolerances (see above)
  omp_set_num_threads(t != nullptr ? std::atoi(t) : 2);
  std::vector<std::string> now;
  const fs::path dir = mp::test::scratch_dir("recorded", "runs");
  for (const RecordedRun& r : kRuns) {
    TrainConfig c = config_of(r);
    c.log = (dir / (std::string(r.name) + ".jsonl")).string();
    std::ostringstream sink;
    mp::train::train(c, sink);
    std::vector<std::string> recs = deterministic_records(r.name, c.log);
    ASSERT_GT(recs.size(), 20u) << r.name;
    now.insert(now.end(), recs.begin(), recs.end());
  }
  omp_set_num_threads(threads_before);

  const fs::path mine = recordings_dir() / (machine_key() + ".jsonl");
  const char* record = std::getenv("MP_RECORD_RUNS");
  if (record != nullptr && std::string(record) == "1") {
    fs::create_directories(recordings_dir());
    std::ofstream out(mine);
    out << Json{{"machine", mp::cpu_features().brand + " | " + mp::cpu_features_string()}}.dump() << "\n";
    for (const std::string& s : now) out << s << "\n";
    GTEST_SKIP() << "recorded " << mine;
  }

  if (fs::exists(mine)) {
    const std::vector<std::string> recorded = read_recording(mine);
    ASSERT_EQ(now.size(), recorded.size()) << mine;
    for (size_t i = 0; i < now.size(); ++i) ASSERT_EQ(now[i], recorded[i]) << "record " << i << " of " << mine;
    return;
  }
  int compared = 0;
  for (const auto& e : fs::directory_iterator(recordings_dir())) {
    if (e.path().extension() != ".jsonl") continue;
    const std::vector<std::string> recorded = read_recording(e.path());
    ASSERT_EQ(now.size(), recorded.size()) << e.path();
    for (size_t i = 0; i < now.size(); ++i) {
      const std::string run = Json::parse(now[i]).at("run").get<std::string>();
      std::string why;
      EXPECT_TRUE(close_records(now[i], recorded[i], tolerance(run), &why))
          << "record " << i << " of " << e.path() << " (another machine's, tolerance " << tolerance(run) << "): " << why
          << "\n now:      " << now[i] << "\n recorded: " << recorded[i];
    }
    ++compared;
  }
  EXPECT_GT(compared, 0) << "no recording in " << recordings_dir();
}

}  // namespace

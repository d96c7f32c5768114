#pragma once
// `mixprec bench step` as a function, for the suites (bench_suites.cpp).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mp/train/config.hpp"

namespace mixprec {

/// What `mixprec bench step` measures: a run's settings (the TrainConfig fields in bench_config_fields(), the
/// flags of the same names, with the benchmark's defaults below) plus the benchmark's own fields.
struct BenchStepOptions : mp::train::TrainConfig {
  int64_t image_size = 32;     ///< images: height = width
  int64_t in_channels = 3;     ///< images: channels
  int64_t num_classes = 10;    ///< images: classes
  int64_t vocab_size = 10000;  ///< word LM: vocabulary
  int64_t warmup = 3;          ///< untimed steps first
  int64_t steps = 10;          ///< timed steps
  std::string json;            ///< also append the JSON object as one line to this file
  bool profile = false;        ///< also time every kernel over the timed steps (JSON "ops")

  /// The benchmark's defaults of the shared fields: ResNet-18, the word_language_model example's medium LSTM
  /// (650 wide, dropout 0.5); batch 0 = 32 images or 20 token streams; lr 0 = 0.01 for sgd, 1e-3 for adamw.
  BenchStepOptions() {
    model = "resnet18";
    optimizer = "sgd";
    batch_size = 0;
    embed_size = 650;
    hidden_size = 650;
    dropout = 0.5;
  }
};

/// The TrainConfig fields that are flags of `mixprec bench step` (a step has no epochs, data or checkpoints).
const std::vector<std::string>& bench_config_fields();

/// Call f(name, field, help) for each of the benchmark's own fields of `o`.
template <class F>
void visit_bench_fields(BenchStepOptions& o, F&& f) {
  f("image_size", o.image_size, "images: height = width");
  f("in_channels", o.in_channels, "images: channels");
  f("num_classes", o.num_classes, "images: classes");
  f("vocab_size", o.vocab_size, "word LM: vocabulary size");
  f("warmup", o.warmup, "untimed steps before the timed ones");
  f("steps", o.steps, "timed steps");
  f("json", o.json, "also append the JSON object as one line to this file");
  f("profile", o.profile, "also time every kernel over the timed steps (adds \"ops\" to the JSON)");
}

/// Whether `model` names the word LM (lstm, gru, rnn) rather than an image model.
bool bench_is_lm(const std::string& model);

/// Run the configuration (after checking every option; throws mp::Error naming the flag) and return the
/// JSON object `mixprec bench step` prints.
nlohmann::ordered_json run_bench_step(const BenchStepOptions& options);

}  // namespace mixprec

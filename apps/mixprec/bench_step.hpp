#pragma once
// `mixprec bench step` as a function, for the suites (bench_suites.cpp).
#include <nlohmann/json.hpp>
#include <string>

namespace mixprec {

/// What `mixprec bench step` measures; every field is the flag of the same name.
struct BenchStepOptions {
  std::string model = "resnet18";      ///< an image model name (mlp, mlp-WxL, resnetN, wrn-D-K) or lstm, gru, rnn
  int64_t batch_size = 0;              ///< images or token streams per step (0 = 32 for images, 20 for the word LM)
  int64_t image_size = 32;             ///< images: height = width
  int64_t in_channels = 3;             ///< images: channels
  int64_t num_classes = 10;            ///< images: classes
  int64_t vocab_size = 10000;          ///< word LM: vocabulary
  int64_t seq_len = 35;                ///< word LM: tokens per stream per step (bptt)
  int64_t embed_size = 650;            ///< word LM: embedding size
  int64_t hidden_size = 650;           ///< word LM: recurrent state size
  int64_t num_layers = 2;              ///< word LM: stacked recurrent layers
  double dropout = 0.5;                ///< word LM: dropout (the word_language_model example's medium model)
  std::string precision = "fp32";      ///< fp32, fp16 or bf16
  std::string opt_level;               ///< O0..O3; empty = O0 for fp32, O2 otherwise
  std::string optimizer = "sgd";       ///< sgd (momentum 0.9) or adamw
  double lr = 0;                       ///< learning rate (0 = 0.01 for sgd, 1e-3 for adamw)
  int64_t warmup = 3;                  ///< untimed steps first
  int64_t steps = 10;                  ///< timed steps
  uint64_t seed = 0;                   ///< seeds the initialisation, the batch and dropout
  std::string json;                    ///< also append the JSON object as one line to this file
  std::string lstm_impl = "fused";     ///< word LM (lstm): basic, fused, onednn (cpu) or cudnn (cuda); see the flag
  std::string memory_format = "auto";  ///< conv nets: auto, channels_last or contiguous; see the flag
  bool profile = false;                ///< also time every kernel over the timed steps (JSON "ops")
  std::string device = "cpu";          ///< cpu, cuda or cuda:N
  std::string matmul_precision = "highest";  ///< f32 matmuls/convs on CUDA: highest (f32) or high (TF32)
};

/// Call f(name, field, help) for each field of `o` (the flags of `mixprec bench step`).
template <class F>
void visit_fields(BenchStepOptions& o, F&& f) {
  f("model", o.model, "image model (mlp, mlp-WxL, resnet8..110, resnet18..152, wrn-D-K) or lstm, gru, rnn (word LM)");
  f("batch_size", o.batch_size, "images or token streams per step (0 = 32 for images, 20 for the word LM)");
  f("image_size", o.image_size, "images: height = width");
  f("in_channels", o.in_channels, "images: channels");
  f("num_classes", o.num_classes, "images: classes");
  f("vocab_size", o.vocab_size, "word LM: vocabulary size");
  f("seq_len", o.seq_len, "word LM: tokens per stream per step (the bptt window)");
  f("embed_size", o.embed_size, "word LM: embedding size");
  f("hidden_size", o.hidden_size, "word LM: recurrent state size");
  f("num_layers", o.num_layers, "word LM: stacked recurrent layers");
  f("dropout", o.dropout, "word LM: dropout probability");
  f("precision", o.precision, "fp32, fp16 or bf16");
  f("opt_level", o.opt_level, "O0, O1, O2 or O3 (default: O0 for fp32, O2 for fp16/bf16)");
  f("optimizer", o.optimizer, "sgd (momentum 0.9) or adamw");
  f("lr", o.lr, "learning rate (0 = 0.01 for sgd, 1e-3 for adamw)");
  f("warmup", o.warmup, "untimed steps before the timed ones");
  f("steps", o.steps, "timed steps");
  f("seed", o.seed, "random seed (initialisation, synthetic batch, dropout)");
  f("json", o.json, "also append the JSON object as one line to this file");
  f("memory_format", o.memory_format,
    "conv nets: activation layout, channels_last (NHWC), contiguous (NCHW) or auto (channels_last)");
  f("lstm_impl", o.lstm_impl,
    "word LM (lstm): basic (per-step graph), fused (our sequence-level node per layer), onednn (oneDNN's LSTM, "
    "cpu) or cudnn (cuDNN's LSTM, cuda)");
  f("profile", o.profile, "also time every kernel over the timed steps (adds \"ops\" to the JSON)");
  f("device", o.device, "cpu, cuda or cuda:N (model, batch and optimizer state live there)");
  f("matmul_precision", o.matmul_precision, "f32 matmuls and convolutions on CUDA: highest (true f32) or high (TF32)");
}

/// Whether `model` names the word LM (lstm, gru, rnn) rather than an image model.
bool bench_is_lm(const std::string& model);

/// Run the configuration (after checking every option; throws mp::Error naming the flag) and return the
/// JSON object `mixprec bench step` prints.
nlohmann::ordered_json run_bench_step(const BenchStepOptions& options);

}  // namespace mixprec

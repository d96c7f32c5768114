// train::generate: text from a GPT checkpoint, one token at a time with a key/value cache.
#include "mp/train/generate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <span>

#include "mp/autograd/node.hpp"
#include "mp/core/error.hpp"
#include "mp/data/bpe.hpp"
#include "mp/data/utf8_stream.hpp"
#include "mp/models/gpt.hpp"
#include "mp/models/sampling.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/train/config.hpp"
#include "mp/train/run_parts.hpp"

namespace mp::train {

// Note [gpt checkpoints]
// The contract between `mixprec train --model gpt-nano|gpt-mini|gpt2 --dataset kjv` (which writes them) and
// generate() (which reads them). A gpt checkpoint is an ordinary training checkpoint (save_checkpoint):
//  * its model section holds models::Gpt's state dict under nanoGPT's names (read_model_state removes the "model."
//    prefix): transformer.wte.weight [V, C], transformer.wpe.weight [block_size, C], transformer.h.{i}...,
//    transformer.ln_f..., lm_head.weight (the tied copy of wte); biases present unless built with bias = false;
//  * metadata "config" is the run's TrainConfig as JSON: "model" (the preset name: gpt-nano, gpt-mini or gpt2),
//    "context" (the context length the model was built with, i.e. wpe's rows; 0 = the preset's block_size) and
//    "dropout" make the model's options (gpt_run_options, as the training run made them);
//  * metadata "tokenizer" is the Hugging Face tokenizer.json text of its byte-level BPE tokenizer
//    (data::BpeTokenizer::to_json()); V is that tokenizer's vocab_size() (no padding of the vocabulary).
// The shapes of wte and wpe, when present, must agree with V, the preset's width and the context; a mismatch is
// refused naming both numbers rather than loaded into a model of other sizes.

namespace {

struct LoadedGpt {
  std::shared_ptr<models::Gpt> model;
  data::BpeTokenizer tokenizer;
};

std::string what_to_give() {
  return "give a checkpoint.safetensors written by `mixprec train --model gpt-nano|gpt-mini|gpt2 --dataset kjv`";
}

LoadedGpt load_gpt(const std::string& path) {
  MP_CHECK(std::filesystem::is_regular_file(path), "generate: expected a GPT checkpoint file, got '", path, "', which ",
           std::filesystem::exists(path) ? "is not a file" : "does not exist", "; ", what_to_give());
  std::map<std::string, std::string> meta;
  nn::StateDict state = read_model_state(path, &meta);

  const auto config = meta.find("config");
  MP_CHECK(config != meta.end(), "generate: '", path,
           "' has no training config (metadata \"config\"): expected a checkpoint of a GPT run, got a bare ",
           "state dict; ", what_to_give());
  TrainConfig c;
  try {
    c = config_from_json(config->second);
  } catch (const Error& e) { MP_FAIL("generate: '", path, "': its metadata \"config\": ", e.what()); }
  const std::string& name = c.model;
  MP_CHECK(models::is_gpt_model(name), "generate: '", path,
           "' is not a GPT checkpoint: expected config model gpt-nano, gpt-mini or gpt2, got '", name, "'; ",
           what_to_give());
  MP_CHECK(c.context >= 0 && c.dropout >= 0 && c.dropout < 1, "generate: '", path,
           "': expected config context >= 0 and dropout in [0, 1), got ", c.context, " and ", c.dropout, "; ",
           what_to_give());
  const int64_t context = c.context;

  const auto tok = meta.find("tokenizer");
  MP_CHECK(tok != meta.end(), "generate: '", path, "' holds no tokenizer (metadata \"tokenizer\"): expected the ",
           "tokenizer.json text that `mixprec train --model ", name, "` stores with a GPT; retrain with a mixprec ",
           "that stores it");
  LoadedGpt r{.model = nullptr,
              .tokenizer = data::BpeTokenizer::from_json(tok->second, path + " (metadata tokenizer)")};

  models::GptOptions o = gpt_run_options(c, r.tokenizer.vocab_size());
  o.bias = state.contains("transformer.ln_f.bias");
  if (state.contains("transformer.wte.weight")) {
    const Tensor& wte = state.at("transformer.wte.weight");
    MP_CHECK(wte.dim() == 2 && wte.size(0) == o.vocab_size && wte.size(1) == o.n_embd, "generate: '", path,
             "': expected transformer.wte.weight of shape [", o.vocab_size, ", ", o.n_embd,
             "] (the tokenizer's vocabulary by ", name, "'s width), got ", shape_str(wte.sizes()),
             "; the weights and the stored tokenizer or config do not belong together");
  }
  if (state.contains("transformer.wpe.weight")) {
    const Tensor& wpe = state.at("transformer.wpe.weight");
    MP_CHECK(wpe.dim() == 2 && wpe.size(0) == o.block_size && wpe.size(1) == o.n_embd, "generate: '", path,
             "': expected transformer.wpe.weight of shape [", o.block_size, ", ", o.n_embd, "] (config context ",
             context, context == 0 ? " = the preset's block size" : "", ", ", name, "'s width), got ",
             shape_str(wpe.sizes()), "; the weights and the config do not belong together");
  }
  r.model = std::make_shared<models::Gpt>(o);
  try {
    r.model->load_state_dict(state);
  } catch (const Error& e) { MP_FAIL("generate: '", path, "': its weights do not fit a ", name, " model: ", e.what()); }
  return r;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// Note [generating with a key/value cache]
// The prompt (cropped to its last block_size tokens) fills the cache in one forward_cached call (the prefill);
// then each new token is one forward_cached call of one position (Note [key/value cache] in src/models/gpt.cpp),
// whose logits give the next token (models::sample_token, draw number i for the i-th new token). When the cache
// holds block_size positions and another token must go in, the sequence is cropped to its last block_size / 2
// tokens and a cleared cache is refilled with them in one call. nanoGPT's sample.py, which has no cache, instead
// crops to the last block_size tokens at every step (each token then sees a full context, and costs a full
// forward); cropping to half amortises the refill over block_size / 2 cheap steps, so a token costs O(block_size)
// attention on average, at the price of a context between block_size / 2 and block_size after the first crop. So
// the tokens equal sample.py's until the context first fills, and differ after. The text is decoded token by
// token through data::Utf8Stream, so a character split across tokens is printed once it is whole.
GenerateResult generate(const std::string& checkpoint, const GenerateOptions& g, std::ostream& out) {
  MP_CHECK(g.max_new_tokens > 0, "generate: expected max_new_tokens > 0, got ", g.max_new_tokens,
           "; ask for at least one token");
  MP_CHECK(g.temperature >= 0 && std::isfinite(g.temperature),
           "generate: expected a temperature >= 0 (0 = ", "greedy, 1 = the model's distribution), got ", g.temperature);
  MP_CHECK(g.top_k >= 0, "generate: expected top_k >= 0 (0 = every token), got ", g.top_k);
  MP_CHECK(g.precision == "fp32" || g.precision == "bf16" || g.precision == "fp16",
           "generate: expected precision fp32, bf16 or fp16, got '", g.precision, "'");
  const DType dtype = dtype_from_string(g.precision);
  const Device device(g.device);

  LoadedGpt m = load_gpt(checkpoint);
  models::Gpt& model = *m.model;
  model.eval();
  if (dtype != DType::f32) model.to(dtype);
  model.to(device);
  const int64_t block = model.options().block_size;

  GenerateResult r;
  r.prompt_tokens = m.tokenizer.encode(g.prompt);
  if (r.prompt_tokens.empty()) {
    const std::optional<int64_t> eot = m.tokenizer.token_id("<|endoftext|>");
    r.prompt_tokens = eot ? std::vector<int64_t>{*eot} : m.tokenizer.encode("\n");
  }
  out << g.prompt << std::flush;

  autograd::NoGradGuard no_grad;
  models::GptKvCache cache;
  // The logits of the last position after feeding `ids` to the cache.
  const auto feed = [&](const std::vector<int64_t>& ids) {
    const Tensor idx = from_vector(ids, {1, static_cast<int64_t>(ids.size())}).to(device);
    const Tensor logits = model.forward_cached(idx, cache);  // [1, T, V]
    return logits.select(0, 0).select(0, logits.size(1) - 1).to(kCPU).to(DType::f32);
  };
  std::vector<int64_t> seq(r.prompt_tokens.end() - std::min<int64_t>(block, std::ssize(r.prompt_tokens)),
                           r.prompt_tokens.end());
  r.prefill_tokens = std::ssize(seq);
  auto t0 = std::chrono::steady_clock::now();
  Tensor logits = feed(seq);
  r.prefill_ms = ms_since(t0);

  t0 = std::chrono::steady_clock::now();
  data::Utf8Stream utf8;
  const models::SamplingOptions so{.temperature = g.temperature, .top_k = g.top_k, .seed = g.seed};
  for (int64_t i = 0; i < g.max_new_tokens; ++i) {
    const int64_t next = models::sample_token(logits, so, static_cast<uint64_t>(i));
    r.tokens.push_back(next);
    seq.push_back(next);
    const std::string piece = utf8.push(m.tokenizer.decode(std::span<const int64_t>(&next, 1)));
    r.text += piece;
    out << piece << std::flush;
    if (i + 1 == g.max_new_tokens) break;
    if (cache.length < block) {
      logits = feed({next});
    } else {  // the context is full: keep its last half (Note [generating with a key/value cache])
      seq.erase(seq.begin(), seq.end() - std::max<int64_t>(1, block / 2));
      cache.clear();
      logits = feed(seq);
      ++r.refills;
    }
  }
  const std::string tail = utf8.finish();
  r.text += tail;
  out << tail << std::flush;
  r.ms_per_token = ms_since(t0) / static_cast<double>(g.max_new_tokens);
  return r;
}

}  // namespace mp::train

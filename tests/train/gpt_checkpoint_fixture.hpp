#pragma once
// A tiny GPT checkpoint as `mixprec train --model gpt-nano` writes it (Note [gpt checkpoints] in
// src/train/generate.cpp): a gpt-nano model over a BPE tokenizer learned from a few sentences, trained a few steps to
// continue them, saved with save_checkpoint and the metadata "config" and "tokenizer". For tests of
// train::generate and `mixprec generate`.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mp/core/philox.hpp"
#include "mp/data/bpe.hpp"
#include "mp/models/gpt.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/adam.hpp"
#include "mp/train/checkpoint.hpp"

namespace mp::test {

/// A few sentences (one with characters of 2, 3 and 4 UTF-8 bytes, which byte-level tokens split).
inline std::vector<std::string> gpt_corpus() {
  return {"In the beginning God created the heaven and the earth.\n",
          "And the earth was without form, and void; and darkness was upon the face of the deep.\n",
          "And the Spirit of God moved upon the face of the waters.\n",
          "And God said, Let there be light: and there was light.\n",
          "Caf\xC3\xA9 cr\xC3\xA8me \xE2\x82\xAC 5, \xF0\x9F\x98\x80 na\xC3\xAFve \xC2\xAB amen \xC2\xBB.\n"};
}

/// The tokenizer of gpt_corpus() (300 tokens: <|endoftext|>, the 256 bytes and 43 merges at most).
inline data::BpeTokenizer gpt_tokenizer() {
  const std::vector<std::string> texts = gpt_corpus();
  return data::BpeTokenizer::train(texts, {.vocab_size = 300, .min_frequency = 2});
}

/// What write_gpt_checkpoint writes (fields left at their defaults give a valid gpt-nano checkpoint).
struct GptCheckpointSpec {
  std::string model = "gpt-nano";  ///< metadata config "model"
  int64_t context = 0;             ///< config "context" (0: the preset's block size); also the model's block size
  bool tokenizer = true;           ///< store metadata "tokenizer"
  bool config = true;              ///< store metadata "config"
  int steps = 30;                  ///< AdamW steps on the corpus
};

/// Writes the checkpoint to `path`; returns the model (eval mode) and its tokenizer for comparisons.
inline std::pair<std::shared_ptr<models::Gpt>, data::BpeTokenizer> write_gpt_checkpoint(
    const std::string& path, const GptCheckpointSpec& spec = {}) {
  data::BpeTokenizer tok = gpt_tokenizer();
  manual_seed(3);
  models::GptOptions o = models::gpt_preset("gpt-nano", tok.vocab_size());
  if (spec.context > 0) o.block_size = spec.context;
  o.dropout = 0.1;
  auto m = std::make_shared<models::Gpt>(o);
  // Teach it the corpus: every window of 24 tokens of the concatenated sentences predicts its next tokens.
  std::vector<int64_t> ids;
  for (const std::string& s : gpt_corpus())
    for (const int64_t id : tok.encode(s)) ids.push_back(id);
  const int64_t T = 24, B = 8, n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> x, y;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = b * (n - T - 1) / (B - 1);
    x.insert(x.end(), ids.begin() + start, ids.begin() + start + T);
    y.insert(y.end(), ids.begin() + start + 1, ids.begin() + start + T + 1);
  }
  const Tensor xt = from_vector(x, {B, T}), yt = from_vector(y, {B * T});
  optim::AdamW opt(m->parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  for (int step = 0; step < spec.steps; ++step) {
    const Tensor loss = cross_entropy(m->forward(xt).reshape({B * T, -1}), yt);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  m->eval();
  std::map<std::string, std::string> meta;
  if (spec.config)
    meta["config"] = "{\"model\": \"" + spec.model +
                     "\", \"dataset\": \"kjv\", \"context\": " + std::to_string(spec.context) +
                     ", \"dropout\": 0.1, \"precision\": \"fp32\"}";
  if (spec.tokenizer) meta["tokenizer"] = tok.to_json();
  train::save_checkpoint(path, {.model = m.get(), .generator = false}, {.epoch = 1}, {}, meta);
  return {m, tok};
}

}  // namespace mp::test

#pragma once
// Text generation from a GPT checkpoint of `mixprec train --model gpt-...` (nanoGPT's sample.py, with a key/value
// cache): what `mixprec generate` runs.
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace mp::train {

/// What generate() does (the flags of `mixprec generate`).
struct GenerateOptions {
  std::string prompt;              ///< the text to continue; empty: start from <|endoftext|> (if any) or a newline
  int64_t max_new_tokens = 200;    ///< tokens to generate (> 0)
  double temperature = 0.8;        ///< softmax temperature (0 = greedy); nanoGPT's sample.py default
  int64_t top_k = 200;             ///< draw among the k most likely tokens (0 = all); sample.py's default
  uint64_t seed = 1337;            ///< the sampling draws' Philox stream (sample.py's seed)
  std::string device = "cpu";      ///< cpu, cuda or cuda:N
  std::string precision = "fp32";  ///< fp32, or bf16 / fp16: the weights cast to that dtype for inference
};

/// What generate() returns.
struct GenerateResult {
  std::vector<int64_t> prompt_tokens;  ///< the prompt's ids (the start token for an empty prompt), uncropped
  std::vector<int64_t> tokens;         ///< the generated ids
  std::string text;                    ///< the generated text (valid UTF-8), as streamed after the prompt
  int64_t prefill_tokens = 0;          ///< positions of the prompt run through the model (<= block_size)
  int64_t refills = 0;                 ///< times the context filled up and the cache was refilled
  double prefill_ms = 0;               ///< the prompt's forward (filling the cache)
  double ms_per_token = 0;             ///< after the prefill: the time per generated token (forward + sampling)
};

/// Load the GPT and its tokenizer from `checkpoint` (Note [gpt checkpoints] in src/train/generate.cpp), continue
/// the prompt by max_new_tokens tokens with a key/value cache, and write the prompt and then the new text to `out`
/// as it is generated (whole UTF-8 characters only, flushed per token). Throws mp::Error naming the file and
/// what was expected for a missing file, a checkpoint of another model, one without a tokenizer, weights that do
/// not match its config, and bad options.
GenerateResult generate(const std::string& checkpoint, const GenerateOptions& options, std::ostream& out);

}  // namespace mp::train

#pragma once
// The next token of a language model from the logits of its last position: greedy, or drawn with a temperature
// from the k most likely tokens (nanoGPT's sample.py), reproducibly for a seed (Note [sampling the next token] in
// src/models/sampling.cpp).
#include <cstdint>
#include <span>

#include "mp/tensor/tensor.hpp"

namespace mp::models {

/// How sample_token chooses.
struct SamplingOptions {
  double temperature = 0.8;  ///< the logits are divided by it before the softmax; 0 = greedy (the argmax)
  int64_t top_k = 200;       ///< only tokens whose logit is among the k largest can be drawn (0 = every token)
  uint64_t seed = 0;         ///< the Philox stream of the draws
};

/// The next token given `logits` (one position: V floats) for draw number `position` (e.g. the index of the token
/// being generated): the argmax (lowest id among equals) when temperature is 0 or top_k is 1, else a draw from
/// softmax(logits / temperature) over the top_k largest logits (ties at the k-th value kept, as nanoGPT), with a
/// uniform number that depends only on (seed, position). Throws on NaN logits, a negative temperature or top_k,
/// and empty logits.
int64_t sample_token(std::span<const float> logits, const SamplingOptions& options, uint64_t position);

/// The same for a tensor of V logits ([V] or [1, V]; any floating dtype, any device: read as f32 on the host).
int64_t sample_token(const Tensor& logits, const SamplingOptions& options, uint64_t position);

}  // namespace mp::models

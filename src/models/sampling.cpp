// models::sample_token: greedy, temperature and top-k sampling of the next token.
#include "mp/models/sampling.hpp"

#include <algorithm>
#include <functional>
#include <cmath>
#include <vector>

#include "mp/core/error.hpp"
#include "mp/core/philox.hpp"

namespace mp::models {

// Note [sampling the next token]
// As nanoGPT's sample.py: logits / temperature, every logit below the k-th largest removed (so ties with the k-th
// stay), softmax, one draw. Temperature 0 (and top_k 1) is the argmax instead: no division by zero, and the lowest
// id wins a tie, so greedy generation is a function of the logits alone. The draw is reproducible: its uniform
// number u in [0, 1) comes from Philox block `position` of stream `seed` (Note [Philox stream convention]: draws
// 4 position .. 4 position + 3 of the stream; words 0 and 1 give 53 bits, so even a token of probability 1e-12
// has its own share of [0, 1)), and the token is the first whose cumulative probability, summed in id order,
// exceeds u times the total. Everything after reading the logits is double arithmetic on the host, so a seed gives
// the same tokens on every device as long as the logits agree; nothing touches the default generator, so sampling
// does not shift the draws of dropout or initialisation.
int64_t sample_token(std::span<const float> logits, const SamplingOptions& o, uint64_t position) {
  const auto V = static_cast<int64_t>(logits.size());
  MP_CHECK(V > 0, "sample_token: expected the logits of at least one token, got none");
  MP_CHECK(o.temperature >= 0 && std::isfinite(o.temperature),
           "sample_token: expected a temperature >= 0 (0 = ", "greedy), got ", o.temperature);
  MP_CHECK(o.top_k >= 0, "sample_token: expected top_k >= 0 (0 = every token), got ", o.top_k);
  int64_t best = 0;
  for (int64_t i = 0; i < V; ++i) {
    MP_CHECK(!std::isnan(logits[static_cast<size_t>(i)]), "sample_token: logit ", i,
             " is NaN; the model's output is not finite (try --precision fp32)");
    if (logits[static_cast<size_t>(i)] > logits[static_cast<size_t>(best)]) best = i;
  }
  if (o.temperature == 0 || o.top_k == 1) return best;

  // The k-th largest logit: the smallest one that can be drawn.
  float threshold = -INFINITY;
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<float> sorted(logits.begin(), logits.end());
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<float>());
    threshold = sorted[static_cast<size_t>(o.top_k - 1)];
  }
  const double top = logits[static_cast<size_t>(best)];
  MP_CHECK(std::isfinite(top), "sample_token: the largest logit is ", top,
           "; expected finite logits (try --precision fp32)");
  std::vector<double> p(static_cast<size_t>(V), 0.0);
  double total = 0;
  for (int64_t i = 0; i < V; ++i) {
    const float l = logits[static_cast<size_t>(i)];
    if (l >= threshold) total += p[static_cast<size_t>(i)] = std::exp((l - top) / o.temperature);
  }
  const U32x4 w = philox_block(o.seed, position);
  const double u = static_cast<double>((static_cast<uint64_t>(w.v[0]) << 21) ^ (w.v[1] >> 11)) * 0x1p-53;
  const double target = u * total;
  double cum = 0;
  int64_t last = best;
  for (int64_t i = 0; i < V; ++i) {
    if (p[static_cast<size_t>(i)] == 0) continue;
    cum += p[static_cast<size_t>(i)];
    last = i;
    if (cum > target) return i;
  }
  return last;  // rounding left target at the very top: the last token that can be drawn
}

int64_t sample_token(const Tensor& logits, const SamplingOptions& o, uint64_t position) {
  MP_CHECK(logits.defined() && (logits.dim() == 1 || (logits.dim() == 2 && logits.size(0) == 1)),
           "sample_token: expected the logits of one position, [V] or [1, V], got ",
           logits.defined() ? shape_str(logits.sizes()) : std::string("an undefined tensor"));
  MP_CHECK(is_floating(logits.dtype()), "sample_token: expected floating logits, got ", dtype_name(logits.dtype()));
  const Tensor l = logits.reshape({-1}).to(kCPU).to(DType::f32).contiguous();
  return sample_token(std::span<const float>(l.data_ptr<float>(), static_cast<size_t>(l.numel())), o, position);
}

}  // namespace mp::models

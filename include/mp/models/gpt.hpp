#pragma once
// A GPT-style decoder-only transformer with nanoGPT's module and parameter names (so its state dict loads into
// nanoGPT's model.py and back): token and position embeddings, pre-LayerNorm blocks of causal self-attention and a
// GELU (tanh) MLP, a final LayerNorm and a language-model head tied to the token embedding.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "mp/nn/dropout.hpp"
#include "mp/nn/embedding.hpp"
#include "mp/nn/layer_norm.hpp"
#include "mp/nn/linear.hpp"
#include "mp/nn/module.hpp"
#include "mp/nn/sequential.hpp"

namespace mp::models {

/// Sizes of a Gpt (nanoGPT's GPTConfig).
struct GptOptions {
  int64_t vocab_size = 0;    ///< V: token embedding rows and head outputs
  int64_t block_size = 256;  ///< T_max: the context length (position embedding rows)
  int64_t n_layer = 6;       ///< transformer blocks
  int64_t n_head = 6;        ///< attention heads (n_embd must divide evenly)
  int64_t n_embd = 384;      ///< C: the model width
  double dropout = 0.0;      ///< on embeddings, attention weights and residual branches
  bool bias = true;          ///< biases in Linear and LayerNorm layers (GPT-2: true)
};

/// The sizes of a named model: gpt-nano (3 layers, 3 heads, width 48: tests), gpt-mini (6, 6, 384, context 256),
/// gpt2 (GPT-2 124M: 12, 12, 768, context 1024). Throws listing the names for another.
GptOptions gpt_preset(const std::string& name, int64_t vocab_size);
/// Whether `name` is a gpt_preset name.
bool is_gpt_model(const std::string& name);

/// The keys and values a Gpt has computed for the positions it has seen, so that each new token costs one
/// position's projections and O(T) attention instead of a forward over the whole sequence (Note [key/value cache]
/// in src/models/gpt.cpp). Filled by Gpt::forward_cached; clear() (or a fresh cache) starts a new sequence.
struct GptKvCache {
  /// Per block: the keys and the values of the cached positions, [B, n_head, length, head_dim] (undefined while
  /// empty), in the dtype and on the device of the model's activations.
  std::vector<Tensor> keys, values;
  /// Positions cached so far (the position id of the next token).
  int64_t length = 0;
  /// Forget every position.
  void clear() {
    keys.clear();
    values.clear();
    length = 0;
  }
};

/// Causal multi-head self-attention (nanoGPT's CausalSelfAttention): c_attn [3C, C] projects x [B, T, C] to q, k,
/// v; heads of C / n_head; mp::scaled_dot_product_attention with the causal mask and attention dropout; c_proj
/// [C, C], then residual dropout.
class CausalSelfAttention : public nn::UnaryModule {
 public:
  explicit CausalSelfAttention(const GptOptions& options);
  /// x [B, T, C] -> [B, T, C].
  Tensor forward(const Tensor& x) override;
  /// The same for T new positions that follow the cached ones: their queries attend to the cached keys `keys`,
  /// `values` ([B, n_head, T_cached, head_dim], undefined when none) and to the new keys up to their own position;
  /// the new keys and values are appended to `keys` and `values`. Inference: no attention dropout.
  Tensor forward_cached(const Tensor& x, Tensor& keys, Tensor& values);

 private:
  // q, k, v of x [B, T, C] as heads [B, n_head, T, head_dim] (c_attn, shared by both forwards).
  std::array<Tensor, 3> heads(const Tensor& x);
  // The heads' output [B, n_head, T, head_dim] -> c_proj, residual dropout: [B, T, C].
  Tensor project(const Tensor& y);

  int64_t n_head_, n_embd_;
  double dropout_;
  std::shared_ptr<nn::Linear> c_attn_, c_proj_;
  std::shared_ptr<nn::Dropout> resid_dropout_;
};

/// One pre-LayerNorm block: x + attn(ln_1(x)), then + mlp(ln_2(x)) with mlp = c_proj(gelu_tanh(c_fc(x))) and
/// dropout (nanoGPT's Block and MLP; names ln_1, attn, ln_2, mlp.c_fc, mlp.c_proj).
class GptBlock : public nn::UnaryModule {
 public:
  explicit GptBlock(const GptOptions& options);
  /// x [B, T, C] -> [B, T, C].
  Tensor forward(const Tensor& x) override;
  /// forward() for positions that follow the cached ones (CausalSelfAttention::forward_cached).
  Tensor forward_cached(const Tensor& x, Tensor& keys, Tensor& values);

 private:
  // h + mlp(ln_2(h)): the second half of the block, shared by both forwards.
  Tensor mlp_residual(const Tensor& h);

  std::shared_ptr<nn::LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<nn::Sequential> mlp_;
};

/// nanoGPT's GPT. Names: transformer.wte.weight [V, C], transformer.wpe.weight [T_max, C],
/// transformer.h.{i}.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias},
/// transformer.ln_f.{weight, bias}, lm_head.weight [V, C] (the very tensor of transformer.wte.weight: one
/// parameter, listed once; the state dict holds both names, as safetensors wants distinct tensors per name on
/// export). Initialisation as nanoGPT: N(0, 0.02) weights, zero biases, c_proj weights N(0, 0.02 / sqrt(2 n_layer)).
class Gpt : public nn::Module {
 public:
  explicit Gpt(const GptOptions& options);
  /// Token ids [B, T] (i64/i32, T <= block_size) -> logits [B, T, V].
  Tensor forward(const Tensor& idx);
  /// Inference with a key/value cache (Note [key/value cache] in src/models/gpt.cpp): token ids [B, T_new] that
  /// follow the cache.length positions in `cache` -> logits [B, T_new, V] of the new positions only (the same as
  /// forward()'s last T_new rows over the whole sequence); their keys and values are appended to the cache. Runs
  /// without autograd and refuses training mode (dropout would make the cached keys differ from a forward's), a
  /// batch size other than the cache's, and cache.length + T_new > block_size (crop the sequence and refill a
  /// cleared cache).
  Tensor forward_cached(const Tensor& idx_new, GptKvCache& cache);
  /// nanoGPT's get_num_params(): every parameter once (the tied head counted with wte), less the position embedding.
  int64_t num_parameters() const;
  /// The options it was built with.
  const GptOptions& options() const { return options_; }

 private:
  // drop(wte(idx) + wpe(start..start + T - 1)) for idx [B, T], after checking the ids' shape and the positions.
  Tensor embed(const Tensor& idx, int64_t start);

  GptOptions options_;
  std::vector<std::shared_ptr<GptBlock>> blocks_;  // the modules of h_, for forward_cached
  std::shared_ptr<nn::Module> transformer_;
  std::shared_ptr<nn::Embedding> wte_, wpe_;
  std::shared_ptr<nn::Dropout> drop_;
  std::shared_ptr<nn::Sequential> h_;
  std::shared_ptr<nn::LayerNorm> ln_f_;
  std::shared_ptr<nn::Linear> lm_head_;
};

}  // namespace mp::models

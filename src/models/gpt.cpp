// models::Gpt: nanoGPT's GPT (token + position embeddings, pre-LayerNorm blocks, tied head).
#include "mp/models/gpt.hpp"

#include <cmath>

#include "mp/autograd/node.hpp"
#include "mp/nn/activation.hpp"
#include "mp/nn/init.hpp"
#include "mp/ops/attention.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/shape.hpp"

namespace mp::models {

GptOptions gpt_preset(const std::string& name, int64_t vocab_size) {
  GptOptions o{.vocab_size = vocab_size};
  if (name == "gpt-nano") {
    o.block_size = 64, o.n_layer = 3, o.n_head = 3, o.n_embd = 48;
  } else if (name == "gpt-mini") {
    o.block_size = 256, o.n_layer = 6, o.n_head = 6, o.n_embd = 384;
  } else if (name == "gpt2") {
    o.block_size = 1024, o.n_layer = 12, o.n_head = 12, o.n_embd = 768;
  } else {
    MP_FAIL("gpt_preset: expected gpt-nano, gpt-mini or gpt2, got '", name, "'");
  }
  return o;
}

bool is_gpt_model(const std::string& name) { return name == "gpt-nano" || name == "gpt-mini" || name == "gpt2"; }

namespace {

GptOptions checked(const GptOptions& o) {
  MP_CHECK(o.vocab_size > 0 && o.block_size > 0 && o.n_layer > 0 && o.n_head > 0 && o.n_embd > 0,
           "Gpt: expected positive vocab_size, block_size, n_layer, n_head and n_embd, got ", o.vocab_size, ", ",
           o.block_size, ", ", o.n_layer, ", ", o.n_head, ", ", o.n_embd);
  MP_CHECK(o.n_embd % o.n_head == 0, "Gpt: n_embd ", o.n_embd, " is not a multiple of n_head ", o.n_head,
           "; every head gets n_embd / n_head channels");
  MP_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, "Gpt: expected dropout in [0, 1), got ", o.dropout);
  return o;
}

nn::LayerNormOptions layer_norm(const GptOptions& o) { return {.normalized_shape = {o.n_embd}, .bias = o.bias}; }

}  // namespace

CausalSelfAttention::CausalSelfAttention(const GptOptions& o)
    : nn::UnaryModule("CausalSelfAttention"), n_head_(o.n_head), n_embd_(o.n_embd), dropout_(o.dropout) {
  c_attn_ = register_module("c_attn", std::make_shared<nn::Linear>(o.n_embd, 3 * o.n_embd, o.bias));
  c_proj_ = register_module("c_proj", std::make_shared<nn::Linear>(o.n_embd, o.n_embd, o.bias));
  resid_dropout_ = register_module("resid_dropout", std::make_shared<nn::Dropout>(o.dropout));
}

std::array<Tensor, 3> CausalSelfAttention::heads(const Tensor& x) {
  MP_CHECK(x.dim() == 3 && x.size(2) == n_embd_, "CausalSelfAttention: expected x of shape [B, T, ", n_embd_, "], got ",
           shape_str(x.sizes()));
  const int64_t B = x.size(0), T = x.size(1), C = n_embd_, D = C / n_head_;
  const Tensor qkv = (*c_attn_)(x);  // [B, T, 3C]
  auto head = [&](int64_t i) { return qkv.narrow(2, i * C, C).reshape({B, T, n_head_, D}).transpose(1, 2); };
  return {head(0), head(1), head(2)};
}

Tensor CausalSelfAttention::project(const Tensor& y) {
  const int64_t B = y.size(0), T = y.size(2);
  return (*resid_dropout_)((*c_proj_)(y.transpose(1, 2).reshape({B, T, n_embd_})));
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  const auto [q, k, v] = heads(x);
  return project(scaled_dot_product_attention(q, k, v, {.causal = true, .dropout_p = is_training() ? dropout_ : 0.0}));
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, Tensor& keys, Tensor& values) {
  auto [q, k, v] = heads(x);
  const int64_t cached = keys.defined() ? keys.size(2) : 0, T = q.size(2);
  if (cached > 0) {
    k = cat({keys, k}, 2);
    v = cat({values, v}, 2);
  }
  keys = k.contiguous();
  values = v.contiguous();
  AttentionOptions o;
  if (cached == 0) {
    o.causal = true;  // top-left aligned, as forward(): the same rule when there are as many keys as queries
  } else if (T > 1) {
    // Bottom-right aligned: new query i sits at position cached + i and sees keys 0..cached + i.
    const TensorOptions pos{.dtype = DType::i64, .device = x.device()};
    o.mask = le(arange(0, static_cast<double>(cached + T), 1.0, pos).reshape({1, cached + T}),
                arange(static_cast<double>(cached), static_cast<double>(cached + T), 1.0, pos).reshape({T, 1}));
  }  // one new query: it sees every key, no mask
  return project(scaled_dot_product_attention(q, keys, values, o));
}

GptBlock::GptBlock(const GptOptions& o) : nn::UnaryModule("Block") {
  ln_1_ = register_module("ln_1", std::make_shared<nn::LayerNorm>(layer_norm(o)));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(o));
  ln_2_ = register_module("ln_2", std::make_shared<nn::LayerNorm>(layer_norm(o)));
  // nanoGPT's MLP: c_fc, gelu (tanh), c_proj, dropout, in a chain named as its attributes.
  mlp_ = register_module("mlp", std::make_shared<nn::Sequential>());
  mlp_->push_back("c_fc", std::make_shared<nn::Linear>(o.n_embd, 4 * o.n_embd, o.bias));
  mlp_->push_back("gelu", std::make_shared<nn::GELU>(GeluApproximate::tanh));
  mlp_->push_back("c_proj", std::make_shared<nn::Linear>(4 * o.n_embd, o.n_embd, o.bias));
  mlp_->push_back("dropout", std::make_shared<nn::Dropout>(o.dropout));
}

Tensor GptBlock::mlp_residual(const Tensor& h) { return add(h, (*mlp_)((*ln_2_)(h))); }

Tensor GptBlock::forward(const Tensor& x) { return mlp_residual(add(x, (*attn_)((*ln_1_)(x)))); }

Tensor GptBlock::forward_cached(const Tensor& x, Tensor& keys, Tensor& values) {
  return mlp_residual(add(x, attn_->forward_cached((*ln_1_)(x), keys, values)));
}

Gpt::Gpt(const GptOptions& options) : nn::Module("GPT"), options_(checked(options)) {
  const GptOptions& o = options_;
  transformer_ = register_module("transformer", std::make_shared<nn::Module>("ModuleDict"));
  wte_ = transformer_->register_module("wte", std::make_shared<nn::Embedding>(o.vocab_size, o.n_embd));
  wpe_ = transformer_->register_module("wpe", std::make_shared<nn::Embedding>(o.block_size, o.n_embd));
  drop_ = transformer_->register_module("drop", std::make_shared<nn::Dropout>(o.dropout));
  h_ = transformer_->register_module("h", std::make_shared<nn::Sequential>());
  for (int64_t i = 0; i < o.n_layer; ++i) {
    blocks_.push_back(std::make_shared<GptBlock>(o));
    h_->push_back(blocks_.back());
  }
  ln_f_ = transformer_->register_module("ln_f", std::make_shared<nn::LayerNorm>(layer_norm(o)));
  lm_head_ = register_module("lm_head", std::make_shared<nn::Linear>(o.n_embd, o.vocab_size, false));
  lm_head_->tie_weight(wte_->weight());  // nanoGPT: self.transformer.wte.weight = self.lm_head.weight

  // nanoGPT's _init_weights, then the scaled residual projections.
  for (const auto& [name, p] : named_parameters()) {
    if (name.ends_with(".bias")) {
      nn::init::zeros_(p);
    } else if (name.find("ln_") == std::string::npos) {
      const bool residual = name.ends_with("c_proj.weight");
      nn::init::normal_(p, 0.0, residual ? 0.02 / std::sqrt(2.0 * static_cast<double>(o.n_layer)) : 0.02);
    }
  }
}

Tensor Gpt::embed(const Tensor& idx, int64_t start) {
  MP_CHECK(idx.dim() == 2, "Gpt: expected token ids of shape [B, T], got ", shape_str(idx.sizes()));
  const int64_t T = idx.size(1);
  MP_CHECK(T >= 1 && start + T <= options_.block_size, "Gpt: a sequence of ", start + T,
           " tokens does not fit the context of ", options_.block_size, " (block_size); use at most block_size tokens");
  const Tensor pos = arange(static_cast<double>(start), static_cast<double>(start + T), 1.0,
                            {.dtype = DType::i64, .device = idx.device()});
  return (*drop_)(add((*wte_)(idx), (*wpe_)(pos)));  // [B, T, C] + [T, C]
}

Tensor Gpt::forward(const Tensor& idx) {
  const Tensor x = (*h_)(embed(idx, 0));
  return (*lm_head_)((*ln_f_)(x));
}

// Note [key/value cache]
// Generating token t+1 with forward() recomputes every layer for all t positions: O(t) projections and MLPs and
// O(t^2) attention per new token. But a causal model's keys and values at a position depend only on the tokens up
// to it, so forward_cached keeps each block's keys and values [B, n_head, T_cached, head_dim] (GptKvCache) and runs
// the blocks on the new positions alone: their position ids continue from cache.length, their keys and values are
// appended, and their queries attend to all T_cached + T_new keys. Per new token that is one position's
// projections and MLP and O(T) attention. The mask: one new query may see every key (no mask); several new queries
// after a non-empty cache need the causal mask aligned to the bottom right (query i sees keys 0..T_cached + i), which
// is not scaled_dot_product_attention's top-left `causal`, so it is passed as a bool mask; an empty cache is
// forward()'s case and uses `causal`. The logits equal forward()'s over the whole sequence up to rounding (other
// GEMM shapes and attention tiles sum in another order: tests/models/test_models_gpt.cpp states the tolerance).
// The blocks' own modules do the work (no copy of the weights); the cache holds activations in the model's dtype.
// Appending is a cat: O(T) bytes per token, the same order as the attention that reads them. Training mode is
// refused: dropout on the cached keys' inputs would freeze one dropout draw into every later step.
Tensor Gpt::forward_cached(const Tensor& idx_new, GptKvCache& cache) {
  MP_CHECK(!is_training(),
           "Gpt::forward_cached: the key/value cache is for inference; call eval() first (dropout in "
           "training mode would be frozen into the cached keys)");
  MP_CHECK(idx_new.dim() == 2 && idx_new.size(1) >= 1, "Gpt::forward_cached: expected token ids of shape [B, T_new] ",
           "with T_new >= 1, got ", shape_str(idx_new.sizes()));
  const int64_t T = idx_new.size(1), n = static_cast<int64_t>(blocks_.size());
  MP_CHECK(cache.length >= 0 && cache.length + T <= options_.block_size, "Gpt::forward_cached: the cache holds ",
           cache.length, " positions and ", T, " new ones make ", cache.length + T, ", more than the context of ",
           options_.block_size, " (block_size); crop the sequence to its last tokens and refill a cleared cache");
  if (cache.length == 0) {
    cache.keys.assign(static_cast<size_t>(n), Tensor());
    cache.values.assign(static_cast<size_t>(n), Tensor());
  }
  MP_CHECK(static_cast<int64_t>(cache.keys.size()) == n && static_cast<int64_t>(cache.values.size()) == n,
           "Gpt::forward_cached: the cache has ", cache.keys.size(), " blocks, the model ", n,
           "; use one cache per model");
  MP_CHECK(cache.length == 0 || (cache.keys[0].defined() && cache.keys[0].size(0) == idx_new.size(0) &&
                                 cache.keys[0].size(2) == cache.length),
           "Gpt::forward_cached: expected ", cache.length == 0 ? 0 : cache.keys[0].size(0),
           " sequences, as the cache holds, got token ids ", shape_str(idx_new.sizes()),
           "; clear() the cache to start other sequences");
  autograd::NoGradGuard no_grad;
  Tensor x = embed(idx_new, cache.length);
  for (int64_t i = 0; i < n; ++i) {
    const auto b = static_cast<size_t>(i);
    x = blocks_[b]->forward_cached(x, cache.keys[b], cache.values[b]);
  }
  cache.length += T;
  return (*lm_head_)((*ln_f_)(x));
}

int64_t Gpt::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, p] : named_parameters())
    if (name != "transformer.wpe.weight") n += p.numel();
  return n;
}

}  // namespace mp::models

// models::Gpt: nanoGPT's GPT (token + position embeddings, pre-LayerNorm blocks, tied head).
#include "mp/models/gpt.hpp"

#include <cmath>

#include "mp/nn/activation.hpp"
#include "mp/nn/init.hpp"
#include "mp/ops/attention.hpp"
#include "mp/ops/pointwise.hpp"

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

Tensor CausalSelfAttention::forward(const Tensor& x) {
  MP_CHECK(x.dim() == 3 && x.size(2) == n_embd_, "CausalSelfAttention: expected x of shape [B, T, ", n_embd_, "], got ",
           shape_str(x.sizes()));
  const int64_t B = x.size(0), T = x.size(1), C = n_embd_, D = C / n_head_;
  const Tensor qkv = (*c_attn_)(x);  // [B, T, 3C]
  auto head = [&](int64_t i) { return qkv.narrow(2, i * C, C).reshape({B, T, n_head_, D}).transpose(1, 2); };
  const Tensor y = scaled_dot_product_attention(head(0), head(1), head(2),
                                                {.causal = true, .dropout_p = is_training() ? dropout_ : 0.0});
  return (*resid_dropout_)((*c_proj_)(y.transpose(1, 2).reshape({B, T, C})));
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

Tensor GptBlock::forward(const Tensor& x) {
  const Tensor h = add(x, (*attn_)((*ln_1_)(x)));
  return add(h, (*mlp_)((*ln_2_)(h)));
}

Gpt::Gpt(const GptOptions& options) : nn::Module("GPT"), options_(checked(options)) {
  const GptOptions& o = options_;
  transformer_ = register_module("transformer", std::make_shared<nn::Module>("ModuleDict"));
  wte_ = transformer_->register_module("wte", std::make_shared<nn::Embedding>(o.vocab_size, o.n_embd));
  wpe_ = transformer_->register_module("wpe", std::make_shared<nn::Embedding>(o.block_size, o.n_embd));
  drop_ = transformer_->register_module("drop", std::make_shared<nn::Dropout>(o.dropout));
  h_ = transformer_->register_module("h", std::make_shared<nn::Sequential>());
  for (int64_t i = 0; i < o.n_layer; ++i) h_->push_back(std::make_shared<GptBlock>(o));
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

Tensor Gpt::forward(const Tensor& idx) {
  MP_CHECK(idx.dim() == 2, "Gpt: expected token ids of shape [B, T], got ", shape_str(idx.sizes()));
  const int64_t T = idx.size(1);
  MP_CHECK(T >= 1 && T <= options_.block_size, "Gpt: a sequence of ", T, " tokens does not fit the context of ",
           options_.block_size, " (block_size); use at most block_size tokens");
  const Tensor pos = arange(T, {.dtype = DType::i64, .device = idx.device()});
  Tensor x = (*drop_)(add((*wte_)(idx), (*wpe_)(pos)));  // [B, T, C] + [T, C]
  x = (*h_)(x);
  return (*lm_head_)((*ln_f_)(x));
}

int64_t Gpt::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, p] : named_parameters())
    if (name != "transformer.wpe.weight") n += p.numel();
  return n;
}

}  // namespace mp::models

#include "mp/optim/ema.hpp"

#include <map>
#include <string>

#include "mp/core/error.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/optimizer.hpp"

namespace mp::optim {

// Note [weight EMA in f32]
// An exponential moving average of the weights, avg = d * avg + (1 - d) * w, moves by (1 - d) of the
// distance to the current weights per step: with d = 0.999, 0.1% of it. Half the spacing of bf16 numbers
// is at least 2^-9 (0.2%) of their size, so an average stored in bf16 would round such moves away and
// stall, as O3's weights lose sub-half-ulp updates (Note [stochastic rounding]); in f16 (half-spacing
// >= 2^-12, 0.024%) each move would carry a rounding error of up to half its size. So the averages are
// f32 whatever the model's dtypes, updated through f32 arithmetic (add_ widens a 16-bit operand); when
// the optimizer keeps f32 masters (O2) a parameter's master, not its 16-bit rounding, is what is
// averaged (matched by the data it aliases, so a tied weight gets its master under both names). Batch
// norm's running statistics are averaged too (timm's ModelEmaV2 does the same), integer buffers are
// copied. The averages start at the weights they were built from and forget them after ~1/(1 - d)
// updates (1000 for 0.999; there is no warm-up of d), so short runs want a smaller d. Evaluating with
// the averages loads them into the model, rounded to its dtypes (16-bit weights under O2/O3), inside a
// Swap that restores the model's own state bit for bit.

namespace {

// The f32 value each entry contributes: a parameter's master when the optimizer keeps masters (a master
// restored from an O2 checkpoint into a run without them is stale). Entries are matched to parameters by
// the data they alias: a tied weight is one parameter under two state-dict names.
nn::StateDict current(const nn::Module& model, const Optimizer* opt) {
  nn::StateDict sd = model.state_dict();
  if (opt == nullptr || !opt->master_weights()) return sd;
  std::map<const void*, Tensor> masters;
  for (const Tensor& p : model.parameters())
    if (const Tensor m = opt->master(p); m.defined()) masters.emplace(p.raw_data(), m.detach());
  for (const std::string& name : sd.keys())
    if (const auto it = masters.find(sd.at(name).raw_data()); it != masters.end()) sd.set(name, it->second);
  return sd;
}

}  // namespace

ModelEma::ModelEma(const nn::Module& model, double decay, const Optimizer* opt) : decay_(decay) {
  MP_CHECK(decay >= 0 && decay < 1, "ModelEma: decay must be in [0, 1), got ", decay);
  for (const auto& [name, t] : current(model, opt))
    avg_.insert(name, is_floating(t.dtype()) ? t.to(DType::f32).clone() : t.clone());
}

void ModelEma::update(const nn::Module& model, const Optimizer* opt) {
  const nn::StateDict now = current(model, opt);
  MP_CHECK(now.size() == avg_.size(), "ModelEma::update: the model has ", now.size(), " state entries, the average ",
           avg_.size(), "; average the model it was built from");
  for (const auto& [name, w] : now) {
    const Tensor* a = avg_.find(name);
    MP_CHECK(a != nullptr && a->sizes() == w.sizes(), "ModelEma::update: entry '", name,
             "' does not match the average (", a == nullptr ? std::string("absent") : a->describe(), " vs ",
             w.describe(), "); average the model it was built from");
    Tensor avg = *a;
    if (!is_floating(avg.dtype())) {
      avg.copy_(w);
      continue;
    }
    mul_(avg, decay_);
    add_(avg, w, 1.0 - decay_);
  }
  ++updates_;
}

nn::StateDict ModelEma::state_dict() const {
  nn::StateDict sd = avg_;
  MP_CHECK(!sd.contains("num_updates"), "ModelEma: the model has a state entry named 'num_updates'");
  sd.insert("num_updates", scalar_tensor(static_cast<double>(updates_), {.dtype = DType::i64}));
  return sd;
}

void ModelEma::load_state_dict(const nn::StateDict& state) {
  const Tensor* n = state.find("num_updates");
  MP_CHECK(n != nullptr && n->numel() == 1 && !is_floating(n->dtype()),
           "ModelEma::load_state_dict: expected an integer 'num_updates' entry, got ",
           n == nullptr ? std::string("none") : n->describe());
  MP_CHECK(state.size() == avg_.size() + 1, "ModelEma::load_state_dict: expected ", avg_.size(),
           " averages and 'num_updates', got ", state.size(), " entries; was it saved from another model?");
  for (const auto& [name, a] : avg_) {
    const Tensor* t = state.find(name);
    MP_CHECK(t != nullptr, "ModelEma::load_state_dict: the average of '", name, "' is missing");
    MP_CHECK(t->sizes() == a.sizes() && t->dtype() == a.dtype(), "ModelEma::load_state_dict: '", name, "' is ",
             t->describe(), ", expected ", a.describe());
  }
  for (const auto& [name, a] : avg_) {
    Tensor dst = a;
    dst.copy_(state.at(name));
  }
  updates_ = n->to(DType::i64).item<int64_t>();
}

ModelEma::Swap::Swap(nn::Module& model, const nn::StateDict& averages)
    : model_(model), saved_(model.state_dict().clone()) {
  model_.load_state_dict(averages, /*strict=*/true);
}

ModelEma::Swap::~Swap() {
  try {
    model_.load_state_dict(saved_, /*strict=*/true);
  } catch (...) {
    // the saved state came from this model, so it fits; nothing can be done in a destructor anyway
  }
}

}  // namespace mp::optim

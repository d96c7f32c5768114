// optim::Optimizer: parameter bookkeeping, per-parameter state, state dicts.
#include "mp/optim/optimizer.hpp"

#include <algorithm>

#include "mp/autograd/node.hpp"

namespace mp::optim {

DType state_dtype(DType param_dtype) { return param_dtype == DType::f64 ? DType::f64 : DType::f32; }

Optimizer::~Optimizer() = default;

void Optimizer::zero_grad() {
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& p : group_params(g)) p.set_grad(Tensor());
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> out;
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& p : group_params(g)) out.push_back(p);
  return out;
}

const ParamState* Optimizer::state(const Tensor& p) const {
  auto it = state_.find(p.impl_ptr().get());
  return it == state_.end() ? nullptr : &it->second;
}

ParamState& Optimizer::state_for(const Tensor& p) { return state_[p.impl_ptr().get()]; }

Tensor& Optimizer::state_buffer(ParamState& st, const Tensor& p, const std::string& name, bool* created) {
  auto it = st.buffers.find(name);
  if (created != nullptr) *created = it == st.buffers.end();
  if (it != st.buffers.end()) return it->second;
  return st.buffers[name] = zeros(p.sizes(), {.dtype = state_dtype(p.dtype()), .device = p.device()});
}

Tensor Optimizer::master_for_step(ParamState& st, const Tensor& p) {
  if (!master_weights_ || !is_low_precision(p.dtype())) return Tensor();
  auto it = st.buffers.find("master");
  if (it != st.buffers.end()) return it->second;
  return st.buffers["master"] = p.detach().to(DType::f32).contiguous();
}

void Optimizer::set_master(const Tensor& p, const Tensor& master) {
  MP_CHECK(master.defined() && master.dtype() == DType::f32 && master.sizes() == p.sizes(),
           "set_master: expected an f32 master of shape ", shape_str(p.sizes()), ", got ", master.describe());
  state_for(p).buffers["master"] = master.detach().contiguous();
}

void Optimizer::drop_master(const Tensor& p) {
  auto it = state_.find(p.impl_ptr().get());
  if (it != state_.end()) it->second.buffers.erase("master");
}

void Optimizer::move_state(const Tensor& from, const Tensor& to) {
  auto it = state_.find(from.impl_ptr().get());
  if (it == state_.end()) return;
  ParamState st = std::move(it->second);
  state_.erase(it);
  state_[to.impl_ptr().get()] = std::move(st);
}

Tensor Optimizer::master(const Tensor& p) const {
  const ParamState* st = state(p);
  if (st == nullptr) return Tensor();
  auto it = st->buffers.find("master");
  return it == st->buffers.end() ? Tensor() : it->second;
}

void Optimizer::check_new_param(const Tensor& p, const char* optimizer) const {
  MP_CHECK(p.defined(), optimizer, ": got an undefined parameter");
  MP_CHECK(is_floating(p.dtype()), optimizer, ": can only optimize floating tensors, got ", p.describe());
  MP_CHECK(p.is_leaf(), optimizer, ": can't optimize a non-leaf tensor (", p.describe(),
           "); pass the module's parameters, or detach() and requires_grad_() a copy");
  for (size_t g = 0; g < num_param_groups(); ++g)
    for (const Tensor& q : group_params(g))
      MP_CHECK(q.impl_ptr() != p.impl_ptr(), optimizer, ": a parameter (", p.describe(), ") is already in group ", g,
               "; each parameter may appear in one group only");
}

Tensor Optimizer::grad_for_step(const Tensor& p, const char* optimizer) {
  Tensor g = p.grad();
  if (!g.defined()) return g;
  MP_CHECK(g.sizes() == p.sizes(), optimizer, ": gradient ", g.describe(), " does not match its parameter ",
           p.describe());
  MP_CHECK(g.device() == p.device(), optimizer, ": gradient on ", g.device().str(), " but parameter on ",
           p.device().str());
  MP_CHECK(is_floating(g.dtype()), optimizer, ": expected a floating gradient, got ", g.describe());
  return g.contiguous();
}

Tensor Optimizer::update_target(const Tensor& p) { return p.is_contiguous() ? p : p.detach().clone(); }

void Optimizer::write_back(const Tensor& p, const Tensor& target) {
  if (target.raw_data() != p.raw_data()) {
    Tensor dst = p.detach();
    dst.copy_(target);
  }
  p.bump_version();
}

// ---------------------------------------------------------------- state dicts

OptimizerStateDict Optimizer::state_dict() const {
  OptimizerStateDict sd;
  int64_t index = 0;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    ParamGroupState gs{group_options(g), {}};
    for (const Tensor& p : group_params(g)) {
      if (const ParamState* st = state(p)) sd.state.emplace(index, *st);
      gs.params.push_back(index++);
    }
    sd.param_groups.push_back(std::move(gs));
  }
  return sd;
}

void Optimizer::load_state_dict(const OptimizerStateDict& sd) {
  constexpr const char* op = "Optimizer::load_state_dict";
  MP_CHECK(sd.param_groups.size() == num_param_groups(), op, ": the state dict has ", sd.param_groups.size(),
           " parameter groups, this optimizer ", num_param_groups(), "; build the optimizer with the same groups");
  std::vector<Tensor> params(parameters().size());  // by the saved indices
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const auto& mine = group_params(g);
    const auto& saved = sd.param_groups[g].params;
    MP_CHECK(saved.size() == mine.size(), op, ": group ", g, " has ", saved.size(), " parameters in the state dict, ",
             mine.size(), " in this optimizer");
    for (size_t i = 0; i < mine.size(); ++i) {
      MP_CHECK(saved[i] >= 0 && static_cast<size_t>(saved[i]) < params.size() &&
                   !params[static_cast<size_t>(saved[i])].defined(),
               op, ": parameter index ", saved[i], " is out of range [0, ", params.size(),
               ") or appears twice in the state dict's groups");
      params[static_cast<size_t>(saved[i])] = mine[i];
    }
  }
  for (const auto& [idx, st] : sd.state) {
    MP_CHECK(idx >= 0 && static_cast<size_t>(idx) < params.size() && params[static_cast<size_t>(idx)].defined(), op,
             ": state for parameter index ", idx, ", which no group lists");
    const Tensor& p = params[static_cast<size_t>(idx)];
    for (const auto& [name, t] : st.buffers)
      MP_CHECK(t.defined() && t.sizes() == p.sizes(), op, ": state '", name, "' of parameter ", idx, " has shape ",
               t.defined() ? shape_str(t.sizes()) : std::string("(undefined)"), ", the parameter ",
               shape_str(p.sizes()));
  }
  // Validate every group's options before changing anything.
  for (size_t g = 0; g < num_param_groups(); ++g) {
    // set_group_options validates; apply to a scratch copy first by round-tripping current options.
    const OptionsMap before = group_options(g);
    set_group_options(g, sd.param_groups[g].options);
    set_group_options(g, before);
  }
  autograd::NoGradGuard ng;
  state_.clear();
  for (const auto& [idx, st] : sd.state) {
    const Tensor& p = params[static_cast<size_t>(idx)];
    ParamState& mine = state_for(p);
    mine.step = st.step;
    for (const auto& [name, t] : st.buffers) {
      Tensor copy = empty(p.sizes(), {.dtype = state_dtype(p.dtype()), .device = p.device()});
      copy.copy_(t);
      mine.buffers[name] = copy;
    }
  }
  for (size_t g = 0; g < num_param_groups(); ++g) set_group_options(g, sd.param_groups[g].options);
}

// ---------------------------------------------------------------- flat form

nn::StateDict OptimizerStateDict::flatten() const {
  nn::StateDict out;
  for (const auto& [idx, st] : state) {
    const std::string pre = "state." + std::to_string(idx) + ".";
    out.insert(pre + "step", scalar_tensor(static_cast<double>(st.step), {.dtype = DType::i64}));
    for (const auto& [name, t] : st.buffers) out.insert(pre + name, t);
  }
  for (size_t g = 0; g < param_groups.size(); ++g) {
    const std::string pre = "param_groups." + std::to_string(g) + ".";
    const auto& idx = param_groups[g].params;
    out.insert(pre + "params", from_vector<int64_t>(idx, {static_cast<int64_t>(idx.size())}));
    for (const auto& [name, v] : param_groups[g].options)
      out.insert(pre + name, scalar_tensor(v, {.dtype = DType::f64}));
  }
  return out;
}

OptimizerStateDict OptimizerStateDict::unflatten(const nn::StateDict& flat) {
  OptimizerStateDict sd;
  for (const auto& [key, t] : flat) {
    // "<section>.<number>.<name>"
    const size_t a = key.find('.'), b = a == std::string::npos ? a : key.find('.', a + 1);
    MP_CHECK(b != std::string::npos && b > a + 1 && b + 1 < key.size(),
             "OptimizerStateDict::unflatten: cannot parse key '", key,
             "'; expected state.<index>.<name> or param_groups.<index>.<name>");
    const std::string section = key.substr(0, a), name = key.substr(b + 1);
    int64_t n = -1;
    try {
      n = std::stoll(key.substr(a + 1, b - a - 1));
    } catch (const std::exception&) { MP_FAIL("OptimizerStateDict::unflatten: key '", key, "' has no numeric index"); }
    MP_CHECK(n >= 0 && t.defined(), "OptimizerStateDict::unflatten: bad index or undefined tensor at '", key, "'");
    if (section == "state") {
      if (name == "step") {
        sd.state[n].step = static_cast<int64_t>(t.item_double());
      } else {
        sd.state[n].buffers[name] = t;
      }
    } else if (section == "param_groups") {
      if (sd.param_groups.size() <= static_cast<size_t>(n)) sd.param_groups.resize(static_cast<size_t>(n) + 1);
      if (name == "params") {
        sd.param_groups[static_cast<size_t>(n)].params = t.to_vector<int64_t>();
      } else {
        sd.param_groups[static_cast<size_t>(n)].options[name] = t.item_double();
      }
    } else {
      MP_FAIL("OptimizerStateDict::unflatten: unknown section '", section, "' in key '", key,
              "'; expected 'state' or 'param_groups'");
    }
  }
  return sd;
}

// ---------------------------------------------------------------- option helpers

namespace detail {

void read_option(const OptionsMap& m, const char* key, double& dst) {
  auto it = m.find(key);
  if (it != m.end()) dst = it->second;
}

void read_option(const OptionsMap& m, const char* key, bool& dst) {
  auto it = m.find(key);
  if (it != m.end()) dst = it->second != 0.0;
}

void check_option_keys(const OptionsMap& m, std::initializer_list<const char*> known, const char* optimizer) {
  for (const auto& [k, v] : m) {
    const bool ok = std::any_of(known.begin(), known.end(), [&](const char* s) { return k == s; });
    if (ok) continue;
    std::string list;
    for (const char* s : known) list += (list.empty() ? "" : ", ") + std::string(s);
    MP_FAIL(optimizer, ": unknown hyper-parameter '", k, "'; known: ", list);
  }
}

}  // namespace detail

}  // namespace mp::optim

// nn::Module: registration, traversal with dotted names, modes, dtype conversion, state dicts, printing.
#include "mp/nn/module.hpp"

#include <algorithm>
#include <map>
#include <ostream>
#include <sstream>
#include <unordered_set>

#include "mp/autograd/node.hpp"

namespace mp::nn {

namespace {

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string join_list(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += '\'';
    s += v[i];
    s += '\'';
  }
  return s;
}

}  // namespace

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}
Module::~Module() = default;

void Module::check_new_name(const std::string& name, const char* what) const {
  MP_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, "::", what, ": name '", name,
           "' must be non-empty and contain no '.' (dots separate nesting levels)");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& e) { return e.name == name; });
  };
  const bool child = std::any_of(children_.begin(), children_.end(), [&](const auto& c) { return c.first == name; });
  MP_CHECK(!taken(params_) && !taken(buffers_) && !child, type_name_, "::", what, ": name '", name,
           "' is already used by a parameter, buffer or child module of this module; pick another name");
}

Tensor& Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "register_parameter");
  if (t.defined()) {
    MP_CHECK(is_floating(t.dtype()) || !requires_grad, type_name_, "::register_parameter: parameter '", name,
             "' must be floating to require gradients, got ", t.describe(), "; convert it with .to(mp::DType::f32)");
    if (!t.is_leaf()) t = t.detach();
    t.requires_grad_(requires_grad);
  }
  params_.push_back({name, std::move(t), true});
  return params_.back().tensor;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t, bool persistent) {
  check_new_name(name, "register_buffer");
  if (t.defined() && !t.is_leaf()) t = t.detach();
  buffers_.push_back({name, std::move(t), persistent});
  return buffers_.back().tensor;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  MP_CHECK(module != nullptr, type_name_, "::register_module: module '", name,
           "' is null; create it with std::make_shared");
  MP_CHECK(module.get() != this, type_name_, "::register_module: a module cannot be its own child ('", name, "')");
  check_new_name(name, "register_module");
  children_.emplace_back(name, std::move(module));
}

Tensor& Module::parameter_slot(const std::string& name) {
  for (Entry& e : params_)
    if (e.name == name) return e.tensor;
  MP_FAIL(type_name_, ": no parameter named '", name, "'");
}

// ---------------------------------------------------------------- traversal

void Module::collect(const std::string& prefix, bool recurse, bool buffers,
                     std::vector<std::pair<std::string, Tensor>>& out, std::vector<const TensorImpl*>& seen) const {
  for (const Entry& e : buffers ? buffers_ : params_) {
    if (!e.tensor.defined()) continue;
    const TensorImpl* key = e.tensor.impl_ptr().get();
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;  // shared (tied) tensors once
    seen.push_back(key);
    out.emplace_back(join_name(prefix, e.name), e.tensor);
  }
  if (!recurse) return;
  for (const auto& [name, child] : children_) child->collect(join_name(prefix, name), true, buffers, out, seen);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  collect("", recurse, false, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<const TensorImpl*> seen;
  collect("", recurse, true, out, seen);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_buffers(recurse)) out.push_back(t);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& c : children_) out.push_back(c.second);
  return out;
}

void Module::collect_modules(const std::string& prefix, std::vector<std::pair<std::string, const Module*>>& out) const {
  for (const auto& seen : out)
    if (seen.second == this) return;  // a module reachable twice is listed once
  out.emplace_back(prefix, this);
  for (const auto& [name, child] : children_) child->collect_modules(join_name(prefix, name), out);
}

std::vector<std::pair<std::string, const Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, const Module*>> out;
  collect_modules("", out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [n, m] : std::as_const(*this).named_modules()) out.emplace_back(n, const_cast<Module*>(m));
  return out;
}

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t n = 0;
  for (const Tensor& p : parameters())
    if (!trainable_only || p.requires_grad()) n += p.numel();
  return n;
}

// ---------------------------------------------------------------- modes and conversion

void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

void Module::to(DType dtype) {
  to(dtype, [](const Module&) { return true; });
}

void Module::to(DType dtype, const ModulePredicate& convert) {
  MP_CHECK(is_floating(dtype), type_name_, "::to: expected a floating dtype (f32, f64, f16, bf16), got ",
           dtype_name(dtype), "; modules convert only their floating parameters and buffers");
  autograd::NoGradGuard ng;
  // Old tensor -> (old kept alive so its address is not reused, new): tied tensors stay tied.
  std::map<const TensorImpl*, std::pair<Tensor, Tensor>> done;
  auto convert_slot = [&](Tensor& slot, bool is_param) {
    if (!slot.defined() || !is_floating(slot.dtype()) || slot.dtype() == dtype) return;
    auto it = done.find(slot.impl_ptr().get());
    if (it != done.end()) {
      slot = it->second.second;
      return;
    }
    Tensor n = slot.detach().to(dtype);
    if (is_param) {
      n.requires_grad_(slot.requires_grad());
      if (slot.grad().defined()) n.set_grad(slot.grad().detach().to(dtype));
    }
    done.emplace(slot.impl_ptr().get(), std::make_pair(slot, n));
    slot = n;
  };
  for (auto& [name, m] : named_modules()) {
    if (!convert(*m)) continue;
    for (Entry& e : m->params_) convert_slot(e.tensor, true);
    for (Entry& e : m->buffers_) convert_slot(e.tensor, false);
  }
}

void Module::to(Device device) {
  autograd::NoGradGuard ng;
  std::map<const TensorImpl*, std::pair<Tensor, Tensor>> done;
  auto move_slot = [&](Tensor& slot, bool is_param) {
    if (!slot.defined() || slot.device() == device) return;
    auto it = done.find(slot.impl_ptr().get());
    if (it != done.end()) {
      slot = it->second.second;
      return;
    }
    Tensor n = slot.detach().to(device);
    if (is_param) {
      n.requires_grad_(slot.requires_grad());
      if (slot.grad().defined()) n.set_grad(slot.grad().detach().to(device));
    }
    done.emplace(slot.impl_ptr().get(), std::make_pair(slot, n));
    slot = n;
  };
  for (auto& [name, m] : named_modules()) {
    for (Entry& e : m->params_) move_slot(e.tensor, true);
    for (Entry& e : m->buffers_) move_slot(e.tensor, false);
  }
}

void Module::zero_grad() {
  for (const Tensor& p : parameters()) p.set_grad(Tensor());
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& c : children_) c.second->apply(fn);
  fn(*this);
}

// ---------------------------------------------------------------- state dicts

void Module::collect_state(const std::string& prefix, std::vector<std::pair<std::string, const Tensor*>>& out) const {
  for (const Entry& e : params_)
    if (e.tensor.defined()) out.emplace_back(join_name(prefix, e.name), &e.tensor);
  for (const Entry& e : buffers_)
    if (e.tensor.defined() && e.persistent) out.emplace_back(join_name(prefix, e.name), &e.tensor);
  for (const auto& [name, child] : children_) child->collect_state(join_name(prefix, name), out);
}

StateDict Module::state_dict() const {
  std::vector<std::pair<std::string, const Tensor*>> slots;
  collect_state("", slots);
  StateDict out;
  for (const auto& [name, t] : slots) out.set(name, t->detach());
  return out;
}

LoadStateDictResult Module::load_state_dict(const StateDict& state, bool strict) {
  // The destination slots by name: the same traversal as state_dict() (a module registered under two
  // names is reached under both).
  std::vector<std::pair<std::string, const Tensor*>> const_slots;
  collect_state("", const_slots);
  std::vector<std::pair<std::string, Tensor*>> slots;
  for (const auto& [name, t] : const_slots) slots.emplace_back(name, const_cast<Tensor*>(t));  // ours: non-const call
  LoadStateDictResult res;
  std::vector<std::string> mismatches;
  for (auto& [name, slot] : slots) {
    const Tensor* src = state.find(name);
    if (src == nullptr || !src->defined()) {
      res.missing_keys.push_back(name);
      continue;
    }
    if (src->sizes() != slot->sizes()) {
      mismatches.push_back("'" + name + "': shape " + shape_str(src->sizes()) + " in the state dict, " +
                           shape_str(slot->sizes()) + " in the module");
    } else if (is_floating(src->dtype()) != is_floating(slot->dtype())) {
      mismatches.push_back("'" + name + "': dtype " + dtype_name(src->dtype()) + " in the state dict, " +
                           dtype_name(slot->dtype()) + " in the module (floating and integer tensors do not convert)");
    }
  }
  std::unordered_set<std::string> known;
  for (const auto& s : slots) known.insert(s.first);
  for (const auto& [name, t] : state)
    if (!known.count(name)) res.unexpected_keys.push_back(name);
  std::string err;
  if (strict && !res.missing_keys.empty()) err += "\n  missing keys: " + join_list(res.missing_keys);
  if (strict && !res.unexpected_keys.empty()) err += "\n  unexpected keys: " + join_list(res.unexpected_keys);
  for (const std::string& m : mismatches) err += "\n  mismatch for " + m;
  MP_CHECK(err.empty(), type_name_, "::load_state_dict: the state dict does not fit this module:", err,
           "\n(pass strict = false to skip missing/unexpected keys; shapes must always match)");
  autograd::NoGradGuard ng;
  for (auto& [name, slot] : slots) {
    const Tensor* src = state.find(name);
    if (src != nullptr && src->defined() && src->impl_ptr() != slot->impl_ptr()) slot->copy_(*src);
  }
  return res;
}

// ---------------------------------------------------------------- printing

void Module::print(std::ostream& os, int indent) const {
  os << type_name_ << "(";
  const std::string extra = extra_repr();
  if (children_.empty()) {
    os << extra << ")";
    return;
  }
  const std::string pad(static_cast<size_t>(indent + 2), ' ');
  os << "\n";
  if (!extra.empty()) os << pad << extra << "\n";
  for (const auto& [name, child] : children_) {
    os << pad << "(" << name << "): ";
    child->print(os, indent + 2);
    os << "\n";
  }
  os << std::string(static_cast<size_t>(indent), ' ') << ")";
}

std::string Module::to_string() const {
  std::ostringstream os;
  print(os, 0);
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.to_string(); }

size_t Module::register_forward_hook(ForwardHook hook) {
  forward_hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void Module::remove_forward_hook(size_t id) {
  std::erase_if(forward_hooks_, [id](const auto& h) { return h.first == id; });
}

void Module::run_forward_hooks(const Tensor& input, const Tensor& output) {
  for (auto& [id, hook] : forward_hooks_) hook(*this, input, output);
}

}  // namespace mp::nn

// StateDict: an insertion-ordered name -> tensor map.
#include "mp/nn/state_dict.hpp"

#include "mp/autograd/node.hpp"

namespace mp::nn {

StateDict::StateDict(std::initializer_list<Item> items) {
  for (const Item& it : items) insert(it.first, it.second);
}

void StateDict::insert(std::string name, Tensor t) {
  MP_CHECK(!contains(name), "StateDict::insert: key '", name, "' is already present; use set() to replace it");
  index_.emplace(name, items_.size());
  items_.emplace_back(std::move(name), std::move(t));
}

void StateDict::set(const std::string& name, Tensor t) {
  auto it = index_.find(name);
  if (it == index_.end()) {
    insert(name, std::move(t));
  } else {
    items_[it->second].second = std::move(t);
  }
}

const Tensor* StateDict::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

const Tensor& StateDict::at(const std::string& name) const {
  const Tensor* t = find(name);
  if (t == nullptr) {
    std::string some;
    for (size_t i = 0; i < items_.size() && i < 8; ++i) some += (i ? ", " : "") + items_[i].first;
    if (items_.size() > 8) some += ", ...";
    MP_FAIL("StateDict::at: no key '", name, "' among ", items_.size(), " keys (", some,
            "); check the module structure or the checkpoint's prefix");
  }
  return *t;
}

void StateDict::erase(const std::string& name) {
  auto it = index_.find(name);
  if (it == index_.end()) return;
  items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < items_.size(); ++i) index_.emplace(items_[i].first, i);
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> k;
  k.reserve(items_.size());
  for (const Item& it : items_) k.push_back(it.first);
  return k;
}

StateDict StateDict::clone() const {
  autograd::NoGradGuard ng;
  StateDict out;
  for (const Item& it : items_) out.insert(it.first, it.second.defined() ? it.second.detach().clone() : Tensor());
  return out;
}

}  // namespace mp::nn

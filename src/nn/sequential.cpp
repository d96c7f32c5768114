// nn::Sequential.
#include "mp/nn/sequential.hpp"

namespace mp::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules) : Sequential() {
  for (const auto& m : modules) push_back(m);
}

Sequential::Sequential(const std::vector<std::shared_ptr<UnaryModule>>& modules) : Sequential() {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<UnaryModule> module) {
  push_back(std::to_string(modules_.size()), std::move(module));
}

void Sequential::push_back(const std::string& name, std::shared_ptr<UnaryModule> module) {
  register_module(name, module);
  modules_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& m : modules_) y = (*m)(y);
  return y;
}

const std::shared_ptr<UnaryModule>& Sequential::operator[](size_t i) const {
  MP_CHECK(i < modules_.size(), "Sequential: index ", i, " out of range for ", modules_.size(), " modules");
  return modules_[i];
}

}  // namespace mp::nn

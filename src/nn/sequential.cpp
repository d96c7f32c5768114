// nn::Sequential.
#include "mp/nn/sequential.hpp"

#include <typeinfo>

#include "mp/nn/activation.hpp"
#include "mp/nn/linear.hpp"

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

// Note [Linear + ReLU fusion]: a Linear directly followed by a ReLU runs as one linear_relu, the ReLU
// in the GEMM's epilogue (bit-identical values and gradients, one pass over the activation fewer in
// each direction). Only exact nn::Linear and nn::ReLU (not subclasses, which may override forward)
// are fused, and only when neither has forward hooks: a hook on the Linear expects its pre-activation
// output, which the fused op never materialises. Parameter names are unchanged ("0.weight", ...).
Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (size_t i = 0; i < modules_.size(); ++i) {
    UnaryModule* m = modules_[i].get();
    if (i + 1 < modules_.size()) {
      UnaryModule* next = modules_[i + 1].get();
      if (typeid(*m) == typeid(Linear) && typeid(*next) == typeid(ReLU) && !m->has_forward_hooks() &&
          !next->has_forward_hooks()) {
        y = static_cast<Linear*>(m)->forward_relu(y);
        ++i;
        continue;
      }
    }
    y = (*m)(y);
  }
  return y;
}

const std::shared_ptr<UnaryModule>& Sequential::operator[](size_t i) const {
  MP_CHECK(i < modules_.size(), "Sequential: index ", i, " out of range for ", modules_.size(), " modules");
  return modules_[i];
}

}  // namespace mp::nn

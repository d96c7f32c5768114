#pragma once
#include <initializer_list>
#include <memory>
#include <type_traits>
#include <vector>

#include "mp/nn/module.hpp"

namespace mp::nn {

/// A chain of single-tensor modules run in order (PyTorch's nn.Sequential). Children are named
/// "0", "1", ... in the order added (or by the name given to push_back).
class Sequential : public UnaryModule {
 public:
  /// An empty chain.
  Sequential() : UnaryModule("Sequential") {}
  /// A chain of the given modules, named "0", "1", ... (brace form: Sequential{a, b, c}).
  Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules);
  /// A chain of the given modules, named "0", "1", ...
  explicit Sequential(const std::vector<std::shared_ptr<UnaryModule>>& modules);
  /// Variadic form for std::make_shared<Sequential>(std::make_shared<Linear>(4, 8), ...).
  template <class... M>
  requires(sizeof...(M) > 0 &&
           (std::is_base_of_v<UnaryModule, M> && ...)) explicit Sequential(std::shared_ptr<M>... modules)
      : Sequential() {
    (push_back(std::shared_ptr<UnaryModule>(std::move(modules))), ...);
  }
  /// Append a module named by its position.
  void push_back(std::shared_ptr<UnaryModule> module);
  /// Append a module under a chosen name.
  void push_back(const std::string& name, std::shared_ptr<UnaryModule> module);
  /// Run the modules in order.
  Tensor forward(const Tensor& x) override;
  /// Number of modules.
  size_t size() const { return modules_.size(); }
  /// Module i (throws when out of range).
  const std::shared_ptr<UnaryModule>& operator[](size_t i) const;
  /// Module i cast to M (throws when out of range or of another type).
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    MP_CHECK(m != nullptr, "Sequential::at: module ", i, " is a ", (*this)[i]->type_name(), ", not the type asked for");
    return m;
  }

 private:
  std::vector<std::shared_ptr<UnaryModule>> modules_;
};

}  // namespace mp::nn

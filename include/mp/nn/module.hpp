#pragma once
#include <deque>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mp/nn/state_dict.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::nn {

class Module;

/// Decides, per module, whether Module::to(dtype, predicate) converts that module's own parameters
/// and buffers (e.g. "everything but batch norm" for amp O2's keep_batchnorm_fp32).
using ModulePredicate = std::function<bool(const Module&)>;

/// What load_state_dict(strict = false) could not match (PyTorch's _IncompatibleKeys).
struct LoadStateDictResult {
  std::vector<std::string> missing_keys;     ///< in the module, absent from the state dict
  std::vector<std::string> unexpected_keys;  ///< in the state dict, absent from the module
};

/// The base of every layer and model (PyTorch's nn.Module): owns named parameters (leaf tensors
/// with requires_grad), buffers (running statistics, counters) and child modules (shared_ptr), all
/// in registration order. Names of nested tensors are dotted paths ("layer1.0.conv1.weight").
/// Layers keep the `Tensor&` that register_parameter/register_buffer return: the slot stays at the
/// same address, and to(dtype) replaces the tensor inside it, so layers and named_parameters() both
/// see the converted tensors.
class Module {
 public:
  /// `type_name` is what printing shows ("Linear", "Sequential", ...).
  explicit Module(std::string type_name = "Module");
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The class name used when printing.
  const std::string& type_name() const { return type_name_; }

  // ---- registration ----
  /// Register a parameter: stored detached as a leaf with requires_grad = `requires_grad`. An
  /// undefined tensor registers an absent parameter (PyTorch's bias=None): skipped everywhere.
  /// Returns the slot (stable address for the module's lifetime).
  Tensor& register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  /// Register a buffer (not trained; saved in state_dict unless `persistent` is false).
  Tensor& register_buffer(const std::string& name, Tensor t, bool persistent = true);
  /// Register a child module under `name`; returns it.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // ---- traversal ----
  /// Parameters of this module and (when `recurse`) its descendants, each once, in registration order.
  std::vector<Tensor> parameters(bool recurse = true) const;
  /// Parameters with dotted names ("0.weight", "layer1.0.conv1.weight").
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  /// Buffers of this module and (when `recurse`) its descendants.
  std::vector<Tensor> buffers(bool recurse = true) const;
  /// Buffers with dotted names ("1.running_mean").
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  /// Direct children in registration order.
  std::vector<std::shared_ptr<Module>> children() const;
  /// Direct children with their names.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  /// This module (name "") and every descendant with dotted names, pre-order, each once.
  std::vector<std::pair<std::string, Module*>> named_modules();
  /// Const form of named_modules().
  std::vector<std::pair<std::string, const Module*>> named_modules() const;
  /// Total elements over parameters() (only those with requires_grad when `trainable_only`).
  int64_t num_parameters(bool trainable_only = false) const;

  // ---- forward hooks ----
  /// Called after a forward with (module, input, output); see register_forward_hook.
  using ForwardHook = std::function<void(Module& module, const Tensor& input, const Tensor& output)>;
  /// Run `hook` after every forward of this module through UnaryModule::operator() (which Sequential
  /// uses). Returns an id for remove_forward_hook.
  size_t register_forward_hook(ForwardHook hook);
  /// Remove a hook registered with register_forward_hook (unknown ids are ignored).
  void remove_forward_hook(size_t id);
  /// Run the registered forward hooks (layers with other forward signatures may call it).
  void run_forward_hooks(const Tensor& input, const Tensor& output);
  /// Whether any forward hook is registered on this module.
  bool has_forward_hooks() const { return !forward_hooks_.empty(); }

  // ---- mode ----
  /// Set training mode on this module and every descendant (dropout active, batch statistics used).
  virtual void train(bool on = true);
  /// train(false).
  void eval() { train(false); }
  /// Whether the module is in training mode.
  bool is_training() const { return training_; }

  // ---- conversion ----
  /// Convert every floating parameter and buffer to `dtype` (integer buffers keep theirs).
  /// Parameters stay leaves with their requires_grad; existing gradients are converted too; tied
  /// parameters stay tied. Parameters are new tensors afterwards: build optimizers after to().
  void to(DType dtype);
  /// Like to(dtype), but only modules for which `convert(module)` is true convert their own tensors.
  void to(DType dtype, const ModulePredicate& convert);
  /// Move every parameter and buffer to `device`.
  void to(Device device);

  // ---- gradients and state ----
  /// Drop every parameter's gradient (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();
  /// Parameters then persistent buffers of each module, recursively, as detached tensors that
  /// alias the live data (as PyTorch: clone() the result to snapshot it).
  StateDict state_dict() const;
  /// Copy the state dict's tensors into this module's parameters and buffers (floating dtypes
  /// convert; shapes must match). Throws naming every missing/unexpected key when `strict`, and
  /// naming every shape or kind (floating vs integer) mismatch always; nothing is copied then.
  LoadStateDictResult load_state_dict(const StateDict& state, bool strict = true);

  /// Call fn on every descendant (children first, as PyTorch) and then on this module.
  void apply(const std::function<void(Module&)>& fn);

  // ---- printing ----
  /// Layer-specific part of the printed form ("in_features=4, out_features=8, bias=true").
  virtual std::string extra_repr() const { return ""; }
  /// The module tree as PyTorch prints it.
  std::string to_string() const;

 protected:
  /// The slot of this module's own parameter `name`; throws when absent.
  Tensor& parameter_slot(const std::string& name);

 private:
  struct Entry {
    std::string name;
    Tensor tensor;
    bool persistent = true;
  };
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, bool recurse, bool buffers, std::vector<std::pair<std::string, Tensor>>& out,
               std::vector<const TensorImpl*>& seen) const;
  void collect_state(const std::string& prefix, std::vector<std::pair<std::string, const Tensor*>>& out) const;
  void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, const Module*>>& out) const;
  void print(std::ostream& os, int indent) const;

  std::string type_name_;
  bool training_ = true;
  std::deque<Entry> params_;  // deque: slots keep their address as entries are added
  std::deque<Entry> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<size_t, ForwardHook>> forward_hooks_;
  size_t next_hook_id_ = 0;
};

/// Print the module tree.
std::ostream& operator<<(std::ostream& os, const Module& m);

/// A module with a single-tensor forward, as Sequential holds.
class UnaryModule : public Module {
 public:
  using Module::Module;
  /// The layer's computation.
  virtual Tensor forward(const Tensor& x) = 0;
  /// forward(x), then the forward hooks.
  Tensor operator()(const Tensor& x) {
    Tensor y = forward(x);
    run_forward_hooks(x, y);
    return y;
  }
};

}  // namespace mp::nn

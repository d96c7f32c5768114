#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mp/core/stochastic_round.hpp"
#include "mp/nn/state_dict.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::optim {

/// Hyper-parameters by name ("lr", "momentum", "beta1", ...): the serialisable form of an options
/// struct, as stored in a state dict's param groups (booleans are 0/1).
using OptionsMap = std::map<std::string, double>;

/// The optimizer state of one parameter (PyTorch's optimizer.state[p]). Buffers are f32 (f64 for
/// f64 parameters) whatever the parameter's dtype.
struct ParamState {
  int64_t step = 0;                       ///< updates applied to this parameter
  std::map<std::string, Tensor> buffers;  ///< "momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"
};

/// One parameter group as saved in a state dict.
struct ParamGroupState {
  OptionsMap options;           ///< the group's hyper-parameters
  std::vector<int64_t> params;  ///< indices into the optimizer's flat parameter order
};

/// An optimizer's state dict (PyTorch's {'state': {index: {...}}, 'param_groups': [...]}): the
/// parameters are numbered 0, 1, ... over the groups in order.
struct OptimizerStateDict {
  std::map<int64_t, ParamState> state;        ///< per parameter index (absent: no update yet)
  std::vector<ParamGroupState> param_groups;  ///< per group, in order

  /// Flat tensor form for checkpoint files: "state.{i}.{buffer}", "state.{i}.step" (i64 scalar),
  /// "param_groups.{g}.params" (i64 [n]) and "param_groups.{g}.{option}" (f64 scalar).
  nn::StateDict flatten() const;
  /// Inverse of flatten(); throws naming a key it cannot parse.
  static OptimizerStateDict unflatten(const nn::StateDict& flat);
};

/// The base of every optimizer (PyTorch's torch.optim.Optimizer): parameter groups with their own
/// hyper-parameters, per-parameter state, zero_grad(), step() and state dicts. Each concrete
/// optimizer updates one tensor per fused kernel call (Note [fused optimizer step] in
/// src/backend/optim_pointwise.hpp), skipping parameters whose gradient is undefined.
class Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Apply one update to every parameter that has a gradient (runs without recording gradients).
  virtual void step() = 0;
  /// Drop every parameter's gradient (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();

  /// Number of parameter groups.
  virtual size_t num_param_groups() const = 0;
  /// The parameters of group g.
  virtual const std::vector<Tensor>& group_params(size_t g) const = 0;
  /// Learning rate of group g.
  virtual double lr(size_t g) const = 0;
  /// Set the learning rate of group g (what LR schedulers call).
  virtual void set_lr(size_t g, double lr) = 0;
  /// Hyper-parameters of group g by name.
  virtual OptionsMap group_options(size_t g) const = 0;
  /// Replace hyper-parameters of group g from a map (unknown names throw; absent names keep their value).
  virtual void set_group_options(size_t g, const OptionsMap& options) = 0;

  /// All parameters over the groups in order (the numbering of the state dict).
  std::vector<Tensor> parameters() const;
  /// The state of p, or null before its first update.
  const ParamState* state(const Tensor& p) const;
  /// The state of every parameter by index, hyper-parameters of every group. Buffers alias the
  /// live state (as PyTorch); clone them to snapshot.
  OptimizerStateDict state_dict() const;
  /// Keep an f32 master copy of every 16-bit parameter (docs/DESIGN.md 1.2): the fused step updates the
  /// master (stored in the state as "master", so state dicts carry it) and writes the rounded result
  /// into the parameter. Masters are created from the parameter's value at its first step.
  void set_master_weights(bool on) { master_weights_ = on; }
  /// Whether 16-bit parameters get f32 masters.
  bool master_weights() const { return master_weights_; }
  /// Round the 16-bit parameters that have no f32 master (O3) stochastically after each update, so
  /// updates below half an ulp survive in expectation (Note [stochastic rounding]). The random bits come
  /// from the Philox stream `seed`: element i of the t-th parameter (in the order of parameters()) at its
  /// step s uses draw i of sub-stream (s, t), so a run is reproducible and a resume continues it exactly.
  /// Not part of state dicts: set it again after loading one (amp::initialize does).
  void set_stochastic_rounding(bool on, uint64_t seed = 0) {
    rounding_on_ = on;
    rounding_seed_ = seed;
  }
  /// Whether 16-bit parameters without masters are rounded stochastically.
  bool stochastic_rounding() const { return rounding_on_; }
  /// The f32 master of p (undefined when p has none yet).
  Tensor master(const Tensor& p) const;
  /// Forget p's state (its master and moments; its next update starts them afresh): what a rank of a sharded run does
  /// with the parameters another rank updates (Note [sharded optimizer state] in src/train/optimizer_shards.cpp).
  void release_state(const Tensor& p) { state_.erase(p.impl_ptr().get()); }
  /// Use `master` (f32, p's shape) as p's master weights from now on (amp::initialize hands in the
  /// original f32 values of a model it converted to 16-bit).
  void set_master(const Tensor& p, const Tensor& master);
  /// Forget p's f32 master: p is f32 itself now (amp::promote_to_f32, Note [automatic precision]).
  void drop_master(const Tensor& p);
  /// Replace parameter `old_param` by `new_param` (same shape) in its group, keeping its state (what
  /// amp::initialize does after converting the model's parameters). Throws when old_param is absent.
  virtual void replace_parameter(const Tensor& old_param, const Tensor& new_param) = 0;
  /// Multiply every gradient by `inv` inside the next step()s' fused pass (GradScaler's unscaling;
  /// 1 = none). The caller resets it.
  void set_grad_scale_inv(double inv) { grad_scale_inv_ = inv; }
  /// The current gradient multiplier of the fused step.
  double grad_scale_inv() const { return grad_scale_inv_; }

  /// Restore state and group hyper-parameters saved by state_dict() of an optimizer over
  /// parameters of the same shapes, grouped alike. Buffers are copied (converted to the state
  /// dtype). Throws, changing nothing, when groups, parameter counts or shapes differ.
  void load_state_dict(const OptimizerStateDict& state_dict);

 protected:
  Optimizer() = default;
  /// The state of p, created empty on first use.
  ParamState& state_for(const Tensor& p);
  /// A state buffer of p named `name`, created as zeros of the state dtype on first use; `created`
  /// tells whether it was.
  Tensor& state_buffer(ParamState& st, const Tensor& p, const std::string& name, bool* created = nullptr);
  /// The f32 master of p for this step when master weights are on and p is 16-bit (created from p's
  /// value on first use), else an undefined tensor.
  Tensor master_for_step(ParamState& st, const Tensor& p);
  /// The rounding of the t-th parameter's update at step `step` (off unless set_stochastic_rounding).
  RoundingStream rounding_for(int64_t step, size_t t) const {
    return {.on = rounding_on_,
            .seed = rounding_seed_,
            .step = static_cast<uint32_t>(step),
            .tensor = static_cast<uint32_t>(t)};
  }
  /// Move the state of `from` to `to` (for replace_parameter).
  void move_state(const Tensor& from, const Tensor& to);
  /// Check a parameter about to join a group: defined, floating, a leaf, not already present.
  void check_new_param(const Tensor& p, const char* optimizer) const;
  /// The gradient of p ready for a kernel (contiguous, p's shape), or undefined to skip p.
  static Tensor grad_for_step(const Tensor& p, const char* optimizer);
  /// The tensor a fused update writes for p: p itself when contiguous, else a contiguous copy of it that
  /// write_back puts into p.
  static Tensor update_target(const Tensor& p);
  /// After the update: copy `target` into p when it is a copy, and bump p's version.
  static void write_back(const Tensor& p, const Tensor& target);
  /// Run a fused-update kernel slot over items (each with .param = update_target(params[i])), one call per run
  /// of items on one device (a multi-tensor launch on a GPU), then write_back every parameter.
  template <class Item, class Slot>
  static void update_all(const std::vector<Item>& items, const std::vector<Tensor>& params, const Slot& slot) {
    const std::span<const Item> all(items);
    for (size_t i = 0; i < items.size();) {
      const Device d = items[i].param.device();
      size_t j = i + 1;
      while (j < items.size() && items[j].param.device() == d) ++j;
      slot.get(d)(all.subspan(i, j - i));
      i = j;
    }
    for (size_t i = 0; i < items.size(); ++i) write_back(params[i], items[i].param);
  }

 private:
  std::unordered_map<const TensorImpl*, ParamState> state_;
  bool master_weights_ = false;
  double grad_scale_inv_ = 1.0;
  bool rounding_on_ = false;
  uint64_t rounding_seed_ = 0;
};

/// The state dtype of a parameter: f64 for f64 parameters, f32 otherwise.
DType state_dtype(DType param_dtype);

/// A group of parameters sharing one options struct.
template <class Options>
struct ParamGroup {
  std::vector<Tensor> params;  ///< the parameters (leaves with requires_grad)
  Options options;             ///< their hyper-parameters
};

/// An optimizer whose groups carry a typed options struct. Options must have a `double lr` member
/// and ADL-visible to_options_map(const Options&), from_options_map(Options&, const OptionsMap&)
/// and validate_options(const Options&).
template <class Options>
class OptimizerWith : public Optimizer {
 public:
  /// The groups (options may be edited between steps, e.g. lr).
  std::vector<ParamGroup<Options>>& param_groups() { return groups_; }
  /// The groups, read-only.
  const std::vector<ParamGroup<Options>>& param_groups() const { return groups_; }
  /// The options new groups get by default.
  const Options& defaults() const { return defaults_; }
  /// Add a group of parameters with the default options.
  void add_param_group(std::vector<Tensor> params) {
    add_param_group(ParamGroup<Options>{std::move(params), defaults_});
  }
  /// Add a group with its own options; throws on invalid options or a parameter already optimized.
  void add_param_group(ParamGroup<Options> group) {
    validate_options(group.options);
    for (size_t i = 0; i < group.params.size(); ++i) {
      check_new_param(group.params[i], name_);
      for (size_t j = 0; j < i; ++j)
        MP_CHECK(group.params[j].impl_ptr() != group.params[i].impl_ptr(), name_,
                 ": a parameter appears twice in one group (positions ", j, " and ", i, "); pass each once");
    }
    groups_.push_back(std::move(group));
  }

  void replace_parameter(const Tensor& old_param, const Tensor& new_param) override {
    MP_CHECK(old_param.sizes() == new_param.sizes(), name_, ": replace_parameter: shapes differ (",
             old_param.describe(), " vs ", new_param.describe(), ")");
    for (auto& g : groups_)
      for (Tensor& p : g.params)
        if (p.impl_ptr() == old_param.impl_ptr()) {
          move_state(old_param, new_param);
          p = new_param;
          return;
        }
    MP_FAIL(name_, ": replace_parameter: ", old_param.describe(), " is not one of this optimizer's parameters");
  }
  size_t num_param_groups() const override { return groups_.size(); }
  const std::vector<Tensor>& group_params(size_t g) const override { return groups_.at(g).params; }
  double lr(size_t g) const override { return groups_.at(g).options.lr; }
  void set_lr(size_t g, double lr) override { groups_.at(g).options.lr = lr; }
  OptionsMap group_options(size_t g) const override { return to_options_map(groups_.at(g).options); }
  void set_group_options(size_t g, const OptionsMap& options) override {
    Options o = groups_.at(g).options;
    from_options_map(o, options);
    validate_options(o);
    groups_.at(g).options = o;
  }

 protected:
  /// `name` names the optimizer in errors.
  OptimizerWith(const char* name, std::vector<ParamGroup<Options>> groups, const Options& defaults)
      : name_(name), defaults_(defaults) {
    validate_options(defaults);
    MP_CHECK(!groups.empty(), name, ": got no parameter groups; pass model.parameters()");
    for (auto& g : groups) add_param_group(std::move(g));
  }

  const char* name_;
  Options defaults_;
  std::vector<ParamGroup<Options>> groups_;
};

namespace detail {
/// Read `key` from `m` into `dst` when present (helpers for from_options_map).
void read_option(const OptionsMap& m, const char* key, double& dst);
/// Boolean form: nonzero = true.
void read_option(const OptionsMap& m, const char* key, bool& dst);
/// Throw when `m` has a key outside `known`, naming the optimizer.
void check_option_keys(const OptionsMap& m, std::initializer_list<const char*> known, const char* optimizer);
}  // namespace detail

}  // namespace mp::optim

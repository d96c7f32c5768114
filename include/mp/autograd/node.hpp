#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mp/tensor/tensor.hpp"

namespace mp::autograd {

class Node;

/// A hook run on the gradient flowing into a tensor; may return a replacement (or undefined to keep).
using GradHook = std::function<Tensor(const Tensor& grad)>;
/// A hook run on a leaf once backward has accumulated its gradient into leaf.grad() (the leaf is passed).
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;

/// Where a gradient goes: input `input_nr` of node `fn`.
struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
  /// Whether the edge leads anywhere.
  bool valid() const { return fn != nullptr; }
};

/// Shape, dtype and device of a node output (to make zero gradients for unused outputs).
struct OutputMeta {
  Shape sizes;
  DType dtype = DType::f32;
  Device device = kCPU;
};

/// A step of the backward graph: takes one gradient per forward output, returns one per forward
/// input (undefined where the input needs none).
class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  /// Compute input gradients from output gradients (grads.size() == num outputs).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  /// Op name, e.g. "MatmulBackward".
  virtual std::string name() const = 0;
  /// Drop saved tensors (called after the node ran unless the graph is retained).
  virtual void release_saved() {}

  /// Edges to the producers of the forward inputs, one per input.
  std::vector<Edge> next_edges;
  /// Meta of each forward output.
  std::vector<OutputMeta> outputs;
  /// Hooks on the gradients of this node's outputs (output index, hook), run before apply().
  std::vector<std::pair<uint32_t, GradHook>> pre_hooks;
  /// Creation order (later nodes run first when ready together).
  uint64_t sequence_nr;
};

/// A node whose backward is a closure; releasing it destroys the closure and what it captured.
class FunctionNode final : public Node {
 public:
  using Backward = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads)>;
  FunctionNode(std::string name, Backward fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return name_; }
  void release_saved() override { fn_ = nullptr; }

 private:
  std::string name_;
  Backward fn_;
};

/// The sink for a leaf tensor's gradient: adds incoming gradients into leaf.grad().
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  /// The leaf variable.
  const Tensor& variable() const { return leaf_; }

 private:
  Tensor leaf_;
};

/// Autograd state of a tensor.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  std::weak_ptr<AccumulateGrad> grad_accumulator;
  std::string name;
  std::vector<GradHook> hooks;
  std::vector<PostAccumulateGradHook> post_accumulate_hooks;
};

/// Whether gradients are being recorded on this thread.
bool grad_mode_enabled();
/// Switch recording on/off on this thread.
void set_grad_mode(bool enabled);

/// RAII: disable gradient recording in a scope (as torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_mode_enabled()) { set_grad_mode(false); }
  ~NoGradGuard() { set_grad_mode(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// RAII: enable gradient recording in a scope.
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(grad_mode_enabled()) { set_grad_mode(true); }
  ~EnableGradGuard() { set_grad_mode(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

/// Whether an op with these inputs must record a node (grad mode on and some input requires grad).
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
/// Vector form of any_requires_grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);

/// The edge that a gradient for `t` should follow (its grad_fn, or its AccumulateGrad when a leaf
/// requiring grad, else invalid).
Edge gradient_edge(const Tensor& t);

/// Connect a freshly built node: edges to `inputs`, meta of `outputs`, and make `outputs` its
/// results (sets their grad_fn/output_nr). Returns the node.
std::shared_ptr<Node> connect(std::shared_ptr<Node> node, const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& outputs);

/// Record a closure node for an op when needed: if any input requires grad (and grad mode is on),
/// `outputs` get a FunctionNode named `name` running `fn`.
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            FunctionNode::Backward fn);

/// Run backward from `roots` with the given seed gradients (ones for scalars when undefined).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool retain_graph = false);

/// Gradients of `outputs` w.r.t. `inputs` without touching .grad (torch.autograd.grad).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

/// Add a hook on the gradient reaching tensor t (leaf or not).
void register_hook(const Tensor& t, GradHook hook);

/// Add a hook run each time a backward pass has added a gradient into leaf.grad() (PyTorch's
/// register_post_accumulate_grad_hook): the point from which that gradient is final for this pass. `leaf` must be
/// a leaf that requires grad. A pass that gives the leaf no gradient does not run it.
void register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook);

}  // namespace mp::autograd

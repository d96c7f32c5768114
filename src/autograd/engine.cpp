#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>

#include "mp/autocast/autocast.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/reduce.hpp"

namespace mp::autograd {
namespace {
thread_local bool t_grad_mode = true;
std::atomic<uint64_t> g_sequence{0};

AutogradMeta& meta(const Tensor& t) {
  auto& a = t.impl().autograd_;
  if (!a) a = std::make_unique<AutogradMeta>();
  return *a;
}
const AutogradMeta* meta_if(const Tensor& t) { return t.defined() ? t.impl().autograd_.get() : nullptr; }

// Make g fit what the node input expects (dtype of the forward input; e.g. a bf16 copy's grad
// flowing into an f32 master).
Tensor conform(Tensor g, const OutputMeta& m) {
  if (!g.defined()) return g;
  if (g.dtype() != m.dtype && is_floating(m.dtype)) g = g.to(m.dtype);
  MP_ASSERT(g.sizes() == m.sizes, "gradient of shape ", shape_str(g.sizes()), " for a tensor of shape ",
            shape_str(m.sizes));
  return g;
}

}  // namespace

Node::Node() : sequence_nr(g_sequence.fetch_add(1)) {}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grads) {
  MP_CHECK(fn_ != nullptr, "backward through ", name_,
           " a second time: its saved tensors were freed after the "
           "first backward; pass retain_graph=true to the first backward if you need this");
  return fn_(grads);
}

AccumulateGrad::AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) {
  outputs.push_back({leaf_.sizes(), leaf_.dtype(), leaf_.device()});
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor g = std::move(grads[0]);
  if (!g.defined()) return {};
  AutogradMeta& m = meta(leaf_);
  for (auto& h : m.hooks) {
    Tensor r = h(g);
    if (r.defined()) g = r;
  }
  if (!m.grad.defined()) {
    // Own the gradient: a fresh dense buffer in the leaf's memory format (a channels-last leaf gets a
    // channels-last gradient, as in PyTorch) that nobody else writes to. Steal the buffer only when nothing
    // else can see it (no other handle, no view of its storage).
    const MemoryFormat f = leaf_.suggest_memory_format();
    const bool exclusive = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous(f) &&
                           g.suggest_memory_format() == f;
    if (exclusive) {
      m.grad = g.detach();
    } else {
      m.grad = empty(g.sizes(), {.dtype = g.dtype(), .device = g.device(), .memory_format = f});
      m.grad.copy_(g.detach());
    }
  } else {
    add_(m.grad, g);
  }
  for (auto& h : m.post_accumulate_hooks) h(leaf_);
  return {};
}

bool grad_mode_enabled() { return t_grad_mode; }
void set_grad_mode(bool enabled) { t_grad_mode = enabled; }

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_mode) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!t_grad_mode) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

Edge gradient_edge(const Tensor& t) {
  const AutogradMeta* m = meta_if(t);
  if (m == nullptr) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  AutogradMeta& mm = meta(t);
  auto acc = mm.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    mm.grad_accumulator = acc;
  }
  return {acc, 0};
}

std::shared_ptr<Node> connect(std::shared_ptr<Node> node, const std::vector<Tensor>& inputs,
                              const std::vector<Tensor>& outputs) {
  node->next_edges.reserve(inputs.size());
  for (const Tensor& in : inputs) node->next_edges.push_back(in.defined() ? gradient_edge(in) : Edge{});
  node->outputs.reserve(outputs.size());
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    node->outputs.push_back({o.sizes(), o.dtype(), o.device()});
    AutogradMeta& m = meta(o);
    m.grad_fn = node;
    m.output_nr = i;
    m.requires_grad = true;
  }
  return node;
}

void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            FunctionNode::Backward fn) {
  if (!any_requires_grad(inputs)) return;
  connect(std::make_shared<FunctionNode>(std::string(name), std::move(fn)), inputs, outputs);
}

void register_hook(const Tensor& t, GradHook hook) {
  MP_CHECK(t.requires_grad(), "register_hook: the tensor does not require grad (", t.describe(), ")");
  AutogradMeta& m = meta(t);
  if (!m.grad_fn) {
    m.hooks.push_back(std::move(hook));
    return;
  }
  m.grad_fn->pre_hooks.push_back({m.output_nr, std::move(hook)});
}

void register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook) {
  MP_CHECK(leaf.requires_grad() && !meta(leaf).grad_fn,
           "register_post_accumulate_grad_hook: expected a leaf that "
           "requires grad, got ",
           leaf.describe(), leaf.requires_grad() ? " (not a leaf)" : "");
  meta(leaf).post_accumulate_hooks.push_back(std::move(hook));
}

namespace {

struct GraphTask {
  std::unordered_map<Node*, int> deps;
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  // When capturing (autograd::grad): gradients flowing into these (node, input_nr) are stored, not applied.
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> captures;
  std::vector<Tensor> captured;
};

void accumulate(std::vector<Tensor>& buf, size_t slot, const Tensor& g) {
  if (!g.defined()) return;
  if (!buf[slot].defined()) {
    buf[slot] = g;
  } else {
    buf[slot] = buf[slot] + g;
  }
}

void run(const std::vector<Edge>& roots, const std::vector<Tensor>& seeds, bool retain_graph, GraphTask& task,
         bool capture_only) {
  NoGradGuard ng;
  amp::AutocastSuspend no_autocast;  // backward ops run in the dtypes the forward chose
  // Count dependencies (how many edges lead into each node).
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (const Edge& e : roots) {
    if (e.valid() && !seen[e.fn.get()]) {
      seen[e.fn.get()] = true;
      stack.push_back(e.fn.get());
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      ++task.deps[e.fn.get()];
      if (!seen[e.fn.get()]) {
        seen[e.fn.get()] = true;
        stack.push_back(e.fn.get());
      }
    }
  }
  auto cmp = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr < b->sequence_nr;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(cmp)> ready(cmp);
  for (size_t i = 0; i < roots.size(); ++i) {
    const Edge& e = roots[i];
    if (!e.valid()) continue;
    auto& buf = task.buffers[e.fn.get()];
    buf.resize(std::max<size_t>(e.fn->outputs.size(), 1));
    accumulate(buf, e.input_nr, seeds[i]);
  }
  for (const Edge& e : roots)
    if (e.valid() && task.deps[e.fn.get()] == 0) {
      task.deps[e.fn.get()] = -1;  // queued
      ready.push(e.fn);
    }
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(task.buffers[node.get()]);
    task.buffers.erase(node.get());
    grads.resize(std::max<size_t>(node->outputs.size(), 1));
    for (auto& [nr, hook] : node->pre_hooks) {
      if (nr < grads.size() && grads[nr].defined()) {
        Tensor r = hook(grads[nr]);
        if (r.defined()) grads[nr] = r;
      }
    }
    if (auto it = task.captures.find(node.get()); it != task.captures.end()) {
      for (auto [nr, slot] : it->second) task.captured[slot] = grads[nr];
    }
    std::vector<Tensor> in_grads;
    const bool is_accumulate = dynamic_cast<AccumulateGrad*>(node.get()) != nullptr;
    if (!(capture_only && is_accumulate)) {
      // Unused outputs of multi-output nodes get zero gradients so formulas need no special cases.
      bool any = false;
      for (const Tensor& g : grads) any = any || g.defined();
      if (any) {
        for (size_t i = 0; i < node->outputs.size(); ++i)
          if (!grads[i].defined())
            grads[i] =
                zeros(node->outputs[i].sizes, {.dtype = node->outputs[i].dtype, .device = node->outputs[i].device});
        in_grads = node->apply(std::move(grads));
      }
      if (!retain_graph) node->release_saved();
    }
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.valid()) continue;
      Node* next = e.fn.get();
      auto& buf = task.buffers[next];
      buf.resize(std::max<size_t>(next->outputs.size(), 1));
      if (i < in_grads.size() && in_grads[i].defined()) {
        accumulate(buf, e.input_nr, conform(in_grads[i], next->outputs[e.input_nr]));
      }
      if (--task.deps[next] == 0) {
        task.deps[next] = -1;
        ready.push(e.fn);
      }
    }
  }
}

Tensor seed_for(const Tensor& root, const Tensor& given, const char* op) {
  if (given.defined()) {
    MP_CHECK(given.sizes() == root.sizes(), op, ": gradient of shape ", shape_str(given.sizes()),
             " does not match the output's shape ", shape_str(root.sizes()));
    return given;
  }
  MP_CHECK(root.numel() == 1, op, ": a gradient can be created implicitly only for scalar outputs, got ",
           root.describe(), "; pass the gradient explicitly");
  return ones(root.sizes(), {.dtype = root.dtype(), .device = root.device()});
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool retain_graph) {
  std::vector<Edge> edges;
  std::vector<Tensor> seeds;
  for (size_t i = 0; i < roots.size(); ++i) {
    MP_CHECK(roots[i].requires_grad(), "backward: the tensor does not require grad and has no grad_fn (",
             roots[i].describe(), "); did you run the forward under NoGradGuard or forget requires_grad_()?");
    edges.push_back(gradient_edge(roots[i]));
    seeds.push_back(seed_for(roots[i], i < grad_roots.size() ? grad_roots[i] : Tensor(), "backward"));
  }
  GraphTask task;
  run(edges, seeds, retain_graph, task, false);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  std::vector<Edge> edges;
  std::vector<Tensor> seeds;
  for (size_t i = 0; i < outputs.size(); ++i) {
    MP_CHECK(outputs[i].requires_grad(), "grad: output ", i, " does not require grad");
    edges.push_back(gradient_edge(outputs[i]));
    seeds.push_back(seed_for(outputs[i], i < grad_outputs.size() ? grad_outputs[i] : Tensor(), "grad"));
  }
  GraphTask task;
  task.captured.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    MP_CHECK(inputs[i].requires_grad(), "grad: input ", i, " does not require grad");
    Edge e = gradient_edge(inputs[i]);
    task.captures[e.fn.get()].push_back({e.input_nr, i});
  }
  run(edges, seeds, retain_graph, task, true);
  return task.captured;
}

}  // namespace mp::autograd

namespace mp {

// The Tensor members that touch its autograd slot (an AutogradMeta, complete only in this layer), TensorImpl's
// constructor and destructor included (both destroy it).
TensorImpl::TensorImpl(std::shared_ptr<Storage> storage, int64_t offset, Shape sizes, Shape strides, DType dtype)
    : storage_(std::move(storage)),
      offset_(offset),
      sizes_(std::move(sizes)),
      strides_(std::move(strides)),
      dtype_(dtype) {}

TensorImpl::~TensorImpl() = default;

bool Tensor::requires_grad() const {
  const auto& a = impl().autograd_;
  return a && (a->requires_grad || a->grad_fn);
}

Tensor& Tensor::requires_grad_(bool on) {
  MP_CHECK(!on || is_floating(dtype()), "requires_grad_: only floating tensors can require gradients, got ",
           describe());
  auto& a = impl().autograd_;
  MP_CHECK(!a || !a->grad_fn, "requires_grad_: can only be set on leaf tensors; use detach() first");
  if (!a) a = std::make_unique<autograd::AutogradMeta>();
  a->requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  const auto& a = impl().autograd_;
  return a ? a->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  auto& a = impl().autograd_;
  if (!a) a = std::make_unique<autograd::AutogradMeta>();
  a->grad = g;
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  const auto& a = impl().autograd_;
  return a ? a->grad_fn : nullptr;
}

bool Tensor::is_leaf() const { return grad_fn() == nullptr; }

std::string Tensor::name() const {
  const auto& a = impl().autograd_;
  return a ? a->name : std::string();
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

}  // namespace mp

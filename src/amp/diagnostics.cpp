#include "mp/amp/diagnostics.hpp"

#include "backend/amp_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/pointwise.hpp"

namespace mp::amp {
namespace {

bool has_nonfinite(const Tensor& t) {
  if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return false;
  const Tensor c = t.detach().contiguous();
  const Tensor ts[1] = {c};
  return backend::unscale_kernel.get(c.device())(std::span<const Tensor>(ts, 1), 1.0, false);
}

}  // namespace

bool any_nonfinite(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> ts;
  for (const Tensor& t : tensors)
    if (t.defined() && is_floating(t.dtype()) && t.numel() > 0) ts.push_back(t.detach().contiguous());
  if (ts.empty()) return false;
  return backend::unscale_kernel.get(ts.front().device())(ts, 1.0, false);
}

UnderflowStats underflow_stats(const std::vector<Tensor>& grads, double scale) {
  UnderflowStats s;
  s.scale = scale;
  std::vector<Tensor> ts;
  for (const Tensor& g : grads)
    if (g.defined() && g.numel() > 0) ts.push_back(g.detach().contiguous());
  if (ts.empty()) return s;
  auto kernel = backend::underflow_kernel.get(ts.front().device());
  const backend::UnderflowCounts at1 = kernel(ts, 1.0);
  const backend::UnderflowCounts atS = kernel(ts, scale);
  for (const Tensor& t : ts) s.values += t.numel();
  s.nonzero = at1.nonzero;
  s.nonfinite = at1.nonfinite;
  s.zeros = s.values - s.nonzero - s.nonfinite;
  if (s.nonzero > 0) {
    const auto n = static_cast<double>(s.nonzero);
    s.underflow_unscaled = static_cast<double>(at1.flushed) / n;
    s.subnormal_unscaled = static_cast<double>(at1.subnormal) / n;
    s.underflow_scaled = static_cast<double>(atS.flushed) / n;
    s.subnormal_scaled = static_cast<double>(atS.subnormal) / n;
  }
  return s;
}

UnderflowStats underflow_stats_of_scaled_grads(const std::vector<Tensor>& params, double scale) {
  UnderflowStats s;
  s.scale = scale;
  std::vector<Tensor> ts;
  for (const Tensor& p : params)
    if (const Tensor g = p.grad(); g.defined() && g.numel() > 0) ts.push_back(g.detach().contiguous());
  if (ts.empty()) return s;
  auto kernel = backend::underflow_kernel.get(ts.front().device());
  const backend::UnderflowCounts atS = kernel(ts, 1.0);          // as stored: g * scale
  const backend::UnderflowCounts at1 = kernel(ts, 1.0 / scale);  // the true gradient g
  for (const Tensor& t : ts) s.values += t.numel();
  s.nonzero = atS.nonzero;
  s.nonfinite = atS.nonfinite;
  s.zeros = s.values - s.nonzero - s.nonfinite;
  if (s.nonzero > 0) {
    const auto n = static_cast<double>(s.nonzero);
    // values the division by the scale takes to 0 in f32 lie far below 2^-24: they underflow too
    s.underflow_unscaled = static_cast<double>(at1.flushed + (atS.nonzero - at1.nonzero)) / n;
    s.subnormal_unscaled = static_cast<double>(at1.subnormal) / n;
    s.underflow_scaled = static_cast<double>(atS.flushed) / n;
    s.subnormal_scaled = static_cast<double>(atS.subnormal) / n;
  }
  return s;
}

OverflowFinder::OverflowFinder(nn::Module& root) : found_(std::make_shared<Found>()) {
  for (auto& [name, m] : root.named_modules()) {
    const std::string label = (name.empty() ? std::string("<model>") : name) + " (" + m->type_name() + ")";
    // The hooks share `found_`, so a gradient hook that fires after the finder is gone stays valid.
    const size_t id = m->register_forward_hook([found = found_, label](nn::Module&, const Tensor&, const Tensor& out) {
      if (!found->first_forward && has_nonfinite(out)) found->first_forward = label;
      if (out.defined() && out.requires_grad())
        autograd::register_hook(out, [found, label](const Tensor& g) {
          if (!found->first_backward && has_nonfinite(g)) found->first_backward = label;
          return Tensor();
        });
    });
    hooks_.emplace_back(m, id);
  }
}

OverflowFinder::~OverflowFinder() {
  for (auto& [m, id] : hooks_) m->remove_forward_hook(id);
}

void OverflowFinder::reset() {
  found_->first_forward.reset();
  found_->first_backward.reset();
}

std::string OverflowFinder::report() const {
  const Found& f = *found_;
  if (!f.first_forward && !f.first_backward) return "no non-finite values seen";
  std::string r;
  if (f.first_forward) r += "forward: first non-finite output from " + *f.first_forward;
  if (f.first_backward)
    r += std::string(r.empty() ? "" : "; ") + "backward: first non-finite gradient at the output of " +
         *f.first_backward;
  return r;
}

}  // namespace mp::amp

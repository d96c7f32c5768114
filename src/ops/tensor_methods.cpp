// The Tensor methods that are ops: views (view, permute, slice, expand, squeeze and what is built on them),
// clone/contiguous and the casts to(dtype)/to(device). They are declared in mp/tensor/tensor.hpp for the method
// syntax but record autograd nodes (and expand's backward sums with sum_to_size), so they are defined here, in the
// layer that may include autograd and ops (docs/DESIGN.md 2.3), as Tensor::requires_grad/backward are defined in
// src/autograd/engine.cpp. What is not an op (metadata, copy_, fill_, detach, item) stays in src/tensor/tensor.cpp.
#include <algorithm>
#include <memory>
#include <numeric>

#include "backend/copy_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/ops/reduce.hpp"
#include "mp/tensor/tensor.hpp"
#include "tensor/copy_into.hpp"

namespace mp {

// ---------------------------------------------------------------- views
namespace {

Tensor make_view(const Tensor& base, Shape sizes, Shape strides, int64_t offset) {
  return Tensor(
      std::make_shared<TensorImpl>(base.storage(), offset, std::move(sizes), std::move(strides), base.dtype()));
}

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  Shape r = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i] == -1) {
      MP_CHECK(infer < 0, op, ": only one dim may be -1, got ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      MP_CHECK(r[i] >= 0, op, ": invalid size ", r[i], " in ", shape_str(shape));
      known *= r[i];
    }
  }
  if (infer >= 0) {
    MP_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(shape), " is invalid for ", numel,
             " elements");
    r[infer] = numel / known;
  }
  MP_CHECK(shape_numel(r) == numel, op, ": shape ", shape_str(shape), " is invalid for a tensor of ", numel,
           " elements");
  return r;
}

// Strides for viewing (sizes, strides) as `shape` without a copy, or empty when impossible
// (the same chunk-matching rule as PyTorch's computeStride).
bool view_strides(const Shape& sizes, const Shape& strides, const Shape& shape, Shape& out) {
  out.assign(shape.size(), 0);
  // No elements: any strides describe it, so every view exists (as in PyTorch).
  if (sizes.empty() || shape_numel(sizes) == 0) {
    if (sizes == shape) {
      out = strides;
      return true;
    }
    out = contiguous_strides(shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  const Shape target = infer_shape(shape, numel(), "view");
  Shape st;
  MP_CHECK(view_strides(sizes(), strides(), target, st), "view: cannot view a tensor of sizes ", shape_str(sizes()),
           " and strides ", shape_str(strides()), " as ", shape_str(target),
           " without a copy; use reshape() or contiguous() first");
  Tensor out = make_view(*this, target, st, storage_offset());
  Shape in_sizes = sizes();
  autograd::record("ViewBackward", {*this}, {out},
                   [in_sizes](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].reshape(in_sizes)}; });
  return out;
}

Tensor Tensor::reshape(const Shape& shape) const {
  const Shape target = infer_shape(shape, numel(), "reshape");
  Shape st;
  if (view_strides(sizes(), strides(), target, st)) return view(target);
  return contiguous().view(target);
}

Tensor Tensor::permute(const Shape& dims) const {
  MP_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: expected ", dim(), " dims, got ", shape_str(dims));
  Shape ns(dims.size()), nst(dims.size()), inv(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    MP_CHECK(!seen[d], "permute: dim ", d, " repeated in ", shape_str(dims));
    seen[d] = true;
    ns[i] = sizes()[d];
    nst[i] = strides()[d];
    inv[d] = static_cast<int64_t>(i);
  }
  Tensor out = make_view(*this, ns, nst, storage_offset());
  autograd::record("PermuteBackward", {*this}, {out},
                   [inv](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].permute(inv)}; });
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  Shape p(dim());
  std::iota(p.begin(), p.end(), 0);
  if (dim() == 0) return *this;
  std::swap(p[wrap_dim(d0, dim(), "transpose")], p[wrap_dim(d1, dim(), "transpose")]);
  return permute(p);
}

Tensor Tensor::t() const {
  MP_CHECK(dim() <= 2, "t: expected a tensor with <= 2 dims, got ", describe());
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  MP_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = sizes()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape ns = sizes(), nst = strides();
  ns[d] = (end - start + step - 1) / step;
  nst[d] *= step;
  Tensor out = make_view(*this, ns, nst, storage_offset() + start * strides()[d]);
  Shape in_sizes = sizes();
  DType dt = dtype();
  autograd::record("SliceBackward", {*this}, {out}, [in_sizes, dt, d, start, end, step](const std::vector<Tensor>& g) {
    Tensor gi = zeros(in_sizes, {.dtype = dt, .device = g[0].device()});
    gi.slice(d, start, end, step).copy_(g[0]);
    return std::vector<Tensor>{gi};
  });
  return out;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  MP_CHECK(start >= 0 && length >= 0 && start + length <= sizes()[d], "narrow: range [", start, ", ", start + length,
           ") is outside dim ", d, " of size ", sizes()[d]);
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  const int64_t n = sizes()[d];
  MP_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d, " of size ", n);
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& shape) const {
  MP_CHECK(shape.size() >= sizes().size(), "expand: cannot expand ", shape_str(sizes()), " to fewer dims ",
           shape_str(shape));
  const size_t lead = shape.size() - sizes().size();
  Shape ns(shape.size()), nst(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      MP_CHECK(shape[i] >= 0, "expand: new leading dims need explicit sizes, got ", shape_str(shape));
      ns[i] = shape[i];
      nst[i] = 0;
      continue;
    }
    const int64_t cur = sizes()[i - lead];
    const int64_t want = shape[i] == -1 ? cur : shape[i];
    MP_CHECK(cur == want || cur == 1, "expand: cannot expand ", shape_str(sizes()), " to ", shape_str(shape), " (dim ",
             i, ": size ", cur, " is not 1)");
    ns[i] = want;
    nst[i] = cur == want ? strides()[i - lead] : 0;
  }
  if (ns == sizes()) return *this;
  Tensor out = make_view(*this, ns, nst, storage_offset());
  Shape in_sizes = sizes();
  autograd::record("ExpandBackward", {*this}, {out}, [in_sizes](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to_size(g[0], in_sizes)};
  });
  return out;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape ns = sizes();
  ns.insert(ns.begin() + d, 1);
  return view(ns);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  if (sizes()[d] != 1) return *this;
  Shape ns = sizes(), nst = strides();
  ns.erase(ns.begin() + d);
  nst.erase(nst.begin() + d);
  Tensor out = make_view(*this, ns, nst, storage_offset());
  Shape in_sizes = sizes();
  autograd::record("SqueezeBackward", {*this}, {out},
                   [in_sizes](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].reshape(in_sizes)}; });
  return out;
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  MP_CHECK(start <= end, "flatten: start dim ", start, " is after end dim ", end);
  Shape ns(sizes().begin(), sizes().begin() + start);
  int64_t m = 1;
  for (int64_t i = start; i <= end; ++i) m *= sizes()[i];
  ns.push_back(m);
  ns.insert(ns.end(), sizes().begin() + end + 1, sizes().end());
  return reshape(ns);
}

// ---------------------------------------------------------------- copies and casts
Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

namespace {
// A differentiable copy of t with its own storage, dense in memory format f.
Tensor clone_in(const Tensor& t, MemoryFormat f) {
  Tensor out = empty(t.sizes(), {.dtype = t.dtype(), .device = t.device(), .memory_format = f});
  {
    autograd::NoGradGuard ng;
    detail::copy_into(out, t.detach());
  }
  autograd::record("CloneBackward", {t}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}
}  // namespace

Tensor Tensor::contiguous(MemoryFormat f) const {
  if (f == MemoryFormat::contiguous) return contiguous();
  const Shape target = format_strides(sizes(), f);
  if (strides() == target) return *this;
  if (is_contiguous(f)) {  // dense already (only size-1 dims differ in stride): the same bytes, restrided
    Tensor out = make_view(*this, sizes(), target, storage_offset());
    autograd::record("AsStridedBackward", {*this}, {out},
                     [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
    return out;
  }
  return clone_in(*this, f);
}

Tensor Tensor::clone() const { return clone_in(*this, MemoryFormat::contiguous); }

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor out = empty(sizes(), {.dtype = dt, .device = device(), .memory_format = suggest_memory_format()});
  {
    autograd::NoGradGuard ng;
    detail::copy_into(out, detach());
  }
  if (is_floating(dt) && is_floating(dtype()) && autograd::any_requires_grad({this})) {
    // A cast saves nothing, so its node may run again after a backward (the autocast cache reuses
    // one cast of a parameter across micro-batches).
    class ToCopyBackward final : public autograd::Node {
     public:
      explicit ToCopyBackward(DType src) : src_(src) {}
      std::vector<Tensor> apply(std::vector<Tensor>&& g) override { return {g[0].to(src_)}; }
      std::string name() const override { return "ToCopyBackward"; }

     private:
      DType src_;
    };
    autograd::connect(std::make_shared<ToCopyBackward>(dtype()), {*this}, {out});
  }
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  const Device from = device();
  // The CUDA side must exist (throws "no CUDA device" with the reason otherwise), and the target is
  // the current device while its memory is allocated (the CUDA allocator serves the current device).
  const std::shared_ptr<void> scope = backend::device_scope_kernel.find(DeviceType::cuda)(d.is_cuda() ? d : from, "to");
  const auto copy = backend::copy_between_devices_kernel.get(d.is_cuda() ? d : from);
  Tensor out;
  if (numel() == 0) {
    out = empty(sizes(), {.dtype = dtype(), .device = d});
  } else if (suggest_memory_format() == MemoryFormat::channels_last &&
             (from.is_cpu() || is_contiguous(MemoryFormat::channels_last))) {
    // A channels-last tensor stays channels-last (PyTorch's .to preserves the memory format): its NHWC
    // bytes travel as the contiguous [N, H, W, C] they are.
    const Tensor src = detach().contiguous(MemoryFormat::channels_last).permute({0, 2, 3, 1});
    const Tensor nhwc = empty(src.sizes(), {.dtype = dtype(), .device = d});
    copy(nhwc, src);
    out = nhwc.permute({0, 3, 1, 2});
  } else if (from.is_cpu() || is_contiguous()) {
    const Tensor src = detach().contiguous();  // a host-side gather for strided host sources
    out = empty(sizes(), {.dtype = dtype(), .device = d});
    copy(out, src);
  } else {
    // A strided device source: copy the storage span it covers to the host in one contiguous
    // transfer, gather there, and send the result on when the target is another device.
    int64_t lo = storage_offset(), hi = storage_offset();
    for (int64_t i = 0; i < dim(); ++i) (stride(i) < 0 ? lo : hi) += stride(i) * (size(i) - 1);
    const Tensor span(std::make_shared<TensorImpl>(storage(), lo, Shape{hi - lo + 1}, Shape{1}, dtype()));
    const Tensor host_span = empty(span.sizes(), {.dtype = dtype()});
    copy(host_span, span);
    out = Tensor(std::make_shared<TensorImpl>(host_span.storage(), storage_offset() - lo, sizes(), strides(), dtype()))
              .contiguous();
    if (!d.is_cpu()) out = out.to(d);
  }
  autograd::record("ToDeviceBackward", {*this}, {out},
                   [from](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].to(from)}; });
  return out;
}

}  // namespace mp

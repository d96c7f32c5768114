// Joining and splitting: cat, stack (copies), split, chunk (views).
#include "mp/autocast/autocast.hpp"
#include "mp/ops/shape.hpp"

#include <algorithm>

#include "mp/autograd/node.hpp"

namespace mp {

namespace {

// PyTorch's legacy rule: a 1-D tensor of size 0 may be concatenated with anything (it is skipped).
bool skippable(const Tensor& t) { return t.dim() == 1 && t.sizes()[0] == 0; }

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  MP_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  MP_AUTOCAST(amp::Op::cat, cat, tensors[0], tensors, dim);
  for (size_t i = 0; i < tensors.size(); ++i) {
    MP_CHECK(tensors[i].defined(), "cat: tensor ", i, " is undefined");
    MP_CHECK(tensors[i].dim() > 0, "cat: tensor ", i,
             " is 0-dim and cannot be concatenated; unsqueeze it or use stack");
  }
  // The reference tensor fixes the rank and the sizes of the other dims.
  size_t ref = 0;
  while (ref + 1 < tensors.size() && skippable(tensors[ref])) ++ref;
  const Tensor& r = tensors[ref];
  dim = wrap_dim(dim, r.dim(), "cat");
  DType dt = r.dtype();
  Shape out_shape = r.sizes();
  out_shape[dim] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MP_CHECK(t.device() == r.device(), "cat: tensor ", i, " is on ", t.device().str(), " but tensor ", ref, " is on ",
             r.device().str(), "; move them to one device");
    dt = promote_types(dt, t.dtype());
    if (skippable(t) && r.dim() != 1) continue;
    MP_CHECK(t.dim() == r.dim(), "cat: tensor ", i, " has ", t.dim(), " dims (shape ", shape_str(t.sizes()),
             ") but tensor ", ref, " has ", r.dim(), " (shape ", shape_str(r.sizes()),
             "); all tensors need the same rank");
    for (int64_t d = 0; d < r.dim(); ++d)
      MP_CHECK(d == dim || t.sizes()[d] == r.sizes()[d], "cat: tensor ", i, " has size ", t.sizes()[d], " in dim ", d,
               " but tensor ", ref, " has size ", r.sizes()[d], " (shapes ", shape_str(t.sizes()), " and ",
               shape_str(r.sizes()), "); sizes must match in every dim except the cat dim ", dim);
    out_shape[dim] += t.sizes()[dim];
  }
  Tensor out = empty(out_shape, {.dtype = dt, .device = r.device()});
  std::vector<int64_t> offsets(tensors.size(), -1);  // -1: skipped
  {
    autograd::NoGradGuard ng;
    int64_t off = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Tensor& t = tensors[i];
      if (skippable(t) && r.dim() != 1) continue;
      offsets[i] = off;
      const int64_t len = t.sizes()[dim];
      if (len > 0) out.narrow(dim, off, len).copy_(t.detach());
      off += len;
    }
  }
  if (autograd::any_requires_grad(tensors)) {
    std::vector<int64_t> lens(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) lens[i] = offsets[i] < 0 ? 0 : tensors[i].sizes()[dim];
    autograd::record("CatBackward", tensors, {out}, [offsets, lens, dim](const std::vector<Tensor>& g) {
      std::vector<Tensor> gs(offsets.size());
      for (size_t i = 0; i < offsets.size(); ++i)
        if (offsets[i] >= 0) gs[i] = g[0].narrow(dim, offsets[i], lens[i]);
      return gs;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  MP_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  MP_AUTOCAST(amp::Op::stack, stack, tensors[0], tensors, dim);
  for (size_t i = 0; i < tensors.size(); ++i) {
    MP_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    MP_CHECK(tensors[i].sizes() == tensors[0].sizes(), "stack: tensor ", i, " has shape ",
             shape_str(tensors[i].sizes()), " but tensor 0 has shape ", shape_str(tensors[0].sizes()),
             "; stack needs tensors of equal shape");
  }
  dim = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& t : tensors) parts.push_back(t.unsqueeze(dim));
  return cat(parts, dim);
}

std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim) {
  MP_CHECK(x.defined(), "split: got an undefined tensor");
  MP_CHECK(x.dim() > 0, "split: cannot split a 0-dim tensor");
  dim = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.sizes()[dim];
  MP_CHECK(size > 0 || (size == 0 && n == 0), "split: chunk size must be positive, got ", size, " for dim ", dim,
           " of size ", n);
  if (n == 0) return {x.narrow(dim, 0, 0)};
  std::vector<Tensor> out;
  out.reserve(static_cast<size_t>((n + size - 1) / size));
  {
    autograd::NoGradGuard ng;
    for (int64_t off = 0; off < n; off += size) out.push_back(x.narrow(dim, off, std::min(size, n - off)));
  }
  // One node for all pieces: its backward concatenates the pieces' gradients into one buffer (the
  // engine supplies zeros for unused pieces). A node per piece would build a full-size zero
  // gradient for each and add them up: O(pieces^2) work for a recurrent net's per-step inputs.
  autograd::record("SplitBackward", {x}, out,
                   [dim](const std::vector<Tensor>& g) { return std::vector<Tensor>{cat(g, dim)}; });
  return out;
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  MP_CHECK(x.defined(), "unbind: got an undefined tensor");
  MP_CHECK(x.dim() > 0, "unbind: cannot unbind a 0-dim tensor");
  dim = wrap_dim(dim, x.dim(), "unbind");
  std::vector<Tensor> out;
  out.reserve(static_cast<size_t>(x.sizes()[dim]));
  {
    autograd::NoGradGuard ng;
    for (int64_t i = 0; i < x.sizes()[dim]; ++i) out.push_back(x.select(dim, i));
  }
  // As split: one node whose backward stacks the slices' gradients.
  autograd::record("UnbindBackward", {x}, out,
                   [dim](const std::vector<Tensor>& g) { return std::vector<Tensor>{stack(g, dim)}; });
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t n, int64_t dim) {
  MP_CHECK(x.defined(), "chunk: got an undefined tensor");
  MP_CHECK(n > 0, "chunk: number of chunks must be positive, got ", n);
  MP_CHECK(x.dim() > 0, "chunk: cannot chunk a 0-dim tensor");
  dim = wrap_dim(dim, x.dim(), "chunk");
  const int64_t len = x.sizes()[dim];
  if (len == 0) return std::vector<Tensor>(static_cast<size_t>(n), x.narrow(dim, 0, 0));  // as PyTorch: n empty chunks
  // PyTorch's rule: chunks of ceil(len / n); the last may be smaller and fewer than n may result.
  return split(x, (len + n - 1) / n, dim);
}

}  // namespace mp

// Embedding lookup (gather forward, dense scatter-add backward) and inverted dropout.
#include "mp/ops/embedding.hpp"

#include <cmath>

#include "backend/index_kernels.hpp"
#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"

namespace mp {

Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx) {
  MP_CHECK(weight.defined() && indices.defined(), "embedding: got an undefined tensor");
  MP_CHECK(weight.dim() == 2, "embedding: expected a weight of shape [V, D], got ", weight.describe());
  MP_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32,
           "embedding: expected i64 or i32 indices, got ", indices.describe(), "; convert with .to(mp::DType::i64)");
  MP_CHECK(weight.device() == indices.device(), "embedding: weight on ", weight.device().str(), " but indices on ",
           indices.device().str(), "; move one with .to(device)");
  const int64_t V = weight.sizes()[0], D = weight.sizes()[1];
  MP_CHECK(padding_idx >= -1 && padding_idx < V, "embedding: padding_idx must be -1 (none) or in [0, ", V, "), got ",
           padding_idx);
  Shape out_shape = indices.sizes();
  out_shape.push_back(D);
  Tensor wc = weight.detach().contiguous();
  Tensor ic = indices.detach().contiguous();
  Tensor out = empty(out_shape, {.dtype = weight.dtype(), .device = weight.device()});
  backend::embedding_kernel.get(weight.device())(out, wc, ic);
  if (autograd::any_requires_grad({&weight})) {
    // Accumulate in f32 for 16-bit weights (repeated indices add many small rows); the engine casts
    // the gradient back to the weight's dtype.
    const DType acc = weight.dtype() == DType::f64 ? DType::f64 : DType::f32;
    autograd::record("EmbeddingBackward", {weight}, {out}, [ic, V, D, acc, padding_idx](const std::vector<Tensor>& g) {
      Tensor gw = zeros({V, D}, {.dtype = acc, .device = g[0].device()});
      backend::embedding_backward_kernel.get(g[0].device())(gw, g[0].contiguous(), ic, padding_idx);
      return std::vector<Tensor>{gw};
    });
  }
  return out;
}

Tensor dropout(const Tensor& x, double p, bool training) {
  MP_CHECK(x.defined(), "dropout: got an undefined tensor");
  MP_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got ", p);
  if (!training || p == 0.0) return x;
  MP_CHECK(is_floating(x.dtype()), "dropout: expected a floating tensor, got ", x.describe(),
           "; convert with .to(mp::DType::f32)");
  const double scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  Tensor xc = x.detach().contiguous();
  Tensor out = empty(x.sizes(), {.dtype = x.dtype(), .device = x.device()});
  Tensor mask = empty(x.sizes(), {.dtype = DType::u8, .device = x.device()});
  // Reserve numel draws even for p == 1, so the stream position does not depend on p; keyed by the global batch
  // (Note [draws keyed by the global batch]).
  const PhiloxState st = default_generator().reserve_batch(static_cast<uint64_t>(x.numel()));
  backend::dropout_kernel.get(x.device())(out, mask, xc, static_cast<float>(p), scale, st);
  if (autograd::any_requires_grad({&x})) {
    const DType dt = x.dtype();
    autograd::record("DropoutBackward", {x}, {out}, [mask, scale, dt](const std::vector<Tensor>& g) {
      Tensor gi = empty(mask.sizes(), {.dtype = dt, .device = mask.device()});
      backend::dropout_backward_kernel.get(mask.device())(gi, g[0].contiguous(), mask, scale);
      return std::vector<Tensor>{gi};
    });
  }
  return out;
}

}  // namespace mp

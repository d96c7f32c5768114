#include "mp/optim/clip_grad.hpp"

#include <cmath>

#include "mp/autograd/node.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/reduce.hpp"

namespace mp::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, const std::function<double(double)>& total) {
  MP_CHECK(max_norm > 0 && std::isfinite(max_norm), "clip_grad_norm_: max_norm must be positive and finite, got ",
           max_norm);
  autograd::NoGradGuard ng;
  double sq = 0.0;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    sq += sum_squares(g).item<double>();  // one pass, f32 accumulation from any floating dtype
  }
  if (total) sq = total(sq);
  const double norm = std::sqrt(sq);
  const double coef = max_norm / (norm + 1e-6);
  if (std::isfinite(norm) && coef < 1.0) {
    for (const Tensor& p : params) {
      Tensor g = p.grad();
      if (g.defined()) mul_(g, coef);
    }
  }
  return norm;
}

}  // namespace mp::optim

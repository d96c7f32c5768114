#include "mp/optim/clip_grad.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "mp/autograd/node.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/reduce.hpp"
#include "mp/ops/shape.hpp"

namespace mp::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, const std::function<double(double)>& total) {
  MP_CHECK(max_norm > 0 && std::isfinite(max_norm), "clip_grad_norm_: max_norm must be positive and finite, got ",
           max_norm);
  autograd::NoGradGuard ng;
  // Each gradient's sum of squares stays on its device (one pass, f32 accumulation from any floating dtype, f64
  // for f64); the partials of one device and dtype are stacked and summed in f64 there, so the host waits once
  // per group, not once per parameter (148 waits a step for GPT-2 on a GPU).
  std::vector<std::vector<Tensor>> groups;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    Tensor s = sum_squares(g);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const std::vector<Tensor>& grp) {
      return grp.front().device() == s.device() && grp.front().dtype() == s.dtype();
    });
    if (it == groups.end())
      groups.push_back({std::move(s)});
    else
      it->push_back(std::move(s));
  }
  double sq = 0.0;
  for (const std::vector<Tensor>& grp : groups) sq += sum(stack(grp).to(DType::f64)).item<double>();
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

#include "mp/autograd/gradcheck.hpp"

#include <cmath>
#include <sstream>

#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"
#include "mp/ops/pointwise.hpp"
#include "mp/ops/reduce.hpp"

namespace mp::autograd {

GradcheckResult gradcheck(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& opt) {
  for (size_t i = 0; i < inputs.size(); ++i)
    MP_CHECK(!inputs[i].requires_grad() || inputs[i].dtype() == DType::f64, "gradcheck: input ", i,
             " must be f64 for central differences to be accurate, got ", inputs[i].describe());
  // Fixed random weights per output make a scalar objective L = sum_k <v_k, out_k>.
  std::vector<Tensor> outs = fn(inputs);
  std::vector<Tensor> weights;
  for (size_t k = 0; k < outs.size(); ++k) {
    std::vector<double> w(static_cast<size_t>(outs[k].numel()));
    for (size_t j = 0; j < w.size(); ++j) w[j] = 2.0 * philox_uniform(opt.seed, k * 1000003ULL, j) - 1.0;
    weights.push_back(from_vector(w, outs[k].sizes()));
  }
  auto objective = [&](const std::vector<Tensor>& outputs) {
    Tensor total = scalar_tensor(0.0, {.dtype = DType::f64});
    for (size_t k = 0; k < outputs.size(); ++k)
      if (is_floating(outputs[k].dtype())) total = add(total, sum(mul(outputs[k].to(DType::f64), weights[k])));
    return total;
  };
  std::vector<Tensor> diff_inputs;
  std::vector<size_t> diff_index;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      diff_inputs.push_back(inputs[i]);
      diff_index.push_back(i);
    }
  Tensor L = objective(outs);
  std::vector<Tensor> analytic = grad({L}, diff_inputs);
  GradcheckResult res;
  NoGradGuard ng;
  for (size_t a = 0; a < diff_inputs.size(); ++a) {
    Tensor x = diff_inputs[a];
    MP_CHECK(x.is_contiguous(), "gradcheck: input ", diff_index[a], " must be contiguous");
    double* p = x.data_ptr<double>();
    std::vector<double> ga = analytic[a].defined() ? analytic[a].to_vector<double>()
                                                   : std::vector<double>(static_cast<size_t>(x.numel()), 0.0);
    for (int64_t j = 0; j < x.numel(); ++j) {
      const double orig = p[j];
      p[j] = orig + opt.eps;
      const double fp = objective(fn(inputs)).item<double>();
      p[j] = orig - opt.eps;
      const double fm = objective(fn(inputs)).item<double>();
      p[j] = orig;
      const double num = (fp - fm) / (2.0 * opt.eps);
      const double err = std::abs(num - ga[j]);
      res.max_abs_error = std::max(res.max_abs_error, err);
      if (!(err <= opt.atol + opt.rtol * std::abs(num)) && res.ok) {
        res.ok = false;
        std::ostringstream os;
        os << "gradcheck: input " << diff_index[a] << " element " << j << ": numerical " << num << " vs analytical "
           << ga[j] << " (|diff| " << err << ")";
        res.message = os.str();
      }
    }
  }
  return res;
}

}  // namespace mp::autograd

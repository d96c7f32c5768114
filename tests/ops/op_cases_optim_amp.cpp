// The op table, optimizer steps and loss-scale kernels (tests/ops/op_cases.hpp): forward values only (no
// gradient flows through a step). SGD (plain, momentum with dampening and weight decay, nesterov), Adam / AdamW (with
// and without amsgrad), three steps on parameters of odd sizes (f32: one larger than a block of the multi-tensor
// kernels), 16-bit parameters with and without f32 masters, gradients in the parameter's dtype or f32: the parameters
// and, as a case of their own, every state buffer; unscaling with and without inf/NaN; the underflow statistics;
// clip_grad_norm_. Folded from the hand-written CUDA tests with their tolerances and reasons;
// tests/cuda/test_cuda_ops_optim.cpp keeps the contracts that are not one op's values (a mixed parameter list in one
// launch, stochastic rounding's shared draws, the GradScaler's skip decisions).
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/amp_kernels.hpp"
#include "op_cases.hpp"
#include "optim_tol.hpp"

namespace mp::op_table {

using namespace cuda_test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

optim::Optimizer& as_optimizer(optim::Optimizer& o) { return o; }
optim::Optimizer& as_optimizer(const std::unique_ptr<optim::Optimizer>& o) { return *o; }

// Three steps of `make_opt` over parameters initialised from in[0..n) with gradients in[n..2n) (the gradient of
// step k: k in[n + i], or in[n + i] / k with `shrinking`, which makes amsgrad's maximum differ from the second
// moment), in the gradients' dtype; afterwards the parameters (or, with `buffers`, every state buffer in name
// order, after the master with `master`), flattened and joined.
template <class MakeOpt>
std::function<Tensor(const std::vector<Tensor>&)> steps_of(MakeOpt make_opt, bool master, bool buffers = false,
                                                           bool shrinking = false) {
  return [make_opt, master, buffers, shrinking](const std::vector<Tensor>& in) {
    const size_t n = in.size() / 2;
    std::vector<Tensor> params;
    for (size_t i = 0; i < n; ++i) params.push_back(in[i].detach().clone().requires_grad_());
    auto holder = make_opt(params);
    optim::Optimizer& opt = as_optimizer(holder);
    opt.set_master_weights(master);
    for (int step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < n; ++i)
        params[i].set_grad(mul(in[n + i], shrinking ? 1.0 / step : static_cast<double>(step)).to(in[n + i].dtype()));
      opt.step();
    }
    std::vector<Tensor> flat;
    for (const Tensor& p : params) {
      if (!buffers) {
        flat.push_back(p.detach().reshape({-1}));
        continue;
      }
      // The master first (the reference in f64 has none: its parameter is the exact master), then the moments.
      if (master) {
        const Tensor m = opt.master(p);
        flat.push_back(
            (m.defined() ? m : p.detach().to(is_low_precision(p.dtype()) ? DType::f32 : p.dtype())).reshape({-1}));
      }
      for (const auto& [name, buf] : opt.state(p)->buffers)
        if (name != "master") flat.push_back(buf.reshape({-1}));
    }
    return cat(flat, 0);
  };
}

// The state buffers' tolerance (f32, or f64 for f64 parameters): state_tol (optim_tol.hpp), plus, for a
// 16-bit parameter without masters, its one-ulp-per-step difference fed into the buffers by weight decay `wd`
// (wd ulp(dt, 2) per step, |w| < 2).
Tol buffer_tol(DType dt, bool master, double wd, int steps) {
  Tol t = state_tol(dt, steps);
  if (is_low_precision(dt) && !master) {
    t.atol += wd * ulp(dt, 2.0) * steps;
    t.why += "; the 16-bit parameter's one-ulp difference per step through weight decay";
  }
  return t;
}

// Parameters in dt and their gradients in gdt (f32: also one larger than a block of the multi-tensor kernels).
std::vector<Tensor> params_and_grads(DType dt, DType gdt) {
  std::vector<Tensor> v;
  std::vector<Shape> shapes = {{37, 11}, {1}, {1029}};
  if (dt == DType::f32) shapes.push_back({(int64_t{1} << 18) + 3});
  for (const Shape& s : shapes) v.push_back(uniform(s, -1, 1, dt));
  for (const Shape& s : shapes) v.push_back(uniform(s, -1, 1, gdt));
  return v;
}

}  // namespace

std::vector<OpCase> optim_amp_cases() {
  std::vector<OpCase> cases;
  const std::vector<std::pair<std::string, optim::SGDOptions>> sgds = {
      {"plain", {.lr = 0.1}},
      {"momentum 0.9 dampening 0.1 wd 0.01", {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01}},
      {"nesterov 0.9", {.lr = 0.05, .momentum = 0.9, .nesterov = true}},
  };
  for (const bool master : {false, true}) {
    // f32 gradients of a 16-bit or f64 parameter ("f32 grads"), or gradients in the parameter's dtype.
    for (const bool f32_grads : {false, true}) {
      const std::string m = std::string(master ? ", f32 masters" : "") + (f32_grads ? ", f32 grads" : "");
      std::vector<DType> dts = master ? std::vector<DType>{DType::f16, DType::bf16} : all_floats();
      // f32 gradients of 16-bit parameters (O2 without masters' own gradients); an f64 parameter would take one f32
      // rounding of its update, which the f64 reference does not have.
      if (f32_grads) dts = {DType::f16, DType::bf16};
      const auto gdt = [f32_grads](DType dt) { return f32_grads ? DType::f32 : dt; };
      for (const auto& [name, o] : sgds) {
        const optim::SGDOptions opts = o;
        const auto sgd = [opts](std::vector<Tensor> p) { return optim::SGD(std::move(p), opts); };
        cases.push_back({"SGD " + name + " 3 steps" + m, dts, [sgd, master, gdt](DType dt) {
                           OpCheck chk;
                           chk.inputs = params_and_grads(dt, gdt(dt));
                           chk.fn = steps_of(sgd, master);
                           chk.out = param_tol(dt, master, 3);
                           return chk;
                         }});
        if (opts.momentum != 0)
          cases.push_back({"SGD " + name + " 3 steps, state" + m, dts, [sgd, master, gdt, opts](DType dt) {
                             OpCheck chk;
                             chk.inputs = params_and_grads(dt, gdt(dt));
                             chk.fn = steps_of(sgd, master, true);
                             chk.out = buffer_tol(dt, master, opts.weight_decay, 3);
                             return chk;
                           }});
      }
      if (f32_grads) continue;
      for (const bool decoupled : {false, true}) {
        for (const bool amsgrad : {false, true}) {
          const std::string name =
              std::string(decoupled ? "AdamW wd 0.1" : "Adam wd 0.01") + (amsgrad ? " amsgrad" : "");
          const double wd = decoupled ? 0.1 : 0.01;
          const auto make = [decoupled, amsgrad, wd](std::vector<Tensor> p) -> std::unique_ptr<optim::Optimizer> {
            if (decoupled)
              return std::make_unique<optim::AdamW>(
                  std::move(p), optim::AdamWOptions{.lr = 0.01, .weight_decay = wd, .amsgrad = amsgrad});
            return std::make_unique<optim::Adam>(
                std::move(p), optim::AdamOptions{.lr = 0.01, .weight_decay = wd, .amsgrad = amsgrad});
          };
          for (const bool buffers : {false, true}) {
            cases.push_back({name + " 3 steps" + (buffers ? ", state" : "") + m, dts,
                             [make, master, buffers, decoupled, wd](DType dt) {
                               OpCheck chk;
                               chk.inputs = params_and_grads(dt, dt);
                               chk.fn = steps_of(make, master, buffers, true);
                               // Adam's L2 weight decay feeds a 16-bit parameter's one-ulp difference into the
                               // moments; AdamW's decay does not enter them.
                               chk.out =
                                   buffers ? buffer_tol(dt, master, decoupled ? 0.0 : wd, 3) : param_tol(dt, master, 3);
                               chk.out.ulps += 2;
                               chk.out.why += "; Adam: sqrt and a division per step, correctly rounded on both devices";
                               return chk;
                             }});
          }
        }
      }
    }
  }
  // Unscaling by 1/1024 (a power of two: exact) of several gradients, one of them poisoned or not; the result is
  // the unscaled gradients joined with found_inf.
  for (const double poison : {0.0, kInf, kNaN}) {
    const std::string p = poison == 0.0 ? "clean" : std::isnan(poison) ? "NaN in the middle" : "inf in a vector tail";
    cases.push_back(
        {"unscale 1/1024 " + p, {DType::f32, DType::f16, DType::bf16, DType::f64}, [poison](DType dt) {
           OpCheck chk;
           Tensor big = uniform({1037}, -1000, 1000, dt);
           if (poison != 0.0) big.narrow(0, std::isnan(poison) ? 500 : 1036, 1).fill_(poison);
           chk.inputs = {uniform({1}, -1000, 1000, dt), big, uniform({(int64_t{1} << 16) + 5}, -1000, 1000, dt)};
           chk.fn = [](const std::vector<Tensor>& in) {
             std::vector<Tensor> gs;
             for (const Tensor& t : in) gs.push_back(t.clone());
             const bool found = backend::unscale_kernel.get(gs.front().device())(gs, 1.0 / 1024, true);
             std::vector<Tensor> flat;
             for (const Tensor& g : gs) flat.push_back(g.reshape({-1}).to(DType::f64));
             flat.push_back(full({1}, found ? 1.0 : 0.0, {.dtype = DType::f64, .device = gs.front().device()}));
             return cat(flat, 0);
           };
           chk.out = exact("multiplication by a power of two: exact; found_inf exact");
           return chk;
         }});
  }
  // Underflow statistics of values 2^k (k in [-30, 2]) with random signs, zeros, inf and NaN: the classification
  // of each value is exact, so the counts are equal.
  for (const double scale : {1.0, 1024.0, 65536.0}) {
    cases.push_back({"underflow_stats scale " + std::to_string(static_cast<int64_t>(scale)),
                     {DType::f32, DType::f64, DType::bf16},
                     [scale](DType dt) {
                       const Tensor k = integers({4099}, -30, 3, DType::f64);
                       const Tensor sign = integers({4099}, 0, 2, DType::f64);
                       Tensor v = mul(pow(full({4099}, 2.0, {.dtype = DType::f64}), k), mul(sign, 2.0) - 1.0);
                       v.narrow(0, 5, 10).zero_();
                       v.narrow(0, 100, 1).fill_(kInf);
                       v.narrow(0, 200, 1).fill_(kNaN);
                       OpCheck chk;
                       chk.inputs = {v.to(dt), mul(v.narrow(0, 0, 1000), 0.75).to(dt)};
                       chk.fn = [scale](const std::vector<Tensor>& in) {
                         const amp::UnderflowStats s = amp::underflow_stats({in[0], in[1]}, scale);
                         return from_vector<double>({static_cast<double>(s.nonzero), static_cast<double>(s.nonfinite),
                                                     s.underflow_unscaled, s.subnormal_unscaled, s.underflow_scaled,
                                                     s.subnormal_scaled},
                                                    {6}, {.dtype = DType::f64})
                             .to(in[0].device());
                       };
                       chk.out = exact("counts of an exact classification");
                       return chk;
                     }});
  }
  // clip_grad_norm_ to 1 of gradients of norm ~3: the total norm joined with the clipped gradients. The norm: sums
  // of squares in f32 (f64) in another order: relative 2 sqrt(K) u_acc (terms >= 0); the gradients are scaled by
  // max_norm / (norm + 1e-6).
  cases.push_back({"clip_grad_norm_ to 1", all_floats(), [](DType dt) {
                     OpCheck chk;
                     chk.inputs = params_and_grads(dt, dt);
                     int64_t K = 0;
                     for (size_t i = chk.inputs.size() / 2; i < chk.inputs.size(); ++i) {
                       chk.inputs[i] = mul(chk.inputs[i].to(DType::f64), 3.0).to(dt);
                       K += chk.inputs[i].numel();
                     }
                     chk.fn = [](const std::vector<Tensor>& in) {
                       const size_t n = in.size() / 2;
                       std::vector<Tensor> params;
                       for (size_t i = 0; i < n; ++i) {
                         params.push_back(in[i].detach().clone().requires_grad_());
                         params.back().set_grad(in[n + i].detach().clone());
                       }
                       const double norm = optim::clip_grad_norm_(params, 1.0);
                       const DType dt = in[0].dtype();
                       std::vector<Tensor> flat{full({1}, norm, {.dtype = dt, .device = in[0].device()})};
                       for (const Tensor& p : params) flat.push_back(p.grad().reshape({-1}));
                       return cat(flat, 0);
                     };
                     chk.out = Tol{.ulps = 2,
                                   .rtol = 2 * std::sqrt(static_cast<double>(K)) * acc_roundoff(dt) + 1e-15,
                                   .why =
                                       "the norm: a sum of squares over K elements in another order; the gradients "
                                       "scaled by max_norm / (norm + 1e-6)"};
                     return chk;
                   }});
  return cases;
}

}  // namespace mp::op_table

// The op table, optimizer steps and loss-scale kernels (tests/ops/op_cases.hpp): forward values only (no
// gradient flows through a step). SGD (plain, momentum with dampening and weight decay, nesterov) and Adam / AdamW,
// three steps on a few parameters of odd sizes, 16-bit parameters with and without f32 masters; unscaling with and
// without inf/NaN; the underflow statistics. New cases; the hand-written tests/cuda/test_cuda_ops_optim.cpp stays
// (it also compares every state buffer, mixed parameter dtypes in one step, stochastic rounding, clip_grad_norm).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "backend/amp_kernels.hpp"
#include "op_cases.hpp"

namespace mp::op_table {

using namespace cuda_test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// test_cuda_ops_optim.cpp's state_tol / param_tol: each step evaluates the same formula (optim_pointwise.hpp) on
// both devices; FMA contraction may differ by one rounding of a product per multiply-add: a few ulps of the
// state per step, absolute at the scale of the terms (|w| <= 2, lr |update| <= 1), over the steps. 16-bit
// parameters: the rounded masters (one ulp) or, without masters, rounded after every step (one ulp per step).
Tol param_tol(DType dt, bool master, int steps) {
  const double u = acc_roundoff(dt);
  if (!is_low_precision(dt))
    return Tol{.ulps = 4.0 * steps, .atol = 8.0 * steps * u, .why = "f32 (f64) update formulas; FMA contraction"};
  if (master)
    return Tol{.ulps = 1,
               .atol = 8.0 * steps * acc_roundoff(DType::f32),
               .why = "16-bit parameter = the f32 master rounded once; the masters' FMA allowance"};
  return Tol{.ulps = 1.0 * steps, .why = "16-bit parameter rounded after every step: one ulp per step"};
}

// Three steps of `make_opt` over parameters initialised from in[0..n) with gradients in[n..2n); the parameters
// afterwards, flattened and joined.
template <class MakeOpt>
std::function<Tensor(const std::vector<Tensor>&)> steps_of(MakeOpt make_opt, bool master) {
  return [make_opt, master](const std::vector<Tensor>& in) {
    const size_t n = in.size() / 2;
    std::vector<Tensor> params;
    for (size_t i = 0; i < n; ++i) params.push_back(in[i].detach().clone().requires_grad_());
    auto opt = make_opt(params);
    opt.set_master_weights(master);
    for (int step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < n; ++i) params[i].set_grad(mul(in[n + i], static_cast<double>(step)).to(in[i].dtype()));
      opt.step();
    }
    std::vector<Tensor> flat;
    for (const Tensor& p : params) flat.push_back(p.detach().reshape({-1}));
    return cat(flat, 0);
  };
}

std::vector<Tensor> params_and_grads(DType dt) {
  std::vector<Tensor> v;
  const std::vector<Shape> shapes = {{37, 11}, {1}, {1029}};
  for (const Shape& s : shapes) v.push_back(uniform(s, -1, 1, dt));
  for (const Shape& s : shapes) v.push_back(uniform(s, -1, 1, dt));
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
    const std::string m = master ? ", f32 masters" : "";
    const std::vector<DType> dts = master ? std::vector<DType>{DType::f16, DType::bf16} : all_floats();
    for (const auto& [name, o] : sgds) {
      const optim::SGDOptions opts = o;
      cases.push_back({"SGD " + name + " 3 steps" + m, dts, [opts, master](DType dt) {
                         OpCheck chk;
                         chk.inputs = params_and_grads(dt);
                         chk.fn =
                             steps_of([opts](std::vector<Tensor> p) { return optim::SGD(std::move(p), opts); }, master);
                         chk.out = param_tol(dt, master, 3);
                         return chk;
                       }});
    }
    cases.push_back(
        {"Adam wd 0.01 3 steps" + m, dts, [master](DType dt) {
           OpCheck chk;
           chk.inputs = params_and_grads(dt);
           chk.fn = steps_of(
               [](std::vector<Tensor> p) { return optim::Adam(std::move(p), {.lr = 0.01, .weight_decay = 0.01}); },
               master);
           chk.out = param_tol(dt, master, 3);
           chk.out.ulps += 2;
           chk.out.why += "; Adam: sqrt and a division per step, correctly rounded on both devices";
           return chk;
         }});
    cases.push_back(
        {"AdamW wd 0.1 3 steps" + m, dts, [master](DType dt) {
           OpCheck chk;
           chk.inputs = params_and_grads(dt);
           chk.fn = steps_of(
               [](std::vector<Tensor> p) { return optim::AdamW(std::move(p), {.lr = 0.01, .weight_decay = 0.1}); },
               master);
           chk.out = param_tol(dt, master, 3);
           chk.out.ulps += 2;
           chk.out.why += "; Adam: sqrt and a division per step, correctly rounded on both devices";
           return chk;
         }});
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
  for (const double scale : {1.0, 65536.0}) {
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
  return cases;
}

}  // namespace mp::op_table

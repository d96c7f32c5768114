// The optimizer steps' tolerances, shared by the op table (tests/ops/op_cases_optim_amp.cpp) and the CUDA optimizer
// contracts (tests/cuda/test_cuda_ops_optim.cpp).
#pragma once
#include "cuda/cuda_test_util.hpp"

namespace mp::cuda_test {

// Each step evaluates the same formula (optim_pointwise.hpp) on both devices; nvcc contracts a * b + c into FMAs (so
// may GCC in the AVX-512 loop), so each multiply-add may differ by one rounding of its product: a few ulps of the
// state per step, absolute at the scale of the terms (|w| <= 2, lr |update| <= 1 in these tests), accumulated over
// the steps.
inline Tol state_tol(DType dt, int steps) {
  const double u = acc_roundoff(dt);
  return Tol{.ulps = 4.0 * steps, .atol = 8.0 * steps * u, .why = "f32 (f64) update formulas; FMA contraction"};
}
// 16-bit parameters are the rounded masters (one 16-bit ulp, plus the masters' FMA allowance: where an update cancels
// the weight, seen on an H200 as a master of 0 on the CPU and 2^-33 on the device, the rounded parameters keep that
// difference) or, without masters, rounded after every step (one ulp per step, and the same FMA allowance: a bf16
// weight the update cancels was 0 on the CPU and -3e-9 on an H200 after 3 steps, bench/RESULTS.md sixth lease).
inline Tol param_tol(DType dt, bool master, int steps) {
  if (!is_low_precision(dt)) return state_tol(dt, steps);
  if (master)
    return Tol{.ulps = 1,
               .atol = state_tol(DType::f32, steps).atol,
               .why = "16-bit parameter = the f32 master rounded once; the masters' FMA allowance"};
  return Tol{.ulps = 1.0 * steps,
             .atol = state_tol(DType::f32, steps).atol,
             .why = "16-bit parameter rounded after every step: one ulp per step; the f32 update's FMA allowance"};
}

}  // namespace mp::cuda_test

// The op table (issue 24): one list of op cases, run by tests/ops/test_op_table.cpp on every device there is
// (the CPU always; cuda:0 when a GPU exists, or the CPU standing in for it under MP_CUDA_TESTS_ON_CPU=1), in the
// manner of ggml's test-backend-ops.
//
// A case is a name, the dtypes it runs in and `make(dt)`: an OpCheck (tests/cuda/cuda_test_util.hpp) holding the
// CPU inputs in dt (seeded; odd sizes, strided, broadcast and channels-last views where they matter), the op, and
// the tolerances, each with its reason: `out` for the forward, `grad` (nullopt: forward only, e.g. optimizer
// steps) for the gradient of every differentiable input under one random upstream gradient. Each case is checked
//   1. against the CPU in f64 (the same op on the inputs widened exactly; `reference` f32 where the op has no
//      f64, the reason in reference_why), on every device, under accuracy_tol() of the case's tolerances, and
//   2. on a device other than the CPU, against the CPU in the same dtype under the case's tolerances themselves
//      (the hand-written CUDA tests' check, their tolerances carried over unchanged).
// The coverage tests fail when a kernel registered for a device (backend::registered_kernels()) is reached by no
// case on that device, observed while the cases run (backend::ObserveKernelCalls), unless kExempt names it.
//
// Adding an op: one case here (a row of the family's op_cases_<family>.cpp); the coverage test names a new
// kernel that has none.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.hpp"

namespace mp::op_table {

using cuda_test::OpCheck;
using cuda_test::Tol;

/// The dtype the reference runs in.
enum class Reference { f64, f32 };

/// One row of the table.
struct OpCase {
  std::string name;                    ///< unique; the test's name (other characters than [A-Za-z0-9] become '_')
  std::vector<DType> dtypes;           ///< the dtypes it runs in
  std::function<OpCheck(DType)> make;  ///< inputs, op and tolerances (with reasons) for one dtype
  Reference reference = Reference::f64;
  std::string reference_why;  ///< why the reference is not f64, when it is not
  /// Optional: the accuracy tolerances (against the reference) when accuracy_tol() of the case's does not fit;
  /// the reason goes in their `why`.
  std::function<Tol(DType)> accuracy_out, accuracy_grad;
};

/// The tolerance of a result in dt against the CPU in f64, from the case's two-device tolerance t. Both devices
/// compute in dt (16-bit: through f32) the same way, so their shared error is not in t (an "exact" two-device
/// tolerance means the same roundings, not none): the formulas round their intermediates and the sums their
/// partial sums to the compute or storage dtype, a handful of roundings each <= u(dt) relative to a value no
/// larger than the largest result (gradients of broadcast inputs: sums of rounded 16-bit products): 8 u(dt)
/// normwise, plus t for the device's own departures, plus one ulp of dt (the reference is not rounded to dt).
inline Tol accuracy_tol(Tol t, DType dt) {
  t.ulps = std::max(t.ulps, 1.0);
  t.normwise += 8 * cuda_test::unit_roundoff(dt);
  t.why = "against the CPU in f64: 8 u(" + std::string(dtype_name(dt)) +
          ") normwise (the roundings both devices share) + 1 ulp + the two-device tolerance: " + t.why;
  return t;
}

/// The floating dtypes (f32, f16, bf16, f64).
inline const std::vector<DType>& all_floats() { return cuda_test::kFloatTypes; }

/// The whole table, and its parts by family (op_cases_<family>.cpp).
const std::vector<OpCase>& op_cases();
std::vector<OpCase> pointwise_cases();
std::vector<OpCase> linalg_conv_pool_cases();
std::vector<OpCase> norm_softmax_loss_cases();
std::vector<OpCase> reduce_index_rnn_cases();
std::vector<OpCase> optim_amp_cases();

}  // namespace mp::op_table

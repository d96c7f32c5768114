#pragma once
// Argument checks shared by the recurrent ops (src/ops/rnn.cpp, src/ops/rnn_library.cpp).
#include "mp/core/error.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::rnn_checks {

/// `t` must be a defined floating tensor; the message names op and what.
inline void check_floating(const Tensor& t, const char* op, const char* what) {
  MP_CHECK(t.defined(), op, ": got an undefined ", what);
  MP_CHECK(is_floating(t.dtype()), op, ": expected a floating ", what, " (f32, f64, f16, bf16), got ", t.describe(),
           "; convert with .to(mp::DType::f32)");
}

/// `b` (named `what`) must be on the device of the input `a`.
inline void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* what) {
  MP_CHECK(a.device() == b.device(), op, ": ", what, " is on ", b.device().str(), " but the input is on ",
           a.device().str(), "; move it with .to(device)");
}

}  // namespace mp::rnn_checks

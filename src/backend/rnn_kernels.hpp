#pragma once
#include "backend/registry.hpp"
#include "backend/rnn_pointwise.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// Fused LSTM gates forward: gates [B, 4H] (pre-activations, order i, f, g, o) and c [B, H] give
/// h_out and c_out [B, H]. All operands contiguous; dtypes may differ (any floating). Computes in
/// double when gates or c is f64, else in float (16-bit operands are converted on load/store).
using LstmGatesForwardKernel = void(const Tensor& h_out, const Tensor& c_out, const Tensor& gates, const Tensor& c);
inline constinit KernelSlot<LstmGatesForwardKernel> lstm_gates_forward_kernel{"lstm_gates_forward"};

/// Fused LSTM gates backward: from dh_out, dc_out [B, H] and the saved forward inputs gates [B, 4H]
/// and c [B, H], writes dgates [B, 4H] and dc [B, H]. All contiguous, any floating dtypes; compute
/// type as in the forward.
using LstmGatesBackwardKernel = void(const Tensor& dgates, const Tensor& dc, const Tensor& dh_out, const Tensor& dc_out,
                                     const Tensor& gates, const Tensor& c);
inline constinit KernelSlot<LstmGatesBackwardKernel> lstm_gates_backward_kernel{"lstm_gates_backward"};

}  // namespace mp::backend

#pragma once
// The per-op precision policy of autocast: one table (src/autocast/policy.cpp) puts every op of
// include/mp/ops in a class. See docs/DESIGN.md section 1.4.
#include <cstdint>

#include "mp/core/device.hpp"

namespace mp::amp {

/// How autocast treats an op's floating inputs.
enum class CastPolicy : uint8_t {
  lower,    ///< cast f32 inputs to the autocast dtype (f16/bf16): matmul, linear, conv, RNN cells, attention
  fp32,     ///< cast 16-bit inputs to f32: softmax, log_softmax, losses, layer_norm, large reductions, exp/log/pow
  promote,  ///< cast all floating inputs to the widest among them: binary element-wise ops, cat, stack, where
  none,     ///< run in whatever dtype the inputs have (relu, pools, dropout, batch_norm with f32 statistics)
};

/// Every op that consults the policy.
enum class Op : uint8_t {
  matmul,
  bmm,
  linear,
  conv2d,
  lstm_cell,
  lstm_layer,
  gru_cell,
  rnn_tanh_cell,
  scaled_dot_product_attention,  // lower
  softmax,
  log_softmax,
  cross_entropy,
  nll_loss,
  mse_loss,
  layer_norm,
  sum,
  mean,
  var,  // fp32
  exp,
  log,
  pow,
  rsqrt,  // fp32
  add,
  sub,
  mul,
  div,
  maximum,
  minimum,
  where,
  cat,
  stack,  // promote
  kCount
};

/// The op's name as the ops API spells it ("matmul", "cross_entropy", ...).
const char* op_name(Op op);

/// The class of `op` on device type `device` (the CPU and CUDA columns of the table).
CastPolicy cast_policy(Op op, DeviceType device);

/// Name of a class: "lower", "fp32", "promote", "none".
const char* policy_name(CastPolicy p);

}  // namespace mp::amp

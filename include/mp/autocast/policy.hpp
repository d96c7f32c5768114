#pragma once
// The per-op precision policy of autocast: one table puts every op of include/mp/ops that consults it in a class.
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

// Note [the autocast policy table]
// MP_AUTOCAST_POLICY is the one list of the ops that consult the policy: X(op, cpu class, cuda class). The enum
// Op, op_name() and cast_policy() all come from it (src/autocast/policy.cpp), so adding an op or moving it to
// another class is one line, and no order can go wrong. Why each class (the reference articles agree):
//  * lower: matrix products dominate the FLOPs and accumulate in f32 inside oneDNN / cuBLASLt / cuDNN, so 16-bit
//    inputs lose little and run on AMX / tensor cores. Attention is lower too: its two products take 16-bit
//    operands while its softmax statistics stay f32 inside the kernel (Note [fused attention]).
//  * fp32: exp/log/pow amplify relative input error; softmax and the losses sum many exponentials; long reductions
//    in 16-bit lose low-order bits (a bf16 running sum stalls at 256 ones); layer_norm's statistics need f32.
//  * promote: element-wise ops with mixed inputs run in the widest type, so an f32 residual added to a bf16 branch
//    stays f32.
//  * Ops not listed run in their inputs' dtype (none): relu, pools, dropout, and batch_norm, which computes its
//    statistics in f32 whatever its input. CPU and CUDA agree today; the columns let them differ.
#define MP_AUTOCAST_POLICY(X)                   \
  X(matmul, lower, lower)                       \
  X(bmm, lower, lower)                          \
  X(linear, lower, lower)                       \
  X(conv2d, lower, lower)                       \
  X(lstm_cell, lower, lower)                    \
  X(lstm_layer, lower, lower)                   \
  X(gru_cell, lower, lower)                     \
  X(rnn_tanh_cell, lower, lower)                \
  X(scaled_dot_product_attention, lower, lower) \
  X(softmax, fp32, fp32)                        \
  X(log_softmax, fp32, fp32)                    \
  X(cross_entropy, fp32, fp32)                  \
  X(nll_loss, fp32, fp32)                       \
  X(mse_loss, fp32, fp32)                       \
  X(layer_norm, fp32, fp32)                     \
  X(sum, fp32, fp32)                            \
  X(mean, fp32, fp32)                           \
  X(var, fp32, fp32)                            \
  X(exp, fp32, fp32)                            \
  X(log, fp32, fp32)                            \
  X(pow, fp32, fp32)                            \
  X(rsqrt, fp32, fp32)                          \
  X(add, promote, promote)                      \
  X(sub, promote, promote)                      \
  X(mul, promote, promote)                      \
  X(div, promote, promote)                      \
  X(maximum, promote, promote)                  \
  X(minimum, promote, promote)                  \
  X(where, promote, promote)                    \
  X(cat, promote, promote)                      \
  X(stack, promote, promote)

/// Every op that consults the policy (Note [the autocast policy table]).
enum class Op : uint8_t {
#define MP_AUTOCAST_OP_ENUM(op, cpu, cuda) op,
  MP_AUTOCAST_POLICY(MP_AUTOCAST_OP_ENUM)
#undef MP_AUTOCAST_OP_ENUM
      kCount
};

/// The op's name as the ops API spells it ("matmul", "cross_entropy", ...).
const char* op_name(Op op);

/// The class of `op` on device type `device` (the CPU and CUDA columns of the table).
CastPolicy cast_policy(Op op, DeviceType device);

/// Name of a class: "lower", "fp32", "promote", "none".
const char* policy_name(CastPolicy p);

}  // namespace mp::amp

#pragma once
// Kernel slots of the fused optimizer updates (Note [fused optimizer step] in optim_pointwise.hpp).
#include <span>

#include "backend/optim_pointwise.hpp"
#include "backend/registry.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// One parameter of an SGD update, in place. param: contiguous f32/f64/f16/bf16; master: undefined, or the
/// contiguous f32 master copy of a 16-bit param (then the update reads and writes the master and stores the
/// rounded result into param, in the same pass); grad: param's shape, contiguous, any floating dtype;
/// momentum_buffer: contiguous, param's shape, f32 (f64 for f64 params), or undefined when momentum is 0;
/// p: the hyper-parameters, the first-step flag and the rounding stream of this parameter.
struct SgdStepItem {
  Tensor param, master, grad, momentum_buffer;
  SgdStepParams p;
};
/// The SGD update of every item (all on the slot's device): one launch per parameter and gradient dtype on
/// a GPU (Note [CUDA multi-tensor launch]); the same values as updating each item alone.
using SgdStepKernel = void(std::span<const SgdStepItem> items);
inline constinit KernelSlot<SgdStepKernel> sgd_step_kernel{"sgd_step"};

/// One parameter of an Adam/AdamW update, in place (param, master, grad as for SgdStepItem). exp_avg,
/// exp_avg_sq and (amsgrad only, else undefined) max_exp_avg_sq: contiguous, param's shape, f32 (f64 for f64
/// params); p: its hyper-parameters, step count and rounding stream.
struct AdamStepItem {
  Tensor param, master, grad, exp_avg, exp_avg_sq, max_exp_avg_sq;
  AdamStepParams p;
};
/// The Adam/AdamW update of every item, as sgd_step_kernel.
using AdamStepKernel = void(std::span<const AdamStepItem> items);
inline constinit KernelSlot<AdamStepKernel> adam_step_kernel{"adam_step"};

}  // namespace mp::backend

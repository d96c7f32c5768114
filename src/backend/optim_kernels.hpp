#pragma once
// Kernel slots of the fused optimizer updates (Note [fused optimizer step] in optim_pointwise.hpp).
#include "backend/optim_pointwise.hpp"
#include "backend/registry.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// One SGD update of one tensor in place. param: contiguous f32/f64/f16/bf16; master: undefined, or
/// the contiguous f32 master copy of a 16-bit param (then the update reads and writes the master and
/// stores the rounded result into param, in the same pass); grad: param's shape, contiguous, any
/// floating dtype; momentum_buffer: contiguous, param's shape, f32 (f64 for f64 params), or undefined
/// when momentum is 0.
using SgdStepKernel = void(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& momentum_buffer,
                           const SgdStepParams& p);
inline constinit KernelSlot<SgdStepKernel> sgd_step_kernel{"sgd_step"};

/// One Adam/AdamW update of one tensor in place (master as for SgdStepKernel). exp_avg, exp_avg_sq and
/// (amsgrad only, else undefined) max_exp_avg_sq: contiguous, param's shape, f32 (f64 for f64 params).
using AdamStepKernel = void(const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& exp_avg,
                            const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const AdamStepParams& p);
inline constinit KernelSlot<AdamStepKernel> adam_step_kernel{"adam_step"};

}  // namespace mp::backend

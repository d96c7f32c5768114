// The autocast policy table: the one place that says which precision each op runs in.
//
// Why each class (docs/DESIGN.md 1.4, and the reference articles):
//  * lower: matrix products dominate the FLOPs and accumulate in f32 inside oneDNN/cuBLASLt/cuDNN,
//    so 16-bit inputs lose little and run on AMX / tensor cores. scaled_dot_product_attention is lower
//    too: its two products take 16-bit operands while its softmax statistics (running max, sum,
//    logsumexp) stay f32 inside the kernel (Note [fused attention] in backend/cpu/attention.cpp).
//  * fp32: exp/log/pow amplify relative input error; softmax and the losses sum many exponentials;
//    long reductions in 16-bit lose low-order bits (a bf16 running sum stalls at 256 ones);
//    layer_norm's statistics need f32 (its output is f32 too, as in PyTorch).
//  * promote: element-wise ops with mixed inputs run in the widest type, so an f32 residual added to
//    a bf16 branch stays f32.
//  * everything else (not listed here) runs in its input dtype; batch_norm computes its statistics
//    in f32 internally whatever the input dtype, so it needs no cast.
// CPU and CUDA agree today. On this CPU f16 "lower" ops compute through f32 (storage-only f16), which
// reproduces f16 numerics (rounding, underflow, the need for loss scaling) without the speed.
#include "mp/autocast/policy.hpp"

#include <array>

#include "mp/core/error.hpp"

namespace mp::amp {
namespace {

struct Entry {
  Op op;
  const char* name;
  CastPolicy cpu;
  CastPolicy cuda;
};

using P = CastPolicy;
constexpr std::array<Entry, static_cast<size_t>(Op::kCount)> kTable{{
    {Op::matmul, "matmul", P::lower, P::lower},
    {Op::bmm, "bmm", P::lower, P::lower},
    {Op::linear, "linear", P::lower, P::lower},
    {Op::conv2d, "conv2d", P::lower, P::lower},
    {Op::lstm_cell, "lstm_cell", P::lower, P::lower},
    {Op::lstm_layer, "lstm_layer", P::lower, P::lower},
    {Op::gru_cell, "gru_cell", P::lower, P::lower},
    {Op::rnn_tanh_cell, "rnn_tanh_cell", P::lower, P::lower},
    {Op::scaled_dot_product_attention, "scaled_dot_product_attention", P::lower, P::lower},
    {Op::softmax, "softmax", P::fp32, P::fp32},
    {Op::log_softmax, "log_softmax", P::fp32, P::fp32},
    {Op::cross_entropy, "cross_entropy", P::fp32, P::fp32},
    {Op::nll_loss, "nll_loss", P::fp32, P::fp32},
    {Op::mse_loss, "mse_loss", P::fp32, P::fp32},
    {Op::layer_norm, "layer_norm", P::fp32, P::fp32},
    {Op::sum, "sum", P::fp32, P::fp32},
    {Op::mean, "mean", P::fp32, P::fp32},
    {Op::var, "var", P::fp32, P::fp32},
    {Op::exp, "exp", P::fp32, P::fp32},
    {Op::log, "log", P::fp32, P::fp32},
    {Op::pow, "pow", P::fp32, P::fp32},
    {Op::rsqrt, "rsqrt", P::fp32, P::fp32},
    {Op::add, "add", P::promote, P::promote},
    {Op::sub, "sub", P::promote, P::promote},
    {Op::mul, "mul", P::promote, P::promote},
    {Op::div, "div", P::promote, P::promote},
    {Op::maximum, "maximum", P::promote, P::promote},
    {Op::minimum, "minimum", P::promote, P::promote},
    {Op::where, "where", P::promote, P::promote},
    {Op::cat, "cat", P::promote, P::promote},
    {Op::stack, "stack", P::promote, P::promote},
}};

constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < kTable.size(); ++i)
    if (static_cast<size_t>(kTable[i].op) != i) return false;
  return true;
}
static_assert(table_in_enum_order(), "the policy table must list every Op once, in enum order");

}  // namespace

const char* op_name(Op op) { return kTable.at(static_cast<size_t>(op)).name; }

CastPolicy cast_policy(Op op, DeviceType device) {
  const Entry& e = kTable.at(static_cast<size_t>(op));
  return device == DeviceType::cuda ? e.cuda : e.cpu;
}

const char* policy_name(CastPolicy p) {
  switch (p) {
    case CastPolicy::lower: return "lower";
    case CastPolicy::fp32: return "fp32";
    case CastPolicy::promote: return "promote";
    case CastPolicy::none: return "none";
  }
  return "?";
}

}  // namespace mp::amp

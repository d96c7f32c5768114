#pragma once
// Kernel slots of mp::lstm_layer_library: a whole LSTM layer on the vendor library (oneDNN's RNN
// primitive in cpu/onednn/rnn.cpp, cuDNN's RNN in cuda/cudnn/rnn.cu). The op (src/ops/rnn_library.cpp)
// checks shapes, dtypes and devices and brings the operands to the form below; each backend refuses the
// compute dtypes its library lacks, naming the ones that work.
#include <vector>

#include "backend/registry.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend {

/// The operands of one layer, all contiguous and on one device, PyTorch's layouts and gate order
/// (i, f, g, o): x [T, B, I], h0 [B, H], w_ih [4H, I] and w_hh [4H, H] of one compute dtype; c0 [B, H]
/// f32; b_ih and b_hh [4H] of any floating dtype, or undefined (zero). T, B, I, H >= 1.
struct LstmLibraryInputs {
  Tensor x;     ///< [T, B, I], compute dtype
  Tensor h0;    ///< [B, H], compute dtype
  Tensor c0;    ///< [B, H], f32
  Tensor w_ih;  ///< [4H, I], compute dtype
  Tensor w_hh;  ///< [4H, H], compute dtype
  Tensor b_ih;  ///< [4H] any floating dtype, or undefined
  Tensor b_hh;  ///< [4H] any floating dtype, or undefined
};

/// What the forward returns: the outputs, and whatever the same backend's backward needs.
struct LstmLibraryForward {
  Tensor y;                   ///< [T, B, H], compute dtype
  Tensor h_n;                 ///< [B, H], compute dtype
  Tensor c_n;                 ///< [B, H], f32
  std::vector<Tensor> saved;  ///< backend-specific (workspace / reserve space, packed weights); empty unless training
};

/// The gradients of one layer, in any floating dtype (the autograd engine casts them to the inputs').
struct LstmLibraryGrads {
  Tensor dx;     ///< [T, B, I]
  Tensor dh0;    ///< [B, H]
  Tensor dc0;    ///< [B, H]
  Tensor dw_ih;  ///< [4H, I]
  Tensor dw_hh;  ///< [4H, H]
  Tensor db;     ///< [4H]: the gradient of b_ih and of b_hh alike (undefined when both are undefined)
};

/// Forward of a whole layer; with `training` the result's `saved` holds what the backward needs.
using LstmLibraryForwardKernel = LstmLibraryForward(const LstmLibraryInputs& in, bool training);
inline constinit KernelSlot<LstmLibraryForwardKernel> lstm_library_forward_kernel{"lstm_library_forward"};

/// Backward of a whole layer from the forward's inputs and result (`fwd` from a training forward of
/// the same backend) and the gradients of y [T, B, H], h_n and c_n [B, H] (contiguous, any floating
/// dtype). Returns every gradient (the op drops those not needed).
using LstmLibraryBackwardKernel = LstmLibraryGrads(const LstmLibraryInputs& in, const LstmLibraryForward& fwd,
                                                   const Tensor& dy, const Tensor& dh_n, const Tensor& dc_n);
inline constinit KernelSlot<LstmLibraryBackwardKernel> lstm_library_backward_kernel{"lstm_library_backward"};

}  // namespace mp::backend

// cuDNN convolutions through the graph (backend) API with execution plans cached per problem (cudnn/conv_graph.cu).
// Internal to the CUDA backend; for CUDA sources with cuDNN only.
#pragma once
#if defined(MP_HAVE_CUDNN)
#include "backend/cuda/conv_problem.hpp"
#include "mp/core/device.hpp"

namespace mp::backend::cuda {

/// Runs one convolution problem (y = conv(x, w) forward, dx backward data, dw backward filter, as the legacy
/// path does; beta = 1 adds to the output) through cuDNN's graph API, Note [cuDNN graph convolutions]. Returns
/// false, having written nothing, when the problem is not for this path (MP_CUDNN_GRAPH=0)
/// or no engine that meets the precision and determinism rules supports it: the caller then runs the legacy
/// path. Throws on other cuDNN errors.
bool run_conv_graph(const ConvProblem& pr, const ConvPointers& a, Device dev, double beta);

}  // namespace mp::backend::cuda

#endif  // MP_HAVE_CUDNN

// CUDA conv2d (forward, backward data, backward weights) on cuDNN 9's convolution calls
// (cudnnConvolutionForward / BackwardData / BackwardFilter, the "v7" API in libcudnn_cnn), with
// descriptors and ranked algorithms cached per problem; the bias and its gradient are mixprec's own
// kernels. Contract: src/backend/conv_kernels.hpp (reference: cpu/conv.cpp).
//
// Note [cuDNN convolution layouts]
// A call runs in NCHW or NHWC by Note [channels-last convolutions] (conv_kernels.hpp): the activations
// are described as dense NCHW or NHWC tensors (other strides are made dense in that layout first) and
// the weight as an OIHW filter (CUDNN_TENSOR_NCHW) or, with NHWC activations, a KRSC = OHWI filter
// (CUDNN_TENSOR_NHWC): cuDNN's tensor-core kernels for f16/bf16 work on NHWC with KRSC filters, and for
// NCHW inputs they transpose inside every call. The weight parameter itself stays OIHW (its gradient
// slot is OIHW): an NHWC call reorders it, [O, C kh kw] -> [O, kh kw C], a copy of the (small) weight
// per call unless the caller keeps the weight channels-last, and writes the weight gradient KRSC into a
// scratch tensor that one strided copy turns into dweight's OIHW. The bias is added, and its gradient
// summed, over channels-last rows for NHWC (Note [column reductions] in cudnn/common.hpp). f64 calls, and
// NHWC problems for which cuDNN offers no usable algorithm (its heuristics answer NOT_SUPPORTED, none is
// deterministic, or each answers NOT_SUPPORTED when run), run in NCHW instead: the operands are made dense
// NCHW and the result is copied into the channels-last output, so channels-last never fails where NCHW
// would run.
//
// Note [cuDNN convolution precision]
// Activations and weights are described as dense tensors (Note [cuDNN convolution layouts]). f16 and
// bf16 run cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configurations: compute type CUDNN_DATA_FLOAT (f32
// accumulation) with CUDNN_TENSOR_OP_MATH, the result rounded once to 16 bits,
// like the CPU. f32 uses CUDNN_FMA_MATH (exact f32 products) unless float32_matmul_precision() is
// `high` (Note [TF32] in mp/core/math_mode.hpp), then CUDNN_DEFAULT_MATH, which lets cuDNN use TF32
// tensor cores. f64 computes in double. The bias is added by a separate kernel in f32 (f64 for f64),
// so a 16-bit output is rounded twice (the convolution, then the sum), where the CPU rounds the f32
// sum once: at most one more ulp of the output.
//
// Note [conv weight gradient dtype]
// The slot returns dweight (and dbias) in f32 for f16/bf16 inputs. cuDNN's legacy API writes dw in
// the dtype of x and dy (every supported configuration has x, dy and dw of one type), summing in f32
// inside, so for 16-bit inputs dw is rounded once to f16/bf16 and widened to f32 exactly: a relative
// error of up to 2^-11 (f16) or 2^-8 (bf16) per element beyond the CPU's f32 sum. PyTorch AMP has
// the same rounding (the weight gradient of its f16 convolution is f16). An f16 dw overflows to inf
// above 65504; under loss scaling GradScaler then skips the step, as it would in PyTorch. (Exact f32
// would need x and dy widened to f32 and the TF32 path, where 16-bit products are exact, at half
// the tensor-core rate plus the conversions: not done.) The bias gradient is mixprec's own
// per-channel sum (per_channel_sums: f32 over short runs, double beyond), stored in f32 directly.
//
// Note [cuDNN algorithm choice]
// Each problem (ConvProblem: direction, dtype, TF32 switch, shapes, geometry) gets a plan per device
// on its first call: descriptors plus the usable algorithms in preference order, kept for the
// process. By default the ranking is cuDNN's heuristic (cudnnGet*Algorithm_v7) restricted to
// algorithms cuDNN reports deterministic, so the choice depends on the shape alone and results are
// bitwise reproducible from run to run -- the CPU backend fixes its choices by shape for the same
// reason (Note [bf16 weight gradient as one GEMM] in cpu/conv.cpp). MP_CUDNN_BENCHMARK=1 ranks by
// timing instead (cudnnFind*AlgorithmEx, blocking, once per shape, like torch.backends.cudnn.benchmark):
// often faster, but timing noise can change the pick, and with it the rounding, between runs.
// MP_CUDNN_DETERMINISTIC=0 admits algorithms that use atomics (Note [cuDNN switches]). Algorithms
// needing more than kMaxWorkspaceBytes of workspace are skipped; when a workspace cannot be
// allocated the next algorithm needing less is used for that call; an algorithm that answers
// NOT_SUPPORTED when run is dropped from the plan and the next one runs.
//
// Note [cuDNN int limits]: the legacy API takes int dims and strides, so a batch whose input or
// output has 2^31 or more elements is processed in chunks of samples: the forward and data-gradient
// chunks are independent; the weight gradient adds the chunks' results (beta = 1 for f32/f64, an
// f32 accumulation of each chunk's 16-bit result for f16/bf16).
#if defined(MP_HAVE_CUDNN)
#include <cstdio>
#include <cuda_runtime_api.h>

#include <array>
#include <exception>
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/conv_kernels.hpp"
#include "backend/cuda/cudnn/conv_graph.hpp"
#include "backend/cuda/cudnn/common.hpp"
#include "backend/cuda/loops.cuh"
#include "mp/core/math_mode.hpp"

namespace mp::backend::cuda {
namespace {

/// Largest workspace one convolution algorithm may use (larger ones are skipped).
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;

struct AlgoChoice {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

// Descriptors and ranked algorithms of one problem (Note [cuDNN algorithm choice]).
struct ConvPlan {
  CudnnTensorDescriptor x, y;
  CudnnFilterDescriptor w;
  CudnnConvolutionDescriptor conv;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  std::vector<AlgoChoice> choices;
};

using PlanMap = std::unordered_map<ConvKey, std::unique_ptr<ConvPlan>, KeyHash<ConvKey>>;

// The plans of one device; only touched while that device's CudnnHandle is held (Note [cuDNN
// handle]). Never destroyed (Note [leaked runtime state]).
PlanMap& plan_cache(int device) { return per_device<PlanMap>(device); }

// The math type the descriptor asks for (Note [cuDNN convolution precision]).
cudnnMathType_t requested_math(const ConvProblem& pr) {
  switch (pr.dtype) {
    case DType::f16:
    case DType::bf16: return CUDNN_TENSOR_OP_MATH;
    case DType::f32: return pr.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
    default: return CUDNN_DEFAULT_MATH;
  }
}

// Whether an algorithm's math type keeps the problem's precision: f32 without TF32 only FMA_MATH;
// never the f32 -> f16 down-conversion (TENSOR_OP_MATH_ALLOW_CONVERSION) for f32.
bool math_allowed(const ConvProblem& pr, cudnnMathType_t m) {
  if (pr.dtype != DType::f32) return true;
  if (!pr.tf32) return m == CUDNN_FMA_MATH;
  return m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// ------------------------------------------------------------------ the three directions

template <ConvDir D>
struct Dir;

template <>
struct Dir<ConvDir::forward> {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  using Algo = cudnnConvolutionFwdAlgo_t;
  static constexpr const char* kRun = "cudnnConvolutionForward";
  static cudnnStatus_t max_count(cudnnHandle_t h, int* n) { return cudnnGetConvolutionForwardAlgorithmMaxCount(h, n); }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const ConvPlan& p, int req, int* ret, Perf* perf) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, p.x.get(), p.w.get(), p.conv.get(), p.y.get(), req, ret, perf);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const ConvPlan& p, const ConvPointers& a, void* out, int req, int* ret,
                            Perf* perf, void* ws, size_t wsb) {
    return cudnnFindConvolutionForwardAlgorithmEx(h, p.x.get(), a.x, p.w.get(), a.w, p.conv.get(), p.y.get(), out, req,
                                                  ret, perf, ws, wsb);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, int algo, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, p.x.get(), p.w.get(), p.conv.get(), p.y.get(),
                                                   static_cast<Algo>(algo), bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const ConvPlan& p, int algo, const ConvPointers& a, void* ws, size_t wsb,
                           const void* alpha, const void* beta) {
    return cudnnConvolutionForward(h, alpha, p.x.get(), a.x, p.w.get(), a.w, p.conv.get(), static_cast<Algo>(algo), ws,
                                   wsb, beta, p.y.get(), a.out);
  }
};

template <>
struct Dir<ConvDir::backward_data> {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  using Algo = cudnnConvolutionBwdDataAlgo_t;
  static constexpr const char* kRun = "cudnnConvolutionBackwardData";
  static cudnnStatus_t max_count(cudnnHandle_t h, int* n) {
    return cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, n);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const ConvPlan& p, int req, int* ret, Perf* perf) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w.get(), p.y.get(), p.conv.get(), p.x.get(), req, ret,
                                                       perf);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const ConvPlan& p, const ConvPointers& a, void* out, int req, int* ret,
                            Perf* perf, void* ws, size_t wsb) {
    return cudnnFindConvolutionBackwardDataAlgorithmEx(h, p.w.get(), a.w, p.y.get(), a.dy, p.conv.get(), p.x.get(), out,
                                                       req, ret, perf, ws, wsb);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, int algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w.get(), p.y.get(), p.conv.get(), p.x.get(),
                                                        static_cast<Algo>(algo), bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const ConvPlan& p, int algo, const ConvPointers& a, void* ws, size_t wsb,
                           const void* alpha, const void* beta) {
    return cudnnConvolutionBackwardData(h, alpha, p.w.get(), a.w, p.y.get(), a.dy, p.conv.get(),
                                        static_cast<Algo>(algo), ws, wsb, beta, p.x.get(), a.out);
  }
};

template <>
struct Dir<ConvDir::backward_filter> {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  using Algo = cudnnConvolutionBwdFilterAlgo_t;
  static constexpr const char* kRun = "cudnnConvolutionBackwardFilter";
  static cudnnStatus_t max_count(cudnnHandle_t h, int* n) {
    return cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, n);
  }
  static cudnnStatus_t heuristic(cudnnHandle_t h, const ConvPlan& p, int req, int* ret, Perf* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x.get(), p.y.get(), p.conv.get(), p.w.get(), req, ret,
                                                         perf);
  }
  static cudnnStatus_t find(cudnnHandle_t h, const ConvPlan& p, const ConvPointers& a, void* out, int req, int* ret,
                            Perf* perf, void* ws, size_t wsb) {
    return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, p.x.get(), a.x, p.y.get(), a.dy, p.conv.get(), p.w.get(),
                                                         out, req, ret, perf, ws, wsb);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvPlan& p, int algo, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x.get(), p.y.get(), p.conv.get(), p.w.get(),
                                                          static_cast<Algo>(algo), bytes);
  }
  static cudnnStatus_t run(cudnnHandle_t h, const ConvPlan& p, int algo, const ConvPointers& a, void* ws, size_t wsb,
                           const void* alpha, const void* beta) {
    return cudnnConvolutionBackwardFilter(h, alpha, p.x.get(), a.x, p.y.get(), a.dy, p.conv.get(),
                                          static_cast<Algo>(algo), ws, wsb, beta, p.w.get(), a.out);
  }
};

// ------------------------------------------------------------------ plans

// Adds the usable entries of cuDNN's ranking to plan.choices (Note [cuDNN algorithm choice]). With
// force_math, entries of any math type are taken and run with that math type instead.
template <ConvDir D>
void collect_choices(cudnnHandle_t h, const ConvProblem& pr, ConvPlan& plan, const typename Dir<D>::Perf* perf,
                     int count, const cudnnMathType_t* force_math) {
  const bool deterministic = cudnn_options().deterministic;
  for (int i = 0; i < count; ++i) {
    const auto& pf = perf[i];
    if (pf.status != CUDNN_STATUS_SUCCESS) continue;
    if (deterministic && pf.determinism != CUDNN_DETERMINISTIC) continue;
    cudnnMathType_t math = pf.mathType;
    if (force_math != nullptr) {
      math = *force_math;
    } else if (!math_allowed(pr, math)) {
      continue;
    }
    bool seen = false;
    for (const AlgoChoice& c : plan.choices) seen = seen || (c.algo == static_cast<int>(pf.algo) && c.math == math);
    if (seen) continue;
    plan.conv.set_math(math);
    size_t bytes = 0;
    if (Dir<D>::workspace(h, plan, static_cast<int>(pf.algo), &bytes) != CUDNN_STATUS_SUCCESS) continue;
    if (bytes > kMaxWorkspaceBytes) continue;
    plan.choices.push_back(AlgoChoice{static_cast<int>(pf.algo), math, bytes});
  }
}

template <ConvDir D>
std::unique_ptr<ConvPlan> build_plan(cudnnHandle_t h, const ConvProblem& pr, const ConvPointers& a, Device dev) {
  auto plan = std::make_unique<ConvPlan>();
  const cudnnDataType_t dt = cudnn_dtype(pr.dtype, "conv2d");
  plan->compute = pr.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  if (pr.nhwc) {
    plan->x.set_nhwc(dt, pr.n, pr.c, pr.h, pr.w);
    plan->y.set_nhwc(dt, pr.n, pr.o, pr.oh, pr.ow);
    plan->w.set_ohwi(dt, pr.o, pr.c / pr.g.groups, pr.kh, pr.kw);
  } else {
    plan->x.set_nchw(dt, pr.n, pr.c, pr.h, pr.w);
    plan->y.set_nchw(dt, pr.n, pr.o, pr.oh, pr.ow);
    plan->w.set_oihw(dt, pr.o, pr.c / pr.g.groups, pr.kh, pr.kw);
  }
  plan->conv.set_2d(pr.g.padding[0], pr.g.padding[1], pr.g.stride[0], pr.g.stride[1], pr.g.dilation[0],
                    pr.g.dilation[1], pr.g.groups, plan->compute);
  const cudnnMathType_t want = requested_math(pr);
  plan->conv.set_math(want);
  int dims[4] = {0, 0, 0, 0};
  MP_CUDNN_CHECK_CTX(cudnnGetConvolution2dForwardOutputDim(plan->conv.get(), plan->x.get(), plan->w.get(), &dims[0],
                                                           &dims[1], &dims[2], &dims[3]),
                     pr.str());
  MP_ASSERT(dims[0] == pr.n && dims[1] == pr.o && dims[2] == pr.oh && dims[3] == pr.ow, "cuDNN's output shape [",
            dims[0], ", ", dims[1], ", ", dims[2], ", ", dims[3], "] differs from mixprec's for ", pr.str());

  int max_count = 0;
  MP_CUDNN_CHECK(Dir<D>::max_count(h, &max_count));
  max_count = std::max(max_count, 1);
  std::vector<typename Dir<D>::Perf> perf(static_cast<size_t>(max_count));
  int returned = 0;
  const cudnnStatus_t hs = Dir<D>::heuristic(h, *plan, max_count, &returned, perf.data());
  if (hs != CUDNN_STATUS_SUCCESS) {
    if (pr.nhwc && cudnn_not_supported(hs)) return plan;  // empty: the caller runs NCHW
    throw_cudnn_error(hs, "cudnnGetConvolution*Algorithm_v7", pr.str(), __FILE__, __LINE__);
  }
  if (cudnn_options().benchmark) {
    // Workspace for the timing runs: the largest any usable candidate asks for (within the cap).
    size_t ws_bytes = 0;
    for (int i = 0; i < returned; ++i)
      if (perf[static_cast<size_t>(i)].status == CUDNN_STATUS_SUCCESS &&
          perf[static_cast<size_t>(i)].memory <= kMaxWorkspaceBytes)
        ws_bytes = std::max(ws_bytes, perf[static_cast<size_t>(i)].memory);
    Tensor ws;
    try {
      ws = cudnn_workspace(ws_bytes, dev);
    } catch (const Error&) {  // out of memory: time only the algorithms that need none
      ws_bytes = 0;
    }
    // The timing runs write their output to scratch, never to the caller's buffer (which a chunked
    // weight gradient accumulates into).
    const Tensor scratch = mp::empty({std::max<int64_t>(pr.output_numel(), 1)}, {.dtype = pr.dtype, .device = dev});
    returned = 0;
    MP_CUDNN_CHECK_CTX(Dir<D>::find(h, *plan, a, scratch.raw_data(), max_count, &returned, perf.data(),
                                    ws.defined() ? ws.raw_data() : nullptr, ws_bytes),
                       pr.str());
  }
  collect_choices<D>(h, pr, *plan, perf.data(), returned, nullptr);
  if (plan->choices.empty() && pr.dtype == DType::f32 && !pr.tf32) {
    // No entry came back as FMA_MATH: run cuDNN's own ranking with FMA_MATH forced (an algorithm
    // without an FMA kernel then answers NOT_SUPPORTED and is dropped when run).
    collect_choices<D>(h, pr, *plan, perf.data(), returned, &want);
  }
  // An NHWC problem without a usable algorithm keeps its empty plan: the caller runs it in NCHW instead
  // (Note [cuDNN convolution layouts]).
  if (cudnn_options().log) {
    if (plan->choices.empty())
      std::fprintf(stderr, "mixprec cuDNN: %s: no usable NHWC algorithm, runs in NCHW (two copies per call)\n",
                   pr.str().c_str());
    else
      std::fprintf(stderr, "mixprec cuDNN: %s: algorithm %d, math %d, workspace %zu bytes (%zu candidates)\n",
                   pr.str().c_str(), plan->choices.front().algo, static_cast<int>(plan->choices.front().math),
                   plan->choices.front().workspace, plan->choices.size());
  }
  MP_CHECK(pr.nhwc || !plan->choices.empty(), "conv2d on cuda: cuDNN offers no usable ",
           cudnn_options().deterministic ? "deterministic " : "", "algorithm for ", pr.str(),
           cudnn_options().deterministic ? "; MP_CUDNN_DETERMINISTIC=0 admits the non-deterministic ones" : "",
           "; or run it on the CPU");
  return plan;
}

// Runs one cuDNN convolution call: out = conv (beta 0) or out += conv (beta 1). Returns false, having
// written nothing, only for an NHWC problem that cuDNN cannot run (no usable algorithm, or all of them
// answering NOT_SUPPORTED): the caller then runs the call in NCHW.
template <ConvDir D>
bool run_conv(const ConvProblem& pr, const ConvPointers& a, Device dev, double beta) {
  if (run_conv_graph(pr, a, dev, beta)) return true;  // the default (Note [cuDNN graph convolutions])
  CudnnHandle handle(dev.index);
  PlanMap& cache = plan_cache(dev.index);
  const ConvKey key = pr.key();
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, build_plan<D>(handle.get(), pr, a, dev)).first;
  ConvPlan& plan = *it->second;
  if (pr.nhwc && plan.choices.empty()) {
    count_cudnn_conv_call(true, true);
    return false;
  }
  const void* alpha = cudnn_scale(plan.compute, 1.0);
  const void* b = cudnn_scale(plan.compute, beta);
  size_t failed_bytes = SIZE_MAX;  // a workspace this large could not be allocated in this call
  std::exception_ptr oom;
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  for (size_t i = 0; i < plan.choices.size();) {
    const AlgoChoice ch = plan.choices[i];
    if (ch.workspace >= failed_bytes) {
      ++i;
      continue;
    }
    Tensor ws;
    try {
      ws = cudnn_workspace(ch.workspace, dev);
    } catch (const Error&) {
      failed_bytes = ch.workspace;
      oom = std::current_exception();
      ++i;
      continue;
    }
    plan.conv.set_math(ch.math);
    last = Dir<D>::run(handle.get(), plan, ch.algo, a, ws.defined() ? ws.raw_data() : nullptr, ch.workspace, alpha, b);
    if (last == CUDNN_STATUS_SUCCESS) {
      count_cudnn_conv_call(pr.nhwc, false);
      return true;
    }
    if (!cudnn_not_supported(last))
      throw_cudnn_error(last, Dir<D>::kRun, detail::str_cat(pr.str(), ", algorithm ", ch.algo), __FILE__, __LINE__);
    plan.choices.erase(plan.choices.begin() + static_cast<std::ptrdiff_t>(i));  // never offered again
  }
  if (oom) std::rethrow_exception(oom);
  if (pr.nhwc) {
    if (cudnn_options().log)
      std::fprintf(stderr, "mixprec cuDNN: %s: every NHWC algorithm answered NOT_SUPPORTED, runs in NCHW\n",
                   pr.str().c_str());
    count_cudnn_conv_call(true, true);
    return false;
  }
  throw_cudnn_error(last, Dir<D>::kRun, pr.str() + "; every algorithm cuDNN proposed answered NOT_SUPPORTED", __FILE__,
                    __LINE__);
}

// ------------------------------------------------------------------ bias

// y[n, o, p] += bias[o] over y [N, O, P] (walk dims Pv, Ov: channel_of), computed in S, rounded once.
template <class T, class S, int VEC, bool ROWS>
__global__ void __launch_bounds__(kDnnThreads)
    add_channel_bias(T* y, const S* bias, int64_t total, int64_t Pv, int64_t Ov) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (start >= total) return;
  NcsIndexWalk it(start, step, Pv, Ov);
  for (int64_t i = start; i < total; i += step, it.next()) {
    T v[VEC];
    load_vec<VEC>(y + i * VEC, v);
#pragma unroll
    for (int k = 0; k < VEC; ++k) v[k] = device_cast<T>(device_cast<S>(v[k]) + bias[channel_of<ROWS, VEC>(it, k)]);
    store_vec<VEC>(y + i * VEC, v);
  }
}

// y [N, O, oh, ow] (contiguous or channels-last) += bias.
template <class T>
void add_bias_typed(const Tensor& y, const Tensor& bias) {
  using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
  const int64_t N = y.size(0), O = y.size(1), P = y.size(2) * y.size(3);
  const Tensor b = param_vector(bias.contiguous(), O, dtype_of<S>(), 0.0, y.device());
  const Tensor y3 = y.view({N, O, P});
  const bool rows = channels_last_rows(y3);
  const ElementwiseShape e = elementwise_shape<T>(y3, rows, {y.raw_data()});
  const unsigned grid = blocks_for(e.total, kDnnThreads, y.device().index);
  auto* yp = static_cast<T*>(y.raw_data());
  const auto* bp = static_cast<const S*>(b.raw_data());
  launch_elementwise<T>(e, rows, [&]<int V, bool R>() {
    add_channel_bias<T, S, V, R><<<grid, kDnnThreads, 0, stream_of(y)>>>(yp, bp, e.total, e.Sv, e.Cv);
  });
}

void add_bias(const Tensor& y, const Tensor& bias) {
  switch (y.dtype()) {
    case DType::f32: return add_bias_typed<float>(y, bias);
    case DType::f64: return add_bias_typed<double>(y, bias);
    case DType::f16: return add_bias_typed<Half>(y, bias);
    case DType::bf16: return add_bias_typed<BFloat16>(y, bias);
    default: MP_FAIL("conv2d on cuda: unsupported output dtype ", dtype_name(y.dtype()));
  }
}

// ------------------------------------------------------------------ helpers of the entries

// The problem of the whole batch; checks what the legacy API can describe.
ConvProblem make_problem(ConvDir dir, DType dt, MemoryFormat fmt, int64_t n, int64_t c, int64_t h, int64_t w, int64_t o,
                         int64_t kh, int64_t kw, int64_t oh, int64_t ow, const Conv2dGeometry& g) {
  ConvProblem pr;
  pr.dir = dir;
  pr.dtype = dt;
  pr.nhwc = fmt == MemoryFormat::channels_last;
  pr.tf32 = dt == DType::f32 && float32_matmul_precision() == Float32MatmulPrecision::high;
  pr.n = n, pr.c = c, pr.h = h, pr.w = w, pr.o = o, pr.kh = kh, pr.kw = kw, pr.oh = oh, pr.ow = ow;
  pr.g = g;
  const bool ok = fits_int(c * h * w) && fits_int(o * oh * ow) && fits_int(o * (c / g.groups) * kh * kw) &&
                  fits_int(g.stride[0]) && fits_int(g.stride[1]) && fits_int(g.padding[0]) && fits_int(g.padding[1]) &&
                  fits_int(g.dilation[0]) && fits_int(g.dilation[1]) && fits_int(g.groups);
  MP_CHECK(ok,
           "conv2d on cuda: one sample's input or output, the weight, or a stride/padding/dilation has 2^31 or "
           "more elements, more than cuDNN takes, in ",
           pr.str(), "; run it on the CPU");
  return pr;
}

// Samples per cuDNN call (Note [cuDNN int limits]).
int64_t chunk_samples(const ConvProblem& pr) {
  const int64_t per = std::max(pr.c * pr.h * pr.w, pr.o * pr.oh * pr.ow);
  return std::max<int64_t>(1, std::min<int64_t>(pr.n, INT32_MAX / std::max<int64_t>(per, 1)));
}

// The layout the cuDNN calls use for activations in layout fmt (Note [cuDNN convolution layouts]): NHWC
// only for the tensor-core dtypes and f32; f64 has no NHWC kernels worth asking for.
MemoryFormat cudnn_layout(MemoryFormat fmt, DType dt) { return dt == DType::f64 ? MemoryFormat::contiguous : fmt; }

// A 16-byte aligned destination dense in layout f for a result meant for t: t itself when it is, or a
// fresh tensor that finish_output copies into t.
Tensor output_in(const Tensor& t, MemoryFormat f) {
  if (t.is_contiguous(f) && is_aligned(t.raw_data(), 16)) return t;
  return mp::empty(t.sizes(), {.dtype = t.dtype(), .device = t.device(), .memory_format = f});
}

// t = tmp (a result computed into output_in's scratch): nothing when tmp is t, a byte copy when the two
// share a dense layout, else the element-wise copy kernel (NCHW scratch -> channels-last t).
void finish_output(const Tensor& t, const Tensor& tmp) {
  if (tmp.raw_data() == t.raw_data()) return;
  if (same_dense_layout(t, tmp)) {
    MP_CUDA_CHECK(cudaMemcpyAsync(t.raw_data(), tmp.raw_data(), static_cast<size_t>(t.numel()) * t.element_size(),
                                  cudaMemcpyDeviceToDevice, stream_of(t)));
  } else {
    Tensor(t).copy_(tmp);  // the handle shares t's storage
  }
}

const char* byte_ptr(const Tensor& t, int64_t elements) {
  return static_cast<const char*>(t.raw_data()) + elements * static_cast<int64_t>(t.element_size());
}
char* byte_ptr_mut(const Tensor& t, int64_t elements) {
  return static_cast<char*>(t.raw_data()) + elements * static_cast<int64_t>(t.element_size());
}

// ------------------------------------------------------------------ kernel entries

// The forward of the whole batch in pr's layout, chunked (Note [cuDNN int limits]), into y. False,
// with nothing written, when cuDNN refuses the NHWC problem.
bool forward_calls(ConvProblem pr, const Tensor& y, const Tensor& xc, const Tensor& wc, Device dev) {
  const int64_t N = pr.n, chunk = chunk_samples(pr), in_per = pr.c * pr.h * pr.w, out_per = pr.o * pr.oh * pr.ow;
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    pr.n = std::min(chunk, N - n0);
    ConvPointers a;
    a.x = byte_ptr(xc, n0 * in_per);
    a.w = wc.raw_data();
    a.out = byte_ptr_mut(y, n0 * out_per);
    if (!run_conv<ConvDir::forward>(pr, a, dev, 0.0)) return false;
  }
  return true;
}

void conv2d_forward_cuda(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Conv2dGeometry& g) {
  DeviceGuard guard(out.device(), "conv2d");
  const MemoryFormat fmt = conv_call_format(out, x);  // Note [cuDNN convolution layouts]
  MP_ASSERT(out.is_contiguous(fmt), "conv2d kernel: output must be dense, got ", out.describe());
  MP_ASSERT(x.dtype() == weight.dtype() && out.dtype() == x.dtype(), "conv2d kernel: dtypes differ");
  const int64_t N = x.size(0), O = weight.size(0), oh = out.size(2), ow = out.size(3);
  MP_ASSERT(out.size(0) == N && out.size(1) == O &&
                oh == conv_out_size(x.size(2), weight.size(2), g.stride[0], g.padding[0], g.dilation[0]) &&
                ow == conv_out_size(x.size(3), weight.size(3), g.stride[1], g.padding[1], g.dilation[1]),
            "conv2d kernel: output ", out.describe(), " does not match the geometry");
  if (out.numel() == 0) return;
  // The call's layout first; NCHW when that is NHWC and cuDNN refuses it.
  for (MemoryFormat f : {cudnn_layout(fmt, x.dtype()), MemoryFormat::contiguous}) {
    const Tensor xc = cudnn_dense(x, f), wc = cudnn_dense(weight, f);
    const Tensor y = output_in(out, f);
    const ConvProblem pr = make_problem(ConvDir::forward, x.dtype(), f, N, x.size(1), x.size(2), x.size(3), O,
                                        weight.size(2), weight.size(3), oh, ow, g);
    if (!forward_calls(pr, y, xc, wc, out.device())) continue;
    if (bias.defined()) add_bias(y, bias);
    finish_output(out, y);
    return;
  }
}

bool backward_data_calls(ConvProblem pr, const Tensor& dxo, const Tensor& dyc, const Tensor& wc, Device dev) {
  const int64_t N = pr.n, chunk = chunk_samples(pr), in_per = pr.c * pr.h * pr.w, out_per = pr.o * pr.oh * pr.ow;
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    pr.n = std::min(chunk, N - n0);
    ConvPointers a;
    a.w = wc.raw_data();
    a.dy = byte_ptr(dyc, n0 * out_per);
    a.out = byte_ptr_mut(dxo, n0 * in_per);
    if (!run_conv<ConvDir::backward_data>(pr, a, dev, 0.0)) return false;
  }
  return true;
}

void conv2d_backward_data_cuda(const Tensor& dx, const Tensor& dy, const Tensor& weight, const Conv2dGeometry& g) {
  DeviceGuard guard(dx.device(), "conv2d backward");
  const MemoryFormat fmt = conv_call_format(dx, dy);  // Note [cuDNN convolution layouts]
  MP_ASSERT(dx.is_contiguous(fmt), "conv2d backward kernel: dx must be dense, got ", dx.describe());
  MP_ASSERT(dy.dtype() == weight.dtype() && dx.dtype() == weight.dtype(), "conv2d backward kernel: dtypes differ");
  const int64_t N = dx.size(0), O = weight.size(0), oh = dy.size(2), ow = dy.size(3);
  MP_ASSERT(dy.size(0) == N && dy.size(1) == O &&
                oh == conv_out_size(dx.size(2), weight.size(2), g.stride[0], g.padding[0], g.dilation[0]) &&
                ow == conv_out_size(dx.size(3), weight.size(3), g.stride[1], g.padding[1], g.dilation[1]),
            "conv2d backward kernel: dy ", dy.describe(), " does not match the geometry");
  if (dx.numel() == 0) return;
  for (MemoryFormat f : {cudnn_layout(fmt, dx.dtype()), MemoryFormat::contiguous}) {
    const Tensor dyc = cudnn_dense(dy, f), wc = cudnn_dense(weight, f);
    const Tensor out = output_in(dx, f);
    const ConvProblem pr = make_problem(ConvDir::backward_data, dx.dtype(), f, N, dx.size(1), dx.size(2), dx.size(3), O,
                                        weight.size(2), weight.size(3), oh, ow, g);
    if (!backward_data_calls(pr, out, dyc, wc, dx.device())) continue;
    finish_output(dx, out);
    return;
  }
}

// The weight gradient of the whole batch in pr's layout into dweight (OIHW, acc dtype). cuDNN writes dw
// in the inputs' dtype (Note [conv weight gradient dtype]) and, for NHWC, as a KRSC filter (a
// channels-last [O, C/g, kh, kw]) in a scratch tensor copied into dweight at the end. False, with dweight
// untouched, when cuDNN refuses the NHWC problem.
bool backward_weights_calls(ConvProblem pr, const Tensor& dweight, const Tensor& xc, const Tensor& dyc) {
  const Device dev = dweight.device();
  const DType acc = dweight.dtype();
  const MemoryFormat f = pr.nhwc ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  const bool direct = pr.dtype == acc;
  const Tensor dw = direct && !pr.nhwc
                        ? output_in(dweight, f)
                        : mp::empty(dweight.sizes(), {.dtype = pr.dtype, .device = dev, .memory_format = f});
  // Where the 16-bit chunks add up in acc: dweight itself (NCHW) or a KRSC scratch (NHWC).
  const Tensor sum = direct    ? dw
                     : pr.nhwc ? mp::empty(dweight.sizes(), {.dtype = acc, .device = dev, .memory_format = f})
                               : dweight;
  const int64_t N = pr.n, chunk = chunk_samples(pr), in_per = pr.c * pr.h * pr.w, out_per = pr.o * pr.oh * pr.ow;
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    pr.n = std::min(chunk, N - n0);
    ConvPointers a;
    a.x = byte_ptr(xc, n0 * in_per);
    a.dy = byte_ptr(dyc, n0 * out_per);
    a.out = dw.raw_data();
    const bool first = n0 == 0;
    if (!run_conv<ConvDir::backward_filter>(pr, a, dev, direct && !first ? 1.0 : 0.0)) return false;
    if (!direct) convert_dtype_into(sum, dw, /*accumulate=*/!first);
  }
  finish_output(dweight, sum);  // KRSC -> OIHW for NHWC (the element-wise copy kernel)
  return true;
}

void conv2d_backward_weights_cuda(const Tensor& dweight, const Tensor& dbias, const Tensor& x, const Tensor& dy,
                                  const Conv2dGeometry& g) {
  DeviceGuard guard(dweight.device(), "conv2d backward");
  MP_ASSERT(dweight.is_contiguous() && (!dbias.defined() || dbias.is_contiguous()),
            "conv2d backward kernel: dweight/dbias must be contiguous");
  MP_ASSERT(x.dtype() == dy.dtype(), "conv2d backward kernel: x and dy dtypes differ");
  const DType acc = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  MP_ASSERT(dweight.dtype() == acc && (!dbias.defined() || dbias.dtype() == acc),
            "conv2d backward kernel: dweight/dbias must be ", dtype_name(acc), " for ", dtype_name(x.dtype()),
            " inputs");
  const int64_t N = x.size(0), O = dweight.size(0), oh = dy.size(2), ow = dy.size(3);
  MP_ASSERT(dy.size(0) == N && dy.size(1) == O &&
                oh == conv_out_size(x.size(2), dweight.size(2), g.stride[0], g.padding[0], g.dilation[0]) &&
                ow == conv_out_size(x.size(3), dweight.size(3), g.stride[1], g.padding[1], g.dilation[1]),
            "conv2d backward kernel: dy ", dy.describe(), " does not match the geometry");
  cudaStream_t stream = stream_of(dweight);
  if (x.numel() == 0 || dy.numel() == 0) {  // an empty batch: the sums are zero
    if (dweight.numel() > 0)
      MP_CUDA_CHECK(cudaMemsetAsync(dweight.raw_data(), 0,
                                    static_cast<size_t>(dweight.numel()) * dweight.element_size(), stream));
    if (dbias.defined() && dbias.numel() > 0)
      MP_CUDA_CHECK(
          cudaMemsetAsync(dbias.raw_data(), 0, static_cast<size_t>(dbias.numel()) * dbias.element_size(), stream));
    return;
  }
  const MemoryFormat fmt =  // Note [cuDNN convolution layouts]
      conv_call_format(Tensor(), x.suggest_memory_format() == MemoryFormat::channels_last ? x : dy);
  Tensor dyc;
  for (MemoryFormat f : {cudnn_layout(fmt, x.dtype()), MemoryFormat::contiguous}) {
    const Tensor xc = cudnn_dense(x, f);
    dyc = cudnn_dense(dy, f);
    const ConvProblem pr = make_problem(ConvDir::backward_filter, x.dtype(), f, N, x.size(1), x.size(2), x.size(3), O,
                                        dweight.size(2), dweight.size(3), oh, ow, g);
    if (backward_weights_calls(pr, dweight, xc, dyc)) break;
  }
  if (dbias.defined()) {  // per-channel sums of dy in whichever layout it now has (Note [column reductions])
    const Tensor sums = acc == DType::f64 ? dbias : mp::empty({O}, {.dtype = DType::f64, .device = dbias.device()});
    per_channel_sums(sums, Tensor(), dyc.view({N, O, oh * ow}), Tensor(), Tensor());
    if (sums.raw_data() != dbias.raw_data()) convert_dtype_into(dbias, sums);
  }
}

}  // namespace

// Both gradients: cuDNN's two backward calls share nothing, so this is the two kernels in turn.
void conv2d_backward_cuda(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& x,
                          const Tensor& dy, const Tensor& weight, const Conv2dGeometry& g) {
  if (dx.defined()) conv2d_backward_data_cuda(dx, dy, weight, g);
  if (dweight.defined()) conv2d_backward_weights_cuda(dweight, dbias, x, dy, g);
}

MP_REGISTER_KERNEL(conv2d_forward_kernel, DeviceType::cuda, &conv2d_forward_cuda);
MP_REGISTER_KERNEL(conv2d_backward_kernel, DeviceType::cuda, &conv2d_backward_cuda);

}  // namespace mp::backend::cuda

#endif  // MP_HAVE_CUDNN

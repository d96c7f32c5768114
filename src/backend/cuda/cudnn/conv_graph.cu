// cuDNN convolutions through the graph (backend) API (see cudnn/conv_graph.hpp).
//
// Note [cuDNN graph convolutions]
// cuDNN 9's legacy calls (cudnnConvolutionForward / BackwardData / BackwardFilter) cost 150-230 us of host
// time per call on an H200's host (bench/RESULTS.md: 7.9 of the 14 ms a host-bound 16-bit ResNet-18 step
// takes to queue; on the graph API the same step queued in 5.3 ms and ran 2.3x faster), so by default (MP_CUDNN_GRAPH=0
// restores the legacy calls) a problem is described once as a one-operation graph (tensor
// descriptors with unique ids 1 = x or dx, 2 = w or dw, 3 = y or dy; the convolution descriptor; the
// operation with its alpha = 1 and beta), cuDNN's heuristics (mode A) rank its engine configurations, and the
// first usable one is finalised into an execution plan kept for the process; each call then only packs the
// three pointers and a workspace and executes the plan (cudnnBackendExecute). The rules of the legacy path
// (Note [cuDNN convolution precision], Note [cuDNN algorithm choice]) hold through the engines' numerical notes:
// no engine that is non-deterministic (unless MP_CUDNN_DETERMINISTIC=0), that reduces in reduced precision, or,
// for f32 and f64 data, that uses tensor cores or down-converts its inputs, except f32 with TF32 allowed.
// Engines that compile kernels at run time go last (finalising one can take a second). Plans needing more
// than kMaxGraphWorkspace are skipped; a workspace that cannot be allocated moves the call to the next plan;
// a plan that answers NOT_SUPPORTED when executed is dropped. A problem with no usable engine (f64, say)
// returns false and runs on the legacy path. With MP_CUDNN_BENCHMARK=1 the candidates are mode A's best, then
// the engines heuristic mode B and the fallback list add, and the first call of a problem finalises up to
// kMaxTimedPlans usable ones (those that compile at run time only when nothing else
// runs) and times each (one warm-up, then the mean of kTimedRuns executions, into a scratch output so the
// caller's tensors are only written by the chosen plan); the fastest goes first, as with cudnn.benchmark.
#if defined(MP_HAVE_CUDNN)
#include "backend/cuda/cudnn/conv_graph.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/cuda/cudnn/common.hpp"

namespace mp::backend::cuda {
namespace {

constexpr size_t kMaxGraphWorkspace = size_t{1} << 30;
// MP_CUDNN_BENCHMARK: configurations timed per problem (PyTorch's cudnn.benchmark_limit is 10 too), of them at
// most kTimedFromA from heuristic mode A.
constexpr size_t kMaxTimedPlans = 10;
constexpr size_t kTimedFromA = 6;
constexpr int kTimedRuns = 3;

// One backend descriptor, destroyed with its owner.
class BackendDesc {
 public:
  BackendDesc() = default;  // none
  explicit BackendDesc(cudnnBackendDescriptorType_t type) { MP_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~BackendDesc() {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
  }
  BackendDesc(BackendDesc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  BackendDesc& operator=(BackendDesc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  BackendDesc(const BackendDesc&) = delete;
  BackendDesc& operator=(const BackendDesc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  // Set attribute `name` to `count` values of `type` at v.
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* v) {
    MP_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, v));
  }
  // Set a descriptor-valued attribute.
  void set(cudnnBackendAttributeName_t name, const BackendDesc& v) {
    const cudnnBackendDescriptor_t h = v.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &h);
  }
  void set_int64(cudnnBackendAttributeName_t name, int64_t v) { set(name, CUDNN_TYPE_INT64, 1, &v); }
  void finalize() { MP_CUDNN_CHECK(cudnnBackendFinalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

// A finalised tensor descriptor of dims [a, b, c, d] with the given strides.
BackendDesc tensor_desc(int64_t uid, cudnnDataType_t dt, const std::array<int64_t, 4>& dims,
                        const std::array<int64_t, 4>& strides) {
  BackendDesc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
  t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
  t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
  t.set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, uid);
  t.set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16);  // cudnn_dense gives 16-byte aligned operands
  t.finalize();
  return t;
}

// Dense strides of [n, c, h, w] in NCHW, or with c innermost (NHWC; for the filter [o, c, kh, kw]: KRSC).
std::array<int64_t, 4> dense_strides(const std::array<int64_t, 4>& d, bool nhwc) {
  if (nhwc) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// A finalised plan and what it needs.
struct ReadyPlan {
  BackendDesc plan;
  int64_t workspace = 0;
  int64_t engine = -1;  // cuDNN's global engine index (for MP_CUDNN_LOG)
};

// One problem's graph, its usable engine configurations in preference order and the plans finalised so far.
struct GraphConv {
  std::vector<BackendDesc> keep;  // tensors, convolution, operation, graph: alive as long as the plans
  std::vector<BackendDesc> configs;
  size_t next = 0;       // the next configuration to finalise
  size_t compiling = 0;  // how many of configs (the last ones) compile kernels at run time
  std::vector<ReadyPlan> ready;
  bool timed = false;  // MP_CUDNN_BENCHMARK: ready is ordered by measured time
  bool logged = false;
};

// Whether an engine's notes meet Note [cuDNN graph convolutions]'s rules for problem pr; runtime compilation
// is reported in `compiles`.
bool engine_usable(const BackendDesc& engine, const ConvProblem& pr, bool& compiles) {
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n = 0;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS)
    return false;
  const bool wide = pr.dtype == DType::f32 || pr.dtype == DType::f64;
  for (int64_t i = 0; i < n; ++i) {
    switch (notes[i]) {
      case CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC:
        if (cudnn_options().deterministic) return false;
        break;
      case CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION: return false;
      case CUDNN_NUMERICAL_NOTE_TENSOR_CORE:
      case CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS:
        if (wide && !(pr.dtype == DType::f32 && pr.tf32)) return false;
        break;
      default: break;
    }
  }
  cudnnBackendBehaviorNote_t behavior[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  int64_t nb = 0;
  compiles = false;
  if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &nb, behavior) == CUDNN_STATUS_SUCCESS)
    for (int64_t i = 0; i < nb; ++i) compiles = compiles || behavior[i] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION;
  return true;
}

// The engine of configuration cfg (an empty descriptor when cuDNN does not say) and its global index.
BackendDesc engine_of(const BackendDesc& cfg, int64_t* index) {
  BackendDesc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t eh = engine.get();
  int64_t n = 0;
  if (cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &eh) !=
          CUDNN_STATUS_SUCCESS ||
      n != 1)
    return BackendDesc();
  if (index != nullptr && cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                                                   &n, index) != CUDNN_STATUS_SUCCESS)
    *index = -1;
  return engine;
}

// The engine configurations heuristic `mode` ranks for a finalised operation graph (none when it fails).
std::vector<BackendDesc> heuristic_configs(const BackendDesc& graph, cudnnBackendHeurMode_t mode) {
  std::vector<BackendDesc> configs;
  BackendDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) return configs;
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               raw.data()) != CUDNN_STATUS_SUCCESS)
    got = 0;
  configs.resize(static_cast<size_t>(std::clamp<int64_t>(got, 0, count)));
  return configs;
}

// The graph of problem pr and its ranked usable engine configurations (none: the problem is not supported).
std::unique_ptr<GraphConv> build_graph(cudnnHandle_t h, const ConvProblem& pr, double beta) {
  auto gc = std::make_unique<GraphConv>();
  const cudnnDataType_t dt = cudnn_dtype(pr.dtype, "conv2d");
  const bool f64 = pr.dtype == DType::f64;
  const cudnnDataType_t compute = f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const std::array<int64_t, 4> xd{pr.n, pr.c, pr.h, pr.w}, yd{pr.n, pr.o, pr.oh, pr.ow},
      wd{pr.o, pr.c / pr.g.groups, pr.kh, pr.kw};
  BackendDesc x = tensor_desc(kUidX, dt, xd, dense_strides(xd, pr.nhwc));
  BackendDesc w = tensor_desc(kUidW, dt, wd, dense_strides(wd, pr.nhwc));
  BackendDesc y = tensor_desc(kUidY, dt, yd, dense_strides(yd, pr.nhwc));

  BackendDesc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t dil[2] = {pr.g.dilation[0], pr.g.dilation[1]}, str[2] = {pr.g.stride[0], pr.g.stride[1]},
                pad[2] = {pr.g.padding[0], pr.g.padding[1]};
  conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute);
  conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  conv.set_int64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, 2);
  conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dil);
  conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, str);
  conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad);
  conv.finalize();

  // alpha = 1 and beta in the compute type's width.
  const float af = 1.0f, bf = static_cast<float>(beta);
  const double ad = 1.0, bd = beta;
  const cudnnBackendAttributeType_t st = f64 ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  const void* alpha = f64 ? static_cast<const void*>(&ad) : static_cast<const void*>(&af);
  const void* bet = f64 ? static_cast<const void*>(&bd) : static_cast<const void*>(&bf);
  std::unique_ptr<BackendDesc> op;
  switch (pr.dir) {
    case ConvDir::forward:
      op = std::make_unique<BackendDesc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, y);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, st, 1, alpha);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, st, 1, bet);
      break;
    case ConvDir::backward_data:
      op = std::make_unique<BackendDesc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, x);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, w);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, y);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, st, 1, alpha);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, st, 1, bet);
      break;
    case ConvDir::backward_filter:
      op = std::make_unique<BackendDesc>(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, x);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, w);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY, y);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, conv);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA, st, 1, alpha);
      op->set(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, st, 1, bet);
      break;
  }
  op->finalize();

  BackendDesc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, *op);
  // The handle attributes are deprecated in newer cuDNN 9 releases (the handle comes with execution); set where
  // still taken, their status ignored.
  (void)cudnnBackendSetAttribute(graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  if (cudnnBackendFinalize(graph.get()) != CUDNN_STATUS_SUCCESS) return gc;  // no configs: not supported

  // Candidates: heuristic mode A's ranking; when timing, also mode B's and the fallback list's engines that A
  // does not rank (Note [cuDNN graph convolutions]), A's best first so the timed set mixes the three.
  std::vector<BackendDesc> plain, later;  // usable configurations; those that compile kernels at run time
  std::vector<int64_t> seen;              // engines already taken (global index)
  std::vector<std::vector<BackendDesc>> by_mode;
  for (const cudnnBackendHeurMode_t mode :
       cudnn_options().benchmark ? std::vector{CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_B, CUDNN_HEUR_MODE_FALLBACK}
                                 : std::vector{CUDNN_HEUR_MODE_A}) {
    by_mode.emplace_back();
    for (BackendDesc& cfg : heuristic_configs(graph, mode)) {
      bool compiles = false;
      int64_t index = -1;
      const BackendDesc engine = engine_of(cfg, &index);
      if (engine.get() == nullptr || !engine_usable(engine, pr, compiles)) continue;
      const bool first_mode = by_mode.size() == 1;  // A keeps an engine's several configurations
      if (!first_mode && std::find(seen.begin(), seen.end(), index) != seen.end()) continue;
      seen.push_back(index);
      (compiles ? later : by_mode.back()).push_back(std::move(cfg));
    }
  }
  // A's first kTimedFromA, then the others' new engines, then the rest of A.
  const size_t head = std::min(by_mode[0].size(), by_mode.size() > 1 ? kTimedFromA : by_mode[0].size());
  for (size_t i = 0; i < head; ++i) gc->configs.push_back(std::move(by_mode[0][i]));
  for (size_t m = 1; m < by_mode.size(); ++m)
    for (BackendDesc& c : by_mode[m]) gc->configs.push_back(std::move(c));
  for (size_t i = head; i < by_mode[0].size(); ++i) gc->configs.push_back(std::move(by_mode[0][i]));
  gc->compiling = later.size();
  for (BackendDesc& c : later) gc->configs.push_back(std::move(c));
  gc->keep.push_back(std::move(x));
  gc->keep.push_back(std::move(w));
  gc->keep.push_back(std::move(y));
  gc->keep.push_back(std::move(conv));
  gc->keep.push_back(std::move(*op));
  gc->keep.push_back(std::move(graph));
  return gc;
}

// Finalise the next usable configuration of gc into gc.ready; false when none is left.
bool finalize_next(cudnnHandle_t h, GraphConv& gc) {
  while (gc.next < gc.configs.size()) {
    const BackendDesc& cfg = gc.configs[gc.next++];
    BackendDesc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    (void)cudnnBackendSetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    if (cudnnBackendFinalize(plan.get()) != CUDNN_STATUS_SUCCESS) continue;  // this configuration cannot run
    int64_t ws = 0, n = 0;
    if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws) !=
            CUDNN_STATUS_SUCCESS ||
        ws < 0 || static_cast<size_t>(ws) > kMaxGraphWorkspace)
      continue;
    ReadyPlan r{std::move(plan), ws, -1};
    (void)engine_of(cfg, &r.engine);
    gc.ready.push_back(std::move(r));
    return true;
  }
  return false;
}

using GraphKey = std::pair<ConvKey, int>;  // the problem and whether beta is 0
using GraphMap = std::map<GraphKey, std::unique_ptr<GraphConv>>;

// The graphs of one device; only touched while that device's CudnnHandle is held (Note [cuDNN handle]).
GraphMap& graph_cache(int device) { return per_device<GraphMap>(device); }

// Execute plan r on the three pointers (by unique id: x, w, y) with a workspace of its size; throws the
// workspace allocation's error.
cudnnStatus_t execute(cudnnHandle_t h, const ReadyPlan& r, void* const (&ptrs)[3], Device dev) {
  static constexpr int64_t uids[3] = {kUidX, kUidW, kUidY};
  const Tensor ws = cudnn_workspace(static_cast<size_t>(r.workspace), dev);
  void* wsp = ws.defined() ? ws.raw_data() : nullptr;
  BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &wsp);
  pack.finalize();
  return cudnnBackendExecute(h, r.plan.get(), pack.get());
}

// MP_CUDNN_BENCHMARK (Note [cuDNN graph convolutions]): finalise up to kMaxTimedPlans configurations, time each
// into a scratch output and order gc.ready fastest first; plans that fail to run are dropped.
void time_plans(cudnnHandle_t h, GraphConv& gc, const ConvProblem& pr, void* const (&ptrs)[3], int out_uid,
                Device dev) {
  const size_t plain = gc.configs.size() - gc.compiling;
  while (gc.ready.size() < kMaxTimedPlans && gc.next < plain && finalize_next(h, gc)) {}
  if (gc.ready.empty()) finalize_next(h, gc);  // only engines that compile at run time: the first that finalises
  const Tensor scratch =
      mp::empty({pr.output_numel() * static_cast<int64_t>(dtype_size(pr.dtype))}, {.dtype = DType::u8, .device = dev});
  const cudaStream_t stream = current_stream(dev.index);
  MP_CUDA_CHECK(cudaMemsetAsync(scratch.raw_data(), 0, static_cast<size_t>(scratch.numel()), stream));
  void* p[3] = {ptrs[0], ptrs[1], ptrs[2]};
  p[out_uid - 1] = scratch.raw_data();
  std::vector<std::pair<float, size_t>> times;  // ms per execution, index into gc.ready
  for (size_t i = 0; i < gc.ready.size(); ++i) {
    try {
      if (execute(h, gc.ready[i], p, dev) != CUDNN_STATUS_SUCCESS) continue;  // warm-up; dropped when it fails
      TimingEvent start, stop;
      MP_CUDA_CHECK(cudaEventRecord(start.e, stream));
      for (int r = 0; r < kTimedRuns; ++r) MP_CUDNN_CHECK_CTX(execute(h, gc.ready[i], p, dev), pr.str());
      MP_CUDA_CHECK(cudaEventRecord(stop.e, stream));
      MP_CUDA_CHECK(cudaEventSynchronize(stop.e));
      float ms = 0.0f;
      MP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
      times.emplace_back(ms / kTimedRuns, i);
    } catch (const Error&) {  // the workspace does not fit: not a candidate
    }
  }
  std::stable_sort(times.begin(), times.end());
  std::vector<ReadyPlan> ordered;
  for (const auto& [ms, i] : times) ordered.push_back(std::move(gc.ready[i]));
  if (cudnn_options().log)
    for (size_t k = 0; k < times.size(); ++k)
      std::fprintf(stderr, "mixprec cuDNN graph timing: %s: engine %lld, %.4f ms%s\n", pr.str().c_str(),
                   static_cast<long long>(ordered[k].engine), static_cast<double>(times[k].first),
                   k == 0 ? " (chosen)" : "");
  gc.ready = std::move(ordered);
  gc.next = gc.configs.size();  // the timed plans are the candidates: no untimed one is added later
  gc.timed = true;
}

}  // namespace

bool run_conv_graph(const ConvProblem& pr, const ConvPointers& a, Device dev, double beta) {
  const CudnnOptions& opt = cudnn_options();
  if (!opt.graph) return false;
  CudnnHandle handle(dev.index);
  GraphMap& cache = graph_cache(dev.index);
  const GraphKey key{pr.key(), beta == 0.0 ? 0 : 1};
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, build_graph(handle.get(), pr, beta)).first;
  GraphConv& gc = *it->second;
  // Pointers by unique id: forward x, w -> y; backward data w, dy -> dx; backward filter x, dy -> dw.
  void* ptrs[3] = {const_cast<void*>(a.x), const_cast<void*>(a.w), const_cast<void*>(a.dy)};
  const int out_uid = pr.dir == ConvDir::forward ? kUidY : pr.dir == ConvDir::backward_data ? kUidX : kUidW;
  ptrs[out_uid - 1] = a.out;
  if (opt.benchmark && !gc.timed) time_plans(handle.get(), gc, pr, ptrs, out_uid, dev);
  std::exception_ptr oom;
  for (size_t i = 0;; ++i) {
    if (i == gc.ready.size() && !finalize_next(handle.get(), gc)) break;
    const ReadyPlan& r = gc.ready[i];
    cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
    try {
      s = execute(handle.get(), r, ptrs, dev);
    } catch (const Error&) {  // its workspace cannot be allocated: the next plan
      oom = std::current_exception();
      continue;
    }
    if (s == CUDNN_STATUS_SUCCESS) {
      if (opt.log && !gc.logged) {
        gc.logged = true;
        std::fprintf(stderr, "mixprec cuDNN graph: %s: engine %lld, workspace %lld bytes (%zu usable configurations)\n",
                     pr.str().c_str(), static_cast<long long>(r.engine), static_cast<long long>(r.workspace),
                     gc.configs.size());
      }
      count_cudnn_conv_call(pr.nhwc, false, true);
      return true;
    }
    if (!cudnn_not_supported(s)) throw_cudnn_error(s, "cudnnBackendExecute", pr.str(), __FILE__, __LINE__);
    gc.ready.erase(gc.ready.begin() + static_cast<std::ptrdiff_t>(i));  // never offered again
    --i;
  }
  if (oom) std::rethrow_exception(oom);
  if (opt.log && !gc.logged) {
    gc.logged = true;
    std::fprintf(stderr, "mixprec cuDNN graph: %s: no usable engine, runs on the legacy API\n", pr.str().c_str());
  }
  return false;
}

}  // namespace mp::backend::cuda

#endif  // MP_HAVE_CUDNN

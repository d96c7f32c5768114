// cuBLASLt GEMMs (see cublaslt.hpp): per-device handle and workspace, the plan cache (Note
// [cuBLASLt plans]), status errors, and the GEMM throughput probe for `mixprec bench`.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/key_hash.hpp"
#include "backend/cuda/cublaslt.hpp"
#include "backend/cuda/runtime.hpp"
#include "mp/core/error.hpp"
#include "mp/core/math_mode.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend::cuda {
namespace {

// ---- errors -------------------------------------------------------------------------------------

const char* cublas_remedy(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "cuBLASLt has no kernel for this combination of dtypes, layouts, alignment and epilogue on this GPU: "
             "make the operands contiguous, use f16/bf16/f32 inputs, or drop the epilogue";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "this operation needs a newer GPU (see `mixprec info` for the compute capability)";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "out of memory: free tensors you no longer need, call empty_cache(), or use a smaller batch";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the cuBLASLt library could not start: check the NVIDIA driver (nvidia-smi) and that libcublasLt "
             "matches the CUDA runtime";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "a GPU kernel failed to run; errors of earlier asynchronous work surface here too: rerun with "
             "CUDA_LAUNCH_BLOCKING=1 (and CUBLASLT_LOG_LEVEL=2) to see where it starts";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "invalid arguments (a mixprec bug: please report it with CUBLASLT_LOG_LEVEL=5 output)";
    default: return "rerun with CUBLASLT_LOG_LEVEL=2 for cuBLASLt's own explanation";
  }
}

// ---- names and descriptions -------------------------------------------------------------------

cudaDataType_t cuda_dtype(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::f64: return CUDA_R_64F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: break;
  }
  MP_FAIL("gemm: cuBLASLt takes f32, f64, f16 or bf16 matrices, got ", dtype_name(t),
          "; convert with .to(mp::DType::f32)");
}

const char* epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::none: return "none";
    case GemmEpilogue::bias: return "bias";
    case GemmEpilogue::relu: return "relu";
    case GemmEpilogue::bias_relu: return "bias+relu";
    case GemmEpilogue::gelu: return "gelu";
    case GemmEpilogue::bias_gelu: return "bias+gelu";
    case GemmEpilogue::bgrada: return "bgrada";
    case GemmEpilogue::bgradb: return "bgradb";
  }
  return "?";
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::relu: return CUBLASLT_EPILOGUE_RELU;
    case GemmEpilogue::bias_relu: return CUBLASLT_EPILOGUE_RELU_BIAS;
    case GemmEpilogue::gelu: return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::bias_gelu: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case GemmEpilogue::bgrada: return CUBLASLT_EPILOGUE_BGRADA;
    case GemmEpilogue::bgradb: return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

bool uses_bias(GemmEpilogue e) {
  return e == GemmEpilogue::bias || e == GemmEpilogue::bias_relu || e == GemmEpilogue::bias_gelu ||
         e == GemmEpilogue::bgrada || e == GemmEpilogue::bgradb;
}

// The compute type gemm() uses (Note [cuBLASLt accumulation]); throws on an unsupported pair.
cublasComputeType_t compute_type(const GemmArgs& a) {
  const DType t = a.ab_dtype;
  const bool pair_ok = (t == DType::f32 && a.d_dtype == DType::f32) || (t == DType::f64 && a.d_dtype == DType::f64) ||
                       (is_low_precision(t) && (a.d_dtype == t || a.d_dtype == DType::f32));
  MP_CHECK(pair_ok, "gemm: cuBLASLt multiplies f32 -> f32, f16 -> f16/f32, bf16 -> bf16/f32 and f64 -> f64, got ",
           dtype_name(t), " inputs with a ", dtype_name(a.d_dtype), " output; convert the inputs or the output");
  switch (a.compute) {
    case GemmCompute::automatic:
      if (t == DType::f64) return CUBLAS_COMPUTE_64F;
      if (t == DType::f32 && float32_matmul_precision() == Float32MatmulPrecision::high)
        return CUBLAS_COMPUTE_32F_FAST_TF32;
      return CUBLAS_COMPUTE_32F;
    case GemmCompute::f32:
      MP_CHECK(t != DType::f64, "gemm: f64 inputs need GemmCompute::f64 (or automatic), got compute f32");
      return CUBLAS_COMPUTE_32F;
    case GemmCompute::tf32:
      MP_CHECK(t == DType::f32, "gemm: TF32 compute takes f32 inputs, got ", dtype_name(t));
      return CUBLAS_COMPUTE_32F_FAST_TF32;
    case GemmCompute::f64:
      MP_CHECK(t == DType::f64, "gemm: f64 compute takes f64 inputs, got ", dtype_name(t));
      return CUBLAS_COMPUTE_64F;
  }
  MP_FAIL("gemm: invalid compute type ", static_cast<int>(a.compute));
}

const char* compute_name(cublasComputeType_t c) {
  switch (c) {
    case CUBLAS_COMPUTE_32F: return "32F";
    case CUBLAS_COMPUTE_32F_FAST_TF32: return "32F_FAST_TF32";
    case CUBLAS_COMPUTE_64F: return "64F";
    default: return "?";
  }
}

std::string describe(const GemmArgs& a) {
  return detail::str_cat(
      "gemm on cuda:", a.device, " m=", a.m, " n=", a.n, " k=", a.k, " batch=", a.batch, ", A ", dtype_name(a.ab_dtype),
      a.trans_a ? " transposed" : "", " ld ", a.lda, " batch stride ", a.stride_a, ", B ", dtype_name(a.ab_dtype),
      a.trans_b ? " transposed" : "", " ld ", a.ldb, " batch stride ", a.stride_b, ", D ", dtype_name(a.d_dtype),
      " ld ", a.ldd, " batch stride ", a.stride_d, ", alpha ", a.alpha, " beta ", a.beta, ", epilogue ",
      epilogue_name(a.epilogue),
      uses_bias(a.epilogue) ? detail::str_cat(" (bias ", dtype_name(a.bias_dtype), ")") : std::string());
}

// Largest power of two (up to 256) that divides the address: the alignment class of an operand.
uint32_t alignment(const void* p) {
  const auto x = reinterpret_cast<uintptr_t>(p);
  if (x == 0) return 256;
  const uintptr_t low = x & (~x + 1);
  return low >= 256 ? 256u : static_cast<uint32_t>(low);
}

void validate(const GemmArgs& a) {
  constexpr int64_t kMax32 = 2147483647;
  MP_CHECK(a.m >= 0 && a.n >= 0 && a.k >= 0 && a.batch >= 0, "gemm: sizes must be non-negative, got ", describe(a));
  MP_CHECK(a.m <= kMax32 && a.n <= kMax32 && a.k <= kMax32 && a.batch <= kMax32,
           "gemm: cuBLASLt takes sizes and batch counts below 2^31, got ", describe(a), "; split the problem");
  MP_CHECK(a.k > 0 || a.m == 0 || a.n == 0 || a.batch == 0,
           "gemm: k == 0 (an empty product) is not passed to cuBLASLt; the caller writes beta*C (+ bias) itself. Got ",
           describe(a));
  const int64_t a_rows = a.trans_a ? a.k : a.m, b_rows = a.trans_b ? a.n : a.k;
  MP_CHECK(a.lda >= std::max<int64_t>(1, a_rows) && a.ldb >= std::max<int64_t>(1, b_rows) &&
               a.ldd >= std::max<int64_t>(1, a.m),
           "gemm: leading dimensions must be at least the stored row counts (A ", a_rows, ", B ", b_rows, ", D ", a.m,
           "), got ", describe(a));
  MP_CHECK(a.batch <= 1 || a.stride_d != 0, "gemm: D cannot be broadcast over the batch (batch stride 0), got ",
           describe(a));
  MP_CHECK(a.stride_a >= 0 && a.stride_b >= 0 && a.stride_d >= 0 && a.bias_batch_stride >= 0,
           "gemm: batch strides must be non-negative, got ", describe(a));
  MP_CHECK(a.a != nullptr && a.b != nullptr && a.d != nullptr, "gemm: A, B or D is null: ", describe(a));
  if (uses_bias(a.epilogue)) {
    MP_CHECK(a.bias != nullptr, "gemm: epilogue ", epilogue_name(a.epilogue), " needs a bias pointer: ", describe(a));
    MP_CHECK(a.bias_dtype == a.d_dtype, "gemm: cuBLASLt wants the bias vector in the output's dtype (",
             dtype_name(a.d_dtype), "), got ", dtype_name(a.bias_dtype), "; convert it with .to()");
  }
  (void)cuda_dtype(a.ab_dtype);
  (void)compute_type(a);
}

// ---- RAII for cuBLASLt descriptors --------------------------------------------------------------

struct DescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const { (void)cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t l) const { (void)cublasLtMatrixLayoutDestroy(l); }
};
struct PrefDeleter {
  void operator()(cublasLtMatmulPreference_t p) const { (void)cublasLtMatmulPreferenceDestroy(p); }
};
using DescPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, DescDeleter>;
using LayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
using PrefPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PrefDeleter>;

// ---- plans ----------------------------------------------------------------------------------------

// Everything the descriptors, layouts and the heuristic's choice depend on (Note [cuBLASLt plans]).
using PlanKey = std::array<int64_t, 23>;

PlanKey make_key(const GemmArgs& a, cublasComputeType_t compute) {
  const bool batched = a.batch > 1;
  const void* c = a.c != nullptr ? a.c : a.d;
  return PlanKey{a.m,
                 a.n,
                 a.k,
                 a.lda,
                 a.ldb,
                 a.ldd,
                 batched ? a.batch : 1,
                 batched ? a.stride_a : 0,
                 batched ? a.stride_b : 0,
                 batched ? a.stride_d : 0,
                 batched && uses_bias(a.epilogue) ? a.bias_batch_stride : 0,
                 static_cast<int64_t>(a.ab_dtype),
                 static_cast<int64_t>(a.d_dtype),
                 uses_bias(a.epilogue) ? static_cast<int64_t>(a.bias_dtype) : -1,
                 static_cast<int64_t>(compute),
                 static_cast<int64_t>(a.epilogue),
                 a.trans_a ? 1 : 0,
                 a.trans_b ? 1 : 0,
                 alignment(a.a),
                 alignment(a.b),
                 alignment(c),
                 alignment(a.d),
                 uses_bias(a.epilogue) ? alignment(a.bias) : 0};
}

struct Plan {
  DescPtr desc;
  LayoutPtr la, lb, lc, ld;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  bool has_algo = false;
  std::string no_algo;  // why there is none (the heuristic's status), when !has_algo
};

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v, const GemmArgs& a) {
  MP_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)), describe(a));
}

template <class T>
void set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, const T& v, const GemmArgs& a) {
  MP_CUBLASLT_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof(v)), describe(a));
}

template <class T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v, const GemmArgs& a) {
  MP_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)), describe(a));
}

LayoutPtr make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t stride, const GemmArgs& a) {
  cublasLtMatrixLayout_t l = nullptr;
  MP_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
                    describe(a));
  LayoutPtr p(l);
  if (a.batch > 1) {
    set_layout(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(a.batch), a);
    set_layout(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride, a);
  }
  return p;
}

std::unique_ptr<Plan> build_plan(cublasLtHandle_t handle, const GemmArgs& a, cublasComputeType_t compute) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t ab = cuda_dtype(a.ab_dtype), dt = cuda_dtype(a.d_dtype);
  const cudaDataType_t scale = compute == CUBLAS_COMPUTE_64F ? CUDA_R_64F : CUDA_R_32F;

  cublasLtMatmulDesc_t desc = nullptr;
  MP_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&desc, compute, scale), describe(a));
  plan->desc.reset(desc);
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, static_cast<int32_t>(a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N), a);
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, static_cast<int32_t>(a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N), a);
  set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(lt_epilogue(a.epilogue)), a);
  if (uses_bias(a.epilogue)) {
    // The heuristic reads the pointer's alignment from here; gemm() sets each call's pointer.
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias, a);
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_dtype(a.bias_dtype)), a);
    if (a.batch > 1) set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, a.bias_batch_stride, a);
  }

  plan->la = make_layout(ab, a.trans_a ? a.k : a.m, a.trans_a ? a.m : a.k, a.lda, a.stride_a, a);
  plan->lb = make_layout(ab, a.trans_b ? a.n : a.k, a.trans_b ? a.k : a.n, a.ldb, a.stride_b, a);
  plan->lc = make_layout(dt, a.m, a.n, a.ldd, a.stride_d, a);
  plan->ld = make_layout(dt, a.m, a.n, a.ldd, a.stride_d, a);

  cublasLtMatmulPreference_t pref_raw = nullptr;
  MP_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&pref_raw), describe(a));
  PrefPtr pref(pref_raw);
  set_pref(pref_raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kGemmWorkspaceBytes), a);
  set_pref(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(a.a), a);
  set_pref(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(a.b), a);
  set_pref(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(a.c != nullptr ? a.c : a.d), a);
  set_pref(pref_raw, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(a.d), a);
  if (is_low_precision(a.d_dtype)) {
    // Note [cuBLASLt accumulation]: split-K partial sums stay in f32.
    set_pref(pref_raw, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE), a);
  }

  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, desc, plan->la.get(), plan->lb.get(), plan->lc.get(),
                                                          plan->ld.get(), pref_raw, 1, &result, &count);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && count == 0)) {
    plan->no_algo = s == CUBLAS_STATUS_SUCCESS
                        ? std::string("the heuristic returned no algorithm")
                        : detail::str_cat("cublasLtMatmulAlgoGetHeuristic answered ", cublasLtGetStatusName(s));
    return plan;
  }
  if (s != CUBLAS_STATUS_SUCCESS)
    throw_cublas_error(static_cast<int>(s), "cublasLtMatmulAlgoGetHeuristic", describe(a), __FILE__, __LINE__);
  plan->algo = result.algo;
  plan->workspace = result.workspaceSize;
  plan->has_algo = true;
  MP_ASSERT(plan->workspace <= kGemmWorkspaceBytes, "cuBLASLt chose an algorithm needing ", plan->workspace,
            " workspace bytes, more than the ", kGemmWorkspaceBytes, " allowed");
  return plan;
}

// ---- per-device state -----------------------------------------------------------------------------

// One device's handle, workspace and plans. Never destroyed (Note [leaked runtime state] in
// runtime.cu): GEMMs may run during static destruction, and the workspace tensor must not return to
// an allocator that is already gone.
struct DeviceContext {
  std::once_flag init_once;
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;
  // Guards the plan map and the statistics, and serialises the use of the handle and of the shared
  // descriptors (gemm() writes each call's bias pointer into its plan's descriptor before cublasLtMatmul).
  std::mutex mu;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, KeyHash<PlanKey>> plans;
  GemmCacheStats stats;
};

DeviceContext& context(int device) {
  check_device(Device(DeviceType::cuda, device), "gemm");
  DeviceContext& ctx = per_device<DeviceContext>(device);
  std::call_once(ctx.init_once, [&] {
    DeviceGuard g(Device(DeviceType::cuda, device), "gemm");
    cublasLtHandle_t h = nullptr;
    MP_CUBLASLT_CHECK(cublasLtCreate(&h), detail::str_cat("creating the cuBLASLt handle of cuda:", device));
    ctx.workspace = empty({static_cast<int64_t>(kGemmWorkspaceBytes)},
                          {.dtype = DType::u8, .device = Device(DeviceType::cuda, device)});
    ctx.handle = h;
  });
  return ctx;
}

// The plan of `a`, built on first use. Called with ctx.mu held.
Plan& plan_for(DeviceContext& ctx, const GemmArgs& a, cublasComputeType_t compute) {
  const PlanKey key = make_key(a, compute);
  auto it = ctx.plans.find(key);
  if (it != ctx.plans.end()) {
    ++ctx.stats.hits;
    return *it->second;
  }
  std::unique_ptr<Plan> p = build_plan(ctx.handle, a, compute);
  ++ctx.stats.misses;
  ++ctx.stats.plans;
  return *ctx.plans.emplace(key, std::move(p)).first->second;
}

// ---- the throughput probe's input fill ----------------------------------------------------------

MP_HD MP_FORCE_INLINE uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// p[i] = a hash of (seed, i) mapped to [-1, 1): benchmark inputs with realistic bit patterns
// (all-zero inputs draw less power and run faster than real data on tensor cores).
template <class T>
__global__ void fill_uniform_kernel(T* p, int64_t n, uint64_t seed) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const uint64_t h = splitmix64(seed ^ static_cast<uint64_t>(i) * 0xD1B54A32D192ED03ull);
    const float v = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
    p[i] = scalar_cast<T>(v);
  }
}

void fill_uniform(const Tensor& t, uint64_t seed) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks =
      std::min<int64_t>((n + threads - 1) / threads, int64_t{32} * device_properties(t.device().index).multiprocessors);
  visit_floating(t.dtype(), "time_gemm_tflops", [&]<class T>() {
    fill_uniform_kernel<T><<<static_cast<unsigned>(blocks), threads, 0, current_stream(t.device().index)>>>(
        static_cast<T*>(t.raw_data()), n, seed);
    MP_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

// ---- public API -----------------------------------------------------------------------------------

void throw_cublas_error(int status, const char* call, const std::string& context, const char* file, int line) {
  const auto s = static_cast<cublasStatus_t>(status);
  ::mp::detail::throw_error(
      file, line,
      ::mp::detail::str_cat("cuBLASLt call ", call, " failed: ", cublasLtGetStatusName(s), " (",
                            cublasLtGetStatusString(s), ") for ", context, "; ", cublas_remedy(s)));
}

void gemm(const GemmArgs& a) {
  validate(a);
  if (a.m == 0 || a.n == 0 || a.batch == 0) return;
  const cublasComputeType_t compute = compute_type(a);
  DeviceGuard guard(Device(DeviceType::cuda, a.device), "gemm");
  DeviceContext& ctx = context(a.device);
  const cudaStream_t stream = current_stream(a.device);
  std::lock_guard<std::mutex> lock(ctx.mu);
  Plan& p = plan_for(ctx, a, compute);
  if (!p.has_algo)
    MP_FAIL("gemm: cuBLASLt has no algorithm for ", describe(a), " (", p.no_algo,
            "); make the operands contiguous and 16-byte aligned, or use another dtype or epilogue");
  if (uses_bias(a.epilogue)) set_desc(p.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, a.bias, a);
  const void* c = a.c != nullptr ? a.c : a.d;
  void* ws = ctx.workspace.raw_data();
  if (compute == CUBLAS_COMPUTE_64F) {
    const double alpha = a.alpha, beta = a.beta;
    MP_CUBLASLT_CHECK(cublasLtMatmul(ctx.handle, p.desc.get(), &alpha, a.a, p.la.get(), a.b, p.lb.get(), &beta, c,
                                     p.lc.get(), a.d, p.ld.get(), &p.algo, ws, kGemmWorkspaceBytes, stream),
                      describe(a));
  } else {
    const float alpha = static_cast<float>(a.alpha), beta = static_cast<float>(a.beta);
    MP_CUBLASLT_CHECK(cublasLtMatmul(ctx.handle, p.desc.get(), &alpha, a.a, p.la.get(), a.b, p.lb.get(), &beta, c,
                                     p.lc.get(), a.d, p.ld.get(), &p.algo, ws, kGemmWorkspaceBytes, stream),
                      describe(a));
  }
}

bool gemm_supported(const GemmArgs& a) {
  validate(a);
  if (a.m == 0 || a.n == 0 || a.batch == 0) return true;
  const cublasComputeType_t compute = compute_type(a);
  DeviceGuard guard(Device(DeviceType::cuda, a.device), "gemm");
  DeviceContext& ctx = context(a.device);
  std::lock_guard<std::mutex> lock(ctx.mu);
  const PlanKey key = make_key(a, compute);
  auto it = ctx.plans.find(key);
  if (it != ctx.plans.end()) return it->second->has_algo;
  std::unique_ptr<Plan> p = build_plan(ctx.handle, a, compute);
  const bool ok = p->has_algo;
  ++ctx.stats.plans;
  ctx.plans.emplace(key, std::move(p));
  return ok;
}

std::string gemm_compute_name(const GemmArgs& a) { return compute_name(compute_type(a)); }

GemmCacheStats gemm_cache_stats(int device) {
  DeviceContext& ctx = context(device);
  std::lock_guard<std::mutex> lock(ctx.mu);
  return ctx.stats;
}

double time_gemm_tflops(DType dtype, int64_t m, int64_t n, int64_t k, int iters, int device) {
  MP_CHECK(m > 0 && n > 0 && k > 0 && iters > 0, "time_gemm_tflops: expected positive sizes and iterations, got m=", m,
           " n=", n, " k=", k, " iters=", iters);
  const Device dev(DeviceType::cuda, device);
  DeviceGuard guard(dev, "time_gemm_tflops");
  const Tensor A = empty({m, k}, {.dtype = dtype, .device = dev});
  const Tensor B = empty({k, n}, {.dtype = dtype, .device = dev});
  const Tensor C = empty({m, n}, {.dtype = dtype, .device = dev});
  fill_uniform(A, 1);
  fill_uniform(B, 2);
  // Row-major C = A B is column-major C^T = B^T A^T: B is B^T column-major (n x k, ld n), A is A^T
  // (k x m, ld k), C is C^T (n x m, ld n); no transposes.
  GemmArgs g;
  g.device = device;
  g.a = B.raw_data();
  g.b = A.raw_data();
  g.d = C.raw_data();
  g.ab_dtype = g.d_dtype = dtype;
  g.m = n;
  g.n = m;
  g.k = k;
  g.lda = n;
  g.ldb = k;
  g.ldd = n;
  gemm(g);  // warm-up: builds the plan, loads the kernel
  gemm(g);
  const cudaStream_t stream = current_stream(device);
  TimingEvent start, stop;
  MP_CUDA_CHECK(cudaEventRecord(start.e, stream));
  for (int i = 0; i < iters; ++i) gemm(g);
  MP_CUDA_CHECK(cudaEventRecord(stop.e, stream));
  MP_CUDA_CHECK(cudaEventSynchronize(stop.e));
  float ms = 0.0f;
  MP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e, stop.e));
  MP_CHECK(ms > 0.0f, "time_gemm_tflops: the GPU timer measured ", ms, " ms for ", iters,
           " GEMMs; use more iterations");
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * iters / (ms * 1e-3) / 1e12;
}

}  // namespace mp::backend::cuda

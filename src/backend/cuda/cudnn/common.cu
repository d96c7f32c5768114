// cuDNN handle, errors, descriptors and the shared helpers of the cuDNN families (see cudnn/common.hpp).
#if defined(MP_HAVE_CUDNN)
#include "backend/cuda/cudnn/common.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cuda/loops.cuh"
#include "mp/core/error.hpp"

namespace mp::backend::cuda {
namespace {

// What to do about a failed cuDNN call, by status class.
const char* cudnn_remedy(cudnnStatus_t s) {
  switch (static_cast<int>(s) / 1000) {
    case 1:
      if (s == CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH || s == CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED)
        return "cuDNN's sub-libraries (libcudnn_ops, libcudnn_cnn, libcudnn_engines_*) must be installed beside "
               "libcudnn.so.9 and have its version (a PyTorch wheel's nvidia/cudnn/lib works: configure with "
               "-DCUDNN_ROOT=<that dir>/..)";
      return "cuDNN could not initialise: check the NVIDIA driver (nvidia-smi) and that the cuDNN 9 libraries "
             "found at run time match the headers mixprec was built with";
    case 2:
      return "cuDNN rejected the arguments: this is a mixprec bug unless the shapes are extreme (dims >= 2^31); "
             "please report it with the message above";
    case 3:
      return "cuDNN has no kernel for this combination of dtype, shape and settings: try another dtype (f32), "
             "MP_CUDNN_DETERMINISTIC=0, or run the op on the CPU";
    case 4:
      if (s == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
        return "free tensors you no longer need, call empty_cache(), or use a smaller batch";
      return "cuDNN failed internally: rerun with CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr for its log";
    case 5:
      return "a cuDNN kernel failed, possibly because of an earlier asynchronous error: rerun with "
             "CUDA_LAUNCH_BLOCKING=1 (and CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr) to locate it";
    default: return "see cuDNN's message above";
  }
}

// Per-device handle state (Note [cuDNN handle]); never destroyed (Note [leaked runtime state]).
struct HandleState {
  std::mutex mu;
  cudnnHandle_t handle = nullptr;
};

HandleState& handle_state(int device) {
  check_device(Device(DeviceType::cuda, device), "cudnn");
  return per_device<HandleState>(device);
}

bool env_flag(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return fallback;
  return !(std::strcmp(e, "0") == 0 || std::strcmp(e, "false") == 0 || std::strcmp(e, "off") == 0);
}

// ------------------------------------------------------------------ dtype conversion kernel

template <class D, class S>
using ConvertAcc = std::conditional_t<std::is_same_v<D, double> || std::is_same_v<S, double>, double, float>;

template <class D, class S>
__global__ void __launch_bounds__(kDnnThreads) convert_kernel(D* dst, const S* src, int64_t n, bool accumulate) {
  using A = ConvertAcc<D, S>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    if (accumulate)
      dst[i] = device_cast<D>(device_cast<A>(dst[i]) + device_cast<A>(src[i]));
    else
      dst[i] = device_cast<D>(src[i]);
  }
}

template <class T>
__global__ void __launch_bounds__(kDnnThreads) fill_kernel(T* dst, int64_t n, T v) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) dst[i] = v;
}

// Calls f.template operator()<T>() for the floating element type of dt (f32, f64, f16, bf16).
template <class F>
void visit_float_type(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: return f.template operator()<float>();
    case DType::f64: return f.template operator()<double>();
    case DType::f16: return f.template operator()<Half>();
    case DType::bf16: return f.template operator()<BFloat16>();
    default: MP_FAIL(op, ": expected a floating tensor (f32, f64, f16, bf16), got ", dtype_name(dt));
  }
}

// ------------------------------------------------------------------ per-channel sums

// Partial sums of one (channel, part) block: sum(dy) and, with x, sum(dy (x - mean[c])), per thread in
// the statistics type S over runs of kFlush vectors, then in double; block-combined in double.
// partials: [C * parts][2].
constexpr int kFlush = 64;

template <class T, class S, int VEC>
__global__ void __launch_bounds__(kDnnThreads)
    channel_sums_partials(const T* dy, const T* x, const S* mean, int64_t C, int64_t Sv, int64_t Mv, ChannelSplit split,
                          double* partials) {
  const int64_t blocks = C * split.parts;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t c = b / split.parts, p = b - c * split.parts;
    const int64_t j0 = p * split.chunk, j1 = j0 + split.chunk < Mv ? j0 + split.chunk : Mv;
    double d1 = 0, d2 = 0;
    const int64_t jt = j0 + threadIdx.x;
    if (jt < j1) {
      const S m = x != nullptr ? mean[c] : S(0);
      S s1 = 0, s2 = 0;
      int run = 0;
      NcsChannelWalk w(jt, blockDim.x, c, Sv, C);
      for (int64_t j = jt; j < j1; j += blockDim.x, w.next()) {
        T g[VEC];
        load_vec<VEC>(dy + w.off * VEC, g);
        if (x != nullptr) {
          T v[VEC];
          load_vec<VEC>(x + w.off * VEC, v);
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const S gs = device_cast<S>(g[k]);
            s1 += gs;
            s2 += gs * (device_cast<S>(v[k]) - m);
          }
        } else {
#pragma unroll
          for (int k = 0; k < VEC; ++k) s1 += device_cast<S>(g[k]);
        }
        if (++run == kFlush) {
          d1 += static_cast<double>(s1);
          d2 += static_cast<double>(s2);
          s1 = s2 = S(0);
          run = 0;
        }
      }
      d1 += static_cast<double>(s1);
      d2 += static_cast<double>(s2);
    }
    const DoubleTuple<2> r = block_combine<2>(DoubleTuple<2>{{d1, d2}}, DoubleTuple<2>{{0.0, 0.0}},
                                              [](const DoubleTuple<2>& a, const DoubleTuple<2>& o) {
                                                return DoubleTuple<2>{{a.v[0] + o.v[0], a.v[1] + o.v[1]}};
                                              });
    if (threadIdx.x == 0) {
      partials[2 * b] = r.v[0];
      partials[2 * b + 1] = r.v[1];
    }
  }
}

// Adds each channel's partials (warp_part_sums: a warp per channel).
__global__ void __launch_bounds__(kDnnThreads)
    channel_sums_finalize(const double* partials, int64_t C, int64_t parts, double* sum_dy, double* sum_dy_xmu) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); c < C; c += warps) {
    double a, b;
    warp_part_sums(partials, c, parts, a, b);
    if ((threadIdx.x & 31u) == 0) {
      sum_dy[c] = a;
      if (sum_dy_xmu != nullptr) sum_dy_xmu[c] = b;
    }
  }
}

// sum(dy) and, with x, sum(dy (x - mean[c])) down one column of channels-last rows (Note [column
// reductions]): the same per-element products and statistics-type runs as channel_sums_partials.
template <class T, class S>
struct GradSums {
  using Stat = S;
  const S* mean;  // [C]; null when there is no x
  __device__ S constant(int64_t c) const { return mean != nullptr ? mean[c] : S(0); }
  __device__ MP_FORCE_INLINE void add(S& u, S& v, T dy, T x, S m) const {
    const S g = device_cast<S>(dy);
    u += g;
    if (mean != nullptr) v += g * (device_cast<S>(x) - m);
  }
};

}  // namespace

// ================================================================ errors, handle, options

void throw_cudnn_error(cudnnStatus_t status, const char* call, const std::string& context, const char* file, int line) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  (void)cudaGetLastError();  // a non-sticky CUDA error behind the failure must not resurface later
  ::mp::detail::throw_error(
      file, line,
      ::mp::detail::str_cat("cuDNN call ", call, " failed: ", cudnnGetErrorString(status), " (",
                            static_cast<int>(status), ")", last[0] != '\0' ? std::string(": ") + last : std::string(),
                            context.empty() ? std::string() : "; " + context, "; ", cudnn_remedy(status)));
}

CudnnHandle::CudnnHandle(int device) {
  HandleState& st = handle_state(device);
  lock_ = std::unique_lock<std::mutex>(st.mu);
  if (st.handle == nullptr) {
    DeviceGuard g(Device(DeviceType::cuda, device), "cudnn");
    const size_t version = cudnnGetVersion();
    MP_CHECK(version / 10000 == CUDNN_MAJOR && version >= static_cast<size_t>(CUDNN_VERSION),
             "cudnn: mixprec was built against cuDNN ", CUDNN_MAJOR, ".", CUDNN_MINOR,
             " but the libcudnn loaded at run time is version ", version / 10000, ".", version / 100 % 100,
             "; put a cuDNN ", CUDNN_MAJOR, ".", CUDNN_MINOR, " or newer ", CUDNN_MAJOR,
             ".x library first on the library path or rebuild");
    cudnnHandle_t h = nullptr;
    MP_CUDNN_CHECK(cudnnCreate(&h));
    const cudnnStatus_t s = cudnnSetStream(h, current_stream(device));
    if (s != CUDNN_STATUS_SUCCESS) {
      cudnnDestroy(h);
      throw_cudnn_error(s, "cudnnSetStream", "", __FILE__, __LINE__);
    }
    st.handle = h;
  }
  handle_ = st.handle;
}

const CudnnOptions& cudnn_options() {
  static const CudnnOptions opts = [] {
    CudnnOptions o;
    o.benchmark = env_flag("MP_CUDNN_BENCHMARK", false);
    o.deterministic = env_flag("MP_CUDNN_DETERMINISTIC", true);
    o.batch_norm = env_flag("MP_CUDNN_BATCH_NORM", true);
    o.log = env_flag("MP_CUDNN_LOG", false);
    o.graph = env_flag("MP_CUDNN_GRAPH", true);
    return o;
  }();
  return opts;
}

cudnnDataType_t cudnn_dtype(DType dt, const char* op) {
  switch (dt) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default:
      MP_FAIL(op, ": cuDNN takes f32, f64, f16 or bf16 tensors, got ", dtype_name(dt),
              "; convert with .to(mp::DType::f32)");
  }
}

Tensor cudnn_workspace(size_t bytes, Device dev) {
  if (bytes == 0) return Tensor();
  return mp::empty({static_cast<int64_t>(bytes)}, {.dtype = DType::u8, .device = dev});
}

const void* cudnn_scale(cudnnDataType_t compute, double value) {
  static const float f_one = 1.0f, f_zero = 0.0f;
  static const double d_one = 1.0, d_zero = 0.0;
  MP_ASSERT(value == 0.0 || value == 1.0, "cudnn_scale: only 0 and 1");
  if (compute == CUDNN_DATA_DOUBLE) return value == 1.0 ? &d_one : &d_zero;
  return value == 1.0 ? &f_one : &f_zero;
}

// ================================================================ descriptors

CudnnTensorDescriptor::CudnnTensorDescriptor() { MP_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_)); }
CudnnTensorDescriptor::~CudnnTensorDescriptor() {
  if (desc_ != nullptr) cudnnDestroyTensorDescriptor(desc_);
}
void CudnnTensorDescriptor::set_nchw(cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w) {
  MP_ASSERT(fits_int(n * c * h * w) && n >= 1 && c >= 1 && h >= 1 && w >= 1, "cudnn tensor [", n, ", ", c, ", ", h,
            ", ", w, "] out of range");
  MP_CUDNN_CHECK_CTX(cudnnSetTensor4dDescriptorEx(desc_, dt, static_cast<int>(n), static_cast<int>(c),
                                                  static_cast<int>(h), static_cast<int>(w), static_cast<int>(c * h * w),
                                                  static_cast<int>(h * w), static_cast<int>(w), 1),
                     detail::str_cat("tensor [", n, ", ", c, ", ", h, ", ", w, "]"));
}

void CudnnTensorDescriptor::set_nhwc(cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w) {
  MP_ASSERT(fits_int(n * c * h * w) && n >= 1 && c >= 1 && h >= 1 && w >= 1, "cudnn tensor [", n, ", ", c, ", ", h,
            ", ", w, "] out of range");
  MP_CUDNN_CHECK_CTX(cudnnSetTensor4dDescriptorEx(desc_, dt, static_cast<int>(n), static_cast<int>(c),
                                                  static_cast<int>(h), static_cast<int>(w), static_cast<int>(h * w * c),
                                                  1, static_cast<int>(w * c), static_cast<int>(c)),
                     detail::str_cat("channels-last tensor [", n, ", ", c, ", ", h, ", ", w, "]"));
}

CudnnFilterDescriptor::CudnnFilterDescriptor() { MP_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_)); }
CudnnFilterDescriptor::~CudnnFilterDescriptor() {
  if (desc_ != nullptr) cudnnDestroyFilterDescriptor(desc_);
}
void CudnnFilterDescriptor::set_oihw(cudnnDataType_t dt, int64_t o, int64_t i, int64_t kh, int64_t kw) {
  MP_ASSERT(fits_int(o * i * kh * kw), "cudnn filter out of range");
  MP_CUDNN_CHECK_CTX(cudnnSetFilter4dDescriptor(desc_, dt, CUDNN_TENSOR_NCHW, static_cast<int>(o), static_cast<int>(i),
                                                static_cast<int>(kh), static_cast<int>(kw)),
                     detail::str_cat("filter [", o, ", ", i, ", ", kh, ", ", kw, "]"));
}

void CudnnFilterDescriptor::set_ohwi(cudnnDataType_t dt, int64_t o, int64_t i, int64_t kh, int64_t kw) {
  MP_ASSERT(fits_int(o * i * kh * kw), "cudnn filter out of range");
  MP_CUDNN_CHECK_CTX(cudnnSetFilter4dDescriptor(desc_, dt, CUDNN_TENSOR_NHWC, static_cast<int>(o), static_cast<int>(i),
                                                static_cast<int>(kh), static_cast<int>(kw)),
                     detail::str_cat("channels-last filter [", o, ", ", i, ", ", kh, ", ", kw, "]"));
}

CudnnConvolutionDescriptor::CudnnConvolutionDescriptor() { MP_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_)); }
CudnnConvolutionDescriptor::~CudnnConvolutionDescriptor() {
  if (desc_ != nullptr) cudnnDestroyConvolutionDescriptor(desc_);
}
void CudnnConvolutionDescriptor::set_2d(int64_t pad_h, int64_t pad_w, int64_t stride_h, int64_t stride_w, int64_t dil_h,
                                        int64_t dil_w, int64_t groups, cudnnDataType_t compute) {
  MP_CUDNN_CHECK_CTX(
      cudnnSetConvolution2dDescriptor(desc_, static_cast<int>(pad_h), static_cast<int>(pad_w),
                                      static_cast<int>(stride_h), static_cast<int>(stride_w), static_cast<int>(dil_h),
                                      static_cast<int>(dil_w), CUDNN_CROSS_CORRELATION, compute),
      detail::str_cat("padding (", pad_h, ", ", pad_w, "), stride (", stride_h, ", ", stride_w, "), dilation (", dil_h,
                      ", ", dil_w, ")"));
  MP_CUDNN_CHECK(cudnnSetConvolutionGroupCount(desc_, static_cast<int>(groups)));
}
void CudnnConvolutionDescriptor::set_math(cudnnMathType_t math) {
  MP_CUDNN_CHECK(cudnnSetConvolutionMathType(desc_, math));
}

// ================================================================ shared tensor helpers

Tensor cudnn_dense(const Tensor& t, MemoryFormat f) {
  const bool dense = t.is_contiguous(f);
  if (dense && is_aligned(t.raw_data(), 16)) return t;
  Tensor out = mp::empty(t.sizes(), {.dtype = t.dtype(), .device = t.device(), .memory_format = f});
  if (dense && same_dense_layout(out, t)) {  // only misaligned (a view at an odd offset): a byte copy
    const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
    if (bytes > 0)
      MP_CUDA_CHECK(cudaMemcpyAsync(out.raw_data(), t.raw_data(), bytes, cudaMemcpyDeviceToDevice,
                                    current_stream(t.device().index)));
    return out;
  }
  out.copy_(t);  // the element-wise copy kernel gathers a strided view
  return out;
}

Tensor empty_like_layout(const Tensor& t, DType dt) {
  if (t.is_contiguous()) return mp::empty(t.sizes(), {.dtype = dt, .device = t.device()});
  MP_ASSERT(same_dense_layout(t, t), "empty_like_layout: ", t.describe(), " is not dense");
  // A contiguous tensor with the dims in t's memory order (outermost first), permuted back: the dims of
  // size > 1 get t's strides (size-1 dims contribute no factor wherever they sit).
  Shape order(static_cast<size_t>(t.dim()));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return t.stride(x) > t.stride(y); });
  Shape sizes, inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    sizes.push_back(t.size(order[i]));
    inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  }
  return mp::empty(sizes, {.dtype = dt, .device = t.device()}).permute(inverse);
}

void convert_dtype_into(const Tensor& dst, const Tensor& src, bool accumulate) {
  MP_ASSERT(same_dense_layout(dst, src) && dst.device() == src.device() && dst.device().is_cuda(),
            "convert_dtype_into: expected CUDA tensors of one shape and dense layout, got ", dst.describe(), " and ",
            src.describe());
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (!accumulate && dst.dtype() == src.dtype()) {
    if (dst.raw_data() != src.raw_data())
      MP_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), static_cast<size_t>(n) * dst.element_size(),
                                    cudaMemcpyDeviceToDevice, stream_of(dst)));
    return;
  }
  const int dev = dst.device().index;
  visit_float_type(dst.dtype(), "convert_dtype_into", [&]<class D>() {
    visit_float_type(src.dtype(), "convert_dtype_into", [&]<class S>() {
      convert_kernel<D, S><<<blocks_for(n, kDnnThreads, dev), kDnnThreads, 0, stream_of(dst)>>>(
          static_cast<D*>(dst.raw_data()), static_cast<const S*>(src.raw_data()), n, accumulate);
      MP_CUDA_CHECK_LAUNCH();
    });
  });
}

Tensor param_vector(const Tensor& t, int64_t n, DType dt, double fill, Device dev) {
  if (t.defined()) {
    MP_ASSERT(t.numel() == n && t.device() == dev, "param_vector: expected ", n, " values on ", dev.str(), ", got ",
              t.describe());
    if (t.dtype() == dt && t.is_contiguous()) return t;
    Tensor out = mp::empty({n}, {.dtype = dt, .device = dev});
    convert_dtype_into(out, t.contiguous());
    return out;
  }
  Tensor out = mp::empty({n}, {.dtype = dt, .device = dev});
  if (n == 0) return out;
  visit_float_type(dt, "param_vector", [&]<class T>() {
    fill_kernel<T><<<blocks_for(n, kDnnThreads, dev.index), kDnnThreads, 0, stream_of(out)>>>(
        static_cast<T*>(out.raw_data()), n, scalar_cast<T>(fill));
    MP_CUDA_CHECK_LAUNCH();
  });
  return out;
}

ColumnTiling column_tiling(int64_t rows, int64_t cols, int vec, int device) {
  ColumnTiling t;
  t.vec = vec;
  const int64_t cv = std::max<int64_t>(cols / vec, 1);
  while ((int64_t{1} << t.tw_shift) < cv && t.tw_shift < 5) ++t.tw_shift;
  const int64_t lanes = kDnnThreads >> t.tw_shift;
  t.tiles = (cv + (int64_t{1} << t.tw_shift) - 1) >> t.tw_shift;
  // About one full wave of blocks, but at least 16 rows per row lane of a block.
  const int64_t target = static_cast<int64_t>(device_properties(device).multiprocessors) * (2048 / kDnnThreads);
  const int64_t max_parts = std::max<int64_t>(1, rows / (16 * lanes));
  t.parts = std::clamp<int64_t>((target + t.tiles - 1) / t.tiles, 1, max_parts);
  t.chunk = (rows + t.parts - 1) / t.parts;
  return t;
}

ChannelSplit channel_split(int64_t channels, int64_t positions, int device) {
  // About one full wave of kDnnThreads-thread blocks, but at least ~4 loads per thread per block.
  const int64_t target = static_cast<int64_t>(device_properties(device).multiprocessors) * (2048 / kDnnThreads);
  const int64_t max_parts = std::max<int64_t>(1, positions / (4 * kDnnThreads));
  ChannelSplit s;
  s.parts = std::clamp<int64_t>((target + channels - 1) / std::max<int64_t>(channels, 1), 1, max_parts);
  s.chunk = (positions + s.parts - 1) / s.parts;
  return s;
}

void per_channel_sums(const Tensor& sum_dy, const Tensor& sum_dy_xmu, const Tensor& dy, const Tensor& x,
                      const Tensor& mean) {
  const bool rows = channels_last_rows(dy);
  MP_ASSERT(dy.dim() == 3 && (dy.is_contiguous() || rows),
            "per_channel_sums: expected a contiguous or channels-last dy [N, C, S], got ", dy.describe());
  const int64_t N = dy.size(0), C = dy.size(1), SP = dy.size(2);
  MP_ASSERT(sum_dy.dtype() == DType::f64 && sum_dy.numel() == C && sum_dy.is_contiguous(),
            "per_channel_sums: bad sum_dy ", sum_dy.describe());
  const bool with_x = sum_dy_xmu.defined();
  if (with_x)
    MP_ASSERT(sum_dy_xmu.dtype() == DType::f64 && sum_dy_xmu.numel() == C && x.sizes() == dy.sizes() &&
                  x.dtype() == dy.dtype() && same_dense_layout(x, dy) && mean.numel() == C && mean.is_contiguous() &&
                  mean.dtype() == (dy.dtype() == DType::f64 ? DType::f64 : DType::f32),
              "per_channel_sums: bad x/mean ", x.describe(), " ", mean.describe());
  if (C == 0) return;
  const int dev = dy.device().index;
  cudaStream_t stream = stream_of(dy);
  visit_float_type(dy.dtype(), "per_channel_sums", [&]<class T>() {
    using S = std::conditional_t<std::is_same_v<T, double>, double, float>;
    if (rows) {  // a column reduction of the [N S, C] matrix (Note [column reductions])
      const int64_t R = N * SP;
      const T* dyp = static_cast<const T*>(dy.raw_data());
      const T* xp = with_x ? static_cast<const T*>(x.raw_data()) : nullptr;
      const ColumnTiling split = column_tiling(R, C, column_vec<T>(C, dyp, xp), dev);
      Tensor partials = mp::empty({C * split.parts * 2}, {.dtype = DType::f64, .device = dy.device()});
      auto* pp = static_cast<double*>(partials.raw_data());
      launch_column_sums(split, dyp, xp, R, C,
                         GradSums<T, S>{with_x ? static_cast<const S*>(mean.raw_data()) : nullptr}, pp, dev);
      channel_sums_finalize<<<blocks_for(C * 32, kDnnThreads, dev), kDnnThreads, 0, stream>>>(
          pp, C, split.parts, static_cast<double*>(sum_dy.raw_data()),
          with_x ? static_cast<double*>(sum_dy_xmu.raw_data()) : nullptr);
      MP_CUDA_CHECK_LAUNCH();
      return;
    }
    constexpr int kVec = static_cast<int>(16 / sizeof(T));
    const bool vec = SP % kVec == 0 && is_aligned(dy.raw_data(), 16) && (!with_x || is_aligned(x.raw_data(), 16));
    const int64_t unit = vec ? kVec : 1, Sv = SP / unit, Mv = N * Sv;
    const ChannelSplit split = channel_split(C, Mv, dev);
    Tensor partials = mp::empty({C * split.parts * 2}, {.dtype = DType::f64, .device = dy.device()});
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(C * split.parts, INT32_MAX));
    const T* dyp = static_cast<const T*>(dy.raw_data());
    const T* xp = with_x ? static_cast<const T*>(x.raw_data()) : nullptr;
    const S* mp_ = with_x ? static_cast<const S*>(mean.raw_data()) : nullptr;
    auto* pp = static_cast<double*>(partials.raw_data());
    if (vec)
      channel_sums_partials<T, S, kVec><<<grid, kDnnThreads, 0, stream>>>(dyp, xp, mp_, C, Sv, Mv, split, pp);
    else
      channel_sums_partials<T, S, 1><<<grid, kDnnThreads, 0, stream>>>(dyp, xp, mp_, C, Sv, Mv, split, pp);
    MP_CUDA_CHECK_LAUNCH();
    channel_sums_finalize<<<blocks_for(C * 32, kDnnThreads, dev), kDnnThreads, 0, stream>>>(
        pp, C, split.parts, static_cast<double*>(sum_dy.raw_data()),
        with_x ? static_cast<double*>(sum_dy_xmu.raw_data()) : nullptr);
    MP_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mp::backend::cuda

#endif  // MP_HAVE_CUDNN

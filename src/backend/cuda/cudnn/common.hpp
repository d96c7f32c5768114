// cuDNN 9 for the CUDA backend (conv.cu, batch_norm.cu): the per-device handle, error checking, the
// dtype mapping, RAII descriptors, workspaces from the caching allocator, the run-time switches, and
// the small device helpers the cuDNN families share (dtype conversion of dense tensors, [C]
// parameter vectors, per-channel sums over [N, C, S] in either layout, index walkers over [N, C, S], the
// column reduction of channels-last activations).
//
// Only for CUDA sources compiled with cuDNN (MP_HAVE_CUDNN, set by CMake when cuDNN 9 was found):
// without it the CUDA backend builds without the convolution and batch-norm kernels, and those ops
// on cuda say that the CUDA backend has no kernel for them.
//
// Note [cuDNN handle]: one cudnnHandle_t per device, created on first use with that device current
// and bound to its one stream (Note [one stream per device]), so cuDNN's work is ordered with every
// other kernel and copy of the device. A handle must not be used by two threads at once: CudnnHandle
// locks the device's handle for its lifetime, which also guards the plan caches kept beside it. The
// handles are never destroyed (Note [leaked runtime state] in runtime.cu).
//
// Note [cuDNN switches]: environment variables read once per process.
//   MP_CUDNN_BENCHMARK=1      pick convolution engines by timing them on the first call of each shape,
//                             like torch.backends.cudnn.benchmark (graph path: Note [cuDNN graph
//                             convolutions]; legacy path: cudnnFind*AlgorithmEx); default 0: cuDNN's
//                             heuristics, fixed by shape.
//   MP_CUDNN_DETERMINISTIC=0  allow algorithms that cuDNN reports as non-deterministic (atomics);
//                             default 1. See Note [cuDNN algorithm choice] in conv.cu.
//   MP_CUDNN_BATCH_NORM=0     run batch norm on mixprec's own kernels only (for comparisons and
//                             debugging); default 1. See Note [batch norm on cuDNN] in batch_norm.cu.
//   MP_CUDNN_LOG=1            print to stderr, once per convolution problem, the algorithm, math type,
//                             workspace and layout cuDNN's plan starts with, or that an NHWC problem
//                             falls back to NCHW (Note [conv layout counters] in runtime.hpp).
//   MP_CUDNN_GRAPH=0          run convolutions through cuDNN's legacy calls; default 1: the graph API with
//                             cached execution plans (Note [cuDNN graph convolutions] in cudnn/conv_graph.cu).
#pragma once
#if defined(MP_HAVE_CUDNN)
#if !defined(__CUDACC__)
#error "cudnn/common.hpp is for CUDA sources (.cu) only"
#endif
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <string>

#include "backend/cuda/loops.cuh"
#include "backend/cuda/runtime.hpp"
#include "mp/core/dtype.hpp"
#include "mp/core/macros.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::backend::cuda {

// ================================================================ errors

/// Throw the mp::Error of a failed cuDNN call: names the call, the status (cudnnGetErrorString and
/// cuDNN's own last-error text), `context` (the problem, e.g. shapes; may be empty) and a remedy.
[[noreturn]] void throw_cudnn_error(cudnnStatus_t status, const char* call, const std::string& context,
                                    const char* file, int line);

/// Whether a status says "not supported" (a different algorithm or path may work).
constexpr bool cudnn_not_supported(cudnnStatus_t s) { return static_cast<int>(s) / 1000 == 3; }

}  // namespace mp::backend::cuda

/// Check a cuDNN call; on failure throw mp::Error naming the call, the status and a remedy.
#define MP_CUDNN_CHECK(call) MP_CUDNN_CHECK_CTX(call, std::string())

/// MP_CUDNN_CHECK with a description of the problem (a std::string expression, evaluated on failure only).
/// In sync-check mode (Note [sync check]) it then waits for the device and names the call when its work faulted.
#define MP_CUDNN_CHECK_CTX(call, context)                                                             \
  do {                                                                                                \
    const cudnnStatus_t mp_cudnn_status_ = (call);                                                    \
    if (mp_cudnn_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                        \
      ::mp::backend::cuda::throw_cudnn_error(mp_cudnn_status_, #call, (context), __FILE__, __LINE__); \
    if (::mp::backend::cuda::sync_check_enabled()) [[unlikely]]                                       \
      ::mp::backend::cuda::sync_check(#call, __FILE__, __LINE__, __func__);                           \
  } while (0)

namespace mp::backend::cuda {

// ================================================================ handle and switches

/// The cuDNN handle of one device, locked for the lifetime of this object (Note [cuDNN handle]).
/// Created on first use; bound to current_stream(device). Throws when cuDNN cannot be initialised.
class CudnnHandle {
 public:
  /// Lock (and on first use create) the handle of cuda:device.
  explicit CudnnHandle(int device);
  /// The handle (valid while this object lives).
  cudnnHandle_t get() const { return handle_; }
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;

 private:
  std::unique_lock<std::mutex> lock_;
  cudnnHandle_t handle_ = nullptr;
};

/// The run-time switches of Note [cuDNN switches] (read once; thread-safe).
struct CudnnOptions {
  bool benchmark = false;     ///< MP_CUDNN_BENCHMARK: time the algorithms on first use of a shape
  bool deterministic = true;  ///< MP_CUDNN_DETERMINISTIC: only algorithms cuDNN reports deterministic
  bool batch_norm = true;     ///< MP_CUDNN_BATCH_NORM: allow cuDNN's batch norm
  bool log = false;           ///< MP_CUDNN_LOG: print each convolution problem's chosen algorithm and layout
  bool graph = true;          ///< MP_CUDNN_GRAPH: convolutions through the graph API (Note [cuDNN graph convolutions])
};

/// The process's cuDNN switches.
const CudnnOptions& cudnn_options();

/// cuDNN data type of f32, f64, f16 or bf16; throws mp::Error naming `op` for any other dtype.
cudnnDataType_t cudnn_dtype(DType dt, const char* op);

/// A workspace of `bytes` bytes on dev from the caching allocator (an undefined Tensor for 0); its
/// memory returns to the cache when the Tensor dies, ordered by the device's one stream.
Tensor cudnn_workspace(size_t bytes, Device dev);

/// Pointer to the value 1 or 0 in the scaling type cuDNN expects for `compute` (double for
/// CUDNN_DATA_DOUBLE, float otherwise): the alpha/beta arguments.
const void* cudnn_scale(cudnnDataType_t compute, double value);

/// Whether every value fits cuDNN's legacy API (int).
inline bool fits_int(int64_t v) { return v >= 0 && v <= INT32_MAX; }

// ================================================================ descriptors (RAII)

/// cudnnTensorDescriptor_t.
class CudnnTensorDescriptor {
 public:
  CudnnTensorDescriptor();
  ~CudnnTensorDescriptor();
  CudnnTensorDescriptor(const CudnnTensorDescriptor&) = delete;
  CudnnTensorDescriptor& operator=(const CudnnTensorDescriptor&) = delete;
  /// A contiguous NCHW tensor [n, c, h, w] (described with its strides; every value < 2^31).
  void set_nchw(cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w);
  /// A dense channels-last tensor [n, c, h, w] (NHWC in memory; described with its strides).
  void set_nhwc(cudnnDataType_t dt, int64_t n, int64_t c, int64_t h, int64_t w);
  /// The raw descriptor.
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

/// cudnnFilterDescriptor_t.
class CudnnFilterDescriptor {
 public:
  CudnnFilterDescriptor();
  ~CudnnFilterDescriptor();
  CudnnFilterDescriptor(const CudnnFilterDescriptor&) = delete;
  CudnnFilterDescriptor& operator=(const CudnnFilterDescriptor&) = delete;
  /// A contiguous OIHW filter [o, i, kh, kw] (i = input channels per group).
  void set_oihw(cudnnDataType_t dt, int64_t o, int64_t i, int64_t kh, int64_t kw);
  /// A channels-last filter [o, i, kh, kw] (OHWI = cuDNN's KRSC in memory: CUDNN_TENSOR_NHWC).
  void set_ohwi(cudnnDataType_t dt, int64_t o, int64_t i, int64_t kh, int64_t kw);
  /// The raw descriptor.
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

/// cudnnConvolutionDescriptor_t.
class CudnnConvolutionDescriptor {
 public:
  CudnnConvolutionDescriptor();
  ~CudnnConvolutionDescriptor();
  CudnnConvolutionDescriptor(const CudnnConvolutionDescriptor&) = delete;
  CudnnConvolutionDescriptor& operator=(const CudnnConvolutionDescriptor&) = delete;
  /// 2-D cross-correlation (PyTorch's conv2d) with the given padding, strides, dilations and groups,
  /// accumulating in `compute` (CUDNN_DATA_FLOAT for f32/f16/bf16, CUDNN_DATA_DOUBLE for f64).
  void set_2d(int64_t pad_h, int64_t pad_w, int64_t stride_h, int64_t stride_w, int64_t dil_h, int64_t dil_w,
              int64_t groups, cudnnDataType_t compute);
  /// cudnnSetConvolutionMathType.
  void set_math(cudnnMathType_t math);
  /// The raw descriptor.
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

// ================================================================ shared tensor helpers

/// t itself when it is dense in memory format f (contiguous, or channels-last for a 4-D t) and its data
/// 16-byte aligned (what cuDNN's vectorised kernels need), else a fresh copy in f (which the caching
/// allocator aligns to 512 bytes).
Tensor cudnn_dense(const Tensor& t, MemoryFormat f = MemoryFormat::contiguous);

/// A fresh tensor of t's shape and dense layout (same_dense_layout in loops.cuh) in dtype dt on t's device.
Tensor empty_like_layout(const Tensor& t, DType dt);

/// dst = src (or dst += src when accumulate) element by element, converting the dtype (f32, f64, f16,
/// bf16; 16-bit results rounded to nearest even as on the CPU). Both of one shape and one dense layout
/// (same_dense_layout), on one CUDA device; runs on its stream.
void convert_dtype_into(const Tensor& dst, const Tensor& src, bool accumulate = false);

/// A contiguous [n] vector of dtype dt on dev: t converted (t itself when it already is one), or
/// `fill` everywhere when t is undefined. For the weight/bias/statistics vectors of the norms.
Tensor param_vector(const Tensor& t, int64_t n, DType dt, double fill, Device dev);

/// Per-channel sums over an [N, C, S] tensor dy (f32, f64, f16 or bf16), contiguous or channels-last
/// (strides {S C, 1, C}: a row-major [N S, C] matrix, reduced by columns), in double:
/// sum_dy[c] = sum of dy[:, c, :]; when sum_dy_xmu is defined also
/// sum_dy_xmu[c] = sum of dy[:, c, :] * (x[:, c, :] - mean[c]) with x like dy (same dtype and layout) and
/// mean [C] (f32, or f64 for f64 data). Each product is formed in the statistics type (f32 for 16-bit and
/// f32 data, as the CPU does); partial sums add in f32 over short runs and in double beyond, in a fixed
/// order (deterministic). Outputs: contiguous f64 [C] tensors on dy's device.
void per_channel_sums(const Tensor& sum_dy, const Tensor& sum_dy_xmu, const Tensor& dy, const Tensor& x,
                      const Tensor& mean);

/// Whether an [N, C, S] operand of the norms is channels-last (strides {S C, 1, C}, the layout the CPU's
/// batch norm detects the same way): S > 1, C > 1 and unit stride over C.
inline bool channels_last_rows(const Tensor& t) {
  return t.dim() == 3 && t.size(1) > 1 && t.size(2) > 1 && t.stride(1) == 1 && t.stride(2) == t.size(1) &&
         t.stride(0) == t.size(1) * t.size(2);
}

/// Block partitioning of per-channel reductions over [N, C, S] (in units of `vec` elements): each of
/// the C * parts blocks reduces `chunk` consecutive positions j = n S + s of one channel.
struct ChannelSplit {
  int64_t parts = 1;  ///< blocks per channel
  int64_t chunk = 0;  ///< positions per block (the last block of a channel may have fewer)
};

/// The split used for channels of `positions` positions each on cuda:device: enough blocks to fill
/// the device (a function of the shape and the device's multiprocessor count only, so the
/// reduction order, and the result, is the same on every run).
ChannelSplit channel_split(int64_t channels, int64_t positions, int device);

/// Threads per block of the cuDNN families' own kernels.
inline constexpr int kDnnThreads = 256;

// Note [column reductions]
// Channels-last activations are a row-major [R, C] matrix (R = N H W), so a per-channel reduction is a
// reduction down the columns. Each thread owns VEC adjacent columns (one 16-byte vector of T when C and the
// pointers allow it, else 1) and keeps their constants in registers; a block is a tile of tw vector columns
// (the vector columns rounded up to a power of two, at most 32) times kDnnThreads / tw row lanes, and takes a
// run of `chunk` rows, lane l every lanes-th row from l: a warp reads whole row segments (coalesced 16-byte
// loads). Per element the accumulator forms two values (u, v) in the statistics type; a thread adds them in
// that type over kColumnFlush rows and in double beyond; the lanes of a block add in a fixed tree through
// shared memory, and a finalising kernel adds a column's parts in part order. Sums only, no divisions: the
// batch statistics use sums shifted by a value of the column itself (ShiftedMoments in batch_norm.cu), robust
// when |mean| >> std like the CPU's shifted sums. The split depends only on the shape and the device's
// multiprocessor count: the order of every addition, and so the result, is the same on every run.
// (The first version, one column per thread and 2-byte loads, Welford updates with a division per element,
// and the parts merged one after the other by one thread per channel, ran the ResNet-18 batch norms at
// 190-390 GB/s on an H200: bench/RESULTS.md.)
inline constexpr int kColumnFlush = 64;

/// The launch shape of a column reduction over [rows, cols] (Note [column reductions]).
struct ColumnTiling {
  int vec = 1;        ///< columns per thread
  int tw_shift = 0;   ///< log2 of the tile width in vectors
  int64_t tiles = 1;  ///< column tiles
  int64_t parts = 1;  ///< row parts per tile (blocks per tile)
  int64_t chunk = 0;  ///< rows per part (the last part may have fewer)
  unsigned grid() const { return static_cast<unsigned>(std::min<int64_t>(tiles * parts, INT32_MAX)); }
};

/// The tiling for a [rows, cols] column reduction with `vec` columns per thread (vec divides cols) on
/// cuda:device: a function of the shape and the device's multiprocessor count only.
ColumnTiling column_tiling(int64_t rows, int64_t cols, int vec, int device);

// ================================================================ device-side walkers

/// A grid-stride loop over the elements (or vectors of `v` elements, with S counted in vectors) of
/// a contiguous [N, C, S] tensor that tracks each index's channel without a division per step:
/// the stride is split once as step = q S + ds, q = q' C + dc, and each step adds the pieces.
struct NcsIndexWalk {
  int64_t s, c;          ///< position in the row and channel of the current index
  int64_t S, C, ds, dc;  ///< row length, channel count, step % S, (step / S) % C
  /// Start at linear index i; the loop adds `step` per iteration.
  __device__ NcsIndexWalk(int64_t i, int64_t step, int64_t S_, int64_t C_) : S(S_), C(C_) {
    const int64_t r = i / S_;
    s = i - r * S_;
    c = r % C_;
    const int64_t q = step / S_;
    ds = step - q * S_;
    dc = q % C_;
  }
  /// Advance by `step`: the row advances by q or q + 1 (when s wraps), so the channel by dc + carry.
  __device__ MP_FORCE_INLINE void next() {
    s += ds;
    int64_t carry = 0;
    if (s >= S) {
      s -= S;
      carry = 1;
    }
    c += dc + carry;  // < 2 C: one subtraction reduces it
    if (c >= C) c -= C;
  }
};

/// The channel of element k of the current vector of an element-wise pass over [N, C, S] in units of VEC
/// elements: NCHW walks NcsIndexWalk(i, step, S / VEC, C), one channel per vector (it.c); channels-last
/// rows ([N S, C] row-major, C % VEC == 0) walk NcsIndexWalk(i, step, 1, C / VEC), where it.c is the
/// vector's place in its row and element k has channel it.c VEC + k.
template <bool ROWS, int VEC>
__device__ MP_FORCE_INLINE int64_t channel_of(const NcsIndexWalk& it, int k) {
  return ROWS ? it.c * VEC + k : it.c;
}

/// Vector width (in elements) usable for [N, C, S] operands along a dim of S elements: 16 bytes of T when S allows it
/// and every pointer is aligned, else 1.
template <class T>
int vec_width_for(int64_t S, std::initializer_list<const void*> ptrs) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  if (S % kVec != 0) return 1;
  for (const void* p : ptrs)
    if (p != nullptr && !is_aligned(p, 16)) return 1;
  return kVec;
}

/// The launch shape of an element-wise pass over [N, C, S] operands (all in x's layout): the vector width,
/// the walk dims (Sv, Cv; see channel_of) and the number of vectors. Vectors run along S for NCHW and
/// along C for channels-last rows.
struct ElementwiseShape {
  int vec = 1;
  int64_t Sv = 0, Cv = 0, total = 0;
};

/// The shape for x ([N, C, S]; rows: channels-last) with the operands' pointers ptrs.
template <class T>
ElementwiseShape elementwise_shape(const Tensor& x, bool rows, std::initializer_list<const void*> ptrs) {
  const int64_t C = x.size(1), SP = x.size(2);
  ElementwiseShape e;
  e.vec = vec_width_for<T>(rows ? C : SP, ptrs);
  e.Sv = rows ? 1 : SP / e.vec;
  e.Cv = rows ? C / e.vec : C;
  e.total = x.numel() / e.vec;  // vec divides C (rows) or S (NCHW)
  return e;
}

/// Calls launch.template operator()<VEC, ROWS>() for the shape's vector width (16 bytes of T or 1) and layout.
template <class T, class Launch>
void launch_elementwise(const ElementwiseShape& e, bool rows, Launch&& launch) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  if (e.vec == kVec) {
    if (rows)
      launch.template operator()<kVec, true>();
    else
      launch.template operator()<kVec, false>();
  } else {
    if (rows)
      launch.template operator()<1, true>();
    else
      launch.template operator()<1, false>();
  }
  MP_CUDA_CHECK_LAUNCH();
}

/// Walks the positions j = n S + s of one channel c of a contiguous [N, C, S] tensor (units as in
/// NcsIndexWalk) in steps of `step`, tracking the element offset (n C + c) S + s without divisions.
struct NcsChannelWalk {
  int64_t off, s;             ///< element offset and position in the row of the current j
  int64_t S, ds, jump, wrap;  ///< row length, step % S, offset change, extra offset on wrap
  /// Start at position j of channel c; the loop adds `step` to j per iteration.
  __device__ NcsChannelWalk(int64_t j, int64_t step, int64_t c, int64_t S_, int64_t C) : S(S_) {
    const int64_t n = j / S_;
    s = j - n * S_;
    off = (n * C + c) * S_ + s;
    const int64_t q = step / S_;
    ds = step - q * S_;
    jump = q * C * S_ + ds;
    wrap = C * S_ - S_;
  }
  /// Advance by `step` positions: n grows by q (+1 when s wraps), s by ds (-S when it wraps).
  __device__ MP_FORCE_INLINE void next() {
    s += ds;
    off += jump;
    if (s >= S) {
      s -= S;
      off += wrap;
    }
  }
};

/// K doubles reduced across a block with a combine function (deterministic tree order).
template <int K>
struct DoubleTuple {
  double v[K];
};

/// Combine every thread's value with `combine(a, b)` (associative in the tree order it is applied in)
/// across a block of blockDim.x threads (a multiple of 32, <= 1024); thread 0 gets the result.
/// `identity` fills the missing warps. Every thread of the block must call it (it synchronises).
template <int K, class F>
__device__ DoubleTuple<K> block_combine(DoubleTuple<K> a, DoubleTuple<K> identity, F combine) {
  __shared__ DoubleTuple<K> warp_vals[32];
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    DoubleTuple<K> b;
#pragma unroll
    for (int k = 0; k < K; ++k) b.v[k] = __shfl_down_sync(0xffffffffu, a.v[k], o);
    a = combine(a, b);  // lanes >= 32 - o combine garbage that lane 0's result never reads
  }
  if (lane == 0) warp_vals[warp] = a;
  __syncthreads();
  if (warp == 0) {
    a = lane < (blockDim.x >> 5) ? warp_vals[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) {
      DoubleTuple<K> b;
#pragma unroll
      for (int k = 0; k < K; ++k) b.v[k] = __shfl_down_sync(0xffffffffu, a.v[k], o);
      a = combine(a, b);
    }
  }
  __syncthreads();  // warp_vals may be reused by the next call
  return a;
}

/// The VEC elements at offset off of a and of b (T{} when b is null).
template <int VEC, class T>
__device__ MP_FORCE_INLINE void load_rows(const T* a, const T* b, int64_t off, T (&va)[VEC], T (&vb)[VEC]) {
  load_vec<VEC>(a + off, va);
  if (b != nullptr) {
    load_vec<VEC>(b + off, vb);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) vb[j] = T{};
  }
}

/// Per-(column, part) sums of a column reduction over the row-major [R, C] matrices a and b (b may be null),
/// Note [column reductions]; launch with kDnnThreads threads and t.grid() blocks. The accumulator F supplies
/// `using Stat` (the statistics type), `Stat constant(int64_t c)` (a per-column constant, read once per
/// thread) and `void add(Stat& u, Stat& v, T a, T b, Stat k)` (adds one element's two values; b is T{} when
/// the matrix b is null). partials: [C * t.parts][2] doubles, (sum u, sum v) of column c's part p at c * parts
/// + p, the layout the [N, C, S] kernels use.
template <int VEC, class T, class F>
__global__ void __launch_bounds__(kDnnThreads)
    column_sums(const T* a, const T* b, int64_t R, int64_t C, ColumnTiling t, F f, double* partials) {
  using S = typename F::Stat;
  __shared__ double buf[2 * VEC][kDnnThreads];  // [value][thread]: consecutive threads, consecutive banks
  const int tw = 1 << t.tw_shift, lanes = kDnnThreads >> t.tw_shift;
  const int tx = static_cast<int>(threadIdx.x) & (tw - 1), ty = static_cast<int>(threadIdx.x) >> t.tw_shift;
  const int64_t Cv = C / VEC, blocks = t.tiles * t.parts;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int64_t tile = blk / t.parts, p = blk - tile * t.parts;
    const int64_t cv = tile * tw + tx;
    const int64_t r0 = p * t.chunk, r1 = r0 + t.chunk < R ? r0 + t.chunk : R;
    double du[VEC], dv[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) du[j] = dv[j] = 0.0;
    if (cv < Cv) {
      S k[VEC], su[VEC], sv[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        k[j] = f.constant(cv * VEC + j);
        su[j] = sv[j] = S(0);
      }
      int run = 0;
      // Two rows per iteration, both loaded before either is added (twice the loads in flight).
      for (int64_t r = r0 + ty; r < r1; r += 2 * lanes) {
        const bool two = r + lanes < r1;
        T va[2][VEC], vb[2][VEC];
        load_rows<VEC>(a, b, r * C + cv * VEC, va[0], vb[0]);
        if (two) load_rows<VEC>(a, b, (r + lanes) * C + cv * VEC, va[1], vb[1]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) f.add(su[j], sv[j], va[0][j], vb[0][j], k[j]);
        if (two) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) f.add(su[j], sv[j], va[1][j], vb[1][j], k[j]);
        }
        if ((run += 2) >= kColumnFlush) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            du[j] += static_cast<double>(su[j]);
            dv[j] += static_cast<double>(sv[j]);
            su[j] = sv[j] = S(0);
          }
          run = 0;
        }
      }
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        du[j] += static_cast<double>(su[j]);
        dv[j] += static_cast<double>(sv[j]);
      }
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      buf[j][threadIdx.x] = du[j];
      buf[VEC + j][threadIdx.x] = dv[j];
    }
    __syncthreads();
    for (int s = lanes >> 1; s > 0; s >>= 1) {  // lanes [0, s) add lanes [s, 2 s): a fixed tree
      if (ty < s) {
#pragma unroll
        for (int q = 0; q < 2 * VEC; ++q) buf[q][threadIdx.x] += buf[q][threadIdx.x + s * tw];
      }
      __syncthreads();
    }
    if (ty == 0 && cv < Cv) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int64_t c = cv * VEC + j;
        partials[2 * (c * t.parts + p)] = buf[j][tx];
        partials[2 * (c * t.parts + p) + 1] = buf[VEC + j][tx];
      }
    }
    __syncthreads();  // buf is rewritten by the next tile
  }
}

/// The two sums of column (or channel) c over its `parts` partials ([C * parts][2] doubles), for a whole warp:
/// lane l adds parts l, l + 32, ... in order, then a fixed shuffle tree (deterministic); lane 0 gets the
/// totals. Every lane of the warp must call it with the same c.
__device__ MP_FORCE_INLINE void warp_part_sums(const double* partials, int64_t c, int64_t parts, double& a, double& b) {
  a = b = 0.0;
  for (int64_t p = threadIdx.x & 31u; p < parts; p += 32) {
    a += partials[2 * (c * parts + p)];
    b += partials[2 * (c * parts + p) + 1];
  }
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
}

/// Columns per thread of a column reduction over [R, C] matrices of T at a and b (b may be null): one 16-byte
/// vector where C and the pointers allow it, else 1.
template <class T>
int column_vec(int64_t C, const void* a, const void* b) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  return C % kVec == 0 && is_aligned(a, 16) && (b == nullptr || is_aligned(b, 16)) ? kVec : 1;
}

/// Launches column_sums with tiling t (from column_tiling with column_vec<T>) on cuda:device's stream.
template <class T, class F>
void launch_column_sums(const ColumnTiling& t, const T* a, const T* b, int64_t R, int64_t C, const F& f,
                        double* partials, int device) {
  constexpr int kVec = static_cast<int>(16 / sizeof(T));
  cudaStream_t stream = current_stream(device);
  if (t.vec == kVec)
    column_sums<kVec, T, F><<<t.grid(), kDnnThreads, 0, stream>>>(a, b, R, C, t, f, partials);
  else
    column_sums<1, T, F><<<t.grid(), kDnnThreads, 0, stream>>>(a, b, R, C, t, f, partials);
  MP_CUDA_CHECK_LAUNCH();
}

}  // namespace mp::backend::cuda

#endif  // MP_HAVE_CUDNN

// CUDA kernel of every element-wise op and of casts (the pointwise slot, pointwise_kernels.hpp):
// the shared MP_HD functors of pointwise.hpp on two paths.
//
// Note [CUDA element-wise paths]
//  * Contiguous: the output and every input dense in one layout (contiguous, or all channels-last:
//    same_dense_layout, so a flat loop pairs the elements), the inputs of one dtype TI, the output TI
//    (or b8 for comparisons, or any dtype for a copy, i.e. a cast), the compute type the natural one
//    for those dtypes, and every pointer aligned to its vector: a grid-stride loop in which each
//    thread loads vec_width<TI, TO>() elements per operand (16 bytes of the wider type), converts to the
//    compute type, applies the functor and stores one vector; the last n % VEC elements go one per
//    thread. Instantiated per (op, TI) for TI in {f32, 16-bit, i64} (f16 and bf16 share one kernel
//    that converts per a flag) and per cast pair; f64 and the narrow integers take it for copies only.
//  * Strided (everything else: broadcast inputs with stride 0, mixed input dtypes, strided outputs,
//    unaligned views, an unusual compute type): one element per thread of a grid-stride loop; byte
//    offsets from an OffsetCalc (coalesced dims, 32-bit magic division) and loads/stores through a
//    switch on the run-time dtype (uniform across the warp), so it is instantiated per (op, compute
//    type) only.
// Both convert exactly like the CPU (Note [CUDA 16-bit conversions] in loops.cuh). nvcc contracts
// a * b + c into an FMA (--fmad=true, the default), so ops such as add_scaled may differ from the CPU
// in the last bit of f32/f64 results.
#include <type_traits>
#include <utility>

#include "backend/cuda/loops.cuh"
#include "backend/pointwise_kernels.hpp"

namespace mp::backend::cuda {
namespace {

template <int N>
using Arity = PointwiseArity<N>;

// float, Half or BFloat16: computes in float.
template <class T>
inline constexpr bool kFloatLike = std::is_same_v<T, float> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// The compute type the ops layer picks for operands of types A and B (promote, then f64 -> double,
// other floating -> float, integers and bool -> int64): the only one the contiguous path covers.
template <class A, class B>
using natural_compute_t = std::conditional_t<std::is_same_v<A, double> || std::is_same_v<B, double>, double,
                                             std::conditional_t<kFloatLike<A> || kFloatLike<B>, float, int64_t>>;

// Storage type of the contiguous path for f16 and bf16 alike: the raw 16 bits, converted per the
// kernel's bf16 flag, so the float math of an op is compiled once for both 16-bit types.
using Bits16 = uint16_t;

// A stored element as compute type C (Bits16: f16 or bf16 bits per `bf16`).
template <class C, class T>
__device__ MP_FORCE_INLINE C to_compute(T v, bool bf16) {
  if constexpr (std::is_same_v<T, Bits16>) {
    return bf16 ? mp::detail::bf16_bits_to_float(v) : half_to_float(Half::from_bits(v));
  } else {
    return device_cast<C>(v);
  }
}

// A result as stored type TO (Bits16: f16 or bf16 bits per `bf16`).
template <class TO, class R>
__device__ MP_FORCE_INLINE TO from_compute(R r, bool bf16) {
  if constexpr (std::is_same_v<TO, Bits16>) {
    return bf16 ? mp::detail::float_to_bf16_bits(r) : float_to_half(r).x;
  } else {
    return device_cast<TO>(r);
  }
}

// f(inputs converted to C) for the values a[k][j] of vector lane j.
template <class C, int NIn, class F, class TI, int V>
__device__ MP_FORCE_INLINE auto apply_lane(const F& f, const TI (&a)[NIn][V], int j, bool bf16) {
  if constexpr (NIn == 1) {
    return f(to_compute<C>(a[0][j], bf16));
  } else if constexpr (NIn == 2) {
    return f(to_compute<C>(a[0][j], bf16), to_compute<C>(a[1][j], bf16));
  } else {
    return f(to_compute<C>(a[0][j], bf16), to_compute<C>(a[1][j], bf16), to_compute<C>(a[2][j], bf16));
  }
}

template <class T, int N>
struct Ptrs {
  const T* p[N];
};

// Contiguous path (Note [CUDA element-wise paths]): n elements, V per thread per iteration.
template <int NIn, int V, class TI, class TO, class C, class F>
__global__ void __launch_bounds__(kThreads) contiguous_kernel(TO* out, Ptrs<TI, NIn> in, int64_t n, F f, bool bf16) {
  const int64_t nvec = n / V;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = tid; i < nvec; i += step) {
    TI a[NIn][V];
#pragma unroll
    for (int k = 0; k < NIn; ++k) load_vec<V>(in.p[k] + i * V, a[k]);
    TO o[V];
#pragma unroll
    for (int j = 0; j < V; ++j) o[j] = from_compute<TO>(apply_lane<C>(f, a, j, bf16), bf16);
    store_vec<V>(out + i * V, o);
  }
  const int64_t e = nvec * V + tid;  // the tail: fewer than V elements
  if (e < n) {
    TI a[NIn][1];
#pragma unroll
    for (int k = 0; k < NIn; ++k) a[k][0] = in.p[k][e];
    out[e] = from_compute<TO>(apply_lane<C>(f, a, 0, bf16), bf16);
  }
}

template <int N>
struct Operands {
  char* p[N];  // operand 0 is the output
  DType dt[N];
};

// Strided path (Note [CUDA element-wise paths]): byte offsets from calc.
template <int NIn, class C, class F>
__global__ void __launch_bounds__(kThreads) strided_kernel(Operands<NIn + 1> ops, OffsetCalc<NIn + 1> calc, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < calc.numel; i += step) {
    int64_t off[NIn + 1];
    calc.get(i, off);
    C a[NIn][1];
#pragma unroll
    for (int k = 0; k < NIn; ++k) a[k][0] = load_as<C>(ops.p[k + 1] + off[k + 1], ops.dt[k + 1]);
    store_as(ops.p[0] + off[0], ops.dt[0], apply_lane<C>(f, a, 0, false));
  }
}

template <class C, int NIn, class F>
void launch_strided(const Tensor& out, std::span<const Tensor> ins, const F& f) {
  constexpr int N = NIn + 1;
  Operands<N> ops{};
  std::array<Shape, N> bstrides;  // byte strides
  const Tensor* ts[N];
  ts[0] = &out;
  for (int k = 0; k < NIn; ++k) ts[k + 1] = &ins[static_cast<size_t>(k)];
  std::array<std::span<const int64_t>, N> spans;
  for (int k = 0; k < N; ++k) {
    ops.p[k] = static_cast<char*>(ts[k]->raw_data());
    ops.dt[k] = ts[k]->dtype();
    const auto es = static_cast<int64_t>(ts[k]->element_size());
    for (int64_t s : ts[k]->strides()) bstrides[static_cast<size_t>(k)].push_back(s * es);
    spans[static_cast<size_t>(k)] = bstrides[static_cast<size_t>(k)];
  }
  const OffsetCalc<N> calc = make_offset_calc<N>(out.sizes(), spans);
  const int dev = out.device().index;
  strided_kernel<NIn, C><<<blocks_for(calc.numel, kThreads, dev), kThreads, 0, current_stream(dev)>>>(ops, calc, f);
  MP_CUDA_CHECK_LAUNCH();
}

template <int NIn, class TI, class TO, class C, class F>
bool launch_contiguous(const Tensor& out, std::span<const Tensor> ins, const F& f, bool bf16 = false) {
  constexpr int V = vec_width<TI, TO>();
  Ptrs<TI, NIn> in{};
  for (int k = 0; k < NIn; ++k) {
    in.p[k] = static_cast<const TI*>(ins[static_cast<size_t>(k)].raw_data());
    if (!is_aligned(in.p[k], V * sizeof(TI))) return false;
  }
  auto* o = static_cast<TO*>(out.raw_data());
  if (!is_aligned(o, V * sizeof(TO))) return false;
  const int64_t n = out.numel();
  const int dev = out.device().index;
  contiguous_kernel<NIn, V, TI, TO, C>
      <<<blocks_for(std::max<int64_t>(n / V, 1), kThreads, dev), kThreads, 0, current_stream(dev)>>>(o, in, n, f, bf16);
  MP_CUDA_CHECK_LAUNCH();
  return true;
}

// The contiguous path when it applies (Note [CUDA element-wise paths]); false otherwise. Same-dtype
// ops get it for f32, f16/bf16 (one Bits16 kernel) and i64; f64 and the other integer types only
// for copies (they are not performance targets and their kernels are the costliest to compile).
template <class C, int NIn, class F>
bool try_contiguous(const Tensor& out, std::span<const Tensor> ins, const F& f) {
  // Every operand in the output's dense layout (contiguous, or e.g. all channels-last): a flat loop.
  if (!same_dense_layout(out, out)) return false;
  const DType ti = ins[0].dtype();
  for (const Tensor& t : ins)
    if (!same_dense_layout(t, out) || t.dtype() != ti) return false;
  using R = decltype([]<size_t... I>(std::index_sequence<I...>) {
    return F{}((static_cast<void>(I), C{})...);
  }(std::make_index_sequence<NIn>{}));
  constexpr bool kComparison = std::is_same_v<R, bool>;
  constexpr bool kCopy = std::is_same_v<F, CopyFn<C>>;
  // Same dtype in and out (or b8 out for comparisons), storage type TI.
  auto same = [&]<class TI>(bool bf16) -> bool {
    if constexpr (kComparison) {
      if (out.dtype() == DType::b8) return launch_contiguous<NIn, TI, bool, C>(out, ins, f, bf16);
    } else {
      if (out.dtype() == ti) return launch_contiguous<NIn, TI, TI, C>(out, ins, f, bf16);
    }
    return false;
  };
  // A same-dtype kernel that does not apply (another output dtype: a cast) falls through to the cast kernels.
  // (Returning its `false` sent every f32 <-> 16-bit cast to the strided path: half the copy rate on an H200.)
  if constexpr (std::is_same_v<C, float>) {
    if (ti == DType::f32 && same.template operator()<float>(false)) return true;
    if ((ti == DType::f16 || ti == DType::bf16) && same.template operator()<Bits16>(ti == DType::bf16)) return true;
  } else if constexpr (std::is_same_v<C, int64_t>) {
    if (ti == DType::i64 && same.template operator()<int64_t>(false)) return true;
  }
  if constexpr (kCopy) {
    return visit_dtype_nothrow(ti, [&]<class TI>() -> bool {
      return visit_dtype_nothrow(out.dtype(), [&]<class TO>() -> bool {
        constexpr bool kDone = std::is_same_v<TI, TO> && (kFloatLike<TI> || std::is_same_v<TI, int64_t>);
        if constexpr (!kDone && std::is_same_v<natural_compute_t<TI, TO>, C>) {
          return launch_contiguous<1, TI, TO, C>(out, ins, f);
        } else {
          return false;
        }
      });
    });
  } else {
    return false;
  }
}

template <class C>
void run_pointwise(PointwiseOp op, const Tensor& out, std::span<const Tensor> ins, const PointwiseParams& p) {
  visit_pointwise_functor<C>(op, p, [&]<int NIn, class F>(Arity<NIn>, const F& f) {
    if (!try_contiguous<C, NIn>(out, ins, f)) launch_strided<C, NIn>(out, ins, f);
  });
}

void pointwise_cuda(PointwiseOp op, const Tensor& out, std::span<const Tensor> ins, DType compute,
                    const PointwiseParams& p) {
  MP_ASSERT(static_cast<int>(ins.size()) == pointwise_arity(op), "wrong operand count");
  DeviceGuard guard(out.device(), pointwise_op_name(op));
  for (const Tensor& t : ins)
    MP_CHECK(t.device() == out.device() && t.sizes() == out.sizes(), pointwise_op_name(op), ": expected inputs on ",
             out.device().str(), " with the output's shape ", shape_str(out.sizes()), ", got ", t.describe());
  if (out.numel() == 0) return;
  switch (compute) {
    case DType::f64: return run_pointwise<double>(op, out, ins, p);
    case DType::f32:
    case DType::f16:
    case DType::bf16: return run_pointwise<float>(op, out, ins, p);
    default: return run_pointwise<int64_t>(op, out, ins, p);
  }
}

}  // namespace

MP_REGISTER_KERNEL(pointwise_kernel, DeviceType::cuda, &pointwise_cuda);

}  // namespace mp::backend::cuda

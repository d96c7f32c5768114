// CUDA softmax family (the slots of softmax_kernels.hpp): softmax / log-softmax forward and backward and
// the fused class losses (cross entropy on logits, NLL on log-probabilities), forward and backward.
// The formulas are the shared MP_HD ones (SoftmaxGradFn, LogSoftmaxGradFn, class_loss_value,
// class_loss_grad; math_exp/math_log are CUDA's expf/logf for float, exp/log for double); compute is f32
// for f32/f16/bf16 data and f64 for f64, loads convert exactly and stores round once, as on the CPU.
//
// Two loop shapes, as on the CPU (cpu/softmax.cpp):
//  * rows (inner == 1): a warp per row when n <= kWarpRowMax, else a block of kBlockRowThreads per row.
//    Each thread walks its share of the row with 16-byte vector loads (after a scalar head that brings
//    the row to a 16-byte boundary, when every operand row has the same misalignment), the row's partials
//    are combined by a butterfly (and, for blocks, through shared memory), and lane 0's result is
//    broadcast so every thread uses the same bits.
//  * columns (inner > 1): a thread per (outer, inner) column walks the dim with stride inner; consecutive
//    threads take consecutive columns, so every access is coalesced.
//
// Note [CUDA online softmax]: the forward reads the row twice, not three times: one pass keeps a running
// max m and a sum s of exp(x - m) (rescaled by exp(m_old - m_new) when the max grows), partials combine the
// same way, then the write pass. The special values come out as in the CPU's two-pass loop (max, then sum
// of exp(x - max)): a -inf value adds nothing unless every value is -inf (then s = NaN, as exp(-inf - -inf)
// on the CPU), a +inf max makes s = NaN (exp(inf - inf)), and a NaN anywhere makes s NaN.
//
// Class-loss forward needs each row's max before the shifted sums (sum of x - m for label smoothing), so
// it makes two read passes (max, then sums); an out-of-range target is found on the device (an integer
// atomicMin keeps the smallest flat position), copied back after the kernel, and thrown as the CPU's
// mp::Error (the one stream synchronisation of these kernels).
#include <cuda_runtime_api.h>

#include <climits>
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/loops.cuh"
#include "backend/cuda/rows.cuh"
#include "backend/cuda/runtime.hpp"
#include "backend/softmax_kernels.hpp"

namespace mp::backend::cuda {
namespace {

// Rows up to this long take a warp each; longer rows a block of kBlockRowThreads.
constexpr int64_t kWarpRowMax = 1024;
constexpr int kBlockRowThreads = 512;
// Threads per block of the warp-per-row kernels (rows per block: kWarpRowBlock / 32).
constexpr int kWarpRowBlock = 128;
// Threads per block of the column kernels.
constexpr int kColThreads = 256;

#define MP_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <class A>
__device__ MP_FORCE_INLINE A quiet_nan() {
  if constexpr (std::is_same_v<A, float>)
    return __int_as_float(0x7fc00000);
  else
    return __longlong_as_double(0x7ff8000000000000ll);
}

// Running max and sum of exp(x - max) (Note [CUDA online softmax]).
template <class A>
struct MaxSum {
  A m, s;
};

template <class A>
__device__ MP_FORCE_INLINE void online_add(MaxSum<A>& st, A x) {
  if (x > st.m) {
    // 1 + (x - x): 1, or NaN for x = +inf (the CPU's exp(inf - inf) in the sum).
    st.s = st.s * math_exp(st.m - x) + (A(1) + (x - x));
    st.m = x;
  } else if (!(x == st.m && x == neg_inf<A>())) {  // -inf adds exp(-inf - max) = 0 unless max stays -inf
    st.s += math_exp(x - st.m);
  }
}

template <class A>
__device__ MP_FORCE_INLINE MaxSum<A> combine_max_sum(MaxSum<A> a, MaxSum<A> b) {
  const A m = b.m > a.m ? b.m : a.m;
  const A sa = a.s == A(0) ? A(0) : a.s * math_exp(a.m - m);  // s == 0: an empty (or all -inf) partial
  const A sb = b.s == A(0) ? A(0) : b.s * math_exp(b.m - m);
  return {m, sa + sb};
}

// A row's (max, sum) of n > 0 values after all partials: every value -inf gives NaN, as the CPU.
template <class A>
__device__ MP_FORCE_INLINE MaxSum<A> finish_max_sum(MaxSum<A> st) {
  if (st.m == neg_inf<A>()) st.s = quiet_nan<A>();
  return st;
}


// ---------------------------------------------------------------- softmax forward

template <class T, int kRowThreads>
__global__ void __launch_bounds__(kRowThreads == kWarpSize ? kWarpRowBlock : kBlockRowThreads)
    softmax_rows_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t rows, int64_t n, bool log) {
  using A = acc_t<T>;
  __shared__ RowSmem smem;
  const RowSched<kRowThreads> rs;
  for (int64_t r = rs.first; r < rows; r += rs.step) {
    const T* const x[1] = {in + r * n};
    MaxSum<A> st{neg_inf<A>(), A(0)};
    row_loop<A, false>(x, nullptr, n, rs.tid, kRowThreads, [&](const A* v, int64_t) { online_add(st, v[0]); });
    st = finish_max_sum(row_allreduce<kRowThreads>(
        st, [](MaxSum<A> a, MaxSum<A> b) { return combine_max_sum(a, b); }, MaxSum<A>{neg_inf<A>(), A(0)}, smem));
    const A m = st.m;
    if (log) {
      const A ls = math_log(st.s);  // (x - m) - log s: m + log s would round at the magnitude of m
      row_loop<A, true>(x, out + r * n, n, rs.tid, kRowThreads, [&](const A* v, int64_t) { return (v[0] - m) - ls; });
    } else {
      const A inv = A(1) / st.s;
      row_loop<A, true>(x, out + r * n, n, rs.tid, kRowThreads,
                        [&](const A* v, int64_t) { return math_exp(v[0] - m) * inv; });
    }
  }
}

// Column (outer o, inner j) = thread; elements at o * n * inner + c * inner + j.
template <class T>
__global__ void softmax_cols_kernel(T* __restrict__ out, const T* __restrict__ in, int64_t cols, int64_t n,
                                    int64_t inner, bool log) {
  using A = acc_t<T>;
  MP_GRID_STRIDE(col, cols) {
    const int64_t o = col / inner, j = col - o * inner;
    const int64_t base = o * n * inner + j;
    MaxSum<A> st{neg_inf<A>(), A(0)};
    for (int64_t c = 0; c < n; ++c) online_add(st, device_cast<A>(in[base + c * inner]));
    st = finish_max_sum(st);
    if (log) {
      const A ls = math_log(st.s);
      for (int64_t c = 0; c < n; ++c)
        out[base + c * inner] = device_cast<T>((device_cast<A>(in[base + c * inner]) - st.m) - ls);
    } else {
      const A inv = A(1) / st.s;
      for (int64_t c = 0; c < n; ++c)
        out[base + c * inner] = device_cast<T>(math_exp(device_cast<A>(in[base + c * inner]) - st.m) * inv);
    }
  }
}

// ---------------------------------------------------------------- softmax backward

template <class T, int kRowThreads>
__global__ void __launch_bounds__(kRowThreads == kWarpSize ? kWarpRowBlock : kBlockRowThreads)
    softmax_backward_rows_kernel(T* __restrict__ gi, const T* __restrict__ go, const T* __restrict__ y, int64_t rows,
                                 int64_t n, bool log) {
  using A = acc_t<T>;
  __shared__ RowSmem smem;
  const RowSched<kRowThreads> rs;
  for (int64_t r = rs.first; r < rows; r += rs.step) {
    const T* const gy[2] = {go + r * n, y + r * n};
    A acc = 0;
    if (log)
      row_loop<A, false>(gy, nullptr, n, rs.tid, kRowThreads, [&](const A* v, int64_t) { acc += v[0]; });
    else
      row_loop<A, false>(gy, nullptr, n, rs.tid, kRowThreads, [&](const A* v, int64_t) { acc += v[0] * v[1]; });
    acc = row_allreduce<kRowThreads>(acc, Plus<A>{}, A(0), smem);
    if (log) {
      const LogSoftmaxGradFn<A> f;
      row_loop<A, true>(gy, gi + r * n, n, rs.tid, kRowThreads,
                        [&](const A* v, int64_t) { return f(v[0], v[1], acc); });
    } else {
      const SoftmaxGradFn<A> f;
      row_loop<A, true>(gy, gi + r * n, n, rs.tid, kRowThreads,
                        [&](const A* v, int64_t) { return f(v[0], v[1], acc); });
    }
  }
}

template <class T>
__global__ void softmax_backward_cols_kernel(T* __restrict__ gi, const T* __restrict__ go, const T* __restrict__ y,
                                             int64_t cols, int64_t n, int64_t inner, bool log) {
  using A = acc_t<T>;
  MP_GRID_STRIDE(col, cols) {
    const int64_t o = col / inner, j = col - o * inner;
    const int64_t base = o * n * inner + j;
    A acc = 0;
    for (int64_t c = 0; c < n; ++c) {
      const A g = device_cast<A>(go[base + c * inner]);
      acc += log ? g : g * device_cast<A>(y[base + c * inner]);
    }
    for (int64_t c = 0; c < n; ++c) {
      const int64_t e = base + c * inner;
      const A g = device_cast<A>(go[e]), yy = device_cast<A>(y[e]);
      gi[e] = device_cast<T>(log ? LogSoftmaxGradFn<A>{}(g, yy, acc) : SoftmaxGradFn<A>{}(g, yy, acc));
    }
  }
}

// ---------------------------------------------------------------- class loss forward

// Scalars of a class-loss launch.
template <class A>
struct LossArgs {
  int64_t rows;          // N * inner
  int64_t C;             // classes
  int64_t inner;         // 1 for the rows kernels
  int64_t ignore_index;  // rows with this target contribute 0
  A eps;                 // label smoothing
  bool log_probs;        // nll_loss: input holds log-probabilities (m = lse' = 0)
};

// A row whose target is ignore_index or out of range: loss 0, stats 0; out of range is recorded.
// Returns whether the row is valid.
template <class A>
__device__ MP_FORCE_INLINE bool check_target(int64_t t, int64_t r, const LossArgs<A>& a, unsigned long long* bad,
                                             bool report) {
  if (t == a.ignore_index) return false;
  if (t < 0 || t >= a.C) {
    if (report) atomicMin(bad, static_cast<unsigned long long>(r));
    return false;
  }
  return true;
}

template <class T, int kRowThreads>
__global__ void __launch_bounds__(kRowThreads == kWarpSize ? kWarpRowBlock : kBlockRowThreads)
    class_loss_rows_kernel(acc_t<T>* __restrict__ losses, acc_t<T>* __restrict__ stats, const T* __restrict__ input,
                           const int64_t* __restrict__ target, LossArgs<acc_t<T>> a, unsigned long long* bad) {
  using A = acc_t<T>;
  __shared__ RowSmem smem;
  const RowSched<kRowThreads> rs;
  for (int64_t r = rs.first; r < a.rows; r += rs.step) {
    const int64_t t = target[r];
    if (!check_target(t, r, a, bad, rs.tid == 0)) {
      if (rs.tid == 0) {
        losses[r] = 0;
        if (stats) stats[2 * r] = stats[2 * r + 1] = 0;
      }
      continue;
    }
    const T* const x[1] = {input + r * a.C};
    // Shifted by the row max m (0 for log-probabilities): Note [class loss with label smoothing].
    A m = 0, l = 0;
    if (!a.log_probs) {
      A mx = neg_inf<A>();
      row_loop<A, false>(x, nullptr, a.C, rs.tid, kRowThreads,
                         [&](const A* v, int64_t) { mx = v[0] > mx ? v[0] : mx; });
      m = row_allreduce<kRowThreads>(mx, Max<A>{}, neg_inf<A>(), smem);
    }
    A mean_x = 0;
    if (!a.log_probs || a.eps != A(0)) {
      MaxSum<A> sums{A(0), A(0)};  // .m: sum of exp(x - m), .s: sum of x - m
      const bool with_exp = !a.log_probs, with_sx = a.eps != A(0);
      row_loop<A, false>(x, nullptr, a.C, rs.tid, kRowThreads, [&](const A* v, int64_t) {
        const A xs = v[0] - m;
        if (with_exp) sums.m += math_exp(xs);
        if (with_sx) sums.s += xs;
      });
      sums = row_allreduce<kRowThreads>(
          sums,
          [](MaxSum<A> p, MaxSum<A> q) {
            return MaxSum<A>{p.m + q.m, p.s + q.s};
          },
          MaxSum<A>{A(0), A(0)}, smem);
      if (with_exp) l = math_log(sums.m);
      if (with_sx) mean_x = sums.s / static_cast<A>(a.C);
    }
    if (rs.tid == 0) {
      losses[r] = class_loss_value<A>(l, device_cast<A>(x[0][t]) - m, mean_x, a.eps);
      if (stats) {
        stats[2 * r] = m;
        stats[2 * r + 1] = l;
      }
    }
  }
}

// Column r = o * inner + j = thread; class c at o * C * inner + c * inner + j. As the CPU's column path, the
// mean of x - m is always summed (the CPU's row path skips it when eps = 0).
template <class T>
__global__ void class_loss_cols_kernel(acc_t<T>* __restrict__ losses, acc_t<T>* __restrict__ stats,
                                       const T* __restrict__ input, const int64_t* __restrict__ target,
                                       LossArgs<acc_t<T>> a, unsigned long long* bad) {
  using A = acc_t<T>;
  MP_GRID_STRIDE(r, a.rows) {
    const int64_t t = target[r];
    losses[r] = 0;
    if (stats) stats[2 * r] = stats[2 * r + 1] = 0;
    if (!check_target(t, r, a, bad, true)) continue;
    const int64_t o = r / a.inner, j = r - o * a.inner;
    const T* x = input + o * a.C * a.inner + j;
    A m = 0;
    if (!a.log_probs) {
      m = neg_inf<A>();
      for (int64_t c = 0; c < a.C; ++c) {
        const A v = device_cast<A>(x[c * a.inner]);
        m = v > m ? v : m;
      }
    }
    A sum = 0, sx = 0, xt = 0;
    for (int64_t c = 0; c < a.C; ++c) {
      const A xs = device_cast<A>(x[c * a.inner]) - m;
      if (!a.log_probs) sum += math_exp(xs);
      sx += xs;
      if (c == t) xt = xs;
    }
    const A l = a.log_probs ? A(0) : math_log(sum);
    losses[r] = class_loss_value<A>(l, xt, sx / static_cast<A>(a.C), a.eps);
    if (stats) {
      stats[2 * r] = m;
      stats[2 * r + 1] = l;
    }
  }
}

// ---------------------------------------------------------------- class loss backward

template <class T, int kRowThreads>
__global__ void __launch_bounds__(kRowThreads == kWarpSize ? kWarpRowBlock : kBlockRowThreads)
    class_loss_backward_rows_kernel(T* __restrict__ gi, const acc_t<T>* __restrict__ w_rows, bool shared_w,
                                    const T* __restrict__ input, const acc_t<T>* __restrict__ stats,
                                    const int64_t* __restrict__ target, LossArgs<acc_t<T>> a) {
  using A = acc_t<T>;
  const A eps_c = a.eps / static_cast<A>(a.C);
  const RowSched<kRowThreads> rs;
  for (int64_t r = rs.first; r < a.rows; r += rs.step) {
    const int64_t t = target[r];
    const bool valid = t != a.ignore_index && t >= 0 && t < a.C;
    const T* const x[1] = {input + r * a.C};
    if (!valid) {
      row_loop<A, true>(x, gi + r * a.C, a.C, rs.tid, kRowThreads, [](const A*, int64_t) { return A(0); });
      continue;
    }
    const A w = w_rows[shared_w ? 0 : r];
    const A m = stats ? stats[2 * r] : A(0), l = stats ? stats[2 * r + 1] : A(0);
    const A eps = a.eps;
    if (a.log_probs) {
      row_loop<A, true>(x, gi + r * a.C, a.C, rs.tid, kRowThreads,
                        [&](const A*, int64_t c) { return class_loss_grad<A>(A(0), c == t, eps, eps_c, w); });
    } else {
      row_loop<A, true>(x, gi + r * a.C, a.C, rs.tid, kRowThreads, [&](const A* v, int64_t c) {
        return class_loss_grad<A>(math_exp((v[0] - m) - l), c == t, eps, eps_c, w);
      });
    }
  }
}

// Columns as in the forward; as the CPU's column path, a row whose weight is 0 (ignored, or a zero incoming
// gradient) gets exactly 0, so a garbage probability cannot leak NaN into it.
template <class T>
__global__ void class_loss_backward_cols_kernel(T* __restrict__ gi, const acc_t<T>* __restrict__ w_rows, bool shared_w,
                                                const T* __restrict__ input, const acc_t<T>* __restrict__ stats,
                                                const int64_t* __restrict__ target, LossArgs<acc_t<T>> a) {
  using A = acc_t<T>;
  const A eps_c = a.eps / static_cast<A>(a.C);
  MP_GRID_STRIDE(r, a.rows) {
    const int64_t t = target[r];
    const bool valid = t != a.ignore_index && t >= 0 && t < a.C;
    const A w = valid ? w_rows[shared_w ? 0 : r] : A(0);
    const A m = stats ? stats[2 * r] : A(0), l = stats ? stats[2 * r + 1] : A(0);
    const int64_t o = r / a.inner, j = r - o * a.inner;
    const int64_t base = o * a.C * a.inner + j;
    for (int64_t c = 0; c < a.C; ++c) {
      const int64_t e = base + c * a.inner;
      const A p = a.log_probs ? A(0) : math_exp((device_cast<A>(input[e]) - m) - l);
      gi[e] = device_cast<T>(w == A(0) ? A(0) : class_loss_grad<A>(p, c == t, a.eps, eps_c, w));
    }
  }
}

// ---------------------------------------------------------------- entry points

// Launches a rows kernel for rows of n: warp_kernel (its <T, kWarpSize> instance) with a warp per row for
// short rows, block_kernel (<T, kBlockRowThreads>) with a block per row otherwise.
template <class... P, class... Args>
void launch_rows(int64_t rows, int64_t n, int dev, cudaStream_t stream, void (*warp_kernel)(P...),
                 void (*block_kernel)(P...), Args... args) {
  if (n <= kWarpRowMax) {
    const unsigned grid = blocks_for(rows * kWarpSize, kWarpRowBlock, dev);
    warp_kernel<<<grid, kWarpRowBlock, 0, stream>>>(args...);
  } else {
    const unsigned grid = blocks_for(rows * kBlockRowThreads, kBlockRowThreads, dev);
    block_kernel<<<grid, kBlockRowThreads, 0, stream>>>(args...);
  }
  MP_CUDA_CHECK_LAUNCH();
}

// The tensor as dtype dt (itself when it already is).
Tensor as_dtype(const Tensor& t, DType dt) { return t.dtype() == dt ? t : t.to(dt); }

// out, or a temporary of dtype dt shaped like it when out has another dtype.
Tensor out_as(const Tensor& out, DType dt) {
  return out.dtype() == dt ? out : empty(out.sizes(), {.dtype = dt, .device = out.device()});
}

// Copy the temporary from out_as into out (nothing when it was out itself).
void finish_out(const Tensor& out, const Tensor& tmp) {
  if (tmp.is_alias_of(out)) return;
  Tensor o = out;
  o.copy_(tmp);
}

void softmax_cuda(bool log, const Tensor& out, const Tensor& in, const SoftmaxShape& s) {
  DeviceGuard guard(out.device(), log ? "log_softmax" : "softmax");
  if (s.outer * s.n * s.inner == 0) return;
  if (out.dtype() != in.dtype()) {  // compute in the CPU's type (f64 when either is f64), round once into out
    const DType cd = in.dtype() == DType::f64 || out.dtype() == DType::f64 ? DType::f64 : DType::f32;
    Tensor tmp = out_as(out, cd);
    softmax_cuda(log, tmp, as_dtype(in, cd), s);
    finish_out(out, tmp);
    return;
  }
  const int dev = out.device().index;
  cudaStream_t stream = stream_of(out);
  visit_floating(in.dtype(), "softmax", [&]<class T>() {
    T* op = static_cast<T*>(out.raw_data());
    const T* ip = static_cast<const T*>(in.raw_data());
    if (s.inner == 1) {
      launch_rows(s.outer, s.n, dev, stream, &softmax_rows_kernel<T, kWarpSize>,
                  &softmax_rows_kernel<T, kBlockRowThreads>, op, ip, s.outer, s.n, log);
    } else {
      const int64_t cols = s.outer * s.inner;
      softmax_cols_kernel<T>
          <<<blocks_for(cols, kColThreads, dev), kColThreads, 0, stream>>>(op, ip, cols, s.n, s.inner, log);
      MP_CUDA_CHECK_LAUNCH();
    }
  });
}

void softmax_backward_cuda(bool log, const Tensor& grad_in, const Tensor& grad_out, const Tensor& out,
                           const SoftmaxShape& s) {
  DeviceGuard guard(grad_in.device(), log ? "log_softmax_backward" : "softmax_backward");
  if (s.outer * s.n * s.inner == 0) return;
  if (grad_out.dtype() != grad_in.dtype() || out.dtype() != grad_in.dtype()) {
    const DType cd = grad_in.dtype() == DType::f64 || out.dtype() == DType::f64 ? DType::f64 : DType::f32;
    Tensor tmp = out_as(grad_in, cd);
    softmax_backward_cuda(log, tmp, as_dtype(grad_out, cd), as_dtype(out, cd), s);
    finish_out(grad_in, tmp);
    return;
  }
  const int dev = grad_in.device().index;
  cudaStream_t stream = stream_of(grad_in);
  visit_floating(grad_in.dtype(), "softmax_backward", [&]<class T>() {
    T* gp = static_cast<T*>(grad_in.raw_data());
    const T* gop = static_cast<const T*>(grad_out.raw_data());
    const T* yp = static_cast<const T*>(out.raw_data());
    if (s.inner == 1) {
      launch_rows(s.outer, s.n, dev, stream, &softmax_backward_rows_kernel<T, kWarpSize>,
                  &softmax_backward_rows_kernel<T, kBlockRowThreads>, gp, gop, yp, s.outer, s.n, log);
    } else {
      const int64_t cols = s.outer * s.inner;
      softmax_backward_cols_kernel<T>
          <<<blocks_for(cols, kColThreads, dev), kColThreads, 0, stream>>>(gp, gop, yp, cols, s.n, s.inner, log);
      MP_CUDA_CHECK_LAUNCH();
    }
  });
}

// Runs f.template operator()<T>() with T the input's element type when its compute type is A, else (mixed
// dtypes, which the ops never pass) with T = A after converting `input` to A.
template <class A, class F>
void visit_input(Tensor& input, F&& f) {
  const DType dt = input.dtype();
  if constexpr (std::is_same_v<A, float>) {
    if (dt == DType::f16) return f.template operator()<Half>();
    if (dt == DType::bf16) return f.template operator()<BFloat16>();
  }
  if (dt != dtype_of<A>()) input = input.to(dtype_of<A>());
  f.template operator()<A>();
}

void class_loss_cuda(const char* op, const Tensor& losses, const Tensor& stats, const Tensor& input,
                     const Tensor& target, const SoftmaxShape& s, const ClassLossParams& p) {
  DeviceGuard guard(losses.device(), op);
  const int64_t rows = s.outer * s.inner;
  if (rows == 0) return;
  const int dev = losses.device().index;
  cudaStream_t stream = stream_of(losses);
  const int64_t* tgt = target.data_ptr<int64_t>();
  Tensor bad_t = empty({1}, {.dtype = DType::i64, .device = losses.device()});
  auto* bad = static_cast<unsigned long long*>(bad_t.raw_data());
  MP_CUDA_CHECK(cudaMemsetAsync(bad, 0xff, sizeof(unsigned long long), stream));
  auto run = [&]<class A>() {
    Tensor x = input;
    visit_input<A>(x, [&]<class T>() {
      const LossArgs<A> a{rows, s.n, s.inner, p.ignore_index, static_cast<A>(p.label_smoothing), p.log_probs};
      A* L = losses.data_ptr<A>();
      A* S = stats.defined() ? stats.data_ptr<A>() : nullptr;
      const T* xp = static_cast<const T*>(x.raw_data());
      if (s.inner == 1) {
        launch_rows(rows, s.n, dev, stream, &class_loss_rows_kernel<T, kWarpSize>,
                    &class_loss_rows_kernel<T, kBlockRowThreads>, L, S, xp, tgt, a, bad);
      } else {
        class_loss_cols_kernel<T>
            <<<blocks_for(rows, kColThreads, dev), kColThreads, 0, stream>>>(L, S, xp, tgt, a, bad);
        MP_CUDA_CHECK_LAUNCH();
      }
    });
  };
  if (losses.dtype() == DType::f64)
    run.template operator()<double>();
  else
    run.template operator()<float>();
  // Note [deferred device checks]: the next host synchronisation reads the word and throws on a hit.
  defer_device_check(dev, bad,
                     [bad_t, target, tgt, stream, name = std::string(op), n = s.n,
                      ignore = p.ignore_index](unsigned long long first_bad) {
                       int64_t value = 0;
                       copy_to_host_now(&value, tgt + first_bad, sizeof(value), stream);
                       MP_FAIL(name, ": target ", value, " (at flat position ", static_cast<int64_t>(first_bad),
                               ") is out of range for ", n, " classes; expected 0 <= target < ", n,
                               " or target == ignore_index (", ignore, ")");
                     });
}

void class_loss_backward_cuda(const Tensor& grad_input, const Tensor& grad_rows, const Tensor& input,
                              const Tensor& stats, const Tensor& target, const SoftmaxShape& s,
                              const ClassLossParams& p) {
  DeviceGuard guard(grad_input.device(), "class_loss_backward");
  const int64_t rows = s.outer * s.inner;
  if (rows * s.n == 0) return;
  const int dev = grad_input.device().index;
  cudaStream_t stream = stream_of(grad_input);
  const int64_t* tgt = target.data_ptr<int64_t>();
  auto run = [&]<class A>() {
    // The typed kernels need grad_input and input of one dtype T with compute type A; otherwise both go
    // through A (input converted, grad_input through a temporary).
    const DType gdt = grad_input.dtype();
    const bool typed =
        gdt == input.dtype() && (gdt == dtype_of<A>() || (std::is_same_v<A, float> && is_low_precision(gdt)));
    Tensor gi = typed ? grad_input : out_as(grad_input, dtype_of<A>());
    Tensor x = typed ? input : as_dtype(input, dtype_of<A>());
    visit_input<A>(x, [&]<class T>() {
      const LossArgs<A> a{rows, s.n, s.inner, p.ignore_index, static_cast<A>(p.label_smoothing), p.log_probs};
      const A* W = grad_rows.data_ptr<A>();
      const bool shared = grad_rows.numel() == 1 && rows != 1;
      const A* S = stats.defined() ? stats.data_ptr<A>() : nullptr;
      T* gp = gi.data_ptr<T>();
      const T* xp = static_cast<const T*>(x.raw_data());
      if (s.inner == 1) {
        launch_rows(rows, s.n, dev, stream, &class_loss_backward_rows_kernel<T, kWarpSize>,
                    &class_loss_backward_rows_kernel<T, kBlockRowThreads>, gp, W, shared, xp, S, tgt, a);
      } else {
        class_loss_backward_cols_kernel<T>
            <<<blocks_for(rows, kColThreads, dev), kColThreads, 0, stream>>>(gp, W, shared, xp, S, tgt, a);
        MP_CUDA_CHECK_LAUNCH();
      }
    });
    finish_out(grad_input, gi);
  };
  if (grad_rows.dtype() == DType::f64)
    run.template operator()<double>();
  else
    run.template operator()<float>();
}

}  // namespace

MP_REGISTER_KERNEL(softmax_kernel, DeviceType::cuda, &softmax_cuda);
MP_REGISTER_KERNEL(softmax_backward_kernel, DeviceType::cuda, &softmax_backward_cuda);
MP_REGISTER_KERNEL(class_loss_kernel, DeviceType::cuda, &class_loss_cuda);
MP_REGISTER_KERNEL(class_loss_backward_kernel, DeviceType::cuda, &class_loss_backward_cuda);

}  // namespace mp::backend::cuda

// CPU 2-D pooling (max, average, adaptive average), forward and backward. OpenMP over chunks of whole N*C
// planes (about kChunkElems elements per chunk, so small planes do not pay a per-plane load/store); each chunk is
// loaded once into the compute type A (f32 for f32/f16/bf16 with the bulk converters, double for f64), processed
// plane by plane, and stored once (rounded for 16-bit outputs). Every output plane is written by one thread and
// no result depends on the thread count.
//
// Note [pooling fast paths]
// The 2x2 stride-2 unpadded window with every window inside the input (the CNN downsampling pool) has
// branch-free, vectorised paths. Forward reads two input rows per output row, in fixed-width blocks of outputs
// (for_row_blocks: no scalar remainders on rows of 14 or 7 outputs); rows of fewer than 4 outputs (7x7 planes)
// copy the cells out to arrays first and pick the maxima in one long loop. Max pool keeps the running maximum
// and its offset in the cell with bit-mask selects, with the general loop's result (scan order a b c d, update
// when v > max or v is NaN: ties keep the first, the last NaN wins), so values and i32/i64 indices are
// bit-identical to the general loop; average pool adds in the general loop's order. The average-pool backward
// writes dx densely (each input lies in at most one window) instead of a zero fill plus a scatter.
// Max pool backward (any window: it gets only the indices) stays a zero fill plus a scatter-add per plane, which
// runs near copy bandwidth for f32; it now converts 16-bit chunks of planes, not single planes, per call.
// adaptive_avg_pool2d to 1x1 is a plane sum with independent partial sums (bf16 read inline) and, backward, a
// fill of each plane with its value rounded once. Every other window takes the general loops, unchanged.
#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/pool_kernels.hpp"

namespace mp::backend::cpu {
namespace {

// One contiguous [N, C, H, W] operand seen as planes of H*W elements.
struct Planes {
  char* base;
  DType dtype;
  int64_t plane;  // elements per plane
  int64_t count;  // number of planes
  explicit Planes(const Tensor& t)
      : base(static_cast<char*>(t.raw_data())),
        dtype(t.dtype()),
        plane(t.size(2) * t.size(3)),
        count(t.size(0) * t.size(1)) {
    MP_ASSERT(t.dim() == 4 && t.is_contiguous(), "pool kernel: expected a contiguous [N, C, H, W] tensor, got ",
              t.describe());
  }
  char* at(int64_t p) const { return base + p * plane * static_cast<int64_t>(dtype_size(dtype)); }
};

// Elements per chunk of planes in map_planes (a chunk holds at least one plane).
constexpr int64_t kChunkElems = 4096;

// Runs body(p0, np, in_values, out_values) over chunks of about kChunkElems elements of whole planes, in
// parallel: in_values holds input planes p0 .. p0 + np - 1 as A (contiguous), loaded with one conversion
// call; body writes all of out_values, which is then stored to the same output planes.
template <class A, class Body>
void map_chunks(const Planes& in, const Planes& out, Body&& body) {
  const int64_t per = std::max<int64_t>(1, kChunkElems / std::max<int64_t>({in.plane, out.plane, 1}));
  const int64_t chunks = (in.count + per - 1) / per;
  const int64_t work = in.count * std::max(in.plane, out.plane);
  const bool in_direct = in.dtype == dtype_of<A>(), out_direct = out.dtype == dtype_of<A>();
#pragma omp parallel if (work >= kParallelGrain && !omp_in_parallel())
  {
    std::vector<A> ibuf(in_direct ? 0 : static_cast<size_t>(per * in.plane));
    std::vector<A> obuf(out_direct ? 0 : static_cast<size_t>(per * out.plane));
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < chunks; ++ch) {
      const int64_t p0 = ch * per, np = std::min(per, in.count - p0);
      const A* iv = load_block<A>(in.at(p0), 1, in.dtype, np * in.plane, ibuf.data());
      A* ov = out_direct ? reinterpret_cast<A*>(out.at(p0)) : obuf.data();
      body(p0, np, iv, ov);
      if (!out_direct) store_block<A>(out.at(p0), 1, out.dtype, np * out.plane, ov);
    }
  }
}

// map_chunks with body(plane_index, in_values, out_values) called per plane.
template <class A, class Body>
void map_planes(const Planes& in, const Planes& out, Body&& body) {
  map_chunks<A>(in, out, [&](int64_t p0, int64_t np, const A* iv, A* ov) {
    for (int64_t q = 0; q < np; ++q) body(p0 + q, iv + q * in.plane, ov + q * out.plane);
  });
}

// The window of the fast paths (Note [pooling fast paths]): 2x2, stride 2, no padding, every window inside.
bool is_2x2_stride2(const Pool2dWindow& w, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  constexpr std::array<int64_t, 2> two{2, 2}, zero{0, 0};
  return w.kernel == two && w.stride == two && w.padding == zero && 2 * OH <= H && 2 * OW <= W;
}

// Covers outputs [0, n) of a row with fixed-width blocks, f.template operator()<B>(first, B) for B = 8 or 4: the
// last block is moved back to end at n, overlapping the one before (those outputs are computed again, to the
// same values; callers write pure functions of their inputs). Fixed widths vectorise completely, with no scalar
// remainder loops (rows of 14 or 7 outputs are common). Rows shorter than 4 take f<0>(0, n), a plain loop.
template <class F>
void for_row_blocks(int64_t n, F&& f) {
  if (n >= 8) {
    int64_t ox = 0;
    for (; ox + 8 <= n; ox += 8) f.template operator()<8>(ox, 8);
    if (ox < n) f.template operator()<8>(n - 8, 8);
  } else if (n >= 4) {
    f.template operator()<4>(0, 4);
    if (n > 4) f.template operator()<4>(n - 4, 4);
  } else {
    f.template operator()<0>(0, n);
  }
}

// Calls f.template operator()<A>() with A the compute type of floating dtype dt.
template <class F>
void visit_compute(DType dt, const char* op, F&& f) {
  visit_floating(dt, op, [&]<class T>() { f.template operator()<acc_t<T>>(); });
}

// ----------------------------------------------------------------------------------------- max pool

// The signed integer type of A's width (f32: int32, f64: int64).
template <class A>
using BitsOf = std::conditional_t<sizeof(A) == 4, int32_t, int64_t>;

// One step of the max-pool scan (Note [pooling fast paths]): v at cell offset pos replaces the running maximum
// m (offset k) when v > m or v is NaN, the general loop's rule. The selects are bit masks, so the scalar
// remainder of the vectorised loop has no data-dependent branches either.
template <class A, class I>
void max_step(A v, I pos, A& m, I& k) {
  using B = BitsOf<A>;
  const bool take = (v > m) | (v != v);
  const B mb = -static_cast<B>(take);
  m = std::bit_cast<A>((std::bit_cast<B>(v) & mb) | (std::bit_cast<B>(m) & ~mb));
  const I mi = -static_cast<I>(take);
  k = (pos & mi) | (k & ~mi);
}

// One plane of the 2x2 stride-2 max pool (Note [pooling fast paths]): cell values a b / c d with the result of
// scanning them in that order, the index the flat offset ih * W + iw.
template <class A, class I>
void max_pool_2x2_plane(const A* xv, A* yv, I* ip, int64_t W, int64_t OH, int64_t OW) {
  const I w = static_cast<I>(W), w1 = static_cast<I>(W + 1);
  for (int64_t oy = 0; oy < OH; ++oy) {
    const A* r0 = xv + 2 * oy * W;
    const A* r1 = r0 + W;
    A* y = yv + oy * OW;
    I* id = ip + oy * OW;
    const I base = static_cast<I>(2 * oy * W);
    for_row_blocks(OW, [&]<int B>(int64_t ox0, int64_t cnt) {
#pragma omp simd
      for (int64_t ox = ox0; ox < ox0 + (B > 0 ? B : cnt); ++ox) {
        // Scan a, b and c, d, then the pair winners: the same result as scanning a b c d in order (the later
        // pair wins only when larger or NaN), with a shorter dependency chain.
        A m = r0[2 * ox], m2 = r1[2 * ox];
        I k = 0, k2 = w;
        max_step(r0[2 * ox + 1], I(1), m, k);
        max_step(r1[2 * ox + 1], w1, m2, k2);
        max_step(m2, k2, m, k);
        y[ox] = m;
        id[ox] = base + static_cast<I>(2 * ox) + k;
      }
    });
  }
}

// The 2x2 stride-2 max pool of np planes with rows of fewer than 4 outputs (a 7x7 input): the cells' values
// are first copied out to arrays a, b, c, d, a batch of outputs at a time, then one long loop picks the maxima
// as max_pool_2x2_plane does (rows this short would leave only scalar code, and its compare chains are slow).
template <class A, class I>
void max_pool_2x2_narrow(const A* xv, A* yv, I* ip, int64_t np, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  constexpr int64_t kBatch = 1024;
  A a[kBatch], b[kBatch], c[kBatch], d[kBatch];
  I base[kBatch];
  const I w = static_cast<I>(W), w1 = static_cast<I>(W + 1);
  int64_t t = 0, done = 0;  // outputs in the batch, outputs stored
  auto flush = [&] {
#pragma omp simd
    for (int64_t j = 0; j < t; ++j) {
      A m = a[j], m2 = c[j];
      I k = 0, k2 = w;
      max_step(b[j], I(1), m, k);
      max_step(d[j], w1, m2, k2);
      max_step(m2, k2, m, k);
      yv[done + j] = m;
      ip[done + j] = base[j] + k;
    }
    done += t;
    t = 0;
  };
  for (int64_t q = 0; q < np; ++q)
    for (int64_t oy = 0; oy < OH; ++oy) {
      if (t + OW > kBatch) flush();
      const A* r0 = xv + q * H * W + 2 * oy * W;
      const A* r1 = r0 + W;
      for (int64_t ox = 0; ox < OW; ++ox, ++t) {
        a[t] = r0[2 * ox];
        b[t] = r0[2 * ox + 1];
        c[t] = r1[2 * ox];
        d[t] = r1[2 * ox + 1];
        base[t] = static_cast<I>(2 * oy * W + 2 * ox);
      }
    }
  flush();
}

template <class A, class I>
void max_pool_forward(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dWindow& w) {
  const Planes in(x), o(out);
  const int64_t H = x.size(2), W = x.size(3), OH = out.size(2), OW = out.size(3);
  I* idx = indices.data_ptr<I>();
  if (is_2x2_stride2(w, H, W, OH, OW)) {
    if (OW < 4) {
      map_chunks<A>(in, o, [&](int64_t p0, int64_t np, const A* xv, A* yv) {
        max_pool_2x2_narrow<A>(xv, yv, idx + p0 * OH * OW, np, H, W, OH, OW);
      });
      return;
    }
    map_planes<A>(in, o,
                  [&](int64_t p, const A* xv, A* yv) { max_pool_2x2_plane<A>(xv, yv, idx + p * OH * OW, W, OH, OW); });
    return;
  }
  map_planes<A>(in, o, [&](int64_t p, const A* xv, A* yv) {
    I* ip = idx + p * OH * OW;
    for (int64_t oy = 0; oy < OH; ++oy) {
      const int64_t y0 = oy * w.stride[0] - w.padding[0];
      const int64_t y1 = std::min(y0 + w.kernel[0], H);
      for (int64_t ox = 0; ox < OW; ++ox) {
        const int64_t x0 = ox * w.stride[1] - w.padding[1];
        const int64_t x1 = std::min(x0 + w.kernel[1], W);
        // Padding is -inf: only the in-bounds part of the window is read. NaN wins (as PyTorch).
        int64_t best = std::max<int64_t>(y0, 0) * W + std::max<int64_t>(x0, 0);
        A m = -std::numeric_limits<A>::infinity();
        for (int64_t iy = std::max<int64_t>(y0, 0); iy < y1; ++iy)
          for (int64_t ix = std::max<int64_t>(x0, 0); ix < x1; ++ix) {
            const A v = xv[iy * W + ix];
            if (v > m || std::isnan(v)) {
              m = v;
              best = iy * W + ix;
            }
          }
        yv[oy * OW + ox] = m;
        ip[oy * OW + ox] = static_cast<I>(best);
      }
    }
  });
}

void max_pool2d_forward_cpu(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dWindow& w) {
  MP_ASSERT(indices.is_contiguous() && indices.sizes() == out.sizes(), "max_pool2d kernel: bad indices tensor");
  visit_compute(x.dtype(), "max_pool2d", [&]<class A>() {
    if (indices.dtype() == DType::i32)
      max_pool_forward<A, int32_t>(out, indices, x, w);
    else
      max_pool_forward<A, int64_t>(out, indices, x, w);
  });
}

// Max pool backward: each chunk of dx planes is zero-filled in the compute type A and gets every dy value added
// at its saved index (overlapping windows may select an input more than once), one conversion call per chunk.
template <class A, class I>
void max_pool_backward(const Tensor& dx, const Tensor& dy, const Tensor& indices) {
  const Planes g(dy), o(dx);
  const I* idx = indices.data_ptr<I>();
  map_chunks<A>(g, o, [&](int64_t p0, int64_t np, const A* gv, A* dxv) {
    const I* ip = idx + p0 * g.plane;
    for (int64_t q = 0; q < np; ++q) {  // plane by plane: the scatter finds the zeroed plane in L1
      A* d = dxv + q * o.plane;
      std::fill(d, d + o.plane, A(0));
      const int64_t b = q * g.plane;
      for (int64_t i = 0; i < g.plane; ++i) d[ip[b + i]] += gv[b + i];
    }
  });
}

void max_pool2d_backward_cpu(const Tensor& dx, const Tensor& dy, const Tensor& indices) {
  MP_ASSERT(indices.is_contiguous() && indices.sizes() == dy.sizes(), "max_pool2d backward kernel: bad indices");
  visit_compute(dx.dtype(), "max_pool2d_backward", [&]<class A>() {
    if (indices.dtype() == DType::i32)
      max_pool_backward<A, int32_t>(dx, dy, indices);
    else
      max_pool_backward<A, int64_t>(dx, dy, indices);
  });
}

// ----------------------------------------------------------------------------------------- average pool

// PyTorch's average-pool window of output (oy, ox): the in-bounds rows [y0, y1) and columns [x0, x1), and
// the divisor (the window clipped to the padded input when count_include_pad, else the in-bounds count).
struct AvgWindow {
  int64_t y0, y1, x0, x1, divisor;
};

AvgWindow avg_window(int64_t oy, int64_t ox, int64_t H, int64_t W, const Pool2dWindow& w, bool count_include_pad) {
  int64_t y0 = oy * w.stride[0] - w.padding[0], x0 = ox * w.stride[1] - w.padding[1];
  int64_t y1 = std::min(y0 + w.kernel[0], H + w.padding[0]), x1 = std::min(x0 + w.kernel[1], W + w.padding[1]);
  const int64_t padded = (y1 - y0) * (x1 - x0);
  y0 = std::max<int64_t>(y0, 0);
  x0 = std::max<int64_t>(x0, 0);
  y1 = std::min(y1, H);
  x1 = std::min(x1, W);
  const int64_t inside = std::max<int64_t>(y1 - y0, 0) * std::max<int64_t>(x1 - x0, 0);
  return {y0, y1, x0, x1, count_include_pad ? padded : inside};
}

// One plane of the 2x2 stride-2 average pool (Note [pooling fast paths]): the general loop's sum order and
// divisor (4 whether or not padding counts: the window is inside).
template <class A>
void avg_pool_2x2_plane(const A* xv, A* yv, int64_t W, int64_t OH, int64_t OW) {
  for (int64_t oy = 0; oy < OH; ++oy) {
    const A* r0 = xv + 2 * oy * W;
    const A* r1 = r0 + W;
    A* y = yv + oy * OW;
    for_row_blocks(OW, [&]<int B>(int64_t ox0, int64_t cnt) {
#pragma omp simd
      for (int64_t ox = ox0; ox < ox0 + (B > 0 ? B : cnt); ++ox) {
        A s = A(0) + r0[2 * ox];
        s += r0[2 * ox + 1];
        s += r1[2 * ox];
        s += r1[2 * ox + 1];
        y[ox] = s / A(4);
      }
    });
  }
}

// Backward of one plane of the 2x2 stride-2 average pool: each dx element of a cell gets 0 + dy / 4 (the
// scatter path's value); rows and columns outside every cell get zeros.
template <class A>
void avg_unpool_2x2_plane(const A* gv, A* dxv, int64_t H, int64_t W, int64_t OH, int64_t OW) {
  for (int64_t oy = 0; oy < OH; ++oy) {
    A* d0 = dxv + 2 * oy * W;
    A* d1 = d0 + W;
    const A* g = gv + oy * OW;
    for_row_blocks(OW, [&]<int B>(int64_t ox0, int64_t cnt) {
#pragma omp simd
      for (int64_t ox = ox0; ox < ox0 + (B > 0 ? B : cnt); ++ox) {
        const A v = A(0) + g[ox] / A(4);
        d0[2 * ox] = v;
        d0[2 * ox + 1] = v;
        d1[2 * ox] = v;
        d1[2 * ox + 1] = v;
      }
    });
    for (int64_t ix = 2 * OW; ix < W; ++ix) d0[ix] = d1[ix] = A(0);
  }
  std::fill(dxv + 2 * OH * W, dxv + H * W, A(0));
}

void avg_pool2d_forward_cpu(const Tensor& out, const Tensor& x, const Pool2dWindow& w, bool count_include_pad) {
  const int64_t H = x.size(2), W = x.size(3), OH = out.size(2), OW = out.size(3);
  const bool fast = is_2x2_stride2(w, H, W, OH, OW);
  visit_compute(x.dtype(), "avg_pool2d", [&]<class A>() {
    if (fast) {
      map_planes<A>(Planes(x), Planes(out),
                    [&](int64_t, const A* xv, A* yv) { avg_pool_2x2_plane(xv, yv, W, OH, OW); });
      return;
    }
    map_planes<A>(Planes(x), Planes(out), [&](int64_t, const A* xv, A* yv) {
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox) {
          const AvgWindow win = avg_window(oy, ox, H, W, w, count_include_pad);
          A s = 0;
          for (int64_t iy = win.y0; iy < win.y1; ++iy)
            for (int64_t ix = win.x0; ix < win.x1; ++ix) s += xv[iy * W + ix];
          yv[oy * OW + ox] = win.divisor > 0 ? s / static_cast<A>(win.divisor) : A(0);
        }
    });
  });
}

void avg_pool2d_backward_cpu(const Tensor& dx, const Tensor& dy, const Pool2dWindow& w, bool count_include_pad) {
  const int64_t H = dx.size(2), W = dx.size(3), OH = dy.size(2), OW = dy.size(3);
  const bool fast = is_2x2_stride2(w, H, W, OH, OW);
  visit_compute(dx.dtype(), "avg_pool2d_backward", [&]<class A>() {
    if (fast) {
      map_planes<A>(Planes(dy), Planes(dx),
                    [&](int64_t, const A* gv, A* dxv) { avg_unpool_2x2_plane(gv, dxv, H, W, OH, OW); });
      return;
    }
    map_planes<A>(Planes(dy), Planes(dx), [&](int64_t, const A* gv, A* dxv) {
      std::fill(dxv, dxv + H * W, A(0));
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox) {
          const AvgWindow win = avg_window(oy, ox, H, W, w, count_include_pad);
          if (win.divisor <= 0) continue;
          const A v = gv[oy * OW + ox] / static_cast<A>(win.divisor);
          for (int64_t iy = win.y0; iy < win.y1; ++iy)
            for (int64_t ix = win.x0; ix < win.x1; ++ix) dxv[iy * W + ix] += v;
        }
    });
  });
}

// ----------------------------------------------------------------------------------------- adaptive average

// Value of a plane element as A: E is A itself, or uint16_t holding bf16 bits (converted inline: a shift).
template <class A, class E>
A as_acc(E v) {
  if constexpr (std::is_same_v<E, uint16_t>)
    return detail::bf16_bits_to_float(v);
  else
    return v;
}

// Sum of n values as A: long planes in 64 bytes' worth of partial sums (independent adds: one accumulator waits
// on each add's latency), combined pairwise, plus the tail; short ones in one omp simd reduction.
template <class A, class E>
A plane_sum(const E* v, int64_t n) {
  constexpr int64_t L = 64 / static_cast<int64_t>(sizeof(A));
  if (n < 16 * L) {
    A s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) s += as_acc<A>(v[j]);
    return s;
  }
  A acc[L] = {};
  int64_t j = 0;
  for (; j + L <= n; j += L)
#pragma omp simd
    for (int64_t l = 0; l < L; ++l) acc[l] += as_acc<A>(v[j + l]);
  A tail = 0;
  for (; j < n; ++j) tail += as_acc<A>(v[j]);
  for (int64_t w = L / 2; w > 0; w /= 2)
    for (int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0] + tail;
}

void adaptive_avg_pool2d_forward_cpu(const Tensor& out, const Tensor& x) {
  const int64_t H = x.size(2), W = x.size(3), OH = out.size(2), OW = out.size(3);
  visit_compute(x.dtype(), "adaptive_avg_pool2d", [&]<class A>() {
    if (OH == 1 && OW == 1) {  // global average: vectorised plane sums (bf16 converted inline)
      const int64_t n = H * W;
      if constexpr (std::is_same_v<A, float>) {
        if (x.dtype() == DType::bf16) {
          const Planes in(x), o(out);
          std::vector<float> means(static_cast<size_t>(in.count));
#pragma omp parallel for if (in.count * n >= kParallelGrain && !omp_in_parallel()) schedule(static)
          for (int64_t p = 0; p < in.count; ++p)
            means[p] = plane_sum<float>(reinterpret_cast<const uint16_t*>(in.at(p)), n) / static_cast<float>(n);
          store_block<float>(o.base, 1, o.dtype, o.count, means.data());
          return;
        }
      }
      map_planes<A>(Planes(x), Planes(out),
                    [&](int64_t, const A* xv, A* yv) { yv[0] = plane_sum<A>(xv, n) / static_cast<A>(n); });
      return;
    }
    map_planes<A>(Planes(x), Planes(out), [&](int64_t, const A* xv, A* yv) {
      for (int64_t oy = 0; oy < OH; ++oy) {
        const int64_t y0 = adaptive_start(oy, H, OH), y1 = adaptive_end(oy, H, OH);
        for (int64_t ox = 0; ox < OW; ++ox) {
          const int64_t x0 = adaptive_start(ox, W, OW), x1 = adaptive_end(ox, W, OW);
          A s = 0;
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) s += xv[iy * W + ix];
          yv[oy * OW + ox] = s / static_cast<A>((y1 - y0) * (x1 - x0));
        }
      }
    });
  });
}

// Fills every plane p of `o` with the element value[p] (the raw bits of o's dtype, B of its width).
template <class B>
void fill_planes(const Planes& o, const char* values) {
#pragma omp parallel for if (o.count * o.plane >= kParallelGrain && !omp_in_parallel()) schedule(static)
  for (int64_t p = 0; p < o.count; ++p) {
    B v;
    std::memcpy(&v, values + p * static_cast<int64_t>(sizeof(B)), sizeof(B));
    B* d = reinterpret_cast<B*>(o.at(p));
    std::fill(d, d + o.plane, v);
  }
}

void adaptive_avg_pool2d_backward_cpu(const Tensor& dx, const Tensor& dy) {
  const int64_t H = dx.size(2), W = dx.size(3), OH = dy.size(2), OW = dy.size(3);
  visit_compute(dx.dtype(), "adaptive_avg_pool2d_backward", [&]<class A>() {
    if (OH == 1 && OW == 1) {  // global average: fill each plane with 0 + dy / (H W), rounded once to dx's dtype
      const Planes g(dy), o(dx);
      const int64_t n = H * W;
      std::vector<A> gbuf(static_cast<size_t>(g.count)), v(static_cast<size_t>(g.count));
      const A* gv = load_block<A>(g.base, 1, g.dtype, g.count, gbuf.data());
      for (int64_t p = 0; p < g.count; ++p) v[p] = A(0) + gv[p] / static_cast<A>(n);
      std::vector<char> bits(static_cast<size_t>(g.count) * dtype_size(o.dtype));
      store_block<A>(bits.data(), 1, o.dtype, g.count, v.data());
      switch (dtype_size(o.dtype)) {
        case 2: return fill_planes<uint16_t>(o, bits.data());
        case 4: return fill_planes<uint32_t>(o, bits.data());
        default: return fill_planes<uint64_t>(o, bits.data());
      }
    }
    map_planes<A>(Planes(dy), Planes(dx), [&](int64_t, const A* gv, A* dxv) {
      std::fill(dxv, dxv + H * W, A(0));
      for (int64_t oy = 0; oy < OH; ++oy) {
        const int64_t y0 = adaptive_start(oy, H, OH), y1 = adaptive_end(oy, H, OH);
        for (int64_t ox = 0; ox < OW; ++ox) {
          const int64_t x0 = adaptive_start(ox, W, OW), x1 = adaptive_end(ox, W, OW);
          const A v = gv[oy * OW + ox] / static_cast<A>((y1 - y0) * (x1 - x0));
          for (int64_t iy = y0; iy < y1; ++iy)
            for (int64_t ix = x0; ix < x1; ++ix) dxv[iy * W + ix] += v;
        }
      }
    });
  });
}

}  // namespace

MP_REGISTER_KERNEL(max_pool2d_forward_kernel, DeviceType::cpu, &max_pool2d_forward_cpu);
MP_REGISTER_KERNEL(max_pool2d_backward_kernel, DeviceType::cpu, &max_pool2d_backward_cpu);
MP_REGISTER_KERNEL(avg_pool2d_forward_kernel, DeviceType::cpu, &avg_pool2d_forward_cpu);
MP_REGISTER_KERNEL(avg_pool2d_backward_kernel, DeviceType::cpu, &avg_pool2d_backward_cpu);
MP_REGISTER_KERNEL(adaptive_avg_pool2d_forward_kernel, DeviceType::cpu, &adaptive_avg_pool2d_forward_cpu);
MP_REGISTER_KERNEL(adaptive_avg_pool2d_backward_kernel, DeviceType::cpu, &adaptive_avg_pool2d_backward_cpu);

}  // namespace mp::backend::cpu

// CPU 2-D pooling (max, average, adaptive average), forward and backward. OpenMP over the N*C planes; each
// plane is loaded once into the compute type A (f32 for f32/f16/bf16 with the bulk converters, double for
// f64), processed, and stored once (rounded for 16-bit outputs). Backward passes scatter into a per-thread
// plane of A, so every dx plane is written by one thread and the result does not depend on the thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
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
      : base(static_cast<char*>(t.raw_data())), dtype(t.dtype()), plane(t.size(2) * t.size(3)),
        count(t.size(0) * t.size(1)) {
    MP_ASSERT(t.dim() == 4 && t.is_contiguous(), "pool kernel: expected a contiguous [N, C, H, W] tensor, got ",
              t.describe());
  }
  char* at(int64_t p) const { return base + p * plane * static_cast<int64_t>(dtype_size(dtype)); }
};

// Per-thread buffers of the compute type A for one input plane and one output plane.
template <class A>
struct PlaneBuffers {
  std::vector<A> in, out;
  PlaneBuffers(int64_t in_n, int64_t out_n) : in(static_cast<size_t>(in_n)), out(static_cast<size_t>(out_n)) {}
};

// Runs body(plane_index, in_values, out_values) over the planes in parallel: in_values holds input plane p as
// A; body writes all of out_values, which is then stored to output plane p.
template <class A, class Body>
void map_planes(const Planes& in, const Planes& out, Body&& body) {
  const int64_t work = in.count * std::max(in.plane, out.plane);
#pragma omp parallel if (work >= kParallelGrain && !omp_in_parallel())
  {
    PlaneBuffers<A> buf(in.plane, out.plane);
#pragma omp for schedule(static)
    for (int64_t p = 0; p < in.count; ++p) {
      const A* iv = load_block<A>(in.at(p), 1, in.dtype, in.plane, buf.in.data());
      const bool direct = out.dtype == dtype_of<A>();
      A* ov = direct ? reinterpret_cast<A*>(out.at(p)) : buf.out.data();
      body(p, iv, ov);
      if (!direct) store_block<A>(out.at(p), 1, out.dtype, out.plane, ov);
    }
  }
}

// Calls f.template operator()<A>() with A the compute type of floating dtype dt.
template <class F>
void visit_compute(DType dt, const char* op, F&& f) {
  visit_floating(dt, op, [&]<class T>() { f.template operator()<acc_t<T>>(); });
}

// ----------------------------------------------------------------------------------------- max pool

template <class A, class I>
void max_pool_forward(const Tensor& out, const Tensor& indices, const Tensor& x, const Pool2dWindow& w) {
  const Planes in(x), o(out);
  const int64_t H = x.size(2), W = x.size(3), OH = out.size(2), OW = out.size(3);
  I* idx = indices.data_ptr<I>();
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
    if (indices.dtype() == DType::i32) max_pool_forward<A, int32_t>(out, indices, x, w);
    else max_pool_forward<A, int64_t>(out, indices, x, w);
  });
}

template <class A, class I>
void max_pool_backward(const Tensor& dx, const Tensor& dy, const Tensor& indices) {
  const Planes g(dy), o(dx);
  const I* idx = indices.data_ptr<I>();
  map_planes<A>(g, o, [&](int64_t p, const A* gv, A* dxv) {
    std::fill(dxv, dxv + o.plane, A(0));
    const I* ip = idx + p * g.plane;
    for (int64_t i = 0; i < g.plane; ++i) dxv[ip[i]] += gv[i];
  });
}

void max_pool2d_backward_cpu(const Tensor& dx, const Tensor& dy, const Tensor& indices) {
  MP_ASSERT(indices.is_contiguous() && indices.sizes() == dy.sizes(), "max_pool2d backward kernel: bad indices");
  visit_compute(dx.dtype(), "max_pool2d_backward", [&]<class A>() {
    if (indices.dtype() == DType::i32) max_pool_backward<A, int32_t>(dx, dy, indices);
    else max_pool_backward<A, int64_t>(dx, dy, indices);
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

void avg_pool2d_forward_cpu(const Tensor& out, const Tensor& x, const Pool2dWindow& w, bool count_include_pad) {
  const int64_t H = x.size(2), W = x.size(3), OH = out.size(2), OW = out.size(3);
  visit_compute(x.dtype(), "avg_pool2d", [&]<class A>() {
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
  visit_compute(dx.dtype(), "avg_pool2d_backward", [&]<class A>() {
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

void adaptive_avg_pool2d_forward_cpu(const Tensor& out, const Tensor& x) {
  const int64_t H = x.size(2), W = x.size(3), OH = out.size(2), OW = out.size(3);
  visit_compute(x.dtype(), "adaptive_avg_pool2d", [&]<class A>() {
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

void adaptive_avg_pool2d_backward_cpu(const Tensor& dx, const Tensor& dy) {
  const int64_t H = dx.size(2), W = dx.size(3), OH = dy.size(2), OW = dy.size(3);
  visit_compute(dx.dtype(), "adaptive_avg_pool2d_backward", [&]<class A>() {
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

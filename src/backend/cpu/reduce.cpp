// CPU reductions. The input arrives as [kept..., reduced...] (a strided view). Two loop shapes cover
// what training needs without copies: "inner" when the innermost reduced dim is unit-stride (row
// sums, softmax denominators, layer-norm statistics) and "outer" when the innermost kept dim is
// unit-stride (bias gradients: column sums; batch-norm over N of NCHW after coalescing). Anything
// else gathers with strides.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/reduce_acc.hpp"
#include "backend/reduce_kernels.hpp"

namespace mp::backend::cpu {
namespace {

struct Dims {
  std::vector<int64_t> sizes, strides;  // coalesced, outermost first
  int64_t numel = 1;
};

Dims coalesce(const Shape& sizes, const Shape& strides, size_t begin, size_t end) {
  Dims d;
  for (size_t i = begin; i < end; ++i) {
    if (sizes[i] == 1) continue;
    d.numel *= sizes[i];
    if (!d.sizes.empty() && d.strides.back() == strides[i] * sizes[i]) {
      d.sizes.back() *= sizes[i];
      d.strides.back() = strides[i];
    } else {
      d.sizes.push_back(sizes[i]);
      d.strides.push_back(strides[i]);
    }
  }
  for (size_t i = begin; i < end; ++i)
    if (sizes[i] == 0) d.numel = 0;
  return d;
}

// Element offset of linear index `i` within coalesced dims.
int64_t offset_of(const Dims& d, int64_t i) {
  int64_t off = 0;
  for (size_t k = d.sizes.size(); k-- > 0;) {
    off += (i % d.sizes[k]) * d.strides[k];
    i /= d.sizes[k];
  }
  return off;
}

template <class Acc>
inline constexpr bool is_sum_like_v = std::is_same_v<Acc, SumAcc<float>> || std::is_same_v<Acc, SumSqAcc<float>>;

// Note [column sums]: acc[j] = combine(acc[j], map(row_r[j])) for rows r = 0, 1, ... in order, the
// rows `row_bytes` apart, read as T (f32, or bf16 widened by a shift in the loop). The same order and
// operations as the buffered path, so the results are bit-identical; only plain sums take the AVX-512
// copy (a sum of squares could be contracted to an FMA there and round differently).
template <class T, class Acc>
struct ColumnSumLanes {
  MP_FORCE_INLINE void operator()(float* acc, const char* p, int64_t row_bytes, int64_t rows, int64_t n) const {
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = reinterpret_cast<const T*>(p + r * row_bytes);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        float v;
        if constexpr (std::is_same_v<T, BFloat16>) {
          v = std::bit_cast<float>(static_cast<uint32_t>(row[j].bits()) << 16);
        } else {
          v = row[j];
        }
        acc[j] = Acc::combine(acc[j], Acc::map(v));
      }
    }
  }
};

template <class A, class Acc>
void reduce_impl(const Tensor& out, const Tensor& in, int64_t nreduce) {
  const size_t nd = in.sizes().size();
  const size_t nk = nd - static_cast<size_t>(nreduce);
  const Dims keep = coalesce(in.sizes(), in.strides(), 0, nk);
  Dims red = coalesce(in.sizes(), in.strides(), nk, nd);
  if (red.sizes.empty() && red.numel == 1) {  // nothing to reduce: each output is one element
    red.sizes = {1};
    red.strides = {1};
  }
  const int64_t nout = keep.numel;
  const char* base = static_cast<const char*>(in.raw_data());
  const DType dt = in.dtype();
  const auto es = static_cast<int64_t>(in.element_size());
  std::vector<A> result(static_cast<size_t>(nout), Acc::init());
  const int64_t total = nout * std::max<int64_t>(red.numel, 1);
  const bool parallel = total >= kParallelGrain && !omp_in_parallel();

  if (red.numel > 0 && red.strides.back() == 1) {
    // inner: each output reduces rows of unit-stride elements. reduce_range covers reduced linear
    // indices [r0, r1) of output o, so few outputs with long rows (a full sum) split across threads.
    const int64_t row = red.sizes.back();
    Dims outer_red = red;
    outer_red.sizes.pop_back();
    outer_red.strides.pop_back();
    auto reduce_range = [&](int64_t o, int64_t r0, int64_t r1) {
      alignas(64) A buf[kBlock];
      const int64_t ko = offset_of(keep, o);
      A acc = Acc::init();
      while (r0 < r1) {
        const int64_t rr = r0 / row, j0 = r0 % row;
        const int64_t n = std::min({kBlock, row - j0, r1 - r0});
        const A* v = load_block<A>(base + (ko + offset_of(outer_red, rr) + j0) * es, 1, dt, n, buf);
        A part = Acc::init();
        if constexpr (std::is_same_v<Acc, SumAcc<A>> || std::is_same_v<Acc, SumSqAcc<A>>) {
#pragma omp simd reduction(+ : part)
          for (int64_t j = 0; j < n; ++j) part += Acc::map(v[j]);
        } else {
          for (int64_t j = 0; j < n; ++j) part = Acc::combine(part, v[j]);
        }
        acc = Acc::combine(acc, part);
        r0 += n;
      }
      return acc;
    };
    const int nthreads = parallel ? omp_get_max_threads() : 1;
    if (nout >= 4 * nthreads || !parallel) {
#pragma omp parallel for if (parallel) schedule(static)
      for (int64_t o = 0; o < nout; ++o) result[static_cast<size_t>(o)] = reduce_range(o, 0, red.numel);
    } else {
      const int64_t chunks = 4 * nthreads, len = (red.numel + chunks - 1) / chunks;
      std::vector<A> part(static_cast<size_t>(chunks));
      for (int64_t o = 0; o < nout; ++o) {
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < chunks; ++c)
          part[static_cast<size_t>(c)] =
              reduce_range(o, std::min(red.numel, c * len), std::min(red.numel, (c + 1) * len));
        A acc = Acc::init();
        for (A v : part) acc = Acc::combine(acc, v);
        result[static_cast<size_t>(o)] = acc;
      }
    }
  } else if (nout > 0 && !keep.sizes.empty() && keep.strides.back() == 1) {
    // outer: vectors of unit-stride outputs accumulate across the reduced indices.
    const int64_t inner = keep.sizes.back();
    const int64_t nblk = (inner + kBlock - 1) / kBlock;
    const int64_t nouter = nout / inner;
    Dims outer_keep = keep;
    outer_keep.sizes.pop_back();
    outer_keep.strides.pop_back();
    // Column sums of f32 / bf16 rows with one reduced stride (bias gradients) read the rows directly
    // in one vector loop per block (Note [column sums]); the rest converts each row into a buffer.
    const bool direct = red.sizes.size() == 1 && std::is_same_v<A, float> && is_sum_like_v<Acc> &&
                        (dt == DType::f32 || dt == DType::bf16);
    const bool vec = direct && std::is_same_v<Acc, SumAcc<A>> && vector_loops_enabled();
#pragma omp parallel for if (parallel) schedule(static)
    for (int64_t w = 0; w < nouter * nblk; ++w) {
      alignas(64) A buf[kBlock];
      const int64_t oo = w / nblk, j0 = (w % nblk) * kBlock;
      const int64_t n = std::min(kBlock, inner - j0);
      A* acc = result.data() + oo * inner + j0;
      const int64_t ko = offset_of(outer_keep, oo) + j0;
      if constexpr (std::is_same_v<A, float> && is_sum_like_v<Acc>) {
        if (direct) {
          const char* p = base + ko * es;
          if (dt == DType::bf16)
            call_isa(vec, ColumnSumLanes<BFloat16, Acc>{}, acc, p, red.strides[0] * es, red.numel, n);
          else
            call_isa(vec, ColumnSumLanes<float, Acc>{}, acc, p, red.strides[0] * es, red.numel, n);
          continue;
        }
      }
      for (int64_t r = 0; r < red.numel; ++r) {
        const A* v = load_block<A>(base + (ko + offset_of(red, r)) * es, 1, dt, n, buf);
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) acc[j] = Acc::combine(acc[j], Acc::map(v[j]));
      }
    }
  } else if (red.numel > 0) {
    const int64_t row = red.sizes.back(), rstride = red.strides.back();
    const int64_t nrows = red.numel / row;
    Dims outer_red = red;
    outer_red.sizes.pop_back();
    outer_red.strides.pop_back();
#pragma omp parallel for if (parallel) schedule(static)
    for (int64_t o = 0; o < nout; ++o) {
      alignas(64) A buf[kBlock];
      const int64_t ko = offset_of(keep, o);
      A acc = Acc::init();
      for (int64_t r = 0; r < nrows; ++r) {
        const int64_t ro = ko + offset_of(outer_red, r);
        for (int64_t j0 = 0; j0 < row; j0 += kBlock) {
          const int64_t n = std::min(kBlock, row - j0);
          const A* v = load_block<A>(base + (ro + j0 * rstride) * es, rstride, dt, n, buf);
          for (int64_t j = 0; j < n; ++j) acc = Acc::combine(acc, Acc::map(v[j]));
        }
      }
      result[static_cast<size_t>(o)] = acc;
    }
  }
  store_block<A>(static_cast<char*>(out.raw_data()), 1, out.dtype(), nout, result.data());
}

template <class A>
void reduce_typed(ReduceOp op, const Tensor& out, const Tensor& in, int64_t nreduce) {
  switch (op) {
    case ReduceOp::sum: return reduce_impl<A, SumAcc<A>>(out, in, nreduce);
    case ReduceOp::max: return reduce_impl<A, MaxAcc<A>>(out, in, nreduce);
    case ReduceOp::min: return reduce_impl<A, MinAcc<A>>(out, in, nreduce);
    case ReduceOp::sum_squares: return reduce_impl<A, SumSqAcc<A>>(out, in, nreduce);
  }
}

void reduce_cpu(ReduceOp op, const Tensor& out, const Tensor& in, int64_t nreduce) {
  MP_CHECK(op == ReduceOp::sum || op == ReduceOp::sum_squares || in.numel() > 0 || nreduce == 0,
           "max/min: cannot reduce an empty dimension (input ", in.describe(), ")");
  switch (in.dtype()) {
    case DType::f64: return reduce_typed<double>(op, out, in, nreduce);
    case DType::f32:
    case DType::f16:
    case DType::bf16: return reduce_typed<float>(op, out, in, nreduce);
    default: return reduce_typed<int64_t>(op, out, in, nreduce);
  }
}

void arg_reduce_cpu(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in) {
  const int64_t n = in.sizes().back();
  MP_CHECK(n > 0, is_max ? "max" : "min", ": cannot reduce an empty dimension (input ", in.describe(), ")");
  const size_t nd = in.sizes().size();
  const Dims keep = coalesce(in.sizes(), in.strides(), 0, nd - 1);
  const int64_t stride = in.strides().back();
  const char* base = static_cast<const char*>(in.raw_data());
  const auto es = static_cast<int64_t>(in.element_size());
  int64_t* idx = indices.data_ptr<int64_t>();
  visit_dtype(in.dtype(), [&]<class T>() {
    using A = std::conditional_t<std::is_same_v<T, double>, double,
                                 std::conditional_t<std::is_floating_point_v<acc_t<T>>, float, int64_t>>;
    std::vector<A> vals(static_cast<size_t>(keep.numel));
#pragma omp parallel for if (keep.numel * n >= kParallelGrain) schedule(static)
    for (int64_t o = 0; o < keep.numel; ++o) {
      const char* p = base + offset_of(keep, o) * es;
      A best = scalar_cast<A>(reinterpret_cast<const T*>(p)[0]);
      int64_t bi = 0;
      for (int64_t j = 1; j < n && best == best; ++j) {
        const A v = scalar_cast<A>(reinterpret_cast<const T*>(p)[j * stride]);
        if (v != v || (is_max ? v > best : v < best)) {
          best = v;
          bi = j;
        }
      }
      vals[static_cast<size_t>(o)] = best;
      idx[o] = bi;
    }
    store_block<A>(static_cast<char*>(values.raw_data()), 1, values.dtype(), keep.numel, vals.data());
  });
}

}  // namespace

MP_REGISTER_KERNEL(reduce_kernel, DeviceType::cpu, &reduce_cpu);
MP_REGISTER_KERNEL(arg_reduce_kernel, DeviceType::cpu, &arg_reduce_cpu);

}  // namespace mp::backend::cpu

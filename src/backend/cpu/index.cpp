// CPU index kernels: embedding gather and its race-free scatter-add backward, and dropout with a
// counter-based (Philox) mask.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/index_kernels.hpp"

namespace mp::backend::cpu {
namespace {

// Per-thread private gradient buffers are used only while they stay below this many elements in all.
constexpr int64_t kMaxPrivateElems = int64_t{1} << 24;

// Call f.template operator()<I>() with I the C++ type of an index tensor (i64 or i32).
template <class F>
void visit_index(const Tensor& indices, const char* op, F&& f) {
  if (indices.dtype() == DType::i64) return f.template operator()<int64_t>();
  if (indices.dtype() == DType::i32) return f.template operator()<int32_t>();
  MP_FAIL(op, ": expected i64 or i32 indices, got ", indices.describe(), "; convert with .to(mp::DType::i64)");
}

// ---------------------------------------------------------------- embedding

void embedding_cpu(const Tensor& out, const Tensor& weight, const Tensor& indices) {
  const int64_t M = indices.numel(), V = weight.sizes()[0], D = weight.sizes()[1];
  const size_t row_bytes = static_cast<size_t>(D) * weight.element_size();
  const char* w = static_cast<const char*>(weight.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  visit_index(indices, "embedding", [&]<class I>() {
    const I* idx = indices.data_ptr<I>();
    for (int64_t m = 0; m < M; ++m)
      MP_CHECK(idx[m] >= 0 && idx[m] < V, "embedding: index ", static_cast<int64_t>(idx[m]), " (at flat position ", m,
               ") is out of range for a weight with V = ", V, " rows; expected 0 <= index < ", V);
#pragma omp parallel for if (should_parallelize(M * D)) schedule(static)
    for (int64_t m = 0; m < M; ++m)
      std::memcpy(o + static_cast<size_t>(m) * row_bytes, w + static_cast<size_t>(idx[m]) * row_bytes, row_bytes);
  });
}

// dst[idx[m], c0:c1] += grad_out[m, c0:c1] for m in [m0, m1) (dst is a [V, D] buffer of A).
template <class A, class I>
void scatter_rows(A* dst, const Tensor& go, const I* idx, int64_t m0, int64_t m1, int64_t c0, int64_t c1, int64_t D,
                  int64_t pad) {
  alignas(64) A buf[kBlock];
  for (int64_t m = m0; m < m1; ++m) {
    const int64_t i = static_cast<int64_t>(idx[m]);
    if (i == pad) continue;
    for (int64_t j0 = c0; j0 < c1; j0 += kBlock) {
      const int64_t n = std::min(kBlock, c1 - j0);
      const A* g = load_at<A>(go, m * D + j0, n, buf);
      A* row = dst + i * D + j0;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) row[j] += g[j];
    }
  }
}

// Note [race-free embedding backward]
// Two rows of grad_out may hit the same weight row (repeated indices), so threads must never add into one
// row concurrently. Wide rows split the columns: each thread owns a column range of every weight row and
// walks all indices. Narrow rows (few columns per thread) split the indices instead, each thread adding
// into its own zeroed [V, D] buffer, and the buffers are summed afterwards (while they fit a memory cap);
// otherwise one thread does it all. Each weight element receives its additions in index order within a
// thread, so the result is deterministic for a given thread count.
template <class A, class I>
void embedding_backward_typed(const Tensor& gw, const Tensor& go, const I* idx, int64_t padding_idx) {
  const int64_t V = gw.sizes()[0], D = gw.sizes()[1], M = go.numel() / std::max<int64_t>(D, 1);
  A* dst = gw.data_ptr<A>();
  const int nt = omp_get_max_threads();
  if (!should_parallelize(M * D)) {
    scatter_rows<A, I>(dst, go, idx, 0, M, 0, D, D, padding_idx);
  } else if (D >= 16 * nt) {
#pragma omp parallel
    {
      const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
      scatter_rows<A, I>(dst, go, idx, 0, M, D * t / n, D * (t + 1) / n, D, padding_idx);
    }
  } else if (V * D * (nt - 1) <= kMaxPrivateElems) {
    std::vector<std::vector<A>> priv(static_cast<size_t>(nt - 1));
    int used = 1;
#pragma omp parallel
    {
      const int t = omp_get_thread_num(), n = omp_get_num_threads();
#pragma omp single
      used = n;
      A* mine = dst;
      if (t > 0) {
        priv[static_cast<size_t>(t - 1)].assign(static_cast<size_t>(V * D), A(0));
        mine = priv[static_cast<size_t>(t - 1)].data();
      }
      scatter_rows<A, I>(mine, go, idx, M * t / n, M * (t + 1) / n, 0, D, D, padding_idx);
    }
    const int64_t total = V * D;
#pragma omp parallel for if (should_parallelize(total * used)) schedule(static)
    for (int64_t k = 0; k < total; ++k) {
      A s = dst[k];
      for (int t = 1; t < used; ++t) s += priv[static_cast<size_t>(t - 1)][static_cast<size_t>(k)];
      dst[k] = s;
    }
  } else {
    scatter_rows<A, I>(dst, go, idx, 0, M, 0, D, D, padding_idx);
  }
}

void embedding_backward_cpu(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& indices,
                            int64_t padding_idx) {
  visit_index(indices, "embedding_backward", [&]<class I>() {
    const I* idx = indices.data_ptr<I>();
    if (grad_weight.dtype() == DType::f64)
      embedding_backward_typed<double, I>(grad_weight, grad_out, idx, padding_idx);
    else
      embedding_backward_typed<float, I>(grad_weight, grad_out, idx, padding_idx);
  });
}

// ---------------------------------------------------------------- dropout

// The mask and output of one block of draws [d0, d0 + n): the Philox words of the blocks it spans
// come from philox_blocks_soa (16 blocks per AVX-512 pass where allowed; measured 5x faster than
// one scalar Philox call per 4 draws), then the keep rule and the scaling run as a vector loop.
template <class A>
struct DropoutLanes {
  uint64_t seed;
  float p;
  A scale;
  MP_FORCE_INLINE void operator()(uint64_t d0, int64_t n, const A* x, A* y, uint8_t* mk) const {
    constexpr int64_t kWords = 4 * (kBlock / 4 + 2 * kPhiloxLanes);
    alignas(64) uint32_t words[kWords];
    const uint64_t b0 = d0 >> 2;
    const int64_t nb = static_cast<int64_t>(((d0 + static_cast<uint64_t>(n) - 1) >> 2) - b0 + 1);
    philox_blocks_soa(seed, b0, nb, words);
    const uint32_t* w = words + (d0 & 3);
    const float pp = p;
    const A s = scale;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) {
      const bool keep = dropout_keeps(philox_to_uniform(w[j]), pp);
      mk[j] = keep ? 1 : 0;
      y[j] = keep ? x[j] * s : A(0);
    }
  }
};

template <class A>
void dropout_typed(const Tensor& out, const Tensor& mask, const Tensor& in, float p, A scale, PhiloxState st) {
  const int64_t n = in.numel(), nblk = (n + kBlock - 1) / kBlock;
  uint8_t* mk = mask.data_ptr<uint8_t>();
  const DropoutLanes<A> lanes{st.seed, p, scale};
  const bool vec = vector_loops_enabled();
#pragma omp parallel for if (should_parallelize(n)) schedule(static)
  for (int64_t b = 0; b < nblk; ++b) {
    const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
    alignas(64) A xbuf[kBlock], ybuf[kBlock];
    const A* x = load_at<A>(in, i0, len, xbuf);
    A* y = dest_at<A>(out, i0, ybuf);
    call_isa(vec, lanes, st.offset + static_cast<uint64_t>(i0), len, x, y, mk + i0);
    flush_at<A>(out, i0, len, y);
  }
}

void dropout_cpu(const Tensor& out, const Tensor& mask, const Tensor& in, float p, double scale, PhiloxState st) {
  if (in.dtype() == DType::f64)
    dropout_typed<double>(out, mask, in, p, scale, st);
  else
    dropout_typed<float>(out, mask, in, p, static_cast<float>(scale), st);
}

// grad_in = grad_out * mask * scale over one block (the u8 mask widened in the vector loop: the
// baseline SSE2 loop stayed scalar).
template <class A>
struct DropoutBackwardLanes {
  A scale;
  MP_FORCE_INLINE void operator()(const A* g, const uint8_t* mk, A* o, int64_t n) const {
    const A s = scale;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) o[j] = mk[j] != 0 ? g[j] * s : A(0);
  }
};

template <class A>
void dropout_backward_typed(const Tensor& gi, const Tensor& go, const Tensor& mask, A scale) {
  const int64_t n = go.numel(), nblk = (n + kBlock - 1) / kBlock;
  const uint8_t* mk = mask.data_ptr<uint8_t>();
  const DropoutBackwardLanes<A> lanes{scale};
  const bool vec = vector_loops_enabled();
#pragma omp parallel for if (should_parallelize(n)) schedule(static)
  for (int64_t b = 0; b < nblk; ++b) {
    const int64_t i0 = b * kBlock, len = std::min(kBlock, n - i0);
    alignas(64) A gbuf[kBlock], obuf[kBlock];
    const A* g = load_at<A>(go, i0, len, gbuf);
    A* o = dest_at<A>(gi, i0, obuf);
    call_isa(vec, lanes, g, mk + i0, o, len);
    flush_at<A>(gi, i0, len, o);
  }
}

void dropout_backward_cpu(const Tensor& grad_in, const Tensor& grad_out, const Tensor& mask, double scale) {
  if (grad_in.dtype() == DType::f64 || grad_out.dtype() == DType::f64)
    dropout_backward_typed<double>(grad_in, grad_out, mask, scale);
  else
    dropout_backward_typed<float>(grad_in, grad_out, mask, static_cast<float>(scale));
}

}  // namespace

MP_REGISTER_KERNEL(embedding_kernel, DeviceType::cpu, &embedding_cpu);
MP_REGISTER_KERNEL(embedding_backward_kernel, DeviceType::cpu, &embedding_backward_cpu);
MP_REGISTER_KERNEL(dropout_kernel, DeviceType::cpu, &dropout_cpu);
MP_REGISTER_KERNEL(dropout_backward_kernel, DeviceType::cpu, &dropout_backward_cpu);

}  // namespace mp::backend::cpu

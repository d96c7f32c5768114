// CPU kernels of loss scaling: multi-tensor unscale + finite check, and underflow statistics.
// The work list is every (tensor, block) pair of all tensors, so a model of many small tensors
// still uses every thread in one parallel region.
#include <omp.h>

#include <vector>

#include "backend/amp_kernels.hpp"
#include "backend/cpu/loops.hpp"

namespace mp::backend::cpu {
namespace {

struct Chunk {
  size_t tensor;
  int64_t start, len;
};

// Blocks of 16 kBlock-sized pieces per work item: big enough to amortise scheduling.
std::vector<Chunk> make_chunks(std::span<const Tensor> ts) {
  constexpr int64_t kChunk = kBlock * 16;
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < ts.size(); ++i) {
    MP_ASSERT(ts[i].is_contiguous(), "unscale: tensor ", i, " is not contiguous");
    for (int64_t s = 0; s < ts[i].numel(); s += kChunk) chunks.push_back({i, s, std::min(kChunk, ts[i].numel() - s)});
  }
  return chunks;
}

int64_t total_elements(std::span<const Tensor> ts) {
  int64_t n = 0;
  for (const Tensor& t : ts) n += t.numel();
  return n;
}

template <class C>
bool unscale_chunk(const Tensor& t, int64_t start, int64_t len, C inv, bool write) {
  char* base = static_cast<char*>(t.raw_data());
  const auto es = static_cast<int64_t>(t.element_size());
  bool finite = true;
  for (int64_t j0 = start; j0 < start + len; j0 += kBlock) {
    const int64_t n = std::min(kBlock, start + len - j0);
    alignas(64) C buf[kBlock];
    const C* v = load_block<C>(base + j0 * es, 1, t.dtype(), n, buf);
    bool ok = true;
#pragma omp simd reduction(&& : ok)
    for (int64_t j = 0; j < n; ++j) ok = ok && is_finite_value(v[j]);
    finite = finite && ok;
    if (write) {
      C* out = t.dtype() == dtype_of<C>() ? reinterpret_cast<C*>(base + j0 * es) : buf;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[j] = v[j] * inv;
      if (t.dtype() != dtype_of<C>()) store_block<C>(base + j0 * es, 1, t.dtype(), n, out);
    }
  }
  return finite;
}

bool unscale_cpu(std::span<const Tensor> ts, double inv_scale, bool write) {
  const std::vector<Chunk> chunks = make_chunks(ts);
  const bool parallel = total_elements(ts) >= kParallelGrain && !omp_in_parallel();
  bool all_finite = true;
#pragma omp parallel for schedule(dynamic, 4) reduction(&& : all_finite) if (parallel)
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Tensor& t = ts[chunks[c].tensor];
    const bool ok = t.dtype() == DType::f64
                        ? unscale_chunk<double>(t, chunks[c].start, chunks[c].len, inv_scale, write)
                        : unscale_chunk<float>(t, chunks[c].start, chunks[c].len, static_cast<float>(inv_scale), write);
    all_finite = all_finite && ok;
  }
  return !all_finite;
}

UnderflowCounts underflow_cpu(std::span<const Tensor> ts, double scale) {
  const std::vector<Chunk> chunks = make_chunks(ts);
  int64_t nonzero = 0, flushed = 0, subnormal = 0, nonfinite = 0;
  const bool parallel = total_elements(ts) >= kParallelGrain && !omp_in_parallel();
#pragma omp parallel for schedule(dynamic, 4) reduction(+ : nonzero, flushed, subnormal, nonfinite) if (parallel)
  for (size_t c = 0; c < chunks.size(); ++c) {
    const Tensor& t = ts[chunks[c].tensor];
    const char* base = static_cast<const char*>(t.raw_data());
    const auto es = static_cast<int64_t>(t.element_size());
    for (int64_t j0 = chunks[c].start; j0 < chunks[c].start + chunks[c].len; j0 += kBlock) {
      const int64_t n = std::min(kBlock, chunks[c].start + chunks[c].len - j0);
      alignas(64) double buf[kBlock];
      const double* v = load_block<double>(base + j0 * es, 1, t.dtype(), n, buf);
      for (int64_t j = 0; j < n; ++j) {
        if (!is_finite_value(v[j])) {
          ++nonfinite;
          continue;
        }
        const int cls = f16_range_class(v[j], scale);
        nonzero += cls != 0;
        flushed += cls == 1;
        subnormal += cls == 2;
      }
    }
  }
  return {nonzero, flushed, subnormal, nonfinite};
}

}  // namespace

MP_REGISTER_KERNEL(unscale_kernel, DeviceType::cpu, &unscale_cpu);
MP_REGISTER_KERNEL(underflow_kernel, DeviceType::cpu, &underflow_cpu);

}  // namespace mp::backend::cpu

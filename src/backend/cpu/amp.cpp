// CPU kernels of loss scaling: multi-tensor unscale + finite check, and underflow statistics.
// The work list is every (tensor, block) pair of all tensors, so a model of many small tensors
// still uses every thread in one parallel region.
#include <omp.h>

#include <algorithm>
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

// Note [finite check on 16-bit bits]
// The check-only pass of the fused step (Note [GradScaler fused step]) over 16-bit gradients reads their bits: a
// bf16 or f16 value is inf or NaN iff its exponent field is all ones, i.e. iff (bits & 0x7fff) reaches the first
// such pattern (0x7f80 bf16, 0x7c00 f16). One max over int16 lanes, no widening: the widening loop ran at 5.6 GB/s on
// an fp16 MLP's gradients (Zen 3, 2 threads), a float reduction waiting on its own additions.
bool finite_16bit_chunk(const Tensor& t, int64_t start, int64_t len) {
  const int16_t first_nonfinite = t.dtype() == DType::bf16 ? int16_t{0x7f80} : int16_t{0x7c00};
  const auto* bits = static_cast<const int16_t*>(t.raw_data()) + start;
  int16_t top = 0;
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < len; ++j) top = std::max(top, static_cast<int16_t>(bits[j] & 0x7fff));
  return top < first_nonfinite;
}

template <class C>
bool unscale_chunk(const Tensor& t, int64_t start, int64_t len, C inv, bool write) {
  if (!write && (t.dtype() == DType::bf16 || t.dtype() == DType::f16)) return finite_16bit_chunk(t, start, len);
  char* base = static_cast<char*>(t.raw_data());
  const auto es = static_cast<int64_t>(t.element_size());
  bool finite = true;
  for (int64_t j0 = start; j0 < start + len; j0 += kBlock) {
    const int64_t n = std::min(kBlock, start + len - j0);
    alignas(64) C buf[kBlock];
    const C* v = load_block<C>(base + j0 * es, 1, t.dtype(), n, buf);
    // x - x is 0 for finite x and NaN for inf/NaN, and NaN survives a sum: one vectorised
    // reduction instead of a branch per element.
    C probe = C(0);
#pragma omp simd reduction(+ : probe)
    for (int64_t j = 0; j < n; ++j) probe += v[j] - v[j];
    finite = finite && probe == C(0);
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
      // f32 is exact for the 16-bit and f32 gradients this classifies (f64 gradients are rounded to f32
      // first, which can move a value across a class boundary by at most half an f32 ulp).
      alignas(64) float buf[kBlock];
      const float* v = load_block<float>(base + j0 * es, 1, t.dtype(), n, buf);
      const auto s = static_cast<float>(scale);
      const auto min_sub = static_cast<float>(kF16MinSubnormal), min_normal = static_cast<float>(kF16MinNormal);
      // Branch-free classification (same classes as f16_range_class); NaN compares false everywhere.
      int32_t nz = 0, fl = 0, sub = 0, nf = 0;
#pragma omp simd reduction(+ : nz, fl, sub, nf)
      for (int64_t j = 0; j < n; ++j) {
        const float a = (v[j] < 0.0f ? -v[j] : v[j]) * s;
        const int32_t finite = (v[j] - v[j]) == 0.0f;
        nf += 1 - finite;
        nz += static_cast<int32_t>(a > 0.0f) & finite;
        fl += static_cast<int32_t>(a > 0.0f) & static_cast<int32_t>(a < min_sub);
        sub += static_cast<int32_t>(a >= min_sub) & static_cast<int32_t>(a < min_normal);
      }
      nonzero += nz;
      flushed += fl;
      subnormal += sub;
      nonfinite += nf;
    }
  }
  return {nonzero, flushed, subnormal, nonfinite};
}

}  // namespace

MP_REGISTER_KERNEL(unscale_kernel, DeviceType::cpu, &unscale_cpu);
MP_REGISTER_KERNEL(underflow_kernel, DeviceType::cpu, &underflow_cpu);

}  // namespace mp::backend::cpu

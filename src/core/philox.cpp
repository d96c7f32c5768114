#include "mp/core/philox.hpp"

#include <algorithm>

#include "mp/core/error.hpp"

namespace mp {
namespace {

// Below this many elements one thread fills the whole tensor.
constexpr size_t kParallelMin = size_t{1} << 15;
// Elements per parallel chunk (a multiple of 4, so chunks of an aligned tensor start on blocks).
constexpr size_t kChunk = 8192;

// Fills dst[0, n) with f(block words, k) where element i is draw offset + i and k = draw % 4,
// computing each Philox block once. Element values depend only on (seed, offset, i).
template <class F>
void fill_blocks(uint64_t seed, uint64_t offset, float* dst, size_t n, F from_block) {
  auto fill_range = [&](size_t begin, size_t end) {
    size_t i = begin;
    while (i < end) {
      const uint64_t j = offset + i;
      const U32x4 b = philox_block(seed, j >> 2);
      const size_t first = static_cast<size_t>(j & 3);
      const size_t count = std::min<size_t>(4 - first, end - i);
      for (size_t k = 0; k < count; ++k) dst[i + k] = from_block(b, static_cast<unsigned>(first + k));
      i += count;
    }
  };
  if (n < kParallelMin) {
    fill_range(0, n);
    return;
  }
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kChunk;
    fill_range(begin, std::min(n, begin + kChunk));
  }
}

}  // namespace

void philox_fill_uniform(uint64_t seed, uint64_t offset, float* dst, size_t n) {
  fill_blocks(seed, offset, dst, n, [](const U32x4& b, unsigned k) { return philox_to_uniform(b.v[k]); });
}

void philox_fill_normal(uint64_t seed, uint64_t offset, float* dst, size_t n) {
  fill_blocks(seed, offset, dst, n, [](const U32x4& b, unsigned k) {
    const unsigned pair = k & 2u;
    return philox_to_normal(b.v[pair], b.v[pair + 1], (k & 1u) != 0);
  });
}

Generator::Generator(uint64_t seed) : seed_(seed) {}

Generator::Generator(const Generator& other) {
  const PhiloxState s = other.state();
  seed_ = s.seed;
  offset_ = s.offset;
}

Generator& Generator::operator=(const Generator& other) {
  if (this != &other) {
    const PhiloxState s = other.state();
    set_state(s.seed, s.offset);
  }
  return *this;
}

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seed_;
}

uint64_t Generator::offset() const {
  std::lock_guard<std::mutex> lock(mu_);
  return offset_;
}

PhiloxState Generator::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return PhiloxState{seed_, offset_};
}

uint64_t Generator::advance(uint64_t n) { return reserve(n).offset; }

PhiloxState Generator::reserve(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  const PhiloxState old{seed_, offset_};
  offset_ += (n + 3) & ~uint64_t{3};  // whole blocks: Note [Philox stream convention]
  return old;
}

// Note [draws keyed by the global batch]
// N data-parallel ranks at batch B should draw the dropout masks one process at batch N x B draws, so that the two
// train the same weights with dropout on (issue 26). Philox's element i depends only on (seed, offset + i) (Note
// [Philox stream convention]), so this needs no communication: every rank keeps the same stream, each batch-major
// draw advances it by the global tensor's size, and rank r takes the draws of rows [r B, (r + 1) B) of the global
// tensor, at offset + r n. Exact for tensors whose first dimension is the batch (the MLP's and GPT's activations,
// attention weights [B, H, T, T]); a time-major tensor ([T, B, H]: the word LM) gets disjoint, independent draws on
// each rank but not a single process's. Offsets that are not a multiple of 4 cost the CUDA kernels a second Philox
// call for a thread's first block (Note [CUDA dropout]), nothing else.
void Generator::set_batch_shard(int index, int count) {
  MP_CHECK(count >= 1 && index >= 0 && index < count, "Generator::set_batch_shard: expected 0 <= index < count, got ",
           index, " of ", count);
  std::lock_guard<std::mutex> lock(mu_);
  shard_index_ = index;
  shard_count_ = count;
}

PhiloxState Generator::reserve_batch(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  PhiloxState part{seed_, offset_ + static_cast<uint64_t>(shard_index_) * n};
  offset_ += (n * static_cast<uint64_t>(shard_count_) + 3) & ~uint64_t{3};  // the global tensor's whole blocks
  return part;
}

void Generator::set_state(uint64_t seed, uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  seed_ = seed;
  offset_ = offset;
}

Generator& default_generator() {
  static Generator generator(Generator::kDefaultSeed);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().set_state(seed, 0); }

}  // namespace mp

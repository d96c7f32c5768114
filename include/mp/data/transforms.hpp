#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "mp/tensor/tensor.hpp"

namespace mp::data {

// Note [data random streams]
// A random transform of one example draws from Rng(seed, stream): Philox4x32-10 keyed by `seed`,
// counter = {draw index (64 bits), stream (64 bits)}. Stream 0 is the tensor factories' stream of
// key `seed` (Note [Philox stream convention]); every other stream uses the counter words 2-3
// that the factories keep at 0, so it never overlaps them. (seed, stream) alone fixes every draw:
// the batch a worker thread builds does not depend on which thread builds it or when.

/// A random-number source for transforms of one example (Philox-based, see mp/core/philox.hpp).
class Rng {
 public:
  /// Draws of sub-stream `stream` of Philox key `seed` (Note [data random streams]).
  explicit Rng(uint64_t seed, uint64_t stream);
  /// A float in [0, 1) on a 2^-24 grid.
  float uniform();
  /// An integer in [0, n), unbiased (Lemire's multiply-and-reject); n must be >= 1 (n < 2^32).
  int64_t randint(int64_t n);
  /// The next raw 32-bit draw.
  uint32_t next_u32();

 private:
  uint64_t seed_;
  uint64_t stream_;
  uint64_t block_ = 0;  ///< next Philox block to compute
  uint32_t buf_[4] = {0, 0, 0, 0};
  int used_ = 4;  ///< words of buf_ consumed
};

/// An image transform on f32 [C,H,W] in [0,1] (after ToTensor-style scaling of u8 by 1/255).
class Transform {
 public:
  virtual ~Transform();
  /// The transformed image, contiguous f32 [C',H',W'] (`img` itself when nothing changes; never written).
  virtual Tensor operator()(const Tensor& img, Rng& rng) const = 0;
};

/// (x - mean[c]) / std[c] per channel (one value each: the same for every channel).
std::shared_ptr<Transform> normalize(std::vector<float> mean, std::vector<float> std);
/// Zero-pad `padding` pixels on every side, then crop a random size x size window (torchvision
/// RandomCrop(size, padding): top = randint(H + 2p - size + 1), then left likewise).
std::shared_ptr<Transform> random_crop(int64_t size, int64_t padding);
/// Mirror left-right with probability p (one uniform() draw per call, flip when it is < p).
std::shared_ptr<Transform> random_horizontal_flip(double p = 0.5);
/// Bilinear resize to size x size (half-pixel centres, as torch interpolate align_corners=False).
std::shared_ptr<Transform> resize(int64_t size);
/// Apply `ts` in order (null entries are skipped), all drawing from the same Rng.
std::shared_ptr<Transform> compose(std::vector<std::shared_ptr<Transform>> ts);

}  // namespace mp::data

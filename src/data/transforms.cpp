// Image transforms of mp::data on f32 [C,H,W] tensors and the per-example Rng
// (Note [data random streams] in mp/data/transforms.hpp). Each transform is one pass over raw
// pointers: no per-pixel Tensor ops.
#include "mp/data/transforms.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "mp/core/error.hpp"
#include "mp/core/philox.hpp"

namespace mp::data {

Rng::Rng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}

uint32_t Rng::next_u32() {
  if (used_ == 4) {
    const U32x4 ctr{{static_cast<uint32_t>(block_), static_cast<uint32_t>(block_ >> 32), static_cast<uint32_t>(stream_),
                     static_cast<uint32_t>(stream_ >> 32)}};
    const U32x4 out = philox4x32_10(ctr, static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32));
    std::memcpy(buf_, out.v, sizeof(buf_));
    ++block_;
    used_ = 0;
  }
  return buf_[used_++];
}

float Rng::uniform() { return philox_to_uniform(next_u32()); }

int64_t Rng::randint(int64_t n) {
  MP_CHECK(n >= 1 && n <= int64_t{1} << 32, "Rng::randint: expected 1 <= n <= 2^32, got n = ", n,
           "; draw from a smaller range");
  if (n == int64_t{1} << 32) return next_u32();
  // Lemire, "Fast random integer generation in an interval" (2019): unbiased multiply-and-reject.
  const uint64_t range = static_cast<uint64_t>(n);
  uint64_t m = static_cast<uint64_t>(next_u32()) * range;
  uint32_t low = static_cast<uint32_t>(m);
  if (low < range) {
    const uint32_t threshold = static_cast<uint32_t>((uint64_t{1} << 32) % range);
    while (low < threshold) {
      m = static_cast<uint64_t>(next_u32()) * range;
      low = static_cast<uint32_t>(m);
    }
  }
  return static_cast<int64_t>(m >> 32);
}

Transform::~Transform() = default;

namespace {

// The input of a transform as a contiguous f32 [C,H,W] tensor; throws naming the transform.
Tensor image_input(const Tensor& img, const char* op) {
  MP_CHECK(img.defined() && img.dim() == 3 && img.dtype() == DType::f32 && img.device().is_cpu(), op,
           ": expected a CPU f32 image [C,H,W], got ", img.defined() ? img.describe() : std::string("undefined"),
           "; transforms run on single examples before batching");
  return img.contiguous();
}

class Normalize final : public Transform {
 public:
  Normalize(std::vector<float> mean, std::vector<float> std) : mean_(std::move(mean)), inv_std_(std.size()) {
    MP_CHECK(!mean_.empty() && mean_.size() == std.size(),
             "normalize: expected mean and std of the same non-zero "
             "length (one value per channel), got ",
             mean_.size(), " and ", std.size());
    for (size_t c = 0; c < std.size(); ++c) {
      MP_CHECK(std[c] > 0.0f && std::isfinite(std[c]), "normalize: expected every std > 0, got std[", c, "] = ", std[c],
               "; compute them with channel_stats()");
      inv_std_[c] = 1.0f / std[c];
    }
  }
  Tensor operator()(const Tensor& in, Rng&) const override {
    const Tensor img = image_input(in, "normalize");
    const int64_t C = img.size(0), plane = img.size(1) * img.size(2);
    MP_CHECK(mean_.size() == 1 || static_cast<int64_t>(mean_.size()) == C, "normalize: expected ", mean_.size(),
             "-channel images (the length of mean/std), got ", img.describe());
    Tensor out = empty(img.sizes());
    const float* src = img.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t c = 0; c < C; ++c) {
      const size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(c);
      const float m = mean_[k], s = inv_std_[k];
      const float* a = src + c * plane;
      float* o = dst + c * plane;
      for (int64_t i = 0; i < plane; ++i) o[i] = (a[i] - m) * s;
    }
    return out;
  }

 private:
  std::vector<float> mean_;
  std::vector<float> inv_std_;
};

class RandomCrop final : public Transform {
 public:
  RandomCrop(int64_t size, int64_t padding) : size_(size), padding_(padding) {
    MP_CHECK(size >= 1 && padding >= 0, "random_crop: expected size >= 1 and padding >= 0, got size ", size,
             ", padding ", padding);
  }
  Tensor operator()(const Tensor& in, Rng& rng) const override {
    const Tensor img = image_input(in, "random_crop");
    const int64_t C = img.size(0), H = img.size(1), W = img.size(2), p = padding_, S = size_;
    MP_CHECK(H + 2 * p >= S && W + 2 * p >= S, "random_crop: expected the padded image (", H + 2 * p, "x", W + 2 * p,
             ") to be at least the crop size ", S, ", got ", img.describe(), "; use a smaller size or more padding");
    const int64_t top = rng.randint(H + 2 * p - S + 1) - p;  // row of the input at output row 0
    const int64_t left = rng.randint(W + 2 * p - S + 1) - p;
    Tensor out = empty({C, S, S});
    const float* src = img.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    // Output columns [x0, x1) read input columns [x0 + left, x1 + left) inside [0, W).
    const int64_t x0 = std::clamp<int64_t>(-left, 0, S), x1 = std::clamp<int64_t>(W - left, x0, S);
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t y = 0; y < S; ++y) {
        float* o = dst + (c * S + y) * S;
        const int64_t sy = y + top;
        if (sy < 0 || sy >= H) {
          std::fill(o, o + S, 0.0f);
          continue;
        }
        std::fill(o, o + x0, 0.0f);
        if (x1 > x0) std::memcpy(o + x0, src + (c * H + sy) * W + x0 + left, sizeof(float) * (x1 - x0));
        std::fill(o + x1, o + S, 0.0f);
      }
    }
    return out;
  }

 private:
  int64_t size_, padding_;
};

class RandomHorizontalFlip final : public Transform {
 public:
  explicit RandomHorizontalFlip(double p) : p_(p) {
    MP_CHECK(p >= 0.0 && p <= 1.0, "random_horizontal_flip: expected a probability in [0, 1], got ", p);
  }
  Tensor operator()(const Tensor& in, Rng& rng) const override {
    const Tensor img = image_input(in, "random_horizontal_flip");
    if (!(static_cast<double>(rng.uniform()) < p_)) return img;
    const int64_t rows = img.size(0) * img.size(1), W = img.size(2);
    Tensor out = empty(img.sizes());
    const float* src = img.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) std::reverse_copy(src + r * W, src + (r + 1) * W, dst + r * W);
    return out;
  }

 private:
  double p_;
};

// Source index pair and weight of bilinear interpolation along one axis (half-pixel centres,
// align_corners=False, negative source coordinates clamped to 0 as in PyTorch).
struct Tap {
  int64_t i0, i1;
  float w1;  // weight of i1; i0 gets 1 - w1
};

std::vector<Tap> bilinear_taps(int64_t in, int64_t out) {
  std::vector<Tap> taps(static_cast<size_t>(out));
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  for (int64_t o = 0; o < out; ++o) {
    const double src = std::max(0.0, (o + 0.5) * scale - 0.5);
    const int64_t i0 = std::min<int64_t>(static_cast<int64_t>(src), in - 1);
    const int64_t i1 = std::min<int64_t>(i0 + 1, in - 1);
    taps[static_cast<size_t>(o)] = {i0, i1, static_cast<float>(src - static_cast<double>(i0))};
  }
  return taps;
}

class Resize final : public Transform {
 public:
  explicit Resize(int64_t size) : size_(size) { MP_CHECK(size >= 1, "resize: expected size >= 1, got ", size); }
  Tensor operator()(const Tensor& in, Rng&) const override {
    const Tensor img = image_input(in, "resize");
    const int64_t C = img.size(0), H = img.size(1), W = img.size(2), S = size_;
    MP_CHECK(H >= 1 && W >= 1, "resize: expected a non-empty image, got ", img.describe());
    if (H == S && W == S) return img;
    const std::vector<Tap> ty = bilinear_taps(H, S), tx = bilinear_taps(W, S);
    Tensor out = empty({C, S, S});
    const float* src = img.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    std::vector<float> row(static_cast<size_t>(S));
    for (int64_t c = 0; c < C; ++c) {
      const float* plane = src + c * H * W;
      for (int64_t y = 0; y < S; ++y) {
        const Tap& t = ty[static_cast<size_t>(y)];
        const float* r0 = plane + t.i0 * W;
        const float* r1 = plane + t.i1 * W;
        float* o = dst + (c * S + y) * S;
        for (int64_t x = 0; x < S; ++x) {
          const Tap& u = tx[static_cast<size_t>(x)];
          const float top = r0[u.i0] + u.w1 * (r0[u.i1] - r0[u.i0]);
          const float bot = r1[u.i0] + u.w1 * (r1[u.i1] - r1[u.i0]);
          o[x] = top + t.w1 * (bot - top);
        }
      }
    }
    return out;
  }

 private:
  int64_t size_;
};

class Compose final : public Transform {
 public:
  explicit Compose(std::vector<std::shared_ptr<Transform>> ts) : ts_(std::move(ts)) {}
  Tensor operator()(const Tensor& img, Rng& rng) const override {
    Tensor x = img;
    for (const auto& t : ts_)
      if (t) x = (*t)(x, rng);
    return x.contiguous();
  }

 private:
  std::vector<std::shared_ptr<Transform>> ts_;
};

}  // namespace

std::shared_ptr<Transform> normalize(std::vector<float> mean, std::vector<float> std) {
  return std::make_shared<Normalize>(std::move(mean), std::move(std));
}
std::shared_ptr<Transform> random_crop(int64_t size, int64_t padding) {
  return std::make_shared<RandomCrop>(size, padding);
}
std::shared_ptr<Transform> random_horizontal_flip(double p) { return std::make_shared<RandomHorizontalFlip>(p); }
std::shared_ptr<Transform> resize(int64_t size) { return std::make_shared<Resize>(size); }
std::shared_ptr<Transform> compose(std::vector<std::shared_ptr<Transform>> ts) {
  return std::make_shared<Compose>(std::move(ts));
}

}  // namespace mp::data

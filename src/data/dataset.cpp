// ImageDataset (u8 images in memory -> f32 batches) and channel_stats.
#include "mp/data/dataset.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "mp/core/error.hpp"

namespace mp::data {

const char* split_name(Split s) {
  switch (s) {
    case Split::train: return "train";
    case Split::test: return "test";
    case Split::valid: return "valid";
  }
  return "?";
}

Dataset::~Dataset() = default;

namespace {

// v / 255 for every byte, rounded exactly like torchvision's ToTensor (img.float().div(255)).
const std::array<float, 256>& byte_to_unit() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) t[static_cast<size_t>(v)] = static_cast<float>(v) / 255.0f;
    return t;
  }();
  return table;
}

void scale_bytes(const uint8_t* src, float* dst, int64_t n) {
  const std::array<float, 256>& lut = byte_to_unit();
  for (int64_t i = 0; i < n; ++i) dst[i] = lut[src[i]];
}

void check_image_data(const ImageData& d, const char* op) {
  MP_CHECK(d.images.defined() && d.images.dim() == 4 && d.images.dtype() == DType::u8 && d.images.device().is_cpu(), op,
           ": expected images as a CPU u8 tensor [N,C,H,W], got ",
           d.images.defined() ? d.images.describe() : std::string("undefined"));
  MP_CHECK(d.labels.defined() && d.labels.dim() == 1 && d.labels.dtype() == DType::i64 &&
               d.labels.size(0) == d.images.size(0),
           op, ": expected labels as i64 [", d.images.size(0), "] (one per image), got ",
           d.labels.defined() ? d.labels.describe() : std::string("undefined"));
}

}  // namespace

ImageDataset::ImageDataset(ImageData data, std::shared_ptr<Transform> transform)
    : data_(std::move(data)), transform_(std::move(transform)) {
  check_image_data(data_, "ImageDataset");
  data_.images = data_.images.contiguous();
  data_.labels = data_.labels.contiguous();
}

int64_t ImageDataset::size() const { return data_.images.size(0); }

Batch ImageDataset::get_batch(std::span<const int64_t> indices, uint64_t seed, uint64_t first_stream) const {
  const int64_t B = static_cast<int64_t>(indices.size()), N = size();
  MP_CHECK(B > 0, "ImageDataset::get_batch: expected at least one index, got none");
  const int64_t C = channels(), H = height(), W = width(), chw = C * H * W;
  const uint8_t* images = data_.images.data_ptr<uint8_t>();
  const int64_t* labels = data_.labels.data_ptr<int64_t>();
  Tensor target = empty({B}, {.dtype = DType::i64});
  int64_t* tgt = target.data_ptr<int64_t>();
  for (int64_t p = 0; p < B; ++p) {
    const int64_t i = indices[static_cast<size_t>(p)];
    MP_CHECK(i >= 0 && i < N, "ImageDataset::get_batch: expected indices in [0, ", N, "), got ", i, " at position ", p);
    tgt[p] = labels[i];
  }
  if (!transform_) {
    Tensor input = empty({B, C, H, W});
    float* dst = input.data_ptr<float>();
    for (int64_t p = 0; p < B; ++p) scale_bytes(images + indices[static_cast<size_t>(p)] * chw, dst + p * chw, chw);
    return {input, target};
  }
  Tensor input;
  Tensor example = empty({C, H, W});
  int64_t out_numel = 0;
  for (int64_t p = 0; p < B; ++p) {
    // One buffer for every example: the transform's result (which may be the buffer itself) is
    // copied into the batch before the next example overwrites it.
    scale_bytes(images + indices[static_cast<size_t>(p)] * chw, example.data_ptr<float>(), chw);
    Rng rng(seed, first_stream + static_cast<uint64_t>(p));
    const Tensor out = (*transform_)(example, rng).contiguous();
    MP_CHECK(out.dim() == 3 && out.dtype() == DType::f32,
             "ImageDataset::get_batch: expected the transform to "
             "return an f32 image [C,H,W], got ",
             out.describe());
    if (p == 0) {
      input = empty({B, out.size(0), out.size(1), out.size(2)});
      out_numel = out.numel();
    }
    MP_CHECK(out.sizes() == Shape(input.sizes().begin() + 1, input.sizes().end()),
             "ImageDataset::get_batch: expected every transformed image to have the shape of the first, ",
             shape_str(Shape(input.sizes().begin() + 1, input.sizes().end())), ", got ", shape_str(out.sizes()),
             "; end the transform with resize() or random_crop() to a fixed size");
    std::memcpy(input.data_ptr<float>() + p * out_numel, out.raw_data(), sizeof(float) * out_numel);
  }
  return {input, target};
}

std::pair<std::vector<float>, std::vector<float>> channel_stats(const ImageData& d) {
  check_image_data(d, "channel_stats");
  const Tensor images = d.images.contiguous();
  const int64_t N = images.size(0), C = images.size(1), plane = images.size(2) * images.size(3);
  MP_CHECK(N > 0 && plane > 0, "channel_stats: expected at least one non-empty image, got ", images.describe());
  const uint8_t* px = images.data_ptr<uint8_t>();
  // Integer sums are exact (a u8 square is < 2^16; 2^47 of them fit in uint64).
  std::vector<uint64_t> sum(static_cast<size_t>(C), 0), sumsq(static_cast<size_t>(C), 0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t* a = px + (n * C + c) * plane;
      uint64_t s = 0, q = 0;
      for (int64_t i = 0; i < plane; ++i) {
        s += a[i];
        q += static_cast<uint64_t>(a[i]) * a[i];
      }
      sum[static_cast<size_t>(c)] += s;
      sumsq[static_cast<size_t>(c)] += q;
    }
  }
  std::vector<float> mean(static_cast<size_t>(C)), std(static_cast<size_t>(C));
  const double count = static_cast<double>(N) * static_cast<double>(plane);
  for (size_t c = 0; c < static_cast<size_t>(C); ++c) {
    const double m = static_cast<double>(sum[c]) / count;
    const double var = std::max(0.0, static_cast<double>(sumsq[c]) / count - m * m);
    mean[c] = static_cast<float>(m / 255.0);
    std[c] = static_cast<float>(std::sqrt(var) / 255.0);
  }
  return {mean, std};
}

}  // namespace mp::data

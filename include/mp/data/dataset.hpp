#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mp/data/transforms.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::data {

/// Which part of a data set.
enum class Split { train, test, valid };

/// "train", "test" or "valid".
const char* split_name(Split s);

/// One batch: input (f32 [B,C,H,W] images, or i64 tokens) and target (i64 [B]).
struct Batch {
  Tensor input;   ///< f32 [B,C,H,W] images or i64 tokens
  Tensor target;  ///< i64 [B] (or [t*B] for language-model windows)
};

/// A map-style dataset whose get_batch is thread-safe (const, no shared mutable state).
class Dataset {
 public:
  virtual ~Dataset();
  /// Number of examples.
  virtual int64_t size() const = 0;
  /// Examples `indices` as one batch; `seed` seeds any random transform of THIS batch (deterministic), example p
  /// of it drawing from sub-stream first_stream + p (a data-parallel rank's part of a global batch starts
  /// where its part starts: Note [data-parallel batches] in src/data/loader.cpp).
  virtual Batch get_batch(std::span<const int64_t> indices, uint64_t seed, uint64_t first_stream = 0) const = 0;
};

/// Images in memory: u8 [N,C,H,W] + i64 labels [N].
struct ImageData {
  Tensor images;                         ///< u8 [N,C,H,W]
  Tensor labels;                         ///< i64 [N], each in [0, num_classes)
  int64_t num_classes = 0;               ///< number of classes
  std::vector<std::string> class_names;  ///< num_classes names (may be empty)
};

/// Dataset over ImageData: get_batch scales u8 to [0,1] f32, applies the transform per example with
/// Rng(seed, first_stream + position in batch), stacks to [B,C,H',W']; target = labels.
class ImageDataset : public Dataset {
 public:
  /// Checks the shapes and dtypes of `data`; `transform` may be null (no transform).
  ImageDataset(ImageData data, std::shared_ptr<Transform> transform = nullptr);
  /// Number of images.
  int64_t size() const override;
  /// f32 [B,C,H',W'] inputs and i64 [B] targets of images `indices` (each in [0, size())).
  Batch get_batch(std::span<const int64_t> indices, uint64_t seed, uint64_t first_stream = 0) const override;
  /// The images and labels.
  const ImageData& data() const { return data_; }
  /// Channels of the stored images (before the transform).
  int64_t channels() const { return data_.images.size(1); }
  /// Height of the stored images (before the transform).
  int64_t height() const { return data_.images.size(2); }
  /// Width of the stored images (before the transform).
  int64_t width() const { return data_.images.size(3); }
  /// The transform (null when none).
  const std::shared_ptr<Transform>& transform() const { return transform_; }

 private:
  ImageData data_;
  std::shared_ptr<Transform> transform_;
};

/// Per-channel mean and std of the images (in [0,1] units), for normalize(). Population std (divide by
/// N*H*W), accumulated in double.
std::pair<std::vector<float>, std::vector<float>> channel_stats(const ImageData& d);

}  // namespace mp::data

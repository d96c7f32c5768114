#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mp/data/dataset.hpp"

namespace mp::data {

/// CIFAR binary version: records of <label byte(s)><3072 bytes> (3x32x32, channel-major); CIFAR-10 has
/// 1 label byte (10 classes), CIFAR-100 has 2 (coarse, fine; the fine one is used, 100 classes). Errors
/// for sizes not a multiple of the record size. Files may be gzip'd (detected by magic bytes).
ImageData read_cifar(const std::vector<std::string>& files, int64_t num_classes /*10 or 100*/);

/// CIFAR-10 from dir (data_batch_1..5.bin / test_batch.bin, also inside a cifar-10-batches-bin subfolder);
/// class names from batches.meta.txt when present, else the standard ten.
ImageData load_cifar10(Split split, const std::string& dir);

/// CIFAR-100 from dir (train.bin / test.bin, also inside cifar-100-binary); class names from
/// fine_label_names.txt when present, else the standard hundred.
ImageData load_cifar100(Split split, const std::string& dir);

}  // namespace mp::data

#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mp/data/dataset.hpp"

namespace mp::data {

/// The bytes of a file, gunzipped when it starts with the gzip magic bytes 1f 8b (whatever its name);
/// errors name the file (missing, unreadable, corrupt or truncated gzip stream). `was_gzip` (optional)
/// receives whether it was gzip'd.
std::vector<uint8_t> read_file_bytes(const std::string& path, bool* was_gzip = nullptr);

/// Read an IDX image file (magic 0x00000803, u8 [N,H,W]) and label file (0x00000801), gzip'd (.gz, detect by
/// magic bytes 1f 8b, not by name) or raw. Checks: magic, dims, sizes match the file length, N equal in both,
/// labels < num_classes. Images come back as u8 [N,1,H,W]; class names "0".."num_classes-1".
ImageData read_idx(const std::string& images_path, const std::string& labels_path, int64_t num_classes = 10);

/// Default folder of Debian's dataset-fashion-mnist.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// Fashion-MNIST train (60k) or test (10k) split from `dir` ({train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]).
/// Missing files: error naming the path and "install it with: apt-get install dataset-fashion-mnist".
ImageData load_fashion_mnist(Split split, const std::string& dir = kFashionMnistDir);

}  // namespace mp::data

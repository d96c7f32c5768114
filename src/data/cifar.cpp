// CIFAR-10 / CIFAR-100, binary version (https://www.cs.toronto.edu/~kriz/cifar.html).
#include "mp/data/cifar.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "mp/core/error.hpp"
#include "mp/data/idx.hpp"

namespace mp::data {

namespace {

constexpr int64_t kCifarPixels = 3 * 32 * 32;

const std::vector<std::string>& cifar10_names() {
  static const std::vector<std::string> names = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                 "dog",      "frog",       "horse", "ship", "truck"};
  return names;
}

const std::vector<std::string>& cifar100_names() {
  static const std::vector<std::string> names = {
      "apple",      "aquarium_fish", "baby",         "bear",       "beaver",      "bed",         "bee",
      "beetle",     "bicycle",       "bottle",       "bowl",       "boy",         "bridge",      "bus",
      "butterfly",  "camel",         "can",          "castle",     "caterpillar", "cattle",      "chair",
      "chimpanzee", "clock",         "cloud",        "cockroach",  "couch",       "crab",        "crocodile",
      "cup",        "dinosaur",      "dolphin",      "elephant",   "flatfish",    "forest",      "fox",
      "girl",       "hamster",       "house",        "kangaroo",   "keyboard",    "lamp",        "lawn_mower",
      "leopard",    "lion",          "lizard",       "lobster",    "man",         "maple_tree",  "motorcycle",
      "mountain",   "mouse",         "mushroom",     "oak_tree",   "orange",      "orchid",      "otter",
      "palm_tree",  "pear",          "pickup_truck", "pine_tree",  "plain",       "plate",       "poppy",
      "porcupine",  "possum",        "rabbit",       "raccoon",    "ray",         "road",        "rocket",
      "rose",       "sea",           "seal",         "shark",      "shrew",       "skunk",       "skyscraper",
      "snail",      "snake",         "spider",       "squirrel",   "streetcar",   "sunflower",   "sweet_pepper",
      "table",      "tank",          "telephone",    "television", "tiger",       "tractor",     "train",
      "trout",      "tulip",         "turtle",       "wardrobe",   "whale",       "willow_tree", "wolf",
      "woman",      "worm"};
  return names;
}

// Non-empty lines of a names file (batches.meta.txt, fine_label_names.txt); empty when absent.
std::vector<std::string> read_names(const std::filesystem::path& p) {
  std::vector<std::string> names;
  std::ifstream f(p);
  for (std::string line; std::getline(f, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) names.push_back(line);
  }
  return names;
}

// `dir` or its subfolder `sub`, whichever holds `probe`; error naming both and how to get the data.
std::filesystem::path find_cifar_dir(const std::string& dir, const std::string& sub, const std::string& probe,
                                     const char* op, const char* archive) {
  std::error_code ec;
  for (const std::filesystem::path& d : {std::filesystem::path(dir), std::filesystem::path(dir) / sub})
    if (std::filesystem::is_regular_file(d / probe, ec)) return d;
  MP_FAIL(op, ": ", (std::filesystem::path(dir) / probe).string(), " not found (nor ",
          (std::filesystem::path(dir) / sub / probe).string(),
          "); expected the binary version of the data set: "
          "download ",
          archive, " from https://www.cs.toronto.edu/~kriz/cifar.html and extract it into ", dir);
}

}  // namespace

ImageData read_cifar(const std::vector<std::string>& files, int64_t num_classes) {
  MP_CHECK(num_classes == 10 || num_classes == 100,
           "read_cifar: expected num_classes 10 (CIFAR-10) or 100 "
           "(CIFAR-100), got ",
           num_classes);
  MP_CHECK(!files.empty(), "read_cifar: expected at least one file, got none");
  const int64_t label_bytes = num_classes == 10 ? 1 : 2;
  const int64_t record = label_bytes + kCifarPixels;
  std::vector<std::vector<uint8_t>> contents;
  int64_t total = 0;
  for (const std::string& path : files) {
    contents.push_back(read_file_bytes(path));
    const int64_t size = static_cast<int64_t>(contents.back().size());
    if (size > 0 && size % record == 0) {
      total += size / record;
      continue;
    }
    const int64_t other_record = (num_classes == 10 ? 2 : 1) + kCifarPixels;  // the other CIFAR's record
    const std::string hint = size > 0 && size % other_record == 0
                                 ? "; it is a multiple of the CIFAR-" + std::string(num_classes == 10 ? "100" : "10") +
                                       " record size: pass num_classes " + (num_classes == 10 ? "100" : "10")
                                 : "; the file is truncated or not a CIFAR binary file (re-download it)";
    MP_FAIL("read_cifar: ", path, ": size ", size, " bytes is not a positive multiple of the CIFAR-", num_classes,
            " record size ", record, " (", label_bytes, " label byte", label_bytes == 1 ? "" : "s", " + 3072 pixels)",
            hint);
  }
  ImageData d;
  d.images = empty({total, 3, 32, 32}, {.dtype = DType::u8});
  d.labels = empty({total}, {.dtype = DType::i64});
  uint8_t* px = d.images.data_ptr<uint8_t>();
  int64_t* lp = d.labels.data_ptr<int64_t>();
  int64_t i = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    const std::vector<uint8_t>& bytes = contents[f];
    const int64_t n = static_cast<int64_t>(bytes.size()) / record;
    for (int64_t r = 0; r < n; ++r, ++i) {
      const uint8_t* rec = bytes.data() + r * record;
      const int64_t label = rec[label_bytes - 1];  // CIFAR-100: <coarse><fine>, the fine label
      MP_CHECK(label < num_classes, "read_cifar: ", files[f], ": record ", r, " has label ", label, ", expected < ",
               num_classes, "; the file is not CIFAR-", num_classes, " (wrong num_classes?)");
      lp[i] = label;
      std::memcpy(px + i * kCifarPixels, rec + label_bytes, kCifarPixels);
    }
  }
  d.num_classes = num_classes;
  d.class_names = num_classes == 10 ? cifar10_names() : cifar100_names();
  return d;
}

ImageData load_cifar10(Split split, const std::string& dir) {
  MP_CHECK(split != Split::valid, "load_cifar10: CIFAR-10 has train and test splits, got ", split_name(split),
           "; hold out part of train for validation");
  const std::filesystem::path d =
      find_cifar_dir(dir, "cifar-10-batches-bin", split == Split::train ? "data_batch_1.bin" : "test_batch.bin",
                     "load_cifar10", "cifar-10-binary.tar.gz");
  std::vector<std::string> files;
  if (split == Split::train) {
    for (int b = 1; b <= 5; ++b) files.push_back((d / ("data_batch_" + std::to_string(b) + ".bin")).string());
  } else {
    files.push_back((d / "test_batch.bin").string());
  }
  ImageData data = read_cifar(files, 10);
  if (std::vector<std::string> names = read_names(d / "batches.meta.txt"); names.size() == 10)
    data.class_names = std::move(names);
  return data;
}

ImageData load_cifar100(Split split, const std::string& dir) {
  MP_CHECK(split != Split::valid, "load_cifar100: CIFAR-100 has train and test splits, got ", split_name(split),
           "; hold out part of train for validation");
  const std::string file = split == Split::train ? "train.bin" : "test.bin";
  const std::filesystem::path d =
      find_cifar_dir(dir, "cifar-100-binary", file, "load_cifar100", "cifar-100-binary.tar.gz");
  ImageData data = read_cifar({(d / file).string()}, 100);
  if (std::vector<std::string> names = read_names(d / "fine_label_names.txt"); names.size() == 100)
    data.class_names = std::move(names);
  return data;
}

}  // namespace mp::data

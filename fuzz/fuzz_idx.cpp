// libFuzzer target: IDX image and label files (MNIST, Fashion-MNIST), raw or gzip'd, through read_idx.
// The input is split in two files: its first byte B gives the image file's share, (B * size) / 256 bytes after
// it; the rest is the label file (fuzz/make_corpus.py writes seeds in this layout).
#include "fuzz_util.hpp"
#include "mp/data/idx.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t rest = size - 1, images_size = (static_cast<size_t>(data[0]) * rest) / 255;
  const std::string images = mp::fuzz::write_temp(data + 1, images_size, "images");
  const std::string labels = mp::fuzz::write_temp(data + 1 + images_size, rest - images_size, "labels");
  mp::fuzz::expect_accept_or_refuse({images, labels}, [&] {
    const mp::data::ImageData d = mp::data::read_idx(images, labels, 10);
    if (d.images.size(0) != d.labels.size(0)) mp::fuzz::finding("read_idx returned unequal image and label counts");
  });
  return 0;
}

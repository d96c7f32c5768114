// libFuzzer target: CIFAR-10 and CIFAR-100 binary files, raw or gzip'd, through read_cifar. The first input
// byte picks the variant (even: CIFAR-10, odd: CIFAR-100); the rest is the file.
#include "fuzz_util.hpp"
#include "mp/data/cifar.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int64_t classes = data[0] % 2 == 0 ? 10 : 100;
  const std::string path = mp::fuzz::write_temp(data + 1, size - 1, "cifar");
  mp::fuzz::expect_accept_or_refuse(path, [&] {
    const mp::data::ImageData d = mp::data::read_cifar({path}, classes);
    if (d.images.size(0) != d.labels.size(0) || d.num_classes != classes)
      mp::fuzz::finding("read_cifar returned unequal image and label counts or the wrong class count");
  });
  return 0;
}

// IDX (raw and gzip'd) and CIFAR readers on files generated here, their error messages, and the real
// Fashion-MNIST of Debian's dataset-fashion-mnist when installed.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mp/data/cifar.hpp"
#include "mp/data/idx.hpp"
#include "mp/mp.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace mp;
using namespace mp::data;
using mp::test::error_of;

namespace {

using Bytes = std::vector<uint8_t>;

// A fresh folder per test, removed afterwards.
class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = mp::test::scratch_dir("data_files", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

void write_file(const std::string& path, const Bytes& b) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}
void put_le32(Bytes& b, uint32_t v) {
  for (int s = 0; s <= 24; s += 8) b.push_back(static_cast<uint8_t>(v >> s));
}

uint32_t crc32(const Bytes& data) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (uint8_t byte : data) c = table[(c ^ byte) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// A gzip member (RFC 1952) holding `data` in stored deflate blocks (RFC 1951 3.2.4). The tests cannot
// link zlib themselves (tests/CMakeLists.txt links only mixprec), so they write the format by hand;
// the real, deflate-compressed files come from the gzip tool and Fashion-MNIST below.
Bytes gzip_stored(const Bytes& data) {
  Bytes out = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
  size_t pos = 0;
  do {
    const size_t len = std::min<size_t>(data.size() - pos, 65535);
    const bool final = pos + len == data.size();
    out.push_back(final ? 1 : 0);  // BFINAL, BTYPE = 00 (stored)
    out.push_back(static_cast<uint8_t>(len));
    out.push_back(static_cast<uint8_t>(len >> 8));
    out.push_back(static_cast<uint8_t>(~len));
    out.push_back(static_cast<uint8_t>(~len >> 8));
    out.insert(out.end(), data.begin() + static_cast<std::ptrdiff_t>(pos),
               data.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
  } while (pos < data.size());
  put_le32(out, crc32(data));
  put_le32(out, static_cast<uint32_t>(data.size()));
  return out;
}

Bytes idx_images(uint32_t n, uint32_t h, uint32_t w, const Bytes& pixels, uint32_t magic = 0x803) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, n);
  put_be32(b, h);
  put_be32(b, w);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}

Bytes idx_labels(uint32_t n, const Bytes& labels, uint32_t magic = 0x801) {
  Bytes b;
  put_be32(b, magic);
  put_be32(b, n);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

// Pixel i of the test images (distinct enough to catch any reordering).
Bytes test_pixels(size_t n) {
  Bytes p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>((i * 37 + 11) % 251);
  return p;
}

void expect_idx(const ImageData& d, uint32_t n, uint32_t h, uint32_t w, const Bytes& pixels, const Bytes& labels) {
  ASSERT_EQ(d.images.sizes(), (Shape{n, 1, h, w}));
  EXPECT_EQ(d.images.dtype(), DType::u8);
  EXPECT_EQ(d.images.to_vector<uint8_t>(), pixels);
  ASSERT_EQ(d.labels.dtype(), DType::i64);
  const std::vector<int64_t> l = d.labels.to_vector<int64_t>();
  ASSERT_EQ(l.size(), labels.size());
  for (size_t i = 0; i < l.size(); ++i) EXPECT_EQ(l[i], labels[i]);
  EXPECT_EQ(d.num_classes, 10);
}

TEST_F(DataFiles, IdxRawRoundTrip) {
  const Bytes px = test_pixels(5 * 4 * 3), lab = {3, 0, 9, 9, 1};
  write_file(path("img"), idx_images(5, 4, 3, px));
  write_file(path("lab"), idx_labels(5, lab));
  expect_idx(read_idx(path("img"), path("lab")), 5, 4, 3, px, lab);
  // The name does not decide: raw bytes under a .gz name are read raw.
  write_file(path("img.gz"), idx_images(5, 4, 3, px));
  expect_idx(read_idx(path("img.gz"), path("lab")), 5, 4, 3, px, lab);
}

TEST_F(DataFiles, IdxGzipRoundTrip) {
  const Bytes px = test_pixels(7 * 6 * 5), lab = {0, 1, 2, 3, 4, 5, 6};
  write_file(path("img.gz"), gzip_stored(idx_images(7, 6, 5, px)));
  write_file(path("lab-no-suffix"), gzip_stored(idx_labels(7, lab)));  // gzip'd without .gz: detected by magic
  expect_idx(read_idx(path("img.gz"), path("lab-no-suffix")), 7, 6, 5, px, lab);

  // Several stored blocks (72016 bytes > 65535 per block), and a file made of two concatenated gzip
  // members (allowed by RFC 1952).
  const Bytes big = test_pixels(8000 * 3 * 3);
  Bytes labs(8000);
  for (size_t i = 0; i < labs.size(); ++i) labs[i] = static_cast<uint8_t>(i % 10);
  const Bytes whole = idx_images(8000, 3, 3, big);
  Bytes two = gzip_stored(Bytes(whole.begin(), whole.begin() + 1000));
  const Bytes second = gzip_stored(Bytes(whole.begin() + 1000, whole.end()));
  two.insert(two.end(), second.begin(), second.end());
  write_file(path("big.gz"), two);
  write_file(path("big-lab.gz"), gzip_stored(idx_labels(8000, labs)));
  expect_idx(read_idx(path("big.gz"), path("big-lab.gz")), 8000, 3, 3, big, labs);
}

TEST_F(DataFiles, IdxDeflateCompressedByGzipTool) {
  if (std::system("command -v gzip >/dev/null 2>&1") != 0) GTEST_SKIP() << "no gzip tool to compress with";
  const Bytes px = test_pixels(50 * 8 * 8), lab(50, 7);
  write_file(path("img"), idx_images(50, 8, 8, px));
  write_file(path("lab"), idx_labels(50, lab));
  ASSERT_EQ(std::system(("gzip -9 " + path("img") + " " + path("lab")).c_str()), 0);
  expect_idx(read_idx(path("img.gz"), path("lab.gz")), 50, 8, 8, px, lab);
}

TEST_F(DataFiles, IdxErrorsNameTheFileAndTheProblem) {
  const Bytes px = test_pixels(5 * 4 * 3), lab = {1, 2, 3, 4, 5};
  write_file(path("img"), idx_images(5, 4, 3, px));
  write_file(path("lab"), idx_labels(5, lab));

  // Truncated: one pixel missing.
  write_file(path("short"), idx_images(5, 4, 3, Bytes(px.begin(), px.end() - 1)));
  std::string m = error_of([&] { read_idx(path("short"), path("lab")); });
  EXPECT_CONTAINS(m, path("short"));
  EXPECT_CONTAINS(m, "truncated: header says 5 images of 4x3 = 60 bytes, file has 59");

  // The same truncation inside a gzip'd file is reported in decompressed bytes.
  write_file(path("short.gz"), gzip_stored(idx_images(5, 4, 3, Bytes(px.begin(), px.end() - 1))));
  m = error_of([&] { read_idx(path("short.gz"), path("lab")); });
  EXPECT_CONTAINS(m, "truncated: header says 5 images of 4x3 = 60 bytes, file has 59 (decompressed)");

  // Trailing bytes.
  Bytes longer = px;
  longer.push_back(0);
  write_file(path("long"), idx_images(5, 4, 3, longer));
  m = error_of([&] { read_idx(path("long"), path("lab")); });
  EXPECT_CONTAINS(m, path("long"));
  EXPECT_CONTAINS(m, "1 trailing bytes");

  // Shorter than a header.
  write_file(path("tiny"), Bytes{0, 0, 8});
  m = error_of([&] { read_idx(path("tiny"), path("lab")); });
  EXPECT_CONTAINS(m, "truncated: an IDX image file starts with a 16-byte header, file has 3 bytes");

  // Wrong magic: swapped arguments, and something else entirely.
  m = error_of([&] { read_idx(path("lab"), path("img")); });
  EXPECT_CONTAINS(m, path("lab"));
  EXPECT_CONTAINS(m, "expected magic 0x00000803 (u8, 3 dims), got 0x00000801");
  EXPECT_CONTAINS(m, "swapped");
  write_file(path("bad-magic"), idx_images(5, 4, 3, px, 0x00000D03));  // f64 data
  m = error_of([&] { read_idx(path("bad-magic"), path("lab")); });
  EXPECT_CONTAINS(m, "not an IDX image file: expected magic 0x00000803 (u8, 3 dims), got 0x00000D03");
  write_file(path("lab-bad-magic"), idx_labels(5, lab, 0x12345678));
  m = error_of([&] { read_idx(path("img"), path("lab-bad-magic")); });
  EXPECT_CONTAINS(m, path("lab-bad-magic"));
  EXPECT_CONTAINS(m, "expected magic 0x00000801 (u8, 1 dim), got 0x12345678");

  // No image, but images of 2^32-1 x 2^32-1: strides beyond 64 bits (found by fuzz/fuzz_idx: a signed overflow in
  // empty()'s strides; was accepted).
  write_file(path("huge"), idx_images(0, 0xFFFFFFFF, 0xFFFFFFFF, {}));
  write_file(path("lab0"), idx_labels(0, {}));
  m = error_of([&] { read_idx(path("huge"), path("lab0")); });
  EXPECT_CONTAINS(m, path("huge"));
  EXPECT_CONTAINS(m, "0 images of 4294967295x4294967295 do not fit in 64 bits");

  // Truncated label file.
  write_file(path("lab-short"), idx_labels(5, Bytes(lab.begin(), lab.end() - 2)));
  m = error_of([&] { read_idx(path("img"), path("lab-short")); });
  EXPECT_CONTAINS(m, "truncated: header says 5 labels = 5 bytes, file has 3");

  // N differs between the files.
  write_file(path("lab4"), idx_labels(4, Bytes(lab.begin(), lab.end() - 1)));
  m = error_of([&] { read_idx(path("img"), path("lab4")); });
  EXPECT_CONTAINS(m, "has 4 labels but " + path("img") + " has 5 images");

  // Label out of range for num_classes.
  m = error_of([&] { read_idx(path("img"), path("lab"), 5); });
  EXPECT_CONTAINS(m, "label 5 at index 4 is out of range: expected < 5");

  // Missing file.
  m = error_of([&] { read_idx(path("nope"), path("lab")); });
  EXPECT_CONTAINS(m, path("nope"));
  EXPECT_CONTAINS(m, "no such file");
}

TEST_F(DataFiles, CorruptAndTruncatedGzipRefused) {
  const Bytes px = test_pixels(5 * 4 * 3), lab = {1, 2, 3, 4, 5};
  write_file(path("lab"), idx_labels(5, lab));
  const Bytes gz = gzip_stored(idx_images(5, 4, 3, px));

  // Cut inside the deflate data: the stream never ends.
  write_file(path("cut.gz"), Bytes(gz.begin(), gz.begin() + 40));
  std::string m = error_of([&] { read_idx(path("cut.gz"), path("lab")); });
  EXPECT_CONTAINS(m, path("cut.gz"));
  EXPECT_CONTAINS(m, "truncated gzip stream");

  // A flipped data byte: the CRC-32 in the trailer no longer matches.
  Bytes flipped = gz;
  flipped[30] ^= 0x40;
  write_file(path("crc.gz"), flipped);
  m = error_of([&] { read_idx(path("crc.gz"), path("lab")); });
  EXPECT_CONTAINS(m, path("crc.gz"));
  EXPECT_CONTAINS(m, "corrupt gzip data");

  // Stored-block length and its complement disagree.
  Bytes bad_len = gz;
  bad_len[13] ^= 0x01;  // NLEN low byte (header 10 bytes, BFINAL byte, LEN 2 bytes)
  write_file(path("len.gz"), bad_len);
  m = error_of([&] { read_idx(path("len.gz"), path("lab")); });
  EXPECT_CONTAINS(m, "corrupt gzip data");
}

TEST_F(DataFiles, FashionMnistMissingSaysHowToInstall) {
  const std::string m = error_of([&] { load_fashion_mnist(Split::train, path("empty")); });
  EXPECT_CONTAINS(m, path("empty") + "/train-images-idx3-ubyte.gz");
  EXPECT_CONTAINS(m, "install it with: apt-get install dataset-fashion-mnist");
  EXPECT_CONTAINS(error_of([&] { load_fashion_mnist(Split::valid, path("empty")); }), "train and test splits");
}

TEST_F(DataFiles, FashionMnistFromGeneratedFolder) {
  // The loader's file naming (t10k for test, raw files accepted).
  const Bytes px = test_pixels(3 * 28 * 28), lab = {9, 0, 6};
  write_file(path("fm/t10k-images-idx3-ubyte"), idx_images(3, 28, 28, px));
  write_file(path("fm/t10k-labels-idx1-ubyte.gz"), gzip_stored(idx_labels(3, lab)));
  const ImageData d = load_fashion_mnist(Split::test, path("fm"));
  expect_idx(d, 3, 28, 28, px, lab);
  ASSERT_EQ(d.class_names.size(), 10u);
  EXPECT_EQ(d.class_names[0], "T-shirt/top");
  EXPECT_EQ(d.class_names[6], "Shirt");
  EXPECT_EQ(d.class_names[9], "Ankle boot");
}

TEST(FashionMnist, RealDataset) {
  std::error_code ec;
  if (!fs::exists(fs::path(kFashionMnistDir) / "train-images-idx3-ubyte.gz", ec))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const ImageData train = load_fashion_mnist(Split::train);
  const ImageData test = load_fashion_mnist(Split::test);
  EXPECT_EQ(train.images.sizes(), (Shape{60000, 1, 28, 28}));
  EXPECT_EQ(test.images.sizes(), (Shape{10000, 1, 28, 28}));
  // Both splits are balanced: 6000 / 1000 images per class (the dataset's README).
  for (const auto& [d, per_class] : {std::pair{&train, 6000}, std::pair{&test, 1000}}) {
    std::vector<int64_t> hist(10, 0);
    for (int64_t l : d->labels.to_vector<int64_t>()) ++hist.at(static_cast<size_t>(l));
    for (int c = 0; c < 10; ++c) EXPECT_EQ(hist[static_cast<size_t>(c)], per_class) << "class " << c;
  }
  // Published training-set statistics: mean 0.2860, std 0.3530 (4 digits, hence +-0.0005).
  const auto [mean, std] = channel_stats(train);
  ASSERT_EQ(mean.size(), 1u);
  EXPECT_NEAR(mean[0], 0.2860, 5e-4);
  EXPECT_NEAR(std[0], 0.3530, 5e-4);
}

// ---- CIFAR ----

// CIFAR records: label byte(s) then 3072 pixels; pixel k of record r is (r * 7 + k) % 256.
Bytes cifar_records(const std::vector<std::vector<uint8_t>>& labels, int first_record) {
  Bytes b;
  for (size_t r = 0; r < labels.size(); ++r) {
    b.insert(b.end(), labels[r].begin(), labels[r].end());
    for (int k = 0; k < 3072; ++k) b.push_back(static_cast<uint8_t>(((first_record + r) * 7 + k) % 256));
  }
  return b;
}

void expect_cifar_pixels(const ImageData& d) {
  const std::vector<uint8_t> px = d.images.to_vector<uint8_t>();
  for (int64_t r = 0; r < d.images.size(0); ++r)
    for (int k = 0; k < 3072; k += 101)
      ASSERT_EQ(px[static_cast<size_t>(r * 3072 + k)], static_cast<uint8_t>((r * 7 + k) % 256)) << "record " << r;
}

TEST_F(DataFiles, Cifar10FolderLayouts) {
  // Train: 5 batch files of 2 records each (labels 0..9), test: 3 records; in the archive's subfolder.
  const fs::path sub = dir_ / "c10" / "cifar-10-batches-bin";
  for (int f = 0; f < 5; ++f)
    write_file((sub / ("data_batch_" + std::to_string(f + 1) + ".bin")).string(),
               cifar_records({{static_cast<uint8_t>(2 * f)}, {static_cast<uint8_t>(2 * f + 1)}}, 2 * f));
  write_file((sub / "test_batch.bin").string(), cifar_records({{4}, {0}, {9}}, 0));
  const ImageData train = load_cifar10(Split::train, path("c10"));
  EXPECT_EQ(train.images.sizes(), (Shape{10, 3, 32, 32}));
  EXPECT_EQ(train.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(train.num_classes, 10);
  expect_cifar_pixels(train);
  ASSERT_EQ(train.class_names.size(), 10u);
  EXPECT_EQ(train.class_names[0], "airplane");
  EXPECT_EQ(train.class_names[9], "truck");
  // The folder itself also works, and batches.meta.txt names the classes.
  const ImageData test = load_cifar10(Split::test, sub.string());
  EXPECT_EQ(test.labels.to_vector<int64_t>(), (std::vector<int64_t>{4, 0, 9}));
  expect_cifar_pixels(test);
  write_file((sub / "batches.meta.txt").string(), Bytes{'a',  '\n', 'b',  '\n', 'c',  '\n', 'd',  '\n', 'e',  '\n', 'f',
                                                        '\n', 'g',  '\n', 'h',  '\n', 'i',  '\n', 'j',  '\n', '\n'});
  EXPECT_EQ(load_cifar10(Split::test, sub.string()).class_names[9], "j");
}

TEST_F(DataFiles, Cifar100UsesFineLabel) {
  write_file(path("c100/cifar-100-binary/train.bin"), cifar_records({{1, 57}, {19, 99}, {0, 0}, {5, 23}}, 0));
  write_file(path("c100/cifar-100-binary/test.bin"), cifar_records({{3, 42}}, 0));
  const ImageData train = load_cifar100(Split::train, path("c100"));
  EXPECT_EQ(train.images.sizes(), (Shape{4, 3, 32, 32}));
  EXPECT_EQ(train.labels.to_vector<int64_t>(), (std::vector<int64_t>{57, 99, 0, 23}));
  EXPECT_EQ(train.num_classes, 100);
  expect_cifar_pixels(train);
  ASSERT_EQ(train.class_names.size(), 100u);
  EXPECT_EQ(train.class_names[0], "apple");
  EXPECT_EQ(train.class_names[99], "worm");
  EXPECT_EQ(load_cifar100(Split::test, path("c100")).labels.to_vector<int64_t>(), (std::vector<int64_t>{42}));
}

TEST_F(DataFiles, CifarErrors) {
  // Not a multiple of the record size.
  Bytes recs = cifar_records({{1}, {2}}, 0);
  recs.erase(recs.end() - 5, recs.end());  // (resize() here: a false -Wstringop-overflow of GCC 12 at -O1 + ASan)
  write_file(path("short.bin"), recs);
  std::string m = error_of([&] { read_cifar({path("short.bin")}, 10); });
  EXPECT_CONTAINS(m, path("short.bin"));
  EXPECT_CONTAINS(m, "size 6141 bytes is not a positive multiple of the CIFAR-10 record size 3073");
  // A CIFAR-100 file read as CIFAR-10 (3 records of 3074 bytes are not a multiple of 3073).
  write_file(path("c100.bin"), cifar_records({{1, 2}, {3, 4}, {5, 6}}, 0));
  m = error_of([&] { read_cifar({path("c100.bin")}, 10); });
  EXPECT_CONTAINS(m, "pass num_classes 100");
  // Label out of range.
  write_file(path("badlabel.bin"), cifar_records({{1}, {12}}, 0));
  m = error_of([&] { read_cifar({path("badlabel.bin")}, 10); });
  EXPECT_CONTAINS(m, "record 1 has label 12, expected < 10");
  // Empty file, bad num_classes, missing folder, no valid split.
  write_file(path("empty.bin"), {});
  EXPECT_CONTAINS(error_of([&] { read_cifar({path("empty.bin")}, 10); }), "not a positive multiple");
  EXPECT_CONTAINS(error_of([&] { read_cifar({path("badlabel.bin")}, 20); }), "expected num_classes 10");
  m = error_of([&] { load_cifar10(Split::train, path("none")); });
  EXPECT_CONTAINS(m, path("none") + "/data_batch_1.bin not found");
  EXPECT_CONTAINS(m, "cifar-10-binary.tar.gz");
  EXPECT_CONTAINS(error_of([&] { load_cifar100(Split::test, path("none")); }), "test.bin not found");
  EXPECT_CONTAINS(error_of([&] { load_cifar10(Split::valid, path("none")); }), "train and test splits");
}

}  // namespace

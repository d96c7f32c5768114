// IDX files (MNIST / Fashion-MNIST format), raw or gzip'd, and the byte reader that gunzips.
#include "mp/data/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "mp/core/error.hpp"

namespace mp::data {

namespace {

bool is_gzip(const std::vector<uint8_t>& b) { return b.size() >= 2 && b[0] == 0x1f && b[1] == 0x8b; }

// Inflate every gzip member of `in` (gzip allows concatenated members); errors name `path`.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& in, const std::string& path) {
  std::vector<uint8_t> out;
  out.resize(std::max<size_t>(in.size() * 4, 1 << 16));
  z_stream zs{};
  MP_CHECK(inflateInit2(&zs, 15 + 16) == Z_OK, "read_file_bytes: ", path, ": zlib inflateInit2 failed");
  size_t in_pos = 0, out_pos = 0;
  int rc = Z_OK;
  while (true) {
    if (out_pos == out.size()) out.resize(out.size() * 2);
    const size_t in_chunk = std::min<size_t>(in.size() - in_pos, UINT_MAX);
    const size_t out_chunk = std::min<size_t>(out.size() - out_pos, UINT_MAX);
    zs.next_in = const_cast<Bytef*>(in.data() + in_pos);
    zs.avail_in = static_cast<uInt>(in_chunk);
    zs.next_out = out.data() + out_pos;
    zs.avail_out = static_cast<uInt>(out_chunk);
    rc = inflate(&zs, Z_NO_FLUSH);
    in_pos += in_chunk - zs.avail_in;
    out_pos += out_chunk - zs.avail_out;
    if (rc == Z_STREAM_END) {
      // Another member follows (concatenated gzip): start over on it; trailing zero padding ends the file.
      if (in.size() - in_pos >= 2 && in[in_pos] == 0x1f && in[in_pos + 1] == 0x8b) {
        inflateReset(&zs);
        continue;
      }
      break;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_out == 0) continue;  // needs more output room only
    const std::string msg = zs.msg ? zs.msg : "";
    inflateEnd(&zs);
    if (rc == Z_BUF_ERROR)
      MP_FAIL("read_file_bytes: ", path, ": truncated gzip stream: the compressed data (", in.size(),
              " bytes) ends before the end of the stream (", out_pos, " bytes inflated); re-download the file");
    MP_FAIL("read_file_bytes: ", path, ": corrupt gzip data after ", in_pos, " of ", in.size(),
            " compressed bytes (zlib: ", msg.empty() ? "error " + std::to_string(rc) : msg, "); re-download the file");
  }
  inflateEnd(&zs);
  out.resize(out_pos);
  return out;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08X", v);
  return buf;
}

// " (decompressed)" for a gzip'd file: the sizes in messages count inflated bytes.
const char* size_note(bool gz) { return gz ? " (decompressed)" : ""; }

constexpr uint32_t kIdxImages = 0x00000803;  // u8 data, 3 dims
constexpr uint32_t kIdxLabels = 0x00000801;  // u8 data, 1 dim

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::string& path, bool* was_gzip) {
  std::error_code ec;
  MP_CHECK(std::filesystem::is_regular_file(path, ec), "read_file_bytes: ", path,
           ": no such file (expected a regular file); check the path");
  std::ifstream f(path, std::ios::binary);
  MP_CHECK(f.good(), "read_file_bytes: ", path, ": cannot open the file for reading; check its permissions");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  MP_CHECK(!f.bad(), "read_file_bytes: ", path, ": read error after ", bytes.size(), " bytes");
  const bool gz = is_gzip(bytes);
  if (was_gzip) *was_gzip = gz;
  return gz ? gunzip(bytes, path) : bytes;
}

ImageData read_idx(const std::string& images_path, const std::string& labels_path, int64_t num_classes) {
  MP_CHECK(num_classes >= 1 && num_classes <= 256,
           "read_idx: expected 1 <= num_classes <= 256 (labels are bytes), got ", num_classes);
  // ---- images ----
  bool img_gz = false;
  const std::vector<uint8_t> img = read_file_bytes(images_path, &img_gz);
  const uint32_t img_magic = img.size() >= 4 ? be32(img.data()) : 0;
  MP_CHECK(img.size() < 4 || img_magic == kIdxImages, "read_idx: ", images_path,
           ": not an IDX image file: expected magic ", hex32(kIdxImages), " (u8, 3 dims), got ", hex32(img_magic),
           img_magic == kIdxLabels ? " (an IDX label file: are the image and label paths swapped?)"
                                   : "; pass the *-images-idx3-ubyte[.gz] file");
  MP_CHECK(img.size() >= 16, "read_idx: ", images_path,
           ": truncated: an IDX image file starts with a 16-byte header, "
           "file has ",
           img.size(), " bytes", size_note(img_gz));
  const uint64_t n = be32(img.data() + 4), h = be32(img.data() + 8), w = be32(img.data() + 12);
  MP_CHECK(shape_fits({static_cast<int64_t>(n), 1, static_cast<int64_t>(h), static_cast<int64_t>(w)}, 1),
           "read_idx: ", images_path, ": corrupt header: ", n, " images of ", h, "x", w,
           " do not fit in 64 bits (a size product, zeros counted as 1, beyond 2^63); not a valid IDX image file");
  const uint64_t expected = n * h * w;
  const uint64_t have = img.size() - 16;
  MP_CHECK(have >= expected, "read_idx: ", images_path, ": truncated: header says ", n, " images of ", h, "x", w, " = ",
           expected, " bytes, file has ", have, size_note(img_gz), "; re-download the file");
  MP_CHECK(have == expected, "read_idx: ", images_path, ": header says ", n, " images of ", h, "x", w, " = ", expected,
           " bytes, file has ", have, size_note(img_gz), " (", have - expected,
           " trailing bytes): not a valid IDX image file");
  // ---- labels ----
  bool lab_gz = false;
  const std::vector<uint8_t> lab = read_file_bytes(labels_path, &lab_gz);
  const uint32_t lab_magic = lab.size() >= 4 ? be32(lab.data()) : 0;
  MP_CHECK(lab.size() < 4 || lab_magic == kIdxLabels, "read_idx: ", labels_path,
           ": not an IDX label file: expected magic ", hex32(kIdxLabels), " (u8, 1 dim), got ", hex32(lab_magic),
           lab_magic == kIdxImages ? " (an IDX image file: are the image and label paths swapped?)"
                                   : "; pass the *-labels-idx1-ubyte[.gz] file");
  MP_CHECK(lab.size() >= 8, "read_idx: ", labels_path,
           ": truncated: an IDX label file starts with an 8-byte header, "
           "file has ",
           lab.size(), " bytes", size_note(lab_gz));
  const uint64_t nl = be32(lab.data() + 4);
  const uint64_t have_l = lab.size() - 8;
  MP_CHECK(have_l >= nl, "read_idx: ", labels_path, ": truncated: header says ", nl, " labels = ", nl,
           " bytes, file has ", have_l, size_note(lab_gz), "; re-download the file");
  MP_CHECK(have_l == nl, "read_idx: ", labels_path, ": header says ", nl, " labels = ", nl, " bytes, file has ", have_l,
           size_note(lab_gz), " (", have_l - nl, " trailing bytes): not a valid IDX label file");
  MP_CHECK(nl == n, "read_idx: ", labels_path, " has ", nl, " labels but ", images_path, " has ", n,
           " images; expected equal counts (pair files of the same split)");

  ImageData d;
  const int64_t N = static_cast<int64_t>(n), H = static_cast<int64_t>(h), W = static_cast<int64_t>(w);
  d.images = empty({N, 1, H, W}, {.dtype = DType::u8});
  if (expected > 0) std::memcpy(d.images.raw_data(), img.data() + 16, expected);
  d.labels = empty({N}, {.dtype = DType::i64});
  int64_t* lp = d.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < N; ++i) {
    const int64_t l = lab[8 + static_cast<size_t>(i)];
    MP_CHECK(l < num_classes, "read_idx: ", labels_path, ": label ", l, " at index ", i,
             " is out of range: expected < ", num_classes, " (num_classes); pass the right num_classes");
    lp[i] = l;
  }
  d.num_classes = num_classes;
  for (int64_t c = 0; c < num_classes; ++c) d.class_names.push_back(std::to_string(c));
  return d;
}

ImageData load_fashion_mnist(Split split, const std::string& dir) {
  MP_CHECK(split != Split::valid, "load_fashion_mnist: Fashion-MNIST has train and test splits, got ",
           split_name(split), "; hold out part of train for validation");
  const std::string prefix = split == Split::train ? "train" : "t10k";
  auto find = [&](const std::string& stem) {
    const std::filesystem::path base = std::filesystem::path(dir) / (prefix + stem);
    std::error_code ec;
    for (const std::string& p : {base.string() + ".gz", base.string()})
      if (std::filesystem::is_regular_file(p, ec)) return p;
    MP_FAIL("load_fashion_mnist: ", base.string(), ".gz not found (nor ", base.string(),
            "); install it with: apt-get install dataset-fashion-mnist (or pass the folder holding the files)");
  };
  const std::string images = find("-images-idx3-ubyte");
  const std::string labels = find("-labels-idx1-ubyte");
  ImageData d = read_idx(images, labels, 10);
  d.class_names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return d;
}

}  // namespace mp::data

// safetensors reading and writing. Note [safetensors validation]: a file is parsed completely (header
// length, JSON, every entry, and the coverage of the data area) before any tensor memory is allocated;
// since the entries must tile the data area exactly, the tensors of an accepted file never need more
// memory than the file's size, so a damaged or hostile file cannot cause a huge allocation.
#include "mp/train/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "mp/autograd/node.hpp"
#include "core/json_excerpt.hpp"
#include "mp/core/atomic_file.hpp"

namespace mp::train {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swapping here");

namespace {

using Json = nlohmann::ordered_json;
constexpr const char* kMetadataKey = "__metadata__";
constexpr int kMaxDepth = 32;  // of a header's JSON, generously (read_header)

/// Whether `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0)
      len = 2, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0)
      len = 3, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0)
      len = 4, cp = c & 0x07;
    else
      return false;
    if (i + static_cast<size_t>(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return false;
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

bool dtype_from_safetensors(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> kTable[] = {
      {"F32", DType::f32}, {"F64", DType::f64}, {"F16", DType::f16}, {"BF16", DType::bf16},
      {"I64", DType::i64}, {"I32", DType::i32}, {"U8", DType::u8},   {"BOOL", DType::b8}};
  for (const auto& [name, dt] : kTable)
    if (s == name) {
      *out = dt;
      return true;
    }
  return false;
}

const char* json_type(const Json& j) { return j.type_name(); }

/// A non-negative JSON integer that fits int64, or false.
bool get_index(const Json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(v);
    return true;
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = v;
    return true;
  }
  return false;
}

/// The parsed and validated header of a file.
struct Header {
  std::vector<TensorInfo> entries;  // header order; offset relative to the data area until finished
  std::map<std::string, std::string> metadata;
  int64_t data_start = 0;  // 8 + header length
  int64_t data_size = 0;   // bytes after the header
};

/// "load_safetensors: 'file'": the start of every message about a file being read.
std::string who(const char* op, const std::string& path) { return std::string(op) + ": '" + path + "'"; }

[[noreturn]] void fail(const std::string& who, const std::string& what) {
  MP_FAIL(who, ": ", what, "; the file is damaged or not a safetensors file");
}

TensorInfo parse_entry(const std::string& ctx, const std::string& name, const Json& v, int64_t data_size) {
  const std::string where = "tensor '" + name + "'";
  if (name.empty()) fail(ctx, "a tensor has an empty name");
  if (!v.is_object()) fail(ctx, where + ": expected an object {dtype, shape, data_offsets}, got " + json_type(v));
  TensorInfo info;
  info.name = name;
  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) fail(ctx, where + ": missing or non-string \"dtype\"");
  if (!dtype_from_safetensors(dt->get<std::string>(), &info.dtype))
    MP_FAIL(ctx, ": ", where, ": unsupported dtype '", dt->get<std::string>(),
            "'; mixprec reads F64, F32, F16, BF16, I64, I32, U8 and BOOL (convert the file with Python first)");
  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array()) fail(ctx, where + ": missing or non-array \"shape\"");
  for (const Json& d : *sh) {
    int64_t s;
    if (!get_index(d, &s))
      fail(ctx, where + ": shape " + json_excerpt(*sh) + " has a negative, non-integer or too large size");
    info.shape.push_back(s);
  }
  if (!shape_fits(info.shape, dtype_size(info.dtype)))
    fail(ctx, where + ": shape " + json_excerpt(*sh) +
                  " has strides or bytes beyond 64 bits (its sizes' product, zeros " + "counted as 1, must fit)");
  const int64_t need = shape_numel(info.shape) * static_cast<int64_t>(dtype_size(info.dtype));
  auto off = v.find("data_offsets");
  int64_t begin = 0, end = 0;
  if (off == v.end() || !off->is_array() || off->size() != 2 || !get_index((*off)[0], &begin) ||
      !get_index((*off)[1], &end))
    fail(ctx, where + ": \"data_offsets\" must be [begin, end] with non-negative integers");
  if (end < begin) fail(ctx, where + ": data_offsets " + json_excerpt(*off) + " end before they begin");
  if (end - begin != need)
    fail(ctx, where + ": data_offsets " + json_excerpt(*off) + " span " + std::to_string(end - begin) +
                  " bytes but dtype " + dt->get<std::string>() + " with shape " + shape_str(info.shape) + " needs " +
                  std::to_string(need));
  if (end > data_size)
    fail(ctx, where + ": data_offsets " + json_excerpt(*off) + " go past the end of the data area (" +
                  std::to_string(data_size) + " bytes; the file is truncated?)");
  info.offset = begin;
  info.nbytes = need;
  return info;
}

Header read_header(const char* op, const std::string& file, std::ifstream& f) {
  const std::string ctx = who(op, file);
  std::error_code ec;
  const auto kind = std::filesystem::status(file, ec).type();
  MP_CHECK(kind != std::filesystem::file_type::directory, op, ": '", file,
           "' is a folder; expected a .safetensors file");
  MP_CHECK(kind == std::filesystem::file_type::not_found || kind == std::filesystem::file_type::regular, op, ": '",
           file, "' is not a regular file; expected a .safetensors file");
  f.open(file, std::ios::binary);
  if (!f) {
    const int err = errno;
    MP_FAIL(op, ": cannot open '", file, "': ", std::strerror(err), "; check the path");
  }
  f.seekg(0, std::ios::end);
  const int64_t file_size = static_cast<int64_t>(f.tellg());
  f.seekg(0);
  if (file_size < 8)
    fail(ctx, "the file has " + std::to_string(file_size) + " bytes, fewer than the 8-byte header length");
  unsigned char len_bytes[8];
  f.read(reinterpret_cast<char*>(len_bytes), 8);
  if (!f) fail(ctx, "could not read the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeader))
    fail(ctx, "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (static_cast<int64_t>(n) > file_size - 8)
    fail(ctx, "header length " + std::to_string(n) + " is larger than the " + std::to_string(file_size - 8) +
                  " bytes after it");
  std::string text(static_cast<size_t>(n), '\0');
  f.read(text.data(), static_cast<std::streamsize>(n));
  if (!f) fail(ctx, "could not read the " + std::to_string(n) + "-byte header");
  if (!valid_utf8(text)) fail(ctx, "the header is not valid UTF-8");
  if (text.empty() || text[0] != '{') fail(ctx, "the header does not start with '{' (expected a JSON object)");

  // Duplicate keys: nlohmann keeps the last silently, so track the keys of every open object.
  std::vector<std::set<std::string>> open;
  std::string dup;
  int dup_depth = 0;
  auto cb = [&](int depth, Json::parse_event_t ev, Json& parsed) {
    // A header nests 3 deep ({name: {"shape": [...]}}); nlohmann's parser with a callback copies values recursively,
    // so a deeper one is refused before it is built (Note [quoting untrusted JSON] in core/json_excerpt.hpp).
    if ((ev == Json::parse_event_t::object_start || ev == Json::parse_event_t::array_start) && depth >= kMaxDepth)
      fail(ctx, "the header nests arrays or objects deeper than " + std::to_string(kMaxDepth) +
                    " levels (a safetensors header nests 3)");
    if (ev == Json::parse_event_t::object_start) {
      open.emplace_back();
    } else if (ev == Json::parse_event_t::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (ev == Json::parse_event_t::key && !open.empty()) {
      if (!open.back().insert(parsed.get<std::string>()).second && dup.empty()) {
        dup = parsed.get<std::string>();
        dup_depth = depth;
      }
    }
    return true;
  };
  Json root;
  try {
    root = Json::parse(text, cb);
  } catch (const Json::exception& e) { fail(ctx, std::string("the header is not valid JSON (") + e.what() + ")"); }
  if (!dup.empty()) {
    if (dup_depth == 1) fail(ctx, "tensor '" + dup + "' appears twice in the header");
    fail(ctx, "key '" + dup + "' appears twice in one object of the header");
  }
  if (!root.is_object()) fail(ctx, std::string("the header is a JSON ") + json_type(root) + ", expected an object");

  Header h;
  h.data_start = 8 + static_cast<int64_t>(n);
  h.data_size = file_size - h.data_start;
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object())
        fail(ctx, std::string("\"__metadata__\" is a ") + json_type(value) + ", expected an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          fail(ctx, "metadata '" + mk + "' is a " + json_type(mv) +
                        ", expected a string (safetensors metadata is str -> str)");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(ctx, key, value, h.data_size));
  }

  // The entries must tile the data area exactly: no overlap, no hole, nothing after the last one.
  std::vector<size_t> order(h.entries.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const TensorInfo &x = h.entries[a], &y = h.entries[b];
    return x.offset != y.offset ? x.offset < y.offset : x.nbytes < y.nbytes;
  });
  int64_t covered = 0;
  const TensorInfo* prev = nullptr;
  for (size_t i : order) {
    const TensorInfo& e = h.entries[i];
    if (e.offset < covered)
      fail(ctx, "tensor '" + e.name + "' (bytes " + std::to_string(e.offset) + ".." +
                    std::to_string(e.offset + e.nbytes) + ") overlaps tensor '" + (prev ? prev->name : std::string()) +
                    "' (ending at " + std::to_string(covered) + ")");
    if (e.offset > covered)
      fail(ctx, "tensor '" + e.name + "' begins at byte " + std::to_string(e.offset) +
                    " of the data area, leaving a hole after byte " + std::to_string(covered) +
                    " (the data area must be fully covered)");
    covered = e.offset + e.nbytes;
    prev = &e;
  }
  if (covered != h.data_size)
    fail(ctx, "the tensors cover " + std::to_string(covered) + " bytes of a " + std::to_string(h.data_size) +
                  "-byte data area (trailing bytes after the last tensor)");
  for (TensorInfo& e : h.entries) e.offset += h.data_start;
  return h;
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i64: return "I64";
    case DType::i32: return "I32";
    case DType::u8: return "U8";
    case DType::b8: return "BOOL";
  }
  MP_FAIL("safetensors_dtype_name: invalid dtype ", static_cast<int>(dtype));
}

void save_safetensors(const std::string& path, const nn::StateDict& tensors,
                      const std::map<std::string, std::string>& metadata) {
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> data;
  data.reserve(tensors.size());
  Json header = Json::object();
  if (!metadata.empty()) {
    Json m = Json::object();
    for (const auto& [k, v] : metadata) {
      MP_CHECK(valid_utf8(k) && valid_utf8(v), "save_safetensors: '", path, "': metadata '", k,
               "' is not valid UTF-8; safetensors headers are UTF-8 JSON");
      m[k] = v;
    }
    header[kMetadataKey] = std::move(m);
  }
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MP_CHECK(!name.empty(), "save_safetensors: '", path, "': a tensor has an empty name; give every tensor a name");
    MP_CHECK(name != kMetadataKey, "save_safetensors: '", path,
             "': '__metadata__' is reserved for the metadata; rename the tensor");
    MP_CHECK(valid_utf8(name), "save_safetensors: '", path, "': tensor name '", name, "' is not valid UTF-8");
    MP_CHECK(t.defined(), "save_safetensors: '", path, "': tensor '", name, "' is undefined; expected a tensor");
    Tensor c = t.detach();
    if (!c.device().is_cpu()) c = c.to(kCPU);
    c = c.contiguous();
    const int64_t nbytes = c.numel() * static_cast<int64_t>(c.element_size());
    header[name] = Json{{"dtype", safetensors_dtype_name(c.dtype())},
                        {"shape", c.sizes()},
                        {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(std::move(c));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  atomic_write_file(path, [&](std::ostream& os) {
    char len[8];
    uint64_t n = text.size();
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
    os.write(len, 8);
    os.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const Tensor& t : data) {
      const auto nbytes = static_cast<std::streamsize>(t.numel() * static_cast<int64_t>(t.element_size()));
      if (nbytes > 0) os.write(static_cast<const char*>(t.raw_data()), nbytes);
    }
  });
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream f;
  const Header h = read_header("load_safetensors", path, f);
  SafetensorsFile out;
  out.metadata = h.metadata;
  for (const TensorInfo& e : h.entries) {
    Tensor t = empty(e.shape, {.dtype = e.dtype});
    if (e.nbytes > 0) {
      f.seekg(e.offset);
      f.read(static_cast<char*>(t.raw_data()), static_cast<std::streamsize>(e.nbytes));
      if (!f)
        MP_FAIL("load_safetensors: '", path, "': tensor '", e.name, "': could not read ", e.nbytes, " bytes at offset ",
                e.offset, " (was the file changed while reading?)");
      if (e.dtype == DType::b8) {  // bool must be 0 or 1 in memory
        auto* p = static_cast<unsigned char*>(t.raw_data());
        for (int64_t i = 0; i < e.nbytes; ++i) p[i] = p[i] != 0;
      }
    }
    out.tensors.insert(e.name, std::move(t));
  }
  return out;
}

std::vector<TensorInfo> read_safetensors_header(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::ifstream f;
  Header h = read_header("read_safetensors_header", path, f);
  if (metadata != nullptr) *metadata = std::move(h.metadata);
  return std::move(h.entries);
}

}  // namespace mp::train

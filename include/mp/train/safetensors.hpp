#pragma once
// The safetensors file format (https://huggingface.co/docs/safetensors), the format of mixprec's
// weights and checkpoints: an 8-byte little-endian header length, a JSON header, then the raw data.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mp/core/dtype.hpp"
#include "mp/nn/state_dict.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp::train {

/// A parsed safetensors file.
struct SafetensorsFile {
  nn::StateDict tensors;                        ///< in header order, contiguous CPU tensors
  std::map<std::string, std::string> metadata;  ///< the "__metadata__" object (empty when absent)
};

/// Largest header the readers accept (the reference implementation's limit, 100 MB).
inline constexpr int64_t kMaxSafetensorsHeader = 100'000'000;

/// Save tensors in safetensors format: u64 LE header length, compact JSON header
/// {"__metadata__": {str: str}, name: {"dtype": "F32"|"F64"|"F16"|"BF16"|"I64"|"I32"|"U8"|"BOOL",
/// "shape": [...], "data_offsets": [begin, end]}} ("__metadata__" left out when empty), padded with spaces
/// to a multiple of 8, then the raw little-endian data in the order given; written atomically
/// (atomic_write_file). Non-contiguous and non-CPU tensors are written as contiguous CPU data.
/// Names must be non-empty valid UTF-8 and not "__metadata__"; metadata must be valid UTF-8.
void save_safetensors(const std::string& path, const nn::StateDict& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// Load a safetensors file. Refuses, with an mp::Error naming the file (and the tensor where there is one)
/// and the fault, never a crash or a huge allocation: files shorter than 8 bytes, header length > file size
/// or > 100 MB, header not JSON / not an object / bad UTF-8, unknown dtype, shape with negative or
/// overflowing product, data_offsets not matching dtype size * numel, offsets out of the data area,
/// overlapping tensors or holes (the data area must be fully covered), duplicate names, metadata values
/// not strings. BOOL bytes other than 0 are read as true.
SafetensorsFile load_safetensors(const std::string& path);

/// One tensor's entry in a safetensors header.
struct TensorInfo {
  std::string name;  ///< tensor name
  DType dtype;       ///< element type
  Shape shape;       ///< sizes ({} for a 0-d scalar)
  int64_t offset;    ///< absolute byte offset of the data in the file (8 + header length + begin)
  int64_t nbytes;    ///< data bytes (end - begin)
};

/// Only the header (names, dtypes, shapes, metadata) without reading tensor data (for `mixprec info FILE`
/// style use); validated like load_safetensors, entries in header order.
std::vector<TensorInfo> read_safetensors_header(const std::string& path,
                                                std::map<std::string, std::string>* metadata = nullptr);

/// The safetensors dtype string of a dtype ("F32", "BF16", "BOOL", ...).
const char* safetensors_dtype_name(DType dtype);

}  // namespace mp::train

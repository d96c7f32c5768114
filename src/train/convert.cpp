// convert_safetensors: change the precision of a safetensors file's floating tensors.
#include "mp/train/convert.hpp"

#include <filesystem>
#include <system_error>

#include "mp/autograd/node.hpp"
#include "mp/train/safetensors.hpp"

namespace mp::train {
namespace {

int64_t file_size(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  MP_CHECK(!ec, "convert_safetensors: cannot read the size of '", path, "': ", ec.message());
  return static_cast<int64_t>(n);
}

}  // namespace

ConvertStats convert_safetensors(const std::string& in, const std::string& out, DType dtype) {
  MP_CHECK(is_floating(dtype), "convert_safetensors: expected a floating target dtype (f32, f64, f16, bf16), got ",
           dtype_name(dtype), "; integer and bool tensors are always kept as they are");
  ConvertStats stats;
  stats.bytes_in = file_size(in);
  SafetensorsFile f = load_safetensors(in);
  autograd::NoGradGuard no_grad;
  for (const std::string& name : f.tensors.keys()) {
    const Tensor& t = f.tensors.at(name);
    ++stats.tensors;
    if (!is_floating(t.dtype()) || t.dtype() == dtype) continue;
    f.tensors.set(name, t.to(dtype));  // replaces in place: the original's memory is freed as we go
    ++stats.converted;
  }
  f.metadata["dtype"] = dtype_name(dtype);
  save_safetensors(out, f.tensors, f.metadata);
  stats.bytes_out = file_size(out);
  return stats;
}

}  // namespace mp::train

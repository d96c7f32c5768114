// libFuzzer target: safetensors files (weights and checkpoints) through read_safetensors_header and
// load_safetensors; an accepted file must also save and load back unchanged.
#include <cstring>

#include "fuzz_util.hpp"
#include "mp/train/safetensors.hpp"

using mp::fuzz::finding;

namespace {

bool same_tensors(const mp::nn::StateDict& a, const mp::nn::StateDict& b) {
  if (a.size() != b.size()) return false;
  auto ib = b.begin();
  for (const auto& [name, t] : a) {
    const auto& [name_b, u] = *ib++;
    if (name != name_b || t.dtype() != u.dtype() || t.sizes() != u.sizes()) return false;
    const size_t n = static_cast<size_t>(t.numel()) * t.element_size();
    if (n > 0 && std::memcmp(t.raw_data(), u.raw_data(), n) != 0) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mp::fuzz::write_temp(data, size, "safetensors");
  mp::fuzz::expect_accept_or_refuse(path, [&] {
    std::map<std::string, std::string> metadata;
    const std::vector<mp::train::TensorInfo> header = mp::train::read_safetensors_header(path, &metadata);
    const mp::train::SafetensorsFile file = mp::train::load_safetensors(path);
    if (file.tensors.size() != header.size() || file.metadata != metadata)
      finding("read_safetensors_header and load_safetensors read different entries");
    // Note [safetensors validation]: the tensors of an accepted file fit in its size.
    size_t bytes = 0;
    for (const auto& [name, t] : file.tensors) bytes += static_cast<size_t>(t.numel()) * t.element_size();
    if (bytes > size)
      finding("the tensors take " + std::to_string(bytes) + " bytes of a " + std::to_string(size) + "-byte file");
    const std::string again = path + ".saved";
    mp::train::save_safetensors(again, file.tensors, file.metadata);
    const mp::train::SafetensorsFile back = mp::train::load_safetensors(again);
    if (!same_tensors(file.tensors, back.tensors) || back.metadata != file.metadata)
      finding("an accepted file does not save and load back unchanged");
  });
  return 0;
}

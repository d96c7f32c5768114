// libFuzzer target: the kernel-path cache file (~/.cache/mixprec/kernel-paths-*.json, Note [the kernel-path cache
// file] in src/backend/cpu/kernel_path_file.cpp) through load_path_cache, which never throws: a foreign or
// corrupt file gives no entries and says why. Accepted entries must store and load back unchanged.
#include "backend/cpu/kernel_path_file.hpp"
#include "fuzz_util.hpp"

using mp::fuzz::finding;

namespace {
// An identity as path_cache_identity() writes it (the seeds in fuzz/corpus use the same).
constexpr const char* kIdentity = R"({"format":1,"cpu":"fuzz","threads":2,"onednn":"3.2.0 fuzz","mixprec":"0.1.0"})";
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mp::fuzz::write_temp(data, size, "kernel-paths.json");
  try {
    std::string why;
    const mp::backend::cpu::PathTable t = mp::backend::cpu::load_path_cache(path, kIdentity, why);
    if (!why.empty() && !t.empty()) finding("load_path_cache returned entries and a reason to ignore them: " + why);
    if (!why.empty()) return 0;
    const std::string err = mp::backend::cpu::store_path_cache(path, kIdentity, t);
    if (!err.empty()) finding("store_path_cache failed on entries it read: " + err);
    const mp::backend::cpu::PathTable back = mp::backend::cpu::load_path_cache(path, kIdentity, why);
    if (!why.empty() || back.size() != t.size()) finding("stored entries do not load back: " + why);
    for (const auto& [key, v] : t) {
      const auto it = back.find(key);
      if (it == back.end() || it->second.path != v.path || it->second.ms.size() != v.ms.size())
        finding("stored entry '" + key + "' does not load back unchanged");
    }
  } catch (const std::exception& e) { finding(std::string("load_path_cache threw: ") + e.what()); }
  return 0;
}

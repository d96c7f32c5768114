#include "mp/core/cpu_features.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

namespace {

// The "flags" line of the first processor in /proc/cpuinfo, as a set; empty if unavailable.
std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream words(line.substr(colon + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

}  // namespace

TEST(CpuFeatures, CachedAndStable) {
  const mp::CpuFeatures& a = mp::cpu_features();
  const mp::CpuFeatures& b = mp::cpu_features();
  EXPECT_EQ(&a, &b);
  EXPECT_GE(a.logical_cores, 1);
  EXPECT_LE(a.logical_cores, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::cout << "brand: '" << a.brand << "', logical cores: " << a.logical_cores
            << ", features: " << mp::cpu_features_string() << "\n";
}

TEST(CpuFeatures, Implications) {
  const mp::CpuFeatures& f = mp::cpu_features();
  // Every AVX-512 extension needs AVX-512F; AVX-512F parts all have AVX2/FMA/F16C.
  if (f.avx512bw || f.avx512vl || f.avx512_bf16 || f.avx512_fp16) { EXPECT_TRUE(f.avx512f); }
  if (f.avx512f) {
    EXPECT_TRUE(f.avx2);
    EXPECT_TRUE(f.fma);
    EXPECT_TRUE(f.f16c);
  }
  if (f.amx_bf16 || f.amx_int8) { EXPECT_TRUE(f.amx_tile); }
  // No shipped CPU has AVX512-FP16 without BW/VL (it builds on them).
  if (f.avx512_fp16) {
    EXPECT_TRUE(f.avx512bw);
    EXPECT_TRUE(f.avx512vl);
  }
}

TEST(CpuFeatures, StringListsExactlyThePresentFeatures) {
  const mp::CpuFeatures& f = mp::cpu_features();
  std::set<std::string> listed;
  std::istringstream words(mp::cpu_features_string());
  for (std::string w; words >> w;) listed.insert(w);
  const std::pair<bool, const char*> all[] = {
      {f.avx2, "avx2"},
      {f.f16c, "f16c"},
      {f.fma, "fma"},
      {f.avx512f, "avx512f"},
      {f.avx512bw, "avx512bw"},
      {f.avx512vl, "avx512vl"},
      {f.avx512_bf16, "avx512_bf16"},
      {f.avx512_fp16, "avx512_fp16"},
      {f.amx_tile, "amx_tile"},
      {f.amx_bf16, "amx_bf16"},
      {f.amx_int8, "amx_int8"},
  };
  size_t present = 0;
  for (const auto& [on, name] : all) {
    EXPECT_EQ(on, listed.count(name) == 1) << name;
    present += on ? 1 : 0;
  }
  EXPECT_EQ(listed.size(), present);
}

// Linux lists a flag in /proc/cpuinfo when cpuid reports it and the kernel enabled its state,
// which is what cpu_features() checks (cpuid + xgetbv). Flags the kernel lists must be detected;
// detected features must be listed, except the newer ones an old kernel may not know by name.
TEST(CpuFeatures, AgreesWithProcCpuinfo) {
  const std::set<std::string> flags = proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line";
  const mp::CpuFeatures& f = mp::cpu_features();
  struct Row {
    bool detected;
    const char* flag;
    bool kernel_may_not_know;
  };
  const Row rows[] = {
      {f.avx2, "avx2", false},
      {f.f16c, "f16c", false},
      {f.fma, "fma", false},
      {f.avx512f, "avx512f", false},
      {f.avx512bw, "avx512bw", false},
      {f.avx512vl, "avx512vl", false},
      {f.avx512_bf16, "avx512_bf16", true},
      {f.avx512_fp16, "avx512_fp16", true},
      {f.amx_tile, "amx_tile", true},
      {f.amx_bf16, "amx_bf16", true},
      {f.amx_int8, "amx_int8", true},
  };
  for (const Row& r : rows) {
    const bool listed = flags.count(r.flag) == 1;
    if (listed) { EXPECT_TRUE(r.detected) << r.flag << " is in /proc/cpuinfo but not detected"; }
    if (r.detected && !r.kernel_may_not_know) { EXPECT_TRUE(listed) << r.flag << " detected but not in /proc/cpuinfo"; }
  }
}

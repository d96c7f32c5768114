#include "mp/core/cpu_features.hpp"

#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MP_X86 1
#endif
#if defined(__linux__)
#include <sched.h>
#endif

namespace mp {
namespace {

#if defined(MP_X86)
struct Regs {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

// cpuid(leaf, subleaf); all zero when the leaf is beyond the maximum the CPU reports.
Regs cpuid(uint32_t leaf, uint32_t subleaf) {
  Regs r;
  if (__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx) == 0) return Regs{};
  return r;
}

// XCR0: which register states the OS saves on context switch. Only valid when OSXSAVE is set.
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(uint32_t reg, int b) { return ((reg >> b) & 1u) != 0; }

std::string brand_string() {
  const Regs ext = cpuid(0x80000000u, 0);
  if (ext.eax < 0x80000004u) return {};
  char buf[49] = {};
  for (uint32_t i = 0; i < 3; ++i) {
    const Regs r = cpuid(0x80000002u + i, 0);
    std::memcpy(buf + 16 * i + 0, &r.eax, 4);
    std::memcpy(buf + 16 * i + 4, &r.ebx, 4);
    std::memcpy(buf + 16 * i + 8, &r.ecx, 4);
    std::memcpy(buf + 16 * i + 12, &r.edx, 4);
  }
  std::string s(buf);
  const auto first = s.find_first_not_of(' ');
  const auto last = s.find_last_not_of(' ');
  return first == std::string::npos ? std::string{} : s.substr(first, last - first + 1);
}
#endif

int count_logical_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

CpuFeatures detect() {
  CpuFeatures f;
  f.logical_cores = count_logical_cores();
#if defined(MP_X86)
  f.brand = brand_string();
  const uint32_t max_leaf = cpuid(0, 0).eax;
  const Regs l1 = cpuid(1, 0);
  const Regs l7 = max_leaf >= 7 ? cpuid(7, 0) : Regs{};
  const Regs l7s1 = (max_leaf >= 7 && l7.eax >= 1) ? cpuid(7, 1) : Regs{};

  const bool osxsave = bit(l1.ecx, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool os_avx = (xcr & 0x6u) == 0x6u;                 // XMM (bit 1) + YMM (bit 2)
  const bool os_avx512 = os_avx && (xcr & 0xe0u) == 0xe0u;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_amx = (xcr & 0x60000u) == 0x60000u;         // XTILECFG (17) + XTILEDATA (18)
  const bool avx = bit(l1.ecx, 28) && os_avx;

  f.fma = avx && bit(l1.ecx, 12);
  f.f16c = avx && bit(l1.ecx, 29);
  f.avx2 = avx && bit(l7.ebx, 5);
  f.avx512f = os_avx512 && bit(l7.ebx, 16);
  f.avx512bw = f.avx512f && bit(l7.ebx, 30);
  f.avx512vl = f.avx512f && bit(l7.ebx, 31);
  f.avx512_bf16 = f.avx512f && bit(l7s1.eax, 5);
  f.avx512_fp16 = f.avx512f && bit(l7.edx, 23);
  f.amx_tile = os_amx && bit(l7.edx, 24);
  f.amx_bf16 = f.amx_tile && bit(l7.edx, 22);
  f.amx_int8 = f.amx_tile && bit(l7.edx, 25);
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();  // C++11 magic static: initialised once, thread-safe
  return features;
}

std::string cpu_features_string() {
  const CpuFeatures& f = cpu_features();
  const std::pair<bool, const char*> names[] = {
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
  std::string s;
  for (const auto& [present, name] : names) {
    if (!present) continue;
    if (!s.empty()) s += ' ';
    s += name;
  }
  return s;
}

}  // namespace mp

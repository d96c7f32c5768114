// The kernel-path selector (Note [kernel paths chosen by measurement]): the decision rule, timing with fake
// kernels, the per-machine cache file (reuse, corrupt, foreign, concurrent writers), pinned mode and records.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "backend/cpu/kernel_path_file.hpp"
#include "backend/cpu/kernel_paths.hpp"
#include "mp/core/error.hpp"
#include "mp/kernel_paths.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using mp::backend::cpu::KernelPath;
using mp::backend::cpu::PathTiming;

namespace {

// The selector's clock in these tests: fake kernels advance it by exactly their time.
double g_now = 0;
double fake_clock() { return g_now; }

// Measuring on with the fake clock, in a cache folder of the test's own, with nothing chosen yet; restores
// pinned mode and the real clock after.
struct MeasureScope {
  fs::path dir;
  explicit MeasureScope(const std::string& name) : dir(mp::test::scratch_dir("kernel_paths", name)) {
    ::setenv("MP_CACHE_DIR", dir.c_str(), 1);
    mp::set_kernel_path_mode(mp::KernelPathMode::measure);
    mp::backend::cpu::set_kernel_path_clock(&fake_clock);
    mp::reset_kernel_paths();
  }
  ~MeasureScope() {
    mp::set_kernel_path_mode(mp::KernelPathMode::pinned);
    mp::backend::cpu::set_kernel_path_clock(nullptr);
    mp::reset_kernel_paths();
    ::unsetenv("MP_CACHE_DIR");
  }
  fs::path file() const { return mp::kernel_path_record().cache_file; }
};

// A fake kernel: each path takes its time in ms, plus `extra_ms[i]` on its i-th call (a busy machine); counts
// the calls.
struct FakeKernel {
  double native_ms, via_ms;
  std::vector<double> extra_ms = {};
  int calls = 0;
  void operator()(KernelPath p) {
    const double extra = static_cast<size_t>(calls) < extra_ms.size() ? extra_ms[static_cast<size_t>(calls)] : 0.0;
    ++calls;
    g_now += 1e-3 * ((p == KernelPath::native ? native_ms : via_ms) + extra);
  }
};

constexpr KernelPath kBoth[] = {KernelPath::native, KernelPath::via_f32};

KernelPath choose(const std::string& key, FakeKernel& k) {
  return mp::backend::cpu::choose_kernel_path(key, kBoth, [&](KernelPath p) { k(p); });
}

}  // namespace

TEST(KernelPaths, DecisionKeepsTheDefaultWithinTenPercent) {
  using mp::backend::cpu::decide_kernel_path;
  const PathTiming faster[] = {{KernelPath::native, 2.0}, {KernelPath::via_f32, 1.0}};
  EXPECT_EQ(decide_kernel_path(faster), KernelPath::via_f32);
  const PathTiming band[] = {{KernelPath::native, 1.05}, {KernelPath::via_f32, 1.0}};  // 5% faster: noise
  EXPECT_EQ(decide_kernel_path(band), KernelPath::native);
  const PathTiming edge[] = {{KernelPath::native, 1.2}, {KernelPath::via_f32, 1.0}};  // 20% faster
  EXPECT_EQ(decide_kernel_path(edge), KernelPath::via_f32);
  const PathTiming slower[] = {{KernelPath::native, 1.0}, {KernelPath::via_f32, 3.0}, {KernelPath::gemm, 0.5}};
  EXPECT_EQ(decide_kernel_path(slower), KernelPath::gemm);  // the fastest of all, not the second candidate
}

TEST(KernelPaths, MeasuresOncePicksTheFasterAndWritesTheCache) {
  const MeasureScope scope("measure");
  FakeKernel k{.native_ms = 20, .via_ms = 2};
  EXPECT_EQ(choose("test fake a", k), KernelPath::via_f32);
  const int calls = k.calls;
  EXPECT_GE(calls, 4);  // warm-up + timed runs of each (the slower may stop early)
  EXPECT_EQ(choose("test fake a", k), KernelPath::via_f32);
  EXPECT_EQ(k.calls, calls) << "a shape is timed once per process";
  FakeKernel slow_via{.native_ms = 2, .via_ms = 20};
  EXPECT_EQ(choose("test fake b", slow_via), KernelPath::native);
  const mp::KernelPathRecord r = mp::kernel_path_record();
  EXPECT_EQ(r.measured, 2);
  EXPECT_GT(r.measure_seconds, 0.0);
  EXPECT_EQ(r.choices.at("test fake a"), "via_f32");
  EXPECT_EQ(r.choices.at("test fake b"), "native");
  ASSERT_TRUE(fs::exists(scope.file())) << scope.file();
  const auto t = mp::kernel_path_timings("test fake a");
  ASSERT_EQ(t.size(), 2u);
  EXPECT_GT(t.at("native"), t.at("via_f32"));

  // A second process (the in-memory choices forgotten) reads the file and times nothing.
  mp::reset_kernel_paths();
  FakeKernel again{.native_ms = 20, .via_ms = 2};
  EXPECT_EQ(choose("test fake a", again), KernelPath::via_f32);
  EXPECT_EQ(again.calls, 0);
  EXPECT_EQ(mp::kernel_path_record().from_cache, 1);
  EXPECT_EQ(mp::kernel_path_record().measured, 0);
}

TEST(KernelPaths, ASlowWarmUpRunIsTheOnlyRunOfThatCandidate) {
  // A candidate 100x slower than the default (oneDNN's f16 kernels for some layouts on a CPU with AVX512-FP16)
  // costs one run, its warm-up, not a warm-up and a timed run.
  const MeasureScope scope("slow_warm_up");
  struct Counting {
    int native = 0, via = 0;
  } n;
  const auto run = [&](KernelPath p) {
    ++(p == KernelPath::native ? n.native : n.via);
    g_now += p == KernelPath::native ? 1e-3 : 0.5;
  };
  EXPECT_EQ(mp::backend::cpu::choose_kernel_path("test fake slow warm-up", kBoth, run), KernelPath::native);
  EXPECT_EQ(n.native, 4);  // warm-up + 3 timed runs
  EXPECT_EQ(n.via, 1);
  // Within the build slack (a warm-up builds primitives) it still gets its timed run.
  Counting m;
  const auto run2 = [&](KernelPath p) {
    ++(p == KernelPath::native ? m.native : m.via);
    g_now += p == KernelPath::native ? 1e-3 : 0.02;
  };
  EXPECT_EQ(mp::backend::cpu::choose_kernel_path("test fake build slack", kBoth, run2), KernelPath::native);
  EXPECT_EQ(m.via, 2);  // warm-up + one timed run, then it stops (over 1.5x the best)
}

TEST(KernelPaths, UnusableCandidatesAreNotTimedAndTheNextIsTheDefault) {
  const MeasureScope scope("unusable");
  FakeKernel k{.native_ms = 2, .via_ms = 20};
  int asked = 0;
  const auto no_native = [&](KernelPath p) {
    ++asked;
    return p != KernelPath::native;
  };
  // native (the default) is dropped: via_f32 is the only candidate left and is chosen however slow.
  EXPECT_EQ(mp::backend::cpu::choose_kernel_path(
                "test fake unusable", kBoth, [&](KernelPath p) { k(p); }, no_native),
            KernelPath::via_f32);
  EXPECT_EQ(asked, 2);
  const int calls = k.calls;
  EXPECT_GE(calls, 1);
  EXPECT_EQ(mp::kernel_path_timings("test fake unusable").count("native"), 0u) << "native was never run";
  // Asked only before timing: a choice already made asks nothing.
  EXPECT_EQ(mp::backend::cpu::choose_kernel_path(
                "test fake unusable", kBoth, [&](KernelPath p) { k(p); }, no_native),
            KernelPath::via_f32);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(k.calls, calls);
}

TEST(KernelPaths, ANoisyTimingServesThisProcessOnly) {
  const MeasureScope scope("noisy");
  // Calls: native warm-up, 3 timed (the third 8 ms late: another process held the core), via_f32 ...
  FakeKernel k{.native_ms = 2, .via_ms = 5, .extra_ms = {0, 0, 0, 8}};
  EXPECT_EQ(choose("test fake noisy", k), KernelPath::native);
  EXPECT_EQ(mp::kernel_path_record().measured, 1);
  EXPECT_FALSE(fs::exists(scope.file())) << "a noisy timing is not written for later processes";
  FakeKernel quiet{.native_ms = 2, .via_ms = 5};
  EXPECT_EQ(choose("test fake quiet", quiet), KernelPath::native);
  EXPECT_TRUE(fs::exists(scope.file()));
}

TEST(KernelPaths, CorruptOrForeignCacheFilesAreIgnoredAndRewritten) {
  const MeasureScope scope("corrupt");
  const std::string file = scope.file();
  for (const std::string& content :
       {std::string("{ not json"), std::string("[1, 2, 3]"),
        std::string(R"({"machine": {"format": 1, "cpu": "another CPU", "threads": 64}, "paths": {"test fake c": )"
                    R"({"path": "via_f32", "ms": {"native": 9, "via_f32": 1}}}})")}) {
    { std::ofstream(file) << content; }
    mp::reset_kernel_paths();
    FakeKernel k{.native_ms = 1, .via_ms = 10};
    EXPECT_EQ(choose("test fake c", k), KernelPath::native) << content;  // measured, not read from the file
    EXPECT_GT(k.calls, 0) << content;
    std::ifstream in(file);
    const nlohmann::json j = nlohmann::json::parse(in);  // rewritten whole and valid
    EXPECT_EQ(j.at("paths").at("test fake c").at("path"), "native") << content;
  }
}

// A foreign identity nested a million arrays deep is ignored like any other, and quoted one level deep (Note [quoting
// untrusted JSON]: a 2 MB input, beyond the fuzz targets' 4 KB: comparing and quoting it by dump() overflowed the
// stack).
TEST(KernelPaths, ADeeplyNestedForeignIdentityIsIgnored) {
  const MeasureScope scope("deep");
  const std::string deep = std::string(1'000'000, '[') + std::string(1'000'000, ']');
  { std::ofstream(scope.file()) << R"({"machine": {"format": )" + deep + R"(}, "paths": {}})"; }
  std::string why;
  EXPECT_TRUE(mp::backend::cpu::load_path_cache(scope.file(), mp::backend::cpu::path_cache_identity(), why).empty());
  EXPECT_NE(why.find(R"(another machine or software stack ({"format":[...]}))"), std::string::npos) << why;
}

TEST(KernelPaths, ConcurrentWritersLoseNoEntry) {
  const MeasureScope scope("concurrent");
  const std::string identity = mp::backend::cpu::path_cache_identity(), file = scope.file();
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w)
    writers.emplace_back([&, w] {
      for (int i = 0; i < 25; ++i) {
        const std::string key = "writer " + std::to_string(w) + " entry " + std::to_string(i);
        const std::string err =
            mp::backend::cpu::store_path_cache(file, identity, {{key, {"native", {{"native", 1.0}}}}});
        EXPECT_EQ(err, "");
      }
    });
  for (std::thread& t : writers) t.join();
  std::string why;
  const auto table = mp::backend::cpu::load_path_cache(file, identity, why);
  EXPECT_EQ(why, "");
  EXPECT_EQ(table.size(), 100u);
}

TEST(KernelPaths, PinnedModeTimesNothing) {
  const MeasureScope scope("pinned");
  mp::set_kernel_path_mode(mp::KernelPathMode::pinned);
  FakeKernel k{.native_ms = 5, .via_ms = 1};
  EXPECT_EQ(choose("test fake d", k), KernelPath::native);
  EXPECT_EQ(k.calls, 0);
  EXPECT_EQ(mp::kernel_path_record().defaults, 1);
  EXPECT_FALSE(fs::exists(scope.file()));
}

TEST(KernelPaths, AdoptedRecordWinsOverTheCacheFile) {
  const MeasureScope scope("adopt");
  FakeKernel k{.native_ms = 20, .via_ms = 2};
  EXPECT_EQ(choose("test fake e", k), KernelPath::via_f32);
  mp::reset_kernel_paths();  // a resumed process whose checkpoint says native
  mp::adopt_kernel_paths({{"test fake e", "native"}});
  FakeKernel again{.native_ms = 20, .via_ms = 2};
  EXPECT_EQ(choose("test fake e", again), KernelPath::native);
  EXPECT_EQ(again.calls, 0);
  EXPECT_EQ(mp::kernel_path_record().from_record, 1);
  EXPECT_THROW(mp::adopt_kernel_paths({{"test fake e", "fastest"}}), mp::Error);
}

TEST(KernelPaths, AnUnwritableCacheFolderOnlyWarns) {
  const MeasureScope scope("unwritable");
  ::setenv("MP_CACHE_DIR", "/proc/mixprec-cannot-be-here", 1);
  mp::reset_kernel_paths();
  FakeKernel k{.native_ms = 1, .via_ms = 10};
  EXPECT_EQ(choose("test fake f", k), KernelPath::native);
  EXPECT_EQ(mp::kernel_path_record().measured, 1);
}

#include "backend/cpu/kernel_paths.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "backend/cpu/kernel_path_file.hpp"
#include "mp/core/error.hpp"

namespace mp::backend::cpu {

// Note [kernel paths chosen by measurement]
// A 16-bit matmul or convolution on the CPU can run oneDNN's 16-bit primitive (native), widen its operands to
// f32 and run the f32 primitive (via_f32: exact products, f32 sums, one rounding), or, for convolutions with
// few output pixels, im2col + one 16-bit GEMM (gemm). An f32 convolution with few output pixels likewise has oneDNN's
// primitive (native) and im2col + one f32 GEMM (gemm). Which is fastest depends on the CPU, the library and the
// shape, and no CPU flag predicts it: bf16 kernels ran 0.52-0.78x f32 on a Sapphire Rapids VM without AMX and
// ~2x f32 on AMD Zen 4, both with AVX512-BF16 (bench/RESULTS.md). So, as cudnn.benchmark does, each shape's
// candidates are timed on first use on the machine at hand: one warm-up run (it builds the primitives) and
// kTimedRuns timed runs each on stand-in operands of the same shape and layouts, the median kept; a candidate whose
// warm-up run (which includes building its primitives) is over 1.5x the best median so far plus kBuildSlack, or whose
// first timed run is over 1.5x it, stops there: one run of a slow kernel is the price of knowing it is slow (f16
// kernels that oneDNN 3.2 runs 100x slower than f32 for some layouts on a CPU with AVX512-FP16 cost 2.5 s per MLP step
// when chosen from contiguous stand-ins, and 11 s of measuring for ResNet-18 when timed 2 runs each, bench/RESULTS.md).
// Candidates that the caller knows to be oneDNN's reference implementations for the call are not timed at all. The
// default (native for bf16 and f32, via_f32 for f16) is replaced only by a path at least kReplaceFactor faster, so a choice
// does not flip with noise. The choice is kept for the process and in the machine's cache file (Note [the kernel-path
// cache file]), so a second process times nothing; but where one candidate's timed runs spread by more than
// kNoisySpread (another process held a core: with OpenMP barriers a 2-thread call then takes several times longer) the
// choice serves this process only, and the next process measures again; timing stops for the process once
// kMeasureBudgetSeconds are spent (later shapes take their default, and the next process measures them). Determinism
// contract: the path changes the rounding (native and via_f32 sum in different orders), so a run is bit-reproducible
// given its choices, not given the machine. The choices a run used are part of its record and of its checkpoints
// (mp::kernel_path_record), and a resumed run adopts them (mp::adopt_kernel_paths) ahead of the cache file and of
// measuring, so exact resume holds even where this machine's cache chose otherwise. MP_BF16=native|native_gemm|via_f32
// forces one rule for every bf16 shape (experiments, tests), and pinned mode (MP_KERNEL_PATHS=pinned, the test suite)
// gives every shape its default without timing.
namespace {

constexpr int kTimedRuns = 3;
constexpr double kStopFactor = 1.5;
constexpr double kBuildSlack = 0.05;  // seconds a warm-up run may spend building primitives before it counts as slow
constexpr double kMeasureBudgetSeconds = 10.0;
constexpr double kNoisySpread = 1.5;
constexpr double kNoisyMinSeconds = 1e-3;  // below a millisecond a spread is timer and cache jitter, not load

struct State {
  std::mutex mu;  // guards everything below
  std::unordered_map<std::string, KernelPath> chosen;
  KernelPathRecord counters;  // its choices map stays empty; filled from `chosen` on request
  bool file_read = false;
  std::string identity, file;
  PathTable from_file;
  std::mutex measuring;  // one shape is timed at a time (timings of two at once would disturb each other)
};

State& state() {
  static State s;
  return s;
}

thread_local bool t_measuring = false;

// -1: not set by set_kernel_path_mode (the environment decides).
std::atomic<int> g_mode{-1};

KernelPathMode mode_from_env() {
  const char* e = std::getenv("MP_KERNEL_PATHS");
  if (e == nullptr || *e == '\0' || std::string(e) == "measure") return KernelPathMode::measure;
  if (std::string(e) == "pinned") return KernelPathMode::pinned;
  MP_FAIL("MP_KERNEL_PATHS: expected measure or pinned, got '", e, "'; unset it to measure");
}

bool contains(std::span<const KernelPath> c, KernelPath p) { return std::find(c.begin(), c.end(), p) != c.end(); }

// Reads the cache file once per process (caller holds s.mu).
void read_file_once(State& s) {
  if (s.file_read) return;
  s.file_read = true;
  s.identity = path_cache_identity();
  s.file = path_cache_file(s.identity);
  s.counters.cache_file = s.file;
  if (s.file.empty()) return;
  std::string why;
  s.from_file = load_path_cache(s.file, s.identity, why);
  if (!why.empty())
    std::fprintf(stderr, "mixprec: ignoring the kernel-path cache %s: %s; measuring again\n", s.file.c_str(),
                 why.c_str());
}

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::atomic<double (*)()> g_clock{&steady_seconds};

double seconds_of(const std::function<void(KernelPath)>& run, KernelPath p) {
  double (*clock)() = g_clock.load();
  const double t0 = clock();
  run(p);
  return clock() - t0;
}

// Times the candidates (Note [kernel paths chosen by measurement]); `noisy` is set when a candidate's timed
// runs spread by more than kNoisySpread and kNoisyMinSeconds (the machine was busy).
std::vector<PathTiming> time_candidates(std::span<const KernelPath> candidates,
                                        const std::function<void(KernelPath)>& run, bool& noisy) {
  std::vector<PathTiming> timings;
  noisy = false;
  double best = std::numeric_limits<double>::infinity();
  for (const KernelPath p : candidates) {
    double warm = 0.0;
    try {
      warm = seconds_of(run, p);  // warm-up: builds and caches the primitives
    } catch (const Error&) {
      if (p == candidates[0]) throw;  // the default must work: the caller's own call would fail the same way
      continue;                       // a path this library cannot run for the shape is no candidate
    }
    if (!timings.empty() && warm > kStopFactor * best + kBuildSlack) {  // slow beyond doubt: no timed runs
      timings.push_back({p, warm});
      continue;
    }
    std::vector<double> t;
    for (int i = 0; i < kTimedRuns; ++i) {
      t.push_back(seconds_of(run, p));
      if (i == 0 && !timings.empty() && t[0] > kStopFactor * best) break;
    }
    std::sort(t.begin(), t.end());
    if (t.back() > kNoisySpread * t.front() && t.back() - t.front() > kNoisyMinSeconds) noisy = true;
    timings.push_back({p, t[t.size() / 2]});
    best = std::min(best, timings.back().seconds);
  }
  return timings;
}

}  // namespace

void set_kernel_path_clock(double (*clock)()) { g_clock.store(clock != nullptr ? clock : &steady_seconds); }

const char* kernel_path_name(KernelPath path) {
  switch (path) {
    case KernelPath::native: return "native";
    case KernelPath::via_f32: return "via_f32";
    case KernelPath::gemm: return "gemm";
  }
  return "?";
}

std::optional<KernelPath> parse_kernel_path(const std::string& name) {
  for (const KernelPath p : {KernelPath::native, KernelPath::via_f32, KernelPath::gemm})
    if (name == kernel_path_name(p)) return p;
  return std::nullopt;
}

KernelPath decide_kernel_path(std::span<const PathTiming> timings) {
  MP_ASSERT(!timings.empty(), "decide_kernel_path: no timings");
  const PathTiming* best = &timings[0];
  for (const PathTiming& t : timings.subspan(1))
    if (t.seconds < best->seconds) best = &t;
  return best->seconds * kReplaceFactor <= timings[0].seconds ? best->path : timings[0].path;
}

KernelPath choose_kernel_path(const std::string& key, std::span<const KernelPath> candidates,
                              const std::function<void(KernelPath)>& run,
                              const std::function<bool(KernelPath)>& usable) {
  MP_ASSERT(!candidates.empty(), "choose_kernel_path: no candidates for ", key);
  const KernelPath dflt = candidates[0];
  if (candidates.size() == 1 || t_measuring) return dflt;
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (auto it = s.chosen.find(key); it != s.chosen.end()) return contains(candidates, it->second) ? it->second : dflt;
    if (kernel_path_mode() == KernelPathMode::pinned) {
      s.chosen.emplace(key, dflt);
      ++s.counters.defaults;
      return dflt;
    }
    read_file_once(s);
    if (auto it = s.from_file.find(key); it != s.from_file.end()) {
      const std::optional<KernelPath> p = parse_kernel_path(it->second.path);
      if (p && contains(candidates, *p)) {
        s.chosen.emplace(key, *p);
        ++s.counters.from_cache;
        return *p;
      }
    }
    if (s.counters.measure_seconds >= kMeasureBudgetSeconds) {
      s.chosen.emplace(key, dflt);
      ++s.counters.defaults;
      return dflt;
    }
  }
  std::lock_guard<std::mutex> measuring(s.measuring);
  {
    std::lock_guard<std::mutex> lock(s.mu);  // another thread may have timed it meanwhile
    if (auto it = s.chosen.find(key); it != s.chosen.end()) return contains(candidates, it->second) ? it->second : dflt;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<PathTiming> timings;
  bool noisy = false;
  {
    t_measuring = true;
    struct Reset {
      ~Reset() { t_measuring = false; }
    } reset;
    std::vector<KernelPath> timed;
    for (const KernelPath p : candidates)
      if (!usable || usable(p)) timed.push_back(p);
    if (timed.empty()) timed.push_back(dflt);
    timings = time_candidates(timed, run, noisy);
  }
  const KernelPath choice = decide_kernel_path(timings);
  CachedPath entry{kernel_path_name(choice), {}};
  for (const PathTiming& t : timings) entry.ms[kernel_path_name(t.path)] = t.seconds * 1e3;
  std::string file, identity;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.chosen.emplace(key, choice);
    ++s.counters.measured;
    s.counters.measure_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.from_file[key] = entry;
    file = s.file;
    identity = s.identity;
  }
  if (!file.empty() && !noisy) {  // a noisy timing serves this process only; the next one measures again
    static std::once_flag warned;
    const std::string err = store_path_cache(file, identity, {{key, entry}});
    if (!err.empty())
      std::call_once(warned, [&] {
        std::fprintf(stderr,
                     "mixprec: cannot write the kernel-path cache %s (%s); measured paths are kept for "
                     "this process only\n",
                     file.c_str(), err.c_str());
      });
  }
  return choice;
}

}  // namespace mp::backend::cpu

namespace mp {

using backend::cpu::KernelPath;

const char* kernel_path_mode_name(KernelPathMode mode) { return mode == KernelPathMode::pinned ? "pinned" : "measure"; }

void set_kernel_path_mode(KernelPathMode mode) { backend::cpu::g_mode.store(static_cast<int>(mode)); }

KernelPathMode kernel_path_mode() {
  const int set = backend::cpu::g_mode.load();
  if (set >= 0) return static_cast<KernelPathMode>(set);
  static const KernelPathMode from_env = backend::cpu::mode_from_env();
  return from_env;
}

KernelPathRecord kernel_path_record() {
  auto& s = backend::cpu::state();
  std::lock_guard<std::mutex> lock(s.mu);
  KernelPathRecord r = s.counters;
  for (const auto& [k, p] : s.chosen) r.choices[k] = backend::cpu::kernel_path_name(p);
  r.mode = kernel_path_mode_name(kernel_path_mode());
  if (!s.file_read) r.cache_file = backend::cpu::path_cache_file(backend::cpu::path_cache_identity());
  return r;
}

std::string kernel_path_record_json(const KernelPathRecord& r) {
  std::map<std::string, int> per_path;
  for (const auto& [k, p] : r.choices) ++per_path[p];
  nlohmann::ordered_json j;
  j["mode"] = r.mode;
  j["measured"] = r.measured;
  j["from_cache"] = r.from_cache;
  j["from_record"] = r.from_record;
  j["defaults"] = r.defaults;
  j["measure_seconds"] = r.measure_seconds;
  j["cache_file"] = r.cache_file;
  j["paths"] = per_path;
  j["choices"] = r.choices;
  return j.dump();
}

std::string kernel_path_counts(const std::map<std::string, std::string>& choices) {
  std::map<std::string, int> per_path;
  for (const auto& [k, p] : choices) ++per_path[p];
  std::string s;
  for (const auto& [p, n] : per_path) s += (s.empty() ? "" : ", ") + p + " " + std::to_string(n);
  return s;
}

std::string kernel_path_summary(const KernelPathRecord& r) {
  if (r.choices.empty()) return "none";
  char buf[160];
  std::snprintf(buf, sizeof buf, "; %d measured in %.1f s, %d from the cache, %d from the checkpoint", r.measured,
                r.measure_seconds, r.from_cache, r.from_record);
  return kernel_path_counts(r.choices) + buf;
}

std::map<std::string, double> kernel_path_timings(const std::string& key) {
  auto& s = backend::cpu::state();
  std::lock_guard<std::mutex> lock(s.mu);
  backend::cpu::read_file_once(s);
  const auto it = s.from_file.find(key);
  return it == s.from_file.end() ? std::map<std::string, double>{} : it->second.ms;
}

std::string kernel_path_cache_summary() {
  const std::string identity = backend::cpu::path_cache_identity();
  const std::string file = backend::cpu::path_cache_file(identity);
  if (file.empty()) return "no cache folder: set MP_CACHE_DIR, XDG_CACHE_HOME or HOME";
  std::string why;
  const backend::cpu::PathTable t = backend::cpu::load_path_cache(file, identity, why);
  if (!why.empty()) return "ignored: " + why;
  if (t.empty()) return "nothing measured yet";
  std::map<std::string, std::string> choices;
  for (const auto& [k, v] : t) choices[k] = v.path;
  return std::to_string(t.size()) + " shapes: " + kernel_path_counts(choices);
}

void adopt_kernel_paths(const std::map<std::string, std::string>& choices) {
  std::vector<std::pair<std::string, KernelPath>> parsed;
  for (const auto& [key, name] : choices) {
    const std::optional<KernelPath> p = backend::cpu::parse_kernel_path(name);
    MP_CHECK(p.has_value(), "kernel paths of a run's record: expected native, via_f32 or gemm for '", key, "', got '",
             name, "'; the record is damaged (delete its kernel_paths entry to measure again)");
    parsed.emplace_back(key, *p);
  }
  auto& s = backend::cpu::state();
  std::lock_guard<std::mutex> lock(s.mu);
  for (const auto& [key, p] : parsed) {
    s.chosen[key] = p;
    ++s.counters.from_record;
  }
}

void reset_kernel_paths() {
  auto& s = backend::cpu::state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.chosen.clear();
  s.counters = KernelPathRecord{};
  s.file_read = false;
  s.from_file.clear();
}

}  // namespace mp

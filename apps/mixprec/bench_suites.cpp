// `mixprec bench SUITE`: the reference articles' experiments (issue 6), each writing SUITE.json,
// SUITE.md and PNG charts into a report folder:
//   op-breakdown  each kernel's share of a training step, fp32 -> bf16 speed-up, achieved bandwidth
//   lstm-impl     basic (per-step graph) vs fused (one sequence-level node per layer) vs library LSTM
//                 (oneDNN's on the CPU, cuDNN's on CUDA)
//   lstm-sweep    word LM over layers x batch x cells: TFLOP/s end to end and in matmuls alone
//   resnets       ResNet-18..152, fp32 vs mixed: step time, time scaled to fp32, largest batch in a budget
//   opt-levels    a Wide-ResNet trained at O0..O3 in bf16 and fp16 (O3 also with stochastic rounding): time,
//                 memory, accuracy
// Every step time comes from run_bench_step (bench_step.hpp) in this process; with PyTorch available
// (bench/pytorch/bench_step.py and a python with torch) the step suites time the same configuration
// in PyTorch right after ours and add the ratio. --quick sizes finish in minutes on a 2-core CPU.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <new>
#include <sstream>

#include "bench_step.hpp"
#include "commands.hpp"
#include "mp/core/error.hpp"
#include "mp/core/atomic_file.hpp"
#include "mp/report/plot.hpp"
#include "mp/report/table.hpp"
#include "mp/train/trainer.hpp"

namespace mixprec {
namespace {

namespace tr = mp::train;
namespace report = mp::report;
using Json = nlohmann::ordered_json;

/// The PyTorch users run: PyPI's newest torch in the bench set-up's .venv-bench (scripts/setup.sh --bench), else
/// the system's (Debian's 1.13).
std::string default_python() {
  return std::filesystem::exists(".venv-bench/bin/python") ? ".venv-bench/bin/python" : "/usr/bin/python3";
}

/// Flags every suite takes.
struct SuiteArgs {
  std::string report;                                  ///< output folder ("" = report/bench-SUITE)
  bool quick = false;                                  ///< small sizes (minutes on a 2-core CPU)
  std::string pytorch = "auto";                        ///< auto (when found), on (required) or off
  std::string python = default_python();               ///< interpreter with torch
  std::string script = "bench/pytorch/bench_step.py";  ///< PyTorch's side of bench step
  int64_t warmup = -1;                                 ///< untimed steps per configuration (-1 = suite default)
  int64_t steps = -1;                                  ///< timed steps per configuration (-1 = suite default)
  std::string device = "cpu";                          ///< cpu, cuda or cuda:N (both frameworks)
};

std::string fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Runs one configuration; failures (out of memory, unsupported dtype) become {"error": ..., "oom": ...}
// rows instead of ending the suite (the articles report OOM configurations, they do not drop them).
Json try_step(const BenchStepOptions& o) {
  try {
    return run_bench_step(o);
  } catch (const std::bad_alloc&) { return {{"error", "out of memory"}, {"oom", true}}; } catch (const mp::Error& e) {
    const std::string msg = e.what();
    return {{"error", msg},
            {"oom", msg.find("out of") != std::string::npos && msg.find("memory") != std::string::npos}};
  }
}

bool ok(const Json& j) { return !j.contains("error"); }
double num(const Json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : std::nan("");
}
std::string err_cell(const Json& j) { return j.value("oom", false) ? "OOM" : "failed"; }

// PyTorch's side: the same flags to bench/pytorch/bench_step.py; nullopt (with the reason in `why`)
// when PyTorch is off or not usable.
class PyTorchSide {
 public:
  explicit PyTorchSide(const SuiteArgs& a) : a_(a) {
    MP_CHECK(a.pytorch == "auto" || a.pytorch == "on" || a.pytorch == "off",
             "bench: --pytorch must be auto, on or off, got '", a.pytorch, "'");
    if (a.pytorch == "off") {
      why_ = "PyTorch side switched off (--pytorch off)";
      return;
    }
    if (!std::filesystem::exists(a.script)) {
      why_ = "PyTorch side skipped: no " + a.script + " (run from the repository root or pass --pytorch_script)";
    } else if (std::system((a.python + " -c 'import torch' >/dev/null 2>&1").c_str()) != 0) {
      why_ = "PyTorch side skipped: '" + a.python + "' cannot import torch (apt-get install python3-torch)";
    } else {
      enabled_ = true;
    }
    MP_CHECK(enabled_ || a.pytorch != "on", "bench: --pytorch on, but ", why_);
  }
  bool enabled() const { return enabled_; }
  const std::string& why() const { return why_; }

  Json step(const BenchStepOptions& o) const {
    if (!enabled_) return {{"error", why_}};
    std::ostringstream cmd;
    cmd << a_.python << " " << a_.script << " --model " << o.model << " --batch_size " << o.batch_size
        << " --image_size " << o.image_size << " --in_channels " << o.in_channels << " --num_classes " << o.num_classes
        << " --vocab_size " << o.vocab_size << " --bptt " << o.bptt << " --embed_size " << o.embed_size
        << " --hidden_size " << o.hidden_size << " --num_layers " << o.num_layers << " --dropout " << o.dropout
        << " --precision " << mp::train::precision_name(o.precision) << " --optimizer " << o.optimizer << " --warmup "
        << o.warmup << " --steps " << o.steps << " --seed " << o.seed << " --device " << o.device << " 2>&1";
    FILE* p = popen(cmd.str().c_str(), "r");
    if (p == nullptr) return {{"error", "could not start " + a_.python}};
    std::string out, line;
    char buf[4096];
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    const int rc = pclose(p);
    std::istringstream lines(out);
    Json last;
    while (std::getline(lines, line))
      if (!line.empty() && line[0] == '{') last = Json::parse(line, nullptr, false);
    if (rc != 0 || last.is_discarded() || last.is_null() || !last.contains("median_ms"))
      return {{"error", "PyTorch run failed (exit " + std::to_string(rc) +
                            "): " + out.substr(out.size() > 300 ? out.size() - 300 : 0)}};
    return last;
  }

 private:
  SuiteArgs a_;
  bool enabled_ = false;
  std::string why_;
};

// The report folder: SUITE.md, SUITE.json and charts.
class Report {
 public:
  Report(const SuiteArgs& a, const std::string& suite)
      : suite_(suite), dir_(a.report.empty() ? "report/bench-" + suite : a.report) {
    std::filesystem::create_directories(dir_);
    json_["suite"] = suite;
    json_["quick"] = a.quick;
  }
  Json& json() { return json_; }
  void md(const std::string& text) { md_ << text; }
  void table(const report::Table& t) { md_ << t.to_markdown() << "\n"; }
  void bars(const std::string& file, const std::string& title, const std::string& ylabel,
            const std::vector<std::string>& labels, const std::vector<double>& values) {
    if (!plot_ok() || labels.empty()) return;
    report::plot_bars((dir_ / file).string(), title, ylabel, labels, values);
    files_.push_back(file);
  }
  void lines(const std::string& file, const std::string& title, const std::string& xlabel, const std::string& ylabel,
             const std::vector<report::Series>& series) {
    if (!plot_ok()) return;
    report::plot_lines((dir_ / file).string(), title, xlabel, ylabel, series);
    files_.push_back(file);
  }
  void write(std::ostream& out) {
    mp::atomic_write_file((dir_ / (suite_ + ".md")).string(), md_.str());
    mp::atomic_write_file((dir_ / (suite_ + ".json")).string(), json_.dump(2) + "\n");
    out << "\n"
        << md_.str() << "\nreport written to " << dir_.string() << ": " << suite_ << ".md " << suite_ << ".json";
    for (const auto& f : files_) out << " " << f;
    out << "\n";
  }

 private:
  bool plot_ok() {
    if (report::gnuplot_available()) return true;
    if (!warned_) md_ << "\nCharts skipped: gnuplot not found (install it with: apt-get install gnuplot-nox).\n";
    warned_ = true;
    return false;
  }
  std::string suite_;
  std::filesystem::path dir_;
  Json json_;
  std::ostringstream md_;
  std::vector<std::string> files_;
  bool warned_ = false;
};

void progress(const std::string& what) { std::cerr << "bench: " << what << "\n" << std::flush; }

BenchStepOptions base_step(const SuiteArgs& a, int64_t warmup, int64_t steps) {
  BenchStepOptions o;
  o.warmup = a.warmup >= 0 ? a.warmup : warmup;
  o.steps = a.steps > 0 ? a.steps : steps;
  o.device = a.device;
  return o;
}

std::string header_line(const Json& j) {
  return "Device: " + j.value("device", std::string("?")) + ", " + std::to_string(j.value("threads", 0)) +
         " threads, mixprec " + j.value("version", std::string("?")) + ".\n\n";
}

// ------------------------------------------------------------------------------ op-breakdown

struct OpBreakdownArgs {
  std::string model = "lstm";
  int64_t batch_size = 0;
  int64_t image_size = 32;
  int64_t in_channels = 3;
  int64_t hidden_size = 650;
  std::string precision = "bf16";
};

void op_breakdown(const SuiteArgs& a, const OpBreakdownArgs& ob, std::ostream& out) {
  Report rep(a, "op-breakdown");
  BenchStepOptions o = base_step(a, a.quick ? 1 : 3, a.quick ? 3 : 10);
  o.model = ob.model;
  o.batch_size = ob.batch_size;
  o.image_size = ob.image_size;
  o.in_channels = ob.in_channels;
  o.embed_size = o.hidden_size = ob.hidden_size;
  o.profile = true;
  progress("op-breakdown: " + o.model + " fp32");
  o.precision = mp::DType::f32;
  const Json f = run_bench_step(o);
  progress("op-breakdown: " + o.model + " " + ob.precision);
  o.precision = mp::train::FieldText<mp::DType>::parse(ob.precision, "precision");
  o.opt_level = mp::amp::OptLevel::O2;
  const Json m = run_bench_step(o);
  struct Row {
    double ms32 = 0, ms16 = 0, by32 = 0, by16 = 0;
  };
  std::map<std::string, Row> rows;
  for (const auto& op : f["ops"]) {
    Row& r = rows[op["name"]];
    r.ms32 = op["ms"];
    r.by32 = op["bytes"];
  }
  for (const auto& op : m["ops"]) {
    Row& r = rows[op["name"]];
    r.ms16 = op["ms"];
    r.by16 = op["bytes"];
  }
  std::vector<std::pair<std::string, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.second.ms32 > y.second.ms32; });
  const double step32 = f["mean_ms"], step16 = m["mean_ms"];
  report::Table t;
  t.header = {"op",       "fp32 ms/step", "fp32 share",          ob.precision + " ms/step", ob.precision + " share",
              "speed-up", "fp32 GB/s",    ob.precision + " GB/s"};
  std::vector<std::string> labels;
  std::vector<double> speedups;
  for (const auto& [name, r] : sorted) {
    t.rows.push_back({name, fmt("%.2f", r.ms32), fmt("%.1f%%", 100 * r.ms32 / step32), fmt("%.2f", r.ms16),
                      fmt("%.1f%%", 100 * r.ms16 / step16), r.ms16 > 0 ? fmt("%.2fx", r.ms32 / r.ms16) : "-",
                      r.ms32 > 0 ? fmt("%.1f", r.by32 / (r.ms32 * 1e6)) : "-",
                      r.ms16 > 0 ? fmt("%.1f", r.by16 / (r.ms16 * 1e6)) : "-"});
    if (labels.size() < 12 && r.ms32 > 0 && r.ms16 > 0) {
      labels.push_back(name);
      speedups.push_back(r.ms32 / r.ms16);
    }
  }
  const double k32 = f["kernel_ms"], k16 = m["kernel_ms"];
  t.rows.push_back({"all kernels", fmt("%.2f", k32), fmt("%.1f%%", 100 * k32 / step32), fmt("%.2f", k16),
                    fmt("%.1f%%", 100 * k16 / step16), fmt("%.2fx", k32 / k16), "", ""});
  t.rows.push_back({"outside kernels (autograd, allocation, dispatch)", fmt("%.2f", step32 - k32),
                    fmt("%.1f%%", 100 * (step32 - k32) / step32), fmt("%.2f", step16 - k16),
                    fmt("%.1f%%", 100 * (step16 - k16) / step16), fmt("%.2fx", (step32 - k32) / (step16 - k16)), "",
                    ""});
  t.rows.push_back({"whole step (mean)", fmt("%.2f", step32), "100%", fmt("%.2f", step16), "100%",
                    fmt("%.2fx", step32 / step16), "", ""});
  rep.md("## Op breakdown: " + o.model + " (" +
         (bench_is_lm(o.model) ? "hidden " + std::to_string(ob.hidden_size) + ", " : "") + "batch " +
         std::to_string(f["config"]["batch_size"].get<int64_t>()) + "), fp32 vs " + ob.precision + " " +
         m["amp"].get<std::string>() + "\n\n" + header_line(f));
  rep.table(t);
  rep.md("\nTimes are exclusive wall time per step of each kernel label over " + std::to_string(o.steps) +
         " timed steps (profiler on). GB/s = bytes of the operand tensors (inputs + outputs) / time: the achieved "
         "bandwidth for memory-bound ops; for matmul and convolution it is not a bandwidth. 'cast' is a copy that "
         "changes dtype.\n");
  rep.json()["fp32"] = f;
  rep.json()[ob.precision] = m;
  rep.bars("speedup.png", "fp32 -> " + ob.precision + " speed-up per op", "speed-up (x)", labels, speedups);
  rep.write(out);
}

// ------------------------------------------------------------------------------ lstm-impl

void lstm_impl(const SuiteArgs& a, std::ostream& out) {
  Report rep(a, "lstm-impl");
  struct Size {
    int64_t hidden, batch;
  };
  const std::vector<Size> sizes = a.quick ? std::vector<Size>{{256, 20}, {650, 20}}
                                          : std::vector<Size>{{256, 20}, {650, 20}, {650, 64}, {1500, 20}, {1500, 64}};
  // The library LSTM of the device: oneDNN's on the CPU, cuDNN's on CUDA.
  const bool cuda = a.device.rfind("cuda", 0) == 0;
  const std::string lib = cuda ? "cudnn" : "onednn";
  const std::vector<std::string> impls = {"basic", "fused", lib};
  report::Table t;
  t.header = {"hidden",         "batch",           "precision",   "basic ms/step", "fused ms/step", "fused speed-up",
              lib + " ms/step", lib + " speed-up", "basic tok/s", "fused tok/s",   lib + " tok/s"};
  std::vector<std::string> labels;
  std::vector<double> speedups_fused, speedups_lib;
  Json runs = Json::array();
  Json first;
  for (const Size& s : sizes)
    for (const char* prec : {"fp32", "bf16"}) {
      BenchStepOptions o = base_step(a, a.quick ? 1 : 2, a.quick ? 3 : 8);
      o.model = "lstm";
      o.hidden_size = o.embed_size = s.hidden;
      o.batch_size = s.batch;
      o.precision = mp::train::FieldText<mp::DType>::parse(prec, "precision");
      Json r[3];
      for (size_t impl = 0; impl < impls.size(); ++impl) {
        o.lstm_impl = impls[impl];
        progress("lstm-impl: H " + std::to_string(s.hidden) + " B " + std::to_string(s.batch) + " " + prec + " " +
                 o.lstm_impl);
        r[impl] = try_step(o);
        r[impl]["lstm_impl"] = o.lstm_impl;
        runs.push_back(r[impl]);
        if (first.is_null() && ok(r[impl])) first = r[impl];
      }
      const double b = num(r[0], "median_ms"), f = num(r[1], "median_ms"), l = num(r[2], "median_ms");
      auto ms = [](const Json& j, double v) { return ok(j) ? fmt("%.1f", v) : err_cell(j); };
      t.rows.push_back({std::to_string(s.hidden), std::to_string(s.batch), prec, ms(r[0], b), ms(r[1], f),
                        fmt("%.2fx", b / f), ms(r[2], l), fmt("%.2fx", b / l), fmt("%.0f", num(r[0], "throughput")),
                        fmt("%.0f", num(r[1], "throughput")), fmt("%.0f", num(r[2], "throughput"))});
      labels.push_back("H" + std::to_string(s.hidden) + " B" + std::to_string(s.batch) + " " + prec);
      speedups_fused.push_back(std::isfinite(b / f) ? b / f : 0.0);
      speedups_lib.push_back(std::isfinite(b / l) ? b / l : 0.0);
    }
  rep.md("## LSTM implementations: basic per-step graph vs fused sequence-level layer vs the library's LSTM\n\n" +
         (first.is_null() ? std::string() : header_line(first)) +
         "Word LM (2 layers, vocabulary 10k, sequence 35, dropout 0.5, SGD momentum, clip 0.25); median ms per "
         "training step, speed-ups over basic. basic = linear + add + fused gate kernel per time step (PyTorch's "
         "non-cuDNN path); fused = mp::lstm_layer: one autograd node per layer, the recurrent weight gradient as one "
         "GEMM over all steps; " +
         lib +
         " = mp::lstm_layer_library: the whole layer (input projection, recurrence, "
         "backward) in " +
         (cuda ? "cuDNN's RNN (what PyTorch runs on GPUs; the articles measured it up to 1.9x "
                 "faster than a basic LSTM)"
               : "oneDNN's LSTM primitive (f32 and bf16 on the CPU)") +
         ". A failed configuration shows as 'failed' (the error is in the JSON) and a speed-up of 0 in the chart.\n\n");
  rep.table(t);
  rep.json()["runs"] = runs;
  rep.bars("speedup.png", "fused LSTM speed-up over basic", "speed-up (x)", labels, speedups_fused);
  rep.bars("speedup_" + lib + ".png", lib + " LSTM speed-up over basic", "speed-up (x)", labels, speedups_lib);
  rep.write(out);
}

// ------------------------------------------------------------------------------ lstm-sweep

// Matmul FLOPs of one training step of the word LM (forward + the two backward GEMMs = 3x forward):
// per layer the input GEMM 2 T B I 4H and the recurrent GEMM 2 T B H 4H, plus the decoder 2 T B H V.
double lm_step_flops(int64_t L, int64_t B, int64_t N, int64_t T, int64_t V) {
  const double tb = static_cast<double>(T) * static_cast<double>(B);
  double fwd = 0;
  for (int64_t l = 0; l < L; ++l) fwd += 2.0 * tb * 4.0 * N * (N + N);
  fwd += 2.0 * tb * N * V;
  return 3.0 * fwd;
}

/// The grid of lstm-sweep (empty = the suite's default for --quick or full).
struct SweepArgs {
  std::vector<int64_t> layers, batches, cells;
  int64_t vocab_size = 10000;
};

void lstm_sweep(const SuiteArgs& a, const SweepArgs& g, const PyTorchSide& torch, std::ostream& out) {
  Report rep(a, "lstm-sweep");
  auto pick = [](const std::vector<int64_t>& given, std::vector<int64_t> d) { return given.empty() ? d : given; };
  const std::vector<int64_t> layers =
      pick(g.layers, a.quick ? std::vector<int64_t>{2} : std::vector<int64_t>{2, 3, 4, 5});
  const std::vector<int64_t> batches =
      pick(g.batches, a.quick ? std::vector<int64_t>{32, 64} : std::vector<int64_t>{32, 64, 128, 256, 512, 1024});
  const std::vector<int64_t> cells =
      pick(g.cells, a.quick ? std::vector<int64_t>{256, 512} : std::vector<int64_t>{512, 1024, 2048, 4096});
  const int64_t T = 35, V = g.vocab_size;
  report::Table t;
  t.header = {"layers",
              "batch",
              "cells",
              "fp32 ms/step",
              "bf16 ms/step",
              "fp32 TFLOP/s",
              "bf16 TFLOP/s",
              "fp32 matmul TFLOP/s",
              "bf16 matmul TFLOP/s",
              "end-to-end speed-up"};
  if (torch.enabled()) {
    t.header.push_back("PyTorch fp32 / mixprec fp32");
    t.header.push_back("PyTorch bf16 / mixprec bf16");
  }
  Json runs = Json::array();
  Json first;
  std::map<std::string, report::Series> curves;  // TFLOP/s vs cells per (precision, largest batch, 2 layers)
  for (int64_t L : layers)
    for (int64_t B : batches)
      for (int64_t N : cells) {
        const double flops = lm_step_flops(L, B, N, T, V);
        Json r[2], pt[2];
        for (int p = 0; p < 2; ++p) {
          BenchStepOptions o = base_step(a, 1, a.quick ? 2 : 5);
          o.model = "lstm";
          o.num_layers = L;
          o.batch_size = B;
          o.hidden_size = o.embed_size = N;
          o.bptt = T;
          o.vocab_size = V;
          o.precision = p == 0 ? mp::DType::f32 : mp::DType::bf16;
          o.profile = true;
          progress("lstm-sweep: L " + std::to_string(L) + " B " + std::to_string(B) + " N " + std::to_string(N) + " " +
                   mp::train::precision_name(o.precision));
          r[p] = try_step(o);
          if (ok(r[p])) {
            double mm = 0;
            for (const auto& op : r[p]["ops"])
              if (op["name"] == "matmul") mm += op["ms"].get<double>();
            r[p]["flops_per_step"] = flops;
            r[p]["tflops"] = flops / (r[p]["median_ms"].get<double>() * 1e-3) / 1e12;
            r[p]["matmul_tflops"] = mm > 0 ? Json(flops / (mm * 1e-3) / 1e12) : Json(nullptr);
            r[p].erase("ops");  // keep the JSON readable: the op table is op-breakdown's business
            r[p].erase("step_ms");
            if (first.is_null()) first = r[p];
          }
          r[p]["layers"] = L;
          if (torch.enabled()) {
            progress("lstm-sweep: L " + std::to_string(L) + " B " + std::to_string(B) + " N " + std::to_string(N) +
                     " " + mp::train::precision_name(o.precision) + " PyTorch");
            o.profile = false;
            pt[p] = torch.step(o);
            pt[p].erase("step_ms");
            r[p]["pytorch"] = pt[p];
          }
          runs.push_back(r[p]);
        }
        auto cell = [&](int p, const char* key, const char* f) {
          return ok(r[p]) ? fmt(f, num(r[p], key)) : err_cell(r[p]);
        };
        t.rows.push_back({std::to_string(L), std::to_string(B), std::to_string(N), cell(0, "median_ms", "%.1f"),
                          cell(1, "median_ms", "%.1f"), cell(0, "tflops", "%.3f"), cell(1, "tflops", "%.3f"),
                          cell(0, "matmul_tflops", "%.3f"), cell(1, "matmul_tflops", "%.3f"),
                          fmt("%.2fx", num(r[0], "median_ms") / num(r[1], "median_ms"))});
        if (torch.enabled())
          for (int p = 0; p < 2; ++p)
            t.rows.back().push_back(
                ok(pt[p]) && ok(r[p]) ? fmt("%.2fx", num(pt[p], "median_ms") / num(r[p], "median_ms")) : "-");
        if (L == layers.front() && B == batches.back())
          for (int p = 0; p < 2; ++p)
            if (ok(r[p])) {
              report::Series& s = curves[p == 0 ? "fp32" : "bf16"];
              s.title = std::string(p == 0 ? "fp32" : "bf16") + ", " + std::to_string(L) + " layers, batch " +
                        std::to_string(B);
              s.x.push_back(static_cast<double>(N));
              s.y.push_back(num(r[p], "tflops"));
            }
      }
  rep.md("## Word-LM sweep: achieved TFLOP/s, fp32 vs bf16 O2\n\n" +
         (first.is_null() ? std::string() : header_line(first)) + "LSTM LM, vocabulary " + std::to_string(V) +
         ", sequence 35, SGD momentum; FLOPs = the matmuls of a training step (3x the "
         "forward: per layer 2TB(4N)(2N), decoder 2TBNV). End to end = FLOPs / median step time; matmul = FLOPs / "
         "time in the matmul kernels (profiler). Configurations that did not fit are reported as OOM. " +
         (torch.enabled() ? std::string("PyTorch ratios: its median step time over ours (> 1: mixprec faster).")
                          : torch.why() + ".") +
         "\n\n");
  rep.table(t);
  rep.json()["runs"] = runs;
  std::vector<report::Series> series;
  for (auto& [k, s] : curves) series.push_back(s);
  if (!series.empty()) rep.lines("tflops.png", "achieved TFLOP/s vs cells", "cells (hidden size)", "TFLOP/s", series);
  rep.write(out);
}

// ------------------------------------------------------------------------------ resnets

// Largest batch whose peak tensor memory (one full training step) fits `budget` bytes: doubling,
// then bisection down to 1/16 of the answer. Returns the batch and the peaks measured on the way.
std::pair<int64_t, Json> max_batch(BenchStepOptions o, double budget, int64_t start) {
  o.warmup = 0;
  o.steps = 1;
  Json trials = Json::array();
  auto fits = [&](int64_t b) {
    o.batch_size = b;
    const Json r = try_step(o);
    const bool f = ok(r) && num(r, "peak_bytes") <= budget;
    trials.push_back({{"batch", b}, {"peak_bytes", ok(r) ? r["peak_bytes"] : Json(nullptr)}, {"fits", f}});
    return f;
  };
  int64_t lo = 0, hi = std::max<int64_t>(1, start);
  while (hi <= (1 << 16) && fits(hi)) lo = hi, hi *= 2;  // lo = 0 when even `start` does not fit
  while (hi - lo > std::max<int64_t>(1, lo / 16)) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid;
  }
  return {lo, trials};
}

/// What resnets runs (empty / 0 = the suite's default for --quick or full).
struct ResnetArgs {
  std::vector<std::string> models;
  int64_t batch_size = 0;
  double budget_gib = 0;
};

void resnets(const SuiteArgs& a, const ResnetArgs& ra, const PyTorchSide& torch, std::ostream& out) {
  Report rep(a, "resnets");
  std::vector<std::string> models = ra.models;
  if (models.empty())
    models = a.quick ? std::vector<std::string>{"resnet18", "resnet34", "resnet50"}
                     : std::vector<std::string>{"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"};
  const int64_t batch = ra.batch_size > 0 ? ra.batch_size : a.quick ? 16 : 128;
  const double budget_gib = ra.budget_gib > 0 ? ra.budget_gib : a.quick ? 1.0 : 16.0;
  const double budget = budget_gib * (1 << 30);
  report::Table t;
  t.header = {"model",
              "fp32 ms/step",
              "bf16 ms/step",
              "bf16 time (fp32 = 1)",
              "fp32 epoch (s)",
              "bf16 epoch (s)",
              "max batch fp32",
              "max batch bf16",
              "max batch ratio",
              "PyTorch fp32 / mixprec fp32",
              "PyTorch bf16 / mixprec bf16"};
  Json runs = Json::array();
  Json first;
  std::vector<std::string> labels;
  std::vector<double> scaled, ratio;
  for (const std::string& m : models) {
    Json r[2], pt[2];
    int64_t mb[2] = {0, 0};
    for (int p = 0; p < 2; ++p) {
      BenchStepOptions o = base_step(a, a.quick ? 1 : 3, a.quick ? 3 : 10);
      o.model = m;
      o.batch_size = batch;
      o.precision = p == 0 ? mp::DType::f32 : mp::DType::bf16;
      progress("resnets: " + m + " " + mp::train::precision_name(o.precision) + " step");
      r[p] = try_step(o);
      if (ok(r[p]) && first.is_null()) first = r[p];
      if (torch.enabled()) {
        progress("resnets: " + m + " " + mp::train::precision_name(o.precision) + " PyTorch step");
        pt[p] = torch.step(o);
      }
      progress("resnets: " + m + " " + mp::train::precision_name(o.precision) + " max batch within " +
               fmt("%.2f", budget_gib) + " GiB");
      Json trials;
      std::tie(mb[p], trials) = max_batch(o, budget, batch);
      r[p]["max_batch"] = mb[p];
      r[p]["max_batch_trials"] = trials;
      r[p].erase("step_ms");
      if (torch.enabled()) r[p]["pytorch"] = pt[p];
      runs.push_back(r[p]);
    }
    const double t32 = num(r[0], "median_ms"), t16 = num(r[1], "median_ms");
    // An epoch of CIFAR's 50,000 training images at the measured step time.
    auto epoch = [&](double ms) { return ms * 1e-3 * 50000.0 / static_cast<double>(batch); };
    auto pt_ratio = [&](int p) {
      return torch.enabled() && ok(pt[p]) && ok(r[p]) ? fmt("%.2fx", num(pt[p], "median_ms") / num(r[p], "median_ms"))
                                                      : "-";
    };
    t.rows.push_back({m, ok(r[0]) ? fmt("%.1f", t32) : err_cell(r[0]), ok(r[1]) ? fmt("%.1f", t16) : err_cell(r[1]),
                      fmt("%.2f", t16 / t32), fmt("%.0f", epoch(t32)), fmt("%.0f", epoch(t16)), std::to_string(mb[0]),
                      std::to_string(mb[1]), mb[0] > 0 ? fmt("%.2fx", static_cast<double>(mb[1]) / mb[0]) : "-",
                      pt_ratio(0), pt_ratio(1)});
    labels.push_back(m);
    scaled.push_back(t16 / t32);
    ratio.push_back(mb[0] > 0 ? static_cast<double>(mb[1]) / mb[0] : std::nan(""));
  }
  rep.md("## ResNets, fp32 vs bf16 O2 (CIFAR shape 32x32x3, batch " + std::to_string(batch) + ")\n\n" +
         (first.is_null() ? std::string() : header_line(first)) +
         "Median ms per training step (SGD momentum); epoch = 50,000 images at that step time. Max batch = the "
         "largest batch whose peak tensor memory over one training step stays within " +
         fmt("%.2f", budget_gib) + " GiB (doubling, then bisection to 1/16; every trial is a real step). " +
         (torch.enabled() ? "PyTorch ratios: its median step time over ours, same configuration, run right after "
                            "ours (> 1: mixprec faster)."
                          : torch.why() + ".") +
         "\n\n");
  rep.table(t);
  rep.json()["runs"] = runs;
  rep.json()["memory_budget_bytes"] = budget;
  rep.bars("time.png", "bf16 step time, fp32 = 1", "relative time", labels, scaled);
  rep.bars("max_batch.png", "largest batch, bf16 / fp32", "ratio", labels, ratio);
  rep.write(out);
}

// ------------------------------------------------------------------------------ opt-levels

void opt_levels(const SuiteArgs& a, tr::TrainConfig base, const std::vector<std::string>& runs_list,
                std::ostream& out) {
  const std::string dir = a.report.empty() ? "report/bench-opt-levels" : a.report;
  std::vector<tr::TrainConfig> configs;
  for (const std::string& item : runs_list) configs.push_back(compare_run_config(base, item, dir));  // flags first
  std::vector<tr::RunSummary> done;
  std::vector<std::string> failed;
  for (size_t i = 0; i < configs.size(); ++i) {
    const tr::TrainConfig& c = configs[i];
    const std::string& item = runs_list[i];
    try {
      done.push_back(tr::train(c, out));
      out << "\n";
    } catch (const mp::Error& e) {  // reported however it ends (an unsupported dtype, a divergence that throws)
      failed.push_back(item + ": " + e.what());
      out << "bench opt-levels: " << item << " did not finish: " << e.what() << "\n";
    }
  }
  MP_CHECK(!done.empty(), "bench opt-levels: no run finished:\n", [&] {
    std::string s;
    for (const auto& f : failed) s += "  " + f + "\n";
    return s;
  }());
  write_compare_report(done, dir, out);
  if (!failed.empty()) {
    std::string note = "\nRuns that did not finish:\n";
    for (const auto& f : failed) note += "- " + f + "\n";
    out << note;
    const auto md = std::filesystem::path(dir) / "compare.md";
    std::ostringstream all;
    all << std::ifstream(md).rdbuf() << note;
    mp::atomic_write_file(md.string(), all.str());
  }
}

}  // namespace

void add_bench_suites(CLI::App* bench) {
  auto common = [](CLI::App* cmd, SuiteArgs& a) {
    cmd->add_option("--report", a.report, "report folder (default report/bench-SUITE)");
    cmd->add_flag("--quick", a.quick, "small sizes: minutes on a 2-core CPU (full sizes are for a GPU)");
    cmd->add_option("--warmup", a.warmup, "untimed steps per configuration (default: the suite's)");
    cmd->add_option("--steps", a.steps, "timed steps per configuration (default: the suite's)");
    cmd->add_option("--device", a.device, "cpu, cuda or cuda:N (PyTorch runs on the same device)")
        ->capture_default_str();
  };
  auto torch_flags = [](CLI::App* cmd, SuiteArgs& a) {
    cmd->add_option("--pytorch", a.pytorch, "PyTorch side by side: auto (when torch imports), on or off")
        ->capture_default_str();
    cmd->add_option("--python", a.python, "python interpreter with torch")->capture_default_str();
    cmd->add_option("--pytorch_script", a.script, "PyTorch's bench step")->capture_default_str();
  };
  {
    auto* cmd = bench->add_subcommand("op-breakdown",
                                      "Each kernel's share of a training step, fp32 vs bf16 speed-up "
                                      "and achieved bandwidth");
    auto a = std::make_shared<SuiteArgs>();
    auto ob = std::make_shared<OpBreakdownArgs>();
    common(cmd, *a);
    cmd->add_option("--model", ob->model, "model as in bench step (lstm, resnet18, mlp-2048x2, ...)")
        ->capture_default_str();
    cmd->add_option("--batch_size", ob->batch_size, "batch (0 = bench step's default)")->capture_default_str();
    cmd->add_option("--hidden_size", ob->hidden_size, "word LM: embedding and hidden size")->capture_default_str();
    cmd->add_option("--image_size", ob->image_size, "images: height = width")->capture_default_str();
    cmd->add_option("--in_channels", ob->in_channels, "images: channels")->capture_default_str();
    cmd->add_option("--precision", ob->precision, "mixed precision to compare with fp32: bf16 or fp16")
        ->capture_default_str();
    cmd->callback([a, ob] { op_breakdown(*a, *ob, std::cout); });
  }
  {
    auto* cmd = bench->add_subcommand(
        "lstm-impl", "Basic (per-step graph) vs fused (sequence-level) vs library (oneDNN/cuDNN) LSTM");
    auto a = std::make_shared<SuiteArgs>();
    common(cmd, *a);
    cmd->callback([a] { lstm_impl(*a, std::cout); });
  }
  {
    auto* cmd =
        bench->add_subcommand("lstm-sweep", "Word LM over layers x batch x cells: achieved TFLOP/s, fp32 vs bf16");
    auto a = std::make_shared<SuiteArgs>();
    auto g = std::make_shared<SweepArgs>();
    common(cmd, *a);
    torch_flags(cmd, *a);
    cmd->add_option("--layers", g->layers, "layer counts (default 2,3,4,5; quick 2)")->delimiter(',');
    cmd->add_option("--batches", g->batches, "batch sizes (default 32..1024; quick 32,64)")->delimiter(',');
    cmd->add_option("--cells", g->cells, "hidden sizes (default 512..4096; quick 256,512)")->delimiter(',');
    cmd->add_option("--vocab_size", g->vocab_size, "vocabulary")->capture_default_str();
    cmd->callback([a, g] {
      for (const auto* v : {&g->layers, &g->batches, &g->cells})
        for (int64_t x : *v)
          MP_CHECK(x > 0, "bench lstm-sweep: --layers/--batches/--cells take positive sizes, got ", x);
      MP_CHECK(g->vocab_size > 0, "bench lstm-sweep: --vocab_size must be positive, got ", g->vocab_size);
      const PyTorchSide torch(*a);
      lstm_sweep(*a, *g, torch, std::cout);
    });
  }
  {
    auto* cmd = bench->add_subcommand("resnets", "ResNet-18..152, fp32 vs bf16: step time, scaled time, max batch");
    auto a = std::make_shared<SuiteArgs>();
    auto ra = std::make_shared<ResnetArgs>();
    common(cmd, *a);
    torch_flags(cmd, *a);
    cmd->add_option("--models", ra->models, "models (default resnet18..152; quick resnet18,34,50)")->delimiter(',');
    cmd->add_option("--batch_size", ra->batch_size, "batch of the timed steps (default 128; quick 16)");
    cmd->add_option("--memory_budget_gib", ra->budget_gib,
                    "tensor-memory budget of the max-batch search (default 16; quick 1)");
    cmd->callback([a, ra] {
      MP_CHECK(ra->budget_gib >= 0, "bench resnets: --memory_budget_gib must be >= 0, got ", ra->budget_gib);
      MP_CHECK(ra->batch_size >= 0, "bench resnets: --batch_size must be >= 0, got ", ra->batch_size);
      for (const auto& m : ra->models)
        MP_CHECK(m.rfind("resnet", 0) == 0,
                 "bench resnets: --models takes resnet names (resnet18, resnet50, ...), got '", m, "'");
      const PyTorchSide torch(*a);
      resnets(*a, *ra, torch, std::cout);
    });
  }
  {
    auto* cmd = bench->add_subcommand("opt-levels", "A Wide-ResNet trained at O0..O3 in bf16 and fp16 (Apex's table)");
    auto a = std::make_shared<SuiteArgs>();
    auto c = std::make_shared<tr::TrainConfig>();
    auto runs = std::make_shared<std::vector<std::string>>(
        std::vector<std::string>{"fp32", "bf16:O1", "bf16:O2", "bf16:O3", "bf16:O3+sr", "fp16:O1", "fp16:O2", "fp16:O3",
                                 "fp16:O3+bn32", "fp16:O3+sr"});
    cmd->add_option("--report", a->report, "report folder (default report/bench-opt-levels)");
    cmd->add_flag("--quick", a->quick, "wrn-10-1 on 8,192 images for 1 epoch (full: wrn-16-4, 10 epochs, all data)");
    cmd->add_option("--train_subset", c->train_subset, "first N training images (default all; quick 8192)");
    cmd->add_option("--runs", *runs,
                    "precision:opt level list with compare's suffixes (+sr stochastic rounding, +bn32 "
                    "keep_batchnorm_fp32: Apex's O3 speed baseline)")
        ->delimiter(',')
        ->capture_default_str();
    cmd->add_option("--model", c->model, "model (default wrn-16-4; quick wrn-10-1)");
    cmd->add_option("--epochs", c->epochs, "epochs (default 10; quick 1)");
    cmd->add_option("--data_dir", c->data_dir, "dataset folder");
    cmd->callback([a, c, runs] {
      tr::TrainConfig base = *c;
      const tr::TrainConfig defaults;
      if (base.model == defaults.model) base.model = a->quick ? "wrn-10-1" : "wrn-16-4";
      if (base.epochs == defaults.epochs) base.epochs = a->quick ? 1 : 10;
      base.batch_size = 128;
      base.optimizer = "sgd";
      base.momentum = 0.9;
      base.warmup_epochs = a->quick ? 0.25 : 1.0;
      if (a->quick && base.train_subset == 0) base.train_subset = 8192;
      base.quiet = false;
      opt_levels(*a, base, *runs, std::cout);
    });
  }
}

}  // namespace mixprec

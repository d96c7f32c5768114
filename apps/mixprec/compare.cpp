// `mixprec compare`: one job at several precisions / opt levels, reported as the reference articles
// do (precision, time, memory, accuracy or perplexity, speed-up over fp32), as markdown, JSON and PNG.
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "mp/core/error.hpp"
#include "mp/core/atomic_file.hpp"
#include "mp/dist/process_group.hpp"
#include "mp/report/plot.hpp"
#include "mp/train/progress.hpp"
#include "mp/report/table.hpp"

namespace mixprec {
namespace {

namespace tr = mp::train;
namespace report = mp::report;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// "fp32", "bf16", "bf16:O1", "fp16:O3", "bf16:O3+sr", "bf16:O3+bn32" -> (precision, opt level, Apex's
// properties, stochastic rounding). Suffixes: +sr (stochastic rounding), +bn32 / +bn16 (keep_batchnorm_fp32
// true / false), +masters / +nomasters (master_weights true / false), in any number and order.
struct RunItem {
  mp::DType precision = mp::DType::f32;
  std::optional<mp::amp::OptLevel> opt_level;
  std::optional<bool> keep_batchnorm_fp32, master_weights;
  bool stochastic_rounding = false;
};
RunItem parse_run(const std::string& item) {
  RunItem r;
  const auto plus = item.find('+');
  std::string rest = item.substr(0, plus);
  for (size_t at = plus; at != std::string::npos;) {
    const size_t next = item.find('+', at + 1);
    const std::string suffix = item.substr(at, next == std::string::npos ? std::string::npos : next - at);
    auto set = [&](std::optional<bool>& field, bool value) {
      MP_CHECK(!field || *field == value, "--runs: '", item, "' sets one property twice (", suffix,
               " after its opposite); keep one of them");
      field = value;
    };
    if (suffix == "+sr")
      r.stochastic_rounding = true;
    else if (suffix == "+bn32" || suffix == "+bn16")
      set(r.keep_batchnorm_fp32, suffix == "+bn32");
    else if (suffix == "+masters" || suffix == "+nomasters")
      set(r.master_weights, suffix == "+masters");
    else
      MP_FAIL("--runs: unknown suffix '", suffix, "' in '", item, "'; expected +sr (stochastic rounding), +bn32 or ",
              "+bn16 (batch-norm weights f32 or 16-bit), +masters or +nomasters (f32 master weights or none), e.g. ",
              "bf16:O3+bn32");
    at = next;
  }
  const auto colon = rest.find(':');
  try {
    r.precision = tr::FieldText<mp::DType>::parse(rest.substr(0, colon), "precision");
    if (colon != std::string::npos)
      r.opt_level = tr::FieldText<std::optional<mp::amp::OptLevel>>::parse(rest.substr(colon + 1), "opt_level");
  } catch (const mp::Error& e) {
    MP_FAIL("--runs: '", item, "': ", e.what(), " (an item is a precision, optionally with an opt level: bf16:O1)");
  }
  return r;
}

// Mean of each consecutive window of `w` values (curves stay readable at thousands of steps).
report::Series smoothed(const std::string& title, const std::vector<double>& v, size_t w) {
  report::Series s{title, {}, {}};
  w = std::max<size_t>(1, w);
  for (size_t i = 0; i + w <= v.size(); i += w) {
    double sum = 0;
    size_t n = 0;
    for (size_t k = i; k < i + w; ++k)
      if (std::isfinite(v[k])) sum += v[k], ++n;
    if (n == 0) continue;
    s.x.push_back(static_cast<double>(i + w));
    s.y.push_back(sum / static_cast<double>(n));
  }
  return s;
}

}  // namespace

tr::TrainConfig compare_run_config(const tr::TrainConfig& base, const std::string& item, const std::string& report) {
  tr::TrainConfig c = base;
  const RunItem r = parse_run(item);
  c.precision = r.precision;
  c.opt_level = r.opt_level;
  c.stochastic_rounding = r.stochastic_rounding;
  c.keep_batchnorm_fp32 = r.keep_batchnorm_fp32;
  c.master_weights = r.master_weights;
  if (!report.empty()) {
    std::string stem = item;
    for (char& ch : stem)
      if (ch == ':') ch = '_';
    std::filesystem::create_directories(report);
    c.log = (std::filesystem::path(report) / (stem + ".jsonl")).string();
  }
  tr::validate(c);
  return c;
}

// How the run's 16-bit matmuls and convolutions computed on the CPU: shapes per kernel path among the choices
// of the run's dtype (Note [kernel paths chosen by measurement]); f16 computes through f32 on the CPU.
std::string kernel_paths_cell(const tr::RunSummary& r) {
  if (r.config.precision == mp::DType::f32 || r.config.device != "cpu") return "-";
  const std::string dt = mp::dtype_name(r.config.precision);
  std::map<std::string, std::string> own;  // the choices of the run's dtype
  for (const auto& [key, path] : r.kernel_paths.choices) {
    const size_t sp = key.find(' ');
    const std::string dts = sp == std::string::npos ? "" : key.substr(sp + 1, dt.size() + 1);
    if (dts == dt + " " || dts == dt + ">") own[key] = path;
  }
  if (own.empty()) return dt == "f16" ? "via_f32" : "-";
  return mp::kernel_path_counts(own);
}

void write_compare_report(const std::vector<tr::RunSummary>& runs, const std::string& dir, std::ostream& out) {
  const bool text = runs.front().metric_name == "perplexity";
  size_t ref = 0;
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].config.precision == mp::DType::f32) {
      ref = i;
      break;
    }
  const tr::RunSummary& base = runs[ref];
  report::Table t;
  t.header = {"precision",
              "train time (s)",
              text ? "tokens/s" : "images/s",
              "data wait (s)",
              "peak memory (MiB)",
              text ? "valid perplexity" : "test accuracy (%)",
              "speed-up over " + base.label,
              "memory vs " + base.label,
              "skipped steps",
              "16-bit kernel paths (shapes)"};
  for (const tr::RunSummary& r : runs) {
    t.rows.push_back({r.label + (r.diverged ? " (diverged)" : ""), fmt("%.1f", r.train_seconds),
                      fmt("%.0f", r.throughput), fmt("%.1f", r.data_wait_seconds),
                      fmt("%.1f", static_cast<double>(r.peak_bytes) / (1 << 20)),
                      text ? fmt("%.2f", r.val_metric) : fmt("%.2f", 100 * r.val_metric),
                      fmt("%.2fx", base.train_seconds / std::max(r.train_seconds, 1e-9)),
                      fmt("%.2f", static_cast<double>(r.peak_bytes) / std::max<double>(1, base.peak_bytes)),
                      std::to_string(r.skipped_steps), kernel_paths_cell(r)});
  }
  // --ema_decay: the weight averages' metric beside the model's
  if (std::any_of(runs.begin(), runs.end(), [](const tr::RunSummary& r) { return r.ema_val_metric.has_value(); })) {
    t.header.insert(t.header.begin() + 6, text ? "EMA valid perplexity" : "EMA test accuracy (%)");
    for (size_t i = 0; i < runs.size(); ++i) {
      const auto& m = runs[i].ema_val_metric;
      t.rows[i].insert(t.rows[i].begin() + 6, !m ? std::string("-") : text ? fmt("%.2f", *m) : fmt("%.2f", 100 * *m));
    }
  }
  const tr::TrainConfig& c = base.config;
  std::ostringstream md;
  md << "## mixprec compare: " << c.model << " on " << c.dataset << ", " << c.epochs << " epoch(s), batch "
     << c.batch_size << ", " << c.optimizer << "\n\n"
     << t.to_markdown() << "\n"
     << "Time is training steps only (evaluation excluded); memory is the peak of tensor memory above what was "
        "live before the model was built.\n";
  const mp::KernelPathRecord& kp = runs.back().kernel_paths;
  if (!kp.choices.empty())
    md << "16-bit kernel paths are chosen per shape by timing them on this CPU (native = oneDNN's 16-bit kernels, "
          "via_f32 = widened to f32, gemm = im2col + one 16-bit GEMM): "
       << mp::kernel_path_summary(kp) << ".\n";
  out << "\n" << md.str();

  if (dir.empty()) return;
  std::filesystem::create_directories(dir);
  const std::filesystem::path d(dir);
  mp::atomic_write_file((d / "compare.md").string(), md.str());
  std::string json = "{\"runs\": [";
  for (size_t i = 0; i < runs.size(); ++i) json += (i ? ", " : "") + tr::summary_to_json(runs[i]);
  json += "]}\n";
  mp::atomic_write_file((d / "compare.json").string(), json);
  std::vector<std::string> written{"compare.md", "compare.json"};
  if (!report::gnuplot_available()) {
    out << "plots skipped: gnuplot not found (install it with: apt-get install gnuplot-nox)\n";
  } else {
    std::vector<report::Series> loss, metric;
    std::vector<std::string> labels;
    std::vector<double> secs, mem;
    size_t steps = 0;
    for (const auto& r : runs) steps = std::max(steps, r.step_losses.size());
    for (const auto& r : runs) {
      loss.push_back(smoothed(r.label, r.step_losses, steps / 100));
      report::Series m{r.label, {}, {}};
      for (const auto& e : r.epochs) {
        m.x.push_back(static_cast<double>(e.epoch));
        m.y.push_back(text ? e.val_metric : 100 * e.val_metric);
      }
      metric.push_back(m);
      report::Series ema{r.label + " (weight EMA)", {}, {}};
      for (const auto& e : r.epochs)
        if (e.ema_val_metric) {
          ema.x.push_back(static_cast<double>(e.epoch));
          ema.y.push_back(text ? *e.ema_val_metric : 100 * *e.ema_val_metric);
        }
      if (!ema.x.empty()) metric.push_back(ema);
      labels.push_back(r.label);
      secs.push_back(r.train_seconds);
      mem.push_back(static_cast<double>(r.peak_bytes) / (1 << 20));
    }
    report::plot_lines((d / "loss.png").string(), "training loss", "step", "loss", loss, /*log_y=*/text);
    report::plot_lines((d / "metric.png").string(), text ? "validation perplexity" : "test accuracy", "epoch",
                       text ? "perplexity" : "accuracy (%)", metric);
    report::plot_bars((d / "time.png").string(), "training time", "seconds", labels, secs);
    report::plot_bars((d / "memory.png").string(), "peak memory", "MiB", labels, mem);
    for (const char* f : {"loss.png", "metric.png", "time.png", "memory.png"}) written.emplace_back(f);
  }
  out << "report written to " << dir << ":";
  for (const auto& w : written) out << " " << w;
  out << "\n";
}

void add_compare_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("compare",
                                 "Run one training job at several precisions and compare time, memory and "
                                 "accuracy/perplexity (markdown table, JSON, PNG plots)");
  struct Args {
    tr::TrainConfig config;
    std::vector<std::string> runs{"fp32", "bf16"};
    std::string report = "report";
  };
  auto a = std::make_shared<Args>();
  add_config_options(cmd, a->config,
                     {"precision", "opt_level", "keep_batchnorm_fp32", "master_weights", "stochastic_rounding", "label",
                      "log", "checkpoint_dir", "save_best", "resume"});
  cmd->add_option("--runs", a->runs,
                  "precisions to compare, optionally with opt levels and suffixes: +sr (stochastic rounding), "
                  "+bn32/+bn16 (keep_batchnorm_fp32 true/false), +masters/+nomasters (master_weights): fp32 bf16 "
                  "bf16:O1 fp16:O2 bf16:O3+sr bf16:O3+bn32")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--report", a->report, "folder for compare.md, compare.json, run logs and plots ('' = none)")
      ->capture_default_str();
  auto file = std::make_shared<ConfigFileOptions>();
  add_config_file_options(cmd, *file);  // Note [a run described in a file]: the base of every run
  cmd->callback([cmd, a, file] {
    MP_CHECK(!a->runs.empty(), "--runs: give at least one precision");
    const tr::TrainConfig base = resolve_config(cmd, a->config, file->path);
    std::vector<tr::TrainConfig> configs;
    for (const std::string& item : a->runs) {
      configs.push_back(compare_run_config(base, item, a->report));  // all checked before the first run
    }
    if (file->print) {
      for (const tr::TrainConfig& c : configs) std::printf("%s\n", config_json_pretty(c).c_str());
      return;
    }
    std::vector<tr::RunSummary> runs;
    const bool reports = mp::dist::world().rank() == 0;  // Note [data-parallel training] 6: each run on every rank
    for (const tr::TrainConfig& c : configs) {
      runs.push_back(tr::train(c, std::cout));
      if (reports) std::cout << "\n";
    }
    if (reports) write_compare_report(runs, a->report, std::cout);
  });
}

}  // namespace mixprec

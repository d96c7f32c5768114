// `mixprec plot LOG.jsonl... --out DIR`: curves of run logs written by train/compare.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "commands.hpp"
#include "mp/core/error.hpp"
#include "mp/report/plot.hpp"
#include "mp/train/run_log.hpp"

namespace mixprec {
namespace {

double as_double(const mp::train::LogValue& v) {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? 1.0 : 0.0;
  return NAN;
}

// The run log's "numerics" records of one file (--numerics_every; docs/RUN_LOG.md): metric -> module -> step -> value.
struct Numerics {
  std::vector<std::string> modules;  // in first-seen order (the model's)
  std::map<std::string, std::map<std::string, std::map<double, double>>> by_metric;
  std::set<double> steps;
};

// The metrics drawn, each as a heat map of modules over steps: field, title, colour-bar label, log10 or not.
struct NumericsChart {
  const char* field;
  const char* title;
  const char* cblabel;
  bool log10;
};
constexpr NumericsChart kNumericsCharts[] = {
    {"act_amax", "largest |activation| (forward output)", "log10 max |output|", true},
    {"grad_amax", "largest |gradient| at the output (loss scale divided out)", "log10 max |dL/d output|", true},
    {"grad_underflow", "parameter gradients below f16's 2^-24 at the loss scale", "share of nonzero values", false},
    {"grad_underflow_unscaled", "parameter gradients below f16's 2^-24 at scale 1", "share of nonzero values", false},
    {"grad_zero", "parameter gradients exactly zero", "share of values", false},
    {"update_lost", "16-bit weight updates lost to rounding", "share of updates", false},
};

// Heat maps of `n` into `dir`, file names starting with `prefix`; returns the files written.
std::vector<std::string> plot_numerics(const Numerics& n, const std::filesystem::path& dir, const std::string& prefix,
                                       const std::string& title) {
  std::vector<std::string> written;
  const std::vector<double> steps(n.steps.begin(), n.steps.end());
  for (const NumericsChart& c : kNumericsCharts) {
    const auto m = n.by_metric.find(c.field);
    if (m == n.by_metric.end()) continue;  // e.g. update_lost of a run without 16-bit weights
    std::vector<std::string> rows;
    std::vector<std::vector<double>> values;
    for (const std::string& module : n.modules) {
      const auto r = m->second.find(module);
      if (r == m->second.end()) continue;
      std::vector<double> row;
      for (double s : steps) {
        const auto v = r->second.find(s);
        const double x = v == r->second.end() ? NAN : v->second;
        row.push_back(c.log10 ? std::log10(x) : x);
      }
      rows.push_back(module.empty() ? "<model>" : module);
      values.push_back(std::move(row));
    }
    bool any = false;
    for (const auto& row : values)
      for (double v : row) any = any || std::isfinite(v);
    if (!any) continue;  // nothing finite to colour (e.g. every step skipped)
    const std::string file = prefix + "numerics_" + c.field + ".png";
    mp::report::plot_heatmap((dir / file).string(), title + c.title, "step", c.cblabel, rows, steps, values,
                             /*shares=*/!c.log10);
    written.push_back(file);
  }
  return written;
}

}  // namespace

void add_plot_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("plot", "Plot loss, loss-scale and validation curves of JSONL run logs (PNG via gnuplot)");
  struct Args {
    std::vector<std::string> logs;
    std::string out = "plots";
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("logs", a->logs, "run logs (.jsonl) written by mixprec train --log or mixprec compare")->required();
  cmd->add_option("--out", a->out, "output folder")->capture_default_str();
  cmd->callback([a] {
    std::vector<mp::report::Series> loss, scale, val;
    std::vector<std::pair<std::string, Numerics>> numerics;  // per log with numerics records: its label
    std::string val_name;
    // Each curve is named by its file's stem, or by its folder where stems repeat (run1/log.jsonl, run2/log.jsonl).
    auto stem = [](const std::string& path) { return std::filesystem::path(path).stem().string(); };
    auto label = [&](const std::string& path) {
      for (const std::string& other : a->logs)
        if (other != path && stem(other) == stem(path)) {
          const std::string folder = std::filesystem::absolute(path).parent_path().filename().string();
          return folder.empty() ? path : folder;
        }
      return stem(path);
    };
    for (const std::string& path : a->logs) {
      const std::string title = label(path);
      mp::report::Series l{title, {}, {}}, s{title, {}, {}}, v{title, {}, {}}, ema{title + " (weight EMA)", {}, {}};
      Numerics num;
      for (const auto& rec : mp::train::read_run_log(path)) {
        auto type = rec.find("type");
        if (type == rec.end()) continue;
        const auto* t = std::get_if<std::string>(&type->second);
        if (t == nullptr) continue;
        auto get = [&](const char* k) {
          auto it = rec.find(k);
          return it == rec.end() ? NAN : as_double(it->second);
        };
        // A resumed run of an older mixprec appended the steps it did again after the log's last checkpoint
        // (Note [a resumed run's log] in src/train/run_log.cpp): the replay supersedes them.
        auto add = [](mp::report::Series& series, double x, double y) {
          while (!series.x.empty() && series.x.back() >= x) series.x.pop_back(), series.y.pop_back();
          series.x.push_back(x), series.y.push_back(y);
        };
        if (*t == "numerics") {
          const auto mod = rec.find("module");
          const std::string* name = mod == rec.end() ? nullptr : std::get_if<std::string>(&mod->second);
          MP_CHECK(name != nullptr, "plot: '", path, "': a numerics record without a \"module\" string; expected ",
                   "the records --numerics_every writes (docs/RUN_LOG.md)");
          if (std::find(num.modules.begin(), num.modules.end(), *name) == num.modules.end())
            num.modules.push_back(*name);
          const double step = get("step");
          num.steps.insert(step);
          for (const NumericsChart& c : kNumericsCharts)
            if (rec.count(c.field) != 0) num.by_metric[c.field][*name][step] = get(c.field);
        } else if (*t == "step") {
          add(l, get("step"), get("loss"));
          add(s, get("step"), get("scale"));
        } else if (*t == "epoch") {
          const bool acc = rec.count("val_accuracy") != 0;
          val_name = acc ? "test accuracy (%)" : "validation perplexity";
          add(v, get("epoch"), acc ? 100 * get("val_accuracy") : get("val_perplexity"));
          if (rec.count(acc ? "ema_val_accuracy" : "ema_val_perplexity") != 0)  // --ema_decay runs
            add(ema, get("epoch"), acc ? 100 * get("ema_val_accuracy") : get("ema_val_perplexity"));
        }
      }
      MP_CHECK(!l.x.empty(), "plot: '", path,
               "' has no step records; expected a run log written by mixprec train --log");
      loss.push_back(l), scale.push_back(s), val.push_back(v);
      if (!num.modules.empty()) numerics.emplace_back(title, std::move(num));
      if (!ema.x.empty()) val.push_back(ema);
    }
    std::filesystem::create_directories(a->out);
    const std::filesystem::path d(a->out);
    mp::report::plot_lines((d / "loss.png").string(), "training loss", "step", "loss", loss);
    mp::report::plot_lines((d / "loss_scale.png").string(), "loss scale", "step", "scale", scale, /*log_y=*/true);
    if (!val_name.empty()) mp::report::plot_lines((d / "validation.png").string(), val_name, "epoch", val_name, val);
    std::string files = std::string("loss.png loss_scale.png") + (val_name.empty() ? "" : " validation.png");
    for (const auto& [title, n] : numerics) {  // one set of heat maps per log; named by the log where several
      const bool several = a->logs.size() > 1;
      for (const std::string& f : plot_numerics(n, d, several ? title + "_" : "", several ? title + ": " : ""))
        files += " " + f;
    }
    std::printf("plots written to %s: %s\n", a->out.c_str(), files.c_str());
  });
}

}  // namespace mixprec

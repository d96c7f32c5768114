// `mixprec plot LOG.jsonl... --out DIR`: curves of run logs written by train/compare.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.hpp"
#include "mp/core/error.hpp"
#include "mp/train/plot.hpp"
#include "mp/train/run_log.hpp"

namespace mixprec {
namespace {

double as_double(const mp::train::LogValue& v) {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? 1.0 : 0.0;
  return NAN;
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
    std::vector<mp::train::Series> loss, scale, val;
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
      mp::train::Series l{title, {}, {}}, s{title, {}, {}}, v{title, {}, {}}, ema{title + " (weight EMA)", {}, {}};
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
        auto add = [](mp::train::Series& series, double x, double y) {
          while (!series.x.empty() && series.x.back() >= x) series.x.pop_back(), series.y.pop_back();
          series.x.push_back(x), series.y.push_back(y);
        };
        if (*t == "step") {
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
      if (!ema.x.empty()) val.push_back(ema);
    }
    std::filesystem::create_directories(a->out);
    const std::filesystem::path d(a->out);
    mp::train::plot_lines((d / "loss.png").string(), "training loss", "step", "loss", loss);
    mp::train::plot_lines((d / "loss_scale.png").string(), "loss scale", "step", "scale", scale, /*log_y=*/true);
    if (!val_name.empty()) mp::train::plot_lines((d / "validation.png").string(), val_name, "epoch", val_name, val);
    std::printf("plots written to %s: loss.png loss_scale.png%s\n", a->out.c_str(),
                val_name.empty() ? "" : " validation.png");
  });
}

}  // namespace mixprec

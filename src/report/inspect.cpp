// `mixprec info FILE`: what a safetensors file or a training checkpoint holds, from its header alone.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/json_excerpt.hpp"
#include "mp/kernel_paths.hpp"
#include "mp/core/error.hpp"
#include "mp/report/inspect.hpp"
#include "mp/train/checkpoint.hpp"
#include "mp/train/progress.hpp"
#include "mp/train/safetensors.hpp"
#include "mp/train/trainer.hpp"

namespace mp::report {

using namespace train;  // the checkpoint format, safetensors headers and TrainConfig this file reads

namespace {

struct Tally {
  int64_t tensors = 0, elements = 0, bytes = 0;
  std::map<std::string, int64_t> dtypes;  // safetensors dtype name -> tensors
  void add(const TensorInfo& t) {
    ++tensors;
    int64_t n = 1;
    for (int64_t s : t.shape) n *= s;
    elements += n;
    bytes += t.nbytes;
    ++dtypes[safetensors_dtype_name(t.dtype)];
  }
};

std::string count(int64_t n) {
  char buf[32];
  if (n >= 1'000'000)
    std::snprintf(buf, sizeof buf, "%.2fM", static_cast<double>(n) / 1e6);
  else if (n >= 10'000)
    std::snprintf(buf, sizeof buf, "%.1fk", static_cast<double>(n) / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

std::string g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string dtypes_of(const Tally& t) {
  std::string s;
  for (const auto& [d, n] : t.dtypes) s += (s.empty() ? "" : ", ") + d + " x" + std::to_string(n);
  return s;
}

void row(std::ostringstream& out, const std::string& name, const Tally& t) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "  %-10s %8lld %10s %11s  ", name.c_str(), static_cast<long long>(t.tensors),
                count(t.elements).c_str(), format_bytes(t.bytes).c_str());
  out << buf << dtypes_of(t) << "\n";
}

}  // namespace

std::string describe_safetensors_file(const std::string& path) {
  std::map<std::string, std::string> md;
  const std::vector<TensorInfo> infos = read_safetensors_header(path, &md);
  const auto fmt = md.find(kCheckpointFormatKey);
  const bool checkpoint = fmt != md.end() && fmt->second == kCheckpointFormat;
  Tally all;
  for (const TensorInfo& t : infos) all.add(t);
  std::ostringstream out;
  out << path << ": " << (checkpoint ? "mixprec training checkpoint" : "safetensors file") << ", " << all.tensors
      << " tensors, " << count(all.elements) << " values, " << format_bytes(all.bytes) << " of data\n";
  if (!checkpoint) {
    out << "  dtypes: " << (all.tensors ? dtypes_of(all) : "-") << "\n";
    if (!md.empty()) {
      out << "  metadata:";
      for (const auto& [k, v] : md) out << " " << k;
      out << "\n";
    }
    return out.str();
  }
  if (const auto c = md.find("config"); c != md.end()) {
    try {
      const TrainConfig cfg = config_from_json(c->second);
      out << "  run: " << run_label(cfg) << ", " << cfg.model << " on " << cfg.dataset << ", " << cfg.epochs
          << " epochs of batch " << cfg.batch_size << (cfg.grad_accum > 1 ? " x " + std::to_string(cfg.grad_accum) : "")
          << ", " << cfg.optimizer << (cfg.lr > 0 ? " lr " + g(cfg.lr) : std::string())
          << (cfg.ema_decay > 0 ? ", weight EMA " + g(cfg.ema_decay) : std::string()) << ", seed " << cfg.seed << "\n";
      if (const auto e = md.find("epoch"); e != md.end()) {
        const auto b = md.find("batch"), s = md.find("global_step");
        out << "  stands at: " << e->second << " of " << cfg.epochs << " epochs done"
            << (b != md.end() && b->second != "0" ? ", batch " + b->second + " of the next" : std::string())
            << (s != md.end() ? ", " + s->second + " optimizer steps" : std::string()) << "\n";
      }
      if (const auto b = md.find("best"); b != md.end()) {
        const nlohmann::json j = nlohmann::json::parse(b->second, nullptr, /*allow_exceptions=*/false);
        if (j.is_object() && j.contains("epoch") && j.contains("metric") && j["metric"].is_string()) {
          const double m = std::strtod(j["metric"].get<std::string>().c_str(), nullptr);
          out << "  best: epoch " << json_excerpt(j["epoch"]) << ", "
              << (is_text_task(cfg) ? "valid perplexity " + g(m) : "test accuracy " + g(100 * m) + "%")
              << (cfg.ema_decay > 0 ? " (weight averages)" : "") << "\n";
        }
      }
      if (const auto k = md.find("kernel_paths"); k != md.end()) {  // Note [kernel paths chosen by measurement]
        const nlohmann::json j = nlohmann::json::parse(k->second, nullptr, /*allow_exceptions=*/false);
        std::map<std::string, std::string> choices;
        if (j.is_object())
          for (const auto& [key, v] : j.items()) choices[key] = v.is_string() ? v.get<std::string>() : "?";
        out << "  16-bit CPU kernel paths: "
            << (j.is_object() ? kernel_path_counts(choices) + " (a resume reuses them)" : "damaged record") << "\n";
      }
    } catch (const Error& e) { out << "  run: the stored config does not parse (" << e.what() << ")\n"; }
  }
  std::map<std::string, Tally> sections;
  std::vector<std::string> order;
  for (const TensorInfo& t : infos) {
    const std::string s = t.name.substr(0, t.name.find('.'));
    if (!sections.count(s)) order.push_back(s);
    sections[s].add(t);
  }
  out << "  section     tensors     values        data  dtypes\n";
  for (const std::string& s : order) row(out, s, sections[s]);
  return out.str();
}

}  // namespace mp::report

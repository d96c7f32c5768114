#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <set>
#include <string>
#include <type_traits>
#include <vector>
#include <ostream>

#include "mp/train/trainer.hpp"

namespace mixprec {

/// The process's exit status when a command returns normally (main returns it; 0 unless a command sets it).
inline int exit_code = 0;
/// Exit statuses of Note [exit statuses] (main.cpp): a usage error, a numerical failure.
inline constexpr int kExitUsage = 2;
inline constexpr int kExitNumerical = 3;

/// `mixprec info`: CPU features, GPUs, library versions, and the advised precision per device.
void add_info_command(CLI::App& app);
/// `mixprec demo`: a short training run in f32 and bf16 on a synthetic task (no dataset needed).
void add_demo_command(CLI::App& app);
/// `mixprec train`: one training run (image classifier or word LM) in any precision.
void add_train_command(CLI::App& app);
/// `mixprec eval FILE`: accuracy or perplexity of a checkpoint or (with --model) a bare state dict.
void add_eval_command(CLI::App& app);
/// `mixprec compare`: the same job at several precisions / opt levels, with a table, JSON and plots.
void add_compare_command(CLI::App& app);
/// `mixprec convert IN OUT --dtype D`: a safetensors file's floating tensors to another dtype.
void add_convert_command(CLI::App& app);
/// `mixprec tokenizer train|encode|decode`: a byte-level BPE tokenizer (Hugging Face's tokenizer.json).
void add_tokenizer_command(CLI::App& app);
/// `mixprec generate CKPT`: continue a prompt with a GPT checkpoint (train::generate, key/value cache).
void add_generate_command(CLI::App& app);
/// `mixprec export FILE OUT [--dtype D]`: a checkpoint's model (or a bare file) as PyTorch's bare state dict.
void add_export_command(CLI::App& app);
/// `mixprec plot LOG...`: loss and metric curves of JSONL run logs as PNG charts.
void add_plot_command(CLI::App& app);
/// `mixprec bench step`: time training steps of one configuration, printed as JSON.
void add_bench_command(CLI::App& app);

/// One run of a comparison: `base` with the precision[:opt_level] of `item` ("bf16:O2") and, when
/// `report` is a folder, its JSONL log there (ITEM.jsonl, ':' as '_'); checked with validate().
mp::train::TrainConfig compare_run_config(const mp::train::TrainConfig& base, const std::string& item,
                                          const std::string& report);
/// The compare table (markdown on `out`; with a folder `dir` also compare.md, compare.json and PNG charts).
void write_compare_report(const std::vector<mp::train::RunSummary>& runs, const std::string& dir, std::ostream& out);
/// `mixprec bench SUITE`: the reference articles' experiments (bench_suites.cpp), under `bench`.
void add_bench_suites(CLI::App* bench);
/// `mixprec bench kernels` (bench_kernels.cpp): GEMM TFLOP/s and element-wise bandwidth.
void add_bench_kernels(CLI::App* bench);

/// Note [a run described in a file]: `--config FILE.json` reads a TrainConfig in the JSON form checkpoints
/// store (what `--print_config` writes; keys are the flag names, absent keys keep their defaults, unknown
/// ones are refused), and every flag given on the command line overrides the file's value. So a run is a
/// file plus a few flags, and a file is made by `--print_config` from the flags of a run.
struct ConfigFileOptions {
  std::string path;    ///< --config
  bool print = false;  ///< --print_config: write the resolved config as JSON and stop
};

/// Register --config and --print_config on cmd.
inline void add_config_file_options(CLI::App* cmd, ConfigFileOptions& f) {
  cmd->add_option("--config", f.path,
                  "read the run's settings from this JSON file (keys are the flag names, as --print_config writes "
                  "them); flags on the command line override it");
  cmd->add_flag("--print_config", f.print,
                "print the run's settings (the file, then the flags) as JSON and stop: a file for --config");
}

/// The settings of a run: those of the --config file when one is given, each flag given on the command line
/// (of cmd, parsed into `flags`) overriding the file's value. Throws mp::Error naming the file or the field.
mp::train::TrainConfig resolve_config(const CLI::App* cmd, const mp::train::TrainConfig& flags,
                                      const std::string& path);

/// The JSON `--print_config` writes (two-space indented, keys in declaration order).
std::string config_json_pretty(const mp::train::TrainConfig& c);

/// Register the TrainConfig fields for which keep(name) holds as flags --name (Note [one table of settings]): bools
/// as --name / --no-name, typed fields through their text (FieldText), with the table's help (and the value in c
/// as the default shown, unless !show_defaults: flags that override a file's settings).
template <class Keep>
void add_config_options_if(CLI::App* cmd, mp::train::TrainConfig& c, Keep keep, bool show_defaults = true) {
  mp::train::visit_fields(c, [&](const char* name, auto& field, const char* help) {
    if (!keep(std::string(name))) return;
    using T = std::remove_reference_t<decltype(field)>;
    const std::string flag = std::string("--") + name;
    if constexpr (std::is_same_v<T, bool>) {
      cmd->add_flag(flag + ",!--no-" + name, field, help);
    } else if constexpr (mp::train::TextField<T>) {
      CLI::Option* o = cmd->add_option_function<std::string>(
          flag, [&field, name](const std::string& s) { field = mp::train::FieldText<T>::parse(s, name); }, help);
      if (show_defaults) o->default_str(mp::train::FieldText<T>::format(field));
    } else {
      CLI::Option* o = cmd->add_option(flag, field, help);
      if (show_defaults) o->capture_default_str();
    }
  });
}

/// Register every TrainConfig field as a flag, except those in `skip`.
inline void add_config_options(CLI::App* cmd, mp::train::TrainConfig& c, const std::set<std::string>& skip = {}) {
  add_config_options_if(cmd, c, [&](const std::string& n) { return skip.count(n) == 0; });
}

/// Register the TrainConfig fields named in `only` as flags.
inline void add_config_options_only(CLI::App* cmd, mp::train::TrainConfig& c, const std::vector<std::string>& only,
                                    bool show_defaults = true) {
  add_config_options_if(
      cmd, c, [&](const std::string& n) { return std::count(only.begin(), only.end(), n) != 0; }, show_defaults);
}

/// The names of cmd's flags that were given on its command line among the TrainConfig fields.
std::set<std::string> given_config_fields(const CLI::App* cmd);

}  // namespace mixprec

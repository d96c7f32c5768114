// `mixprec train` and `mixprec eval`.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "mp/dist/process_group.hpp"
#include "mp/train/progress.hpp"

namespace mixprec {

using mp::train::format_bytes;
using mp::train::format_duration;

namespace {

// Note [stopping a training run with a signal]
// SIGINT (Ctrl-C) or SIGTERM (what batch schedulers send before they kill a job) asks train() to stop after
// the current step and checkpoint there (mp::train::request_stop), so `--resume` continues exactly instead of
// losing the steps since the last periodic checkpoint. A second signal ends the process at once (the
// default action): the checkpoint on disk is then the last complete one, never a torn file (checkpoints
// are written to a temporary file and renamed).
volatile std::sig_atomic_t g_signal = 0;

void on_stop_signal(int sig) {
  if (g_signal != 0) {  // the second one: the default action
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_signal = sig;
  mp::train::request_stop();
  static const char msg[] = "\nmixprec: stopping after this step (send the signal again to stop at once)\n";
  const ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (const int sig : {SIGINT, SIGTERM}) sigaction(sig, &sa, nullptr);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train an image classifier or a word language model in any precision");
  auto flags = std::make_shared<mp::train::TrainConfig>();
  auto file = std::make_shared<ConfigFileOptions>();
  add_config_options(cmd, *flags);
  add_config_file_options(cmd, *file);  // Note [a run described in a file]
  cmd->callback([cmd, flags, file] {
    const auto c = std::make_shared<mp::train::TrainConfig>(resolve_config(cmd, *flags, file->path));
    if (file->print) {
      mp::train::validate(*c);
      std::printf("%s\n", config_json_pretty(*c).c_str());
      return;
    }
    install_stop_handlers();  // Note [stopping a training run with a signal]
    const mp::train::RunSummary s = mp::train::train(*c, std::cout);
    if (mp::dist::world().rank() != 0) {  // Note [data-parallel training] 6: rank 0 reports the run
      if (s.interrupted) exit_code = 128 + g_signal;
      if (s.diverged) exit_code = kExitNumerical;
      return;
    }
    const std::string how =
        s.diverged ? "DIVERGED (a loss or gradient became inf/NaN)"
        : s.interrupted
            ? std::string("stopped by ") + ::strsignal(g_signal) + " after " + std::to_string(s.steps) + " steps"
        : s.stopped_early ? "stopped after " + std::to_string(s.steps) + " steps (--stop_after_steps)"
                          : std::string("finished");
    std::printf("\n%s summary: %s\n", s.label.c_str(), how.c_str());
    std::printf("  training time %s (%.1f %s), data wait %s, evaluation %s\n", format_duration(s.train_seconds).c_str(),
                s.throughput, s.throughput_unit.c_str(), format_duration(s.data_wait_seconds).c_str(),
                format_duration(s.eval_seconds).c_str());
    std::printf("  peak memory %s, steps %lld, skipped steps %lld, final loss scale %g\n",
                format_bytes(s.peak_bytes).c_str(), static_cast<long long>(s.steps),
                static_cast<long long>(s.skipped_steps), s.final_loss_scale);
    if (s.stopped_early && s.epochs.empty())
      std::printf("  no evaluation (the run stopped before it finished an epoch)\n");
    else if (s.metric_name == "accuracy")
      std::printf("  test loss %.4f, test accuracy %.2f%%\n", s.val_loss, 100 * s.val_metric);
    else
      std::printf("  valid loss %.4f, valid perplexity %.2f\n", s.val_loss, s.val_metric);
    if (s.ema_val_metric)
      std::printf(s.metric_name == "accuracy" ? "  weight averages (EMA %g): test loss %.4f, test accuracy %.2f%%\n"
                                              : "  weight averages (EMA %g): valid loss %.4f, valid perplexity %.2f\n",
                  c->ema_decay, *s.ema_val_loss,
                  s.metric_name == "accuracy" ? 100 * *s.ema_val_metric : *s.ema_val_metric);
    if (s.best_epoch > 0 &&
        (!s.best_checkpoint.empty() || (!s.epochs.empty() && s.best_epoch != s.epochs.back().epoch))) {
      std::string where;
      if (!s.best_checkpoint.empty())
        where = c->ema_decay > 0 ? " (mixprec eval --ema " + s.best_checkpoint + ")" : " (" + s.best_checkpoint + ")";
      std::printf(s.metric_name == "accuracy" ? "  best: epoch %lld, test accuracy %.2f%%%s%s\n"
                                              : "  best: epoch %lld, valid perplexity %.2f%s%s\n",
                  static_cast<long long>(s.best_epoch),
                  s.metric_name == "accuracy" ? 100 * s.best_val_metric : s.best_val_metric,
                  c->ema_decay > 0 ? " of the weight averages" : "", where.c_str());
    }
    if (!s.kernel_paths.choices.empty())
      std::printf("  16-bit kernel paths: %s\n", mp::kernel_path_summary(s.kernel_paths).c_str());
    const std::string ckpt = (std::filesystem::path(c->checkpoint_dir) / "checkpoint.safetensors").string();
    std::error_code ec;
    if (!c->checkpoint_dir.empty() && std::filesystem::exists(ckpt, ec))  // a run that diverged early may have none
      std::printf("  checkpoint: %s\n", ckpt.c_str());
    if (!s.last_good_file.empty()) std::printf("  last good state: %s\n", s.last_good_file.c_str());
    if (!c->log.empty()) std::printf("  run log: %s\n", c->log.c_str());
    if (s.stopped_early)
      std::printf(c->checkpoint_dir.empty() ? "  no --checkpoint_dir: nothing was saved to continue from\n"
                  : c->init_from.empty()    ? "  the checkpoint holds the position: run the same command with "
                                              "--resume to continue\n"
                                            : "  the checkpoint holds the position: run the same command with "
                                              "--resume and without --init_from to continue\n");
    std::fflush(stdout);
    if (s.interrupted) exit_code = 128 + g_signal;  // as a shell reports a process ended by the signal
    if (s.diverged) {                               // Note [exit statuses]
      std::fprintf(stderr, "mixprec: numerical failure: %s\n", s.numerical_failure.c_str());
      exit_code = kExitNumerical;
    }
  });
}

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval",
                                 "Evaluate a checkpoint written by `mixprec train`, or a bare state dict (PyTorch's "
                                 "or `mixprec export`'s) with --model (accuracy or perplexity)");
  struct Args {
    std::string path, split = "test";
    mp::train::EvalOverrides overrides;
    bool ema = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("checkpoint", a->path,
                  "checkpoint.safetensors written by mixprec train, or a bare state dict (then --model is needed)")
      ->required();
  cmd->add_option("--split", a->split, "test, or valid (text corpora)")->capture_default_str();
  // The settings an evaluation may change, each flag from the run's table (Note [one table of settings]); a flag
  // not given keeps what the checkpoint says. --model names a bare state dict's model (torch names: README).
  add_config_options_only(cmd, a->overrides.values, mp::train::eval_override_fields(), /*show_defaults=*/false);
  cmd->add_flag("--ema", a->ema, "evaluate the checkpoint's f32 weight averages (trained with --ema_decay)");
  cmd->callback([cmd, a] {
    a->overrides.given = given_config_fields(cmd);
    const mp::train::EvalResult r = mp::train::evaluate_checkpoint(a->path, a->split, &a->overrides, std::cout, a->ema);
    if (r.metric_name == "accuracy")
      std::printf("%s: %lld images, loss %.4f, accuracy %.2f%% (%.1f s)\n", a->path.c_str(),
                  static_cast<long long>(r.examples), r.loss, 100 * r.metric, r.seconds);
    else
      std::printf("%s: %lld tokens (%s), loss %.4f, perplexity %.2f (%.1f s)\n", a->path.c_str(),
                  static_cast<long long>(r.examples), a->split.c_str(), r.loss, r.metric, r.seconds);
  });
}

}  // namespace mixprec

// `mixprec train` and `mixprec eval`.
#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "mp/train/progress.hpp"

namespace mixprec {

using mp::train::format_bytes;
using mp::train::format_duration;

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train an image classifier or a word language model in any precision");
  auto c = std::make_shared<mp::train::TrainConfig>();
  add_config_options(cmd, *c);
  cmd->callback([c] {
    const mp::train::RunSummary s = mp::train::train(*c, std::cout);
    std::printf("\n%s summary: %s\n", s.label.c_str(), s.diverged ? "DIVERGED (loss became inf/NaN)" : "finished");
    std::printf("  training time %s (%.1f %s), data wait %s, evaluation %s\n", format_duration(s.train_seconds).c_str(),
                s.throughput, s.throughput_unit.c_str(), format_duration(s.data_wait_seconds).c_str(),
                format_duration(s.eval_seconds).c_str());
    std::printf("  peak memory %s, steps %lld, skipped steps %lld, final loss scale %g\n",
                format_bytes(s.peak_bytes).c_str(), static_cast<long long>(s.steps),
                static_cast<long long>(s.skipped_steps), s.final_loss_scale);
    if (s.metric_name == "accuracy")
      std::printf("  test loss %.4f, test accuracy %.2f%%\n", s.val_loss, 100 * s.val_metric);
    else
      std::printf("  valid loss %.4f, valid perplexity %.2f\n", s.val_loss, s.val_metric);
    if (!c->checkpoint_dir.empty()) std::printf("  checkpoint: %s/checkpoint.safetensors\n", c->checkpoint_dir.c_str());
    if (!c->log.empty()) std::printf("  run log: %s\n", c->log.c_str());
  });
}

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "Evaluate a checkpoint written by `mixprec train` (accuracy or perplexity)");
  struct Args {
    std::string path, split = "test";
    mp::train::TrainConfig overrides;
  };
  auto a = std::make_shared<Args>();
  a->overrides.precision.clear();
  cmd->add_option("checkpoint", a->path, "checkpoint.safetensors written by mixprec train")->required();
  cmd->add_option("--split", a->split, "test, or valid (text corpora)")->capture_default_str();
  cmd->add_option("--data_dir", a->overrides.data_dir, "dataset folder or file (default: the one it was trained on)");
  cmd->add_option("--precision", a->overrides.precision, "evaluate in fp32, fp16 or bf16 (default: as trained)");
  cmd->add_option("--opt_level", a->overrides.opt_level, "O0..O3 (default: as trained)");
  cmd->add_option("--eval_batch_size", a->overrides.eval_batch_size, "images per batch")->capture_default_str();
  cmd->add_option("--num_workers", a->overrides.num_workers, "loader threads")->capture_default_str();
  cmd->add_option("--device", a->overrides.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->callback([a] {
    const mp::train::EvalResult r = mp::train::evaluate_checkpoint(a->path, a->split, &a->overrides, std::cout);
    if (r.metric_name == "accuracy")
      std::printf("%s: %lld images, loss %.4f, accuracy %.2f%% (%.1f s)\n", a->path.c_str(),
                  static_cast<long long>(r.examples), r.loss, 100 * r.metric, r.seconds);
    else
      std::printf("%s: %lld tokens (%s), loss %.4f, perplexity %.2f (%.1f s)\n", a->path.c_str(),
                  static_cast<long long>(r.examples), a->split.c_str(), r.loss, r.metric, r.seconds);
  });
}

}  // namespace mixprec

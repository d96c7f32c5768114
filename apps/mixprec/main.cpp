// The mixprec command-line tool.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "commands.hpp"
#include "mp/core/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"mixprec: mixed-precision neural-network training (FP32 / BF16 / FP16)"};
  app.require_subcommand(1);
  mixprec::add_info_command(app);
  mixprec::add_train_command(app);
  mixprec::add_eval_command(app);
  mixprec::add_compare_command(app);
  mixprec::add_convert_command(app);
  mixprec::add_export_command(app);
  mixprec::add_plot_command(app);
  mixprec::add_demo_command(app);
  mixprec::add_bench_command(app);
  // Note [exit statuses]: 0 success; 1 an error in the input or the environment (a bad setting, a missing or
  // damaged file, no such device); 2 a usage error (an unknown flag, a value of the wrong form: CLI11's
  // message and usage); 3 a numerical failure (the run diverged, the loss scale is stuck, a static scale skipped
  // too many steps in a row), after writing the last good state (Note [stopping on a numerical failure] in
  // src/train/train_loop.cpp); 128 + N stopped by signal N (SIGINT 130, SIGTERM 143) after checkpointing. The
  // README's table says the same.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the message (and usage), or the help text for --help (rc 0)
    return rc == 0 ? 0 : mixprec::kExitUsage;
  } catch (const mp::NumericalError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "mixprec: numerical failure: %s\n", e.what());
    return mixprec::kExitNumerical;
  } catch (const mp::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "mixprec: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "mixprec: error: %s\n", e.what());
    return 1;
  }
  return mixprec::exit_code;
}

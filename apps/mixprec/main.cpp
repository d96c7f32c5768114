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
  mixprec::add_plot_command(app);
  mixprec::add_demo_command(app);
  mixprec::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) { return app.exit(e); } catch (const mp::Error& e) {
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

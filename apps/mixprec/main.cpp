// The mixprec command-line tool.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "commands.hpp"
#include "mp/core/error.hpp"
#include "mp/dist/process_group.hpp"

namespace {

// The ranks of a data-parallel run (Note [data-parallel training] in src/train/data_parallel.cpp), or null for a
// single process.
mp::dist::ProcessGroup* ranks() {
  if (!mp::dist::launched_by_mpi() || !mp::dist::built_with_mpi()) return nullptr;
  try {
    mp::dist::ProcessGroup& w = mp::dist::world();
    return w.size() > 1 ? &w : nullptr;
  } catch (const std::exception&) { return nullptr; }
}

// Report an error ("rank R of N: " first in a data-parallel run) and end with `status`: a rank of several ends the
// whole run, since the others may be waiting for it in a collective (Note [data-parallel training] 7).
int fail(const char* what, const char* message, int status) {
  std::fflush(stdout);
  mp::dist::ProcessGroup* w = ranks();
  const std::string where =
      w == nullptr ? std::string() : "rank " + std::to_string(w->rank()) + " of " + std::to_string(w->size()) + ": ";
  std::fprintf(stderr, "mixprec: %s%s%s\n", where.c_str(), what, message);
  std::fflush(stderr);
  if (w != nullptr) w->abort(status);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mixprec: mixed-precision neural-network training (FP32 / BF16 / FP16)"};
  app.require_subcommand(1);
  mixprec::add_info_command(app);
  mixprec::add_train_command(app);
  mixprec::add_eval_command(app);
  mixprec::add_compare_command(app);
  mixprec::add_convert_command(app);
  mixprec::add_export_command(app);
  mixprec::add_tokenizer_command(app);
  mixprec::add_generate_command(app);
  mixprec::add_plot_command(app);
  mixprec::add_demo_command(app);
  mixprec::add_bench_command(app);
  // Note [exit statuses]: 0 success; 1 an error in the input or the environment (a bad setting, a missing or
  // damaged file, no such device); 2 a usage error (an unknown flag, a value of the wrong form: CLI11's
  // message and usage); 3 a numerical failure (the run diverged, the loss scale is stuck, a static scale skipped
  // too many steps in a row), after writing the last good state (Note [stopping on a numerical failure] in
  // src/train/train_loop.cpp); 4 (dist::kExitRankFailure) a data-parallel rank waited past --dist_timeout for another
  // (Note [rank failures] in src/dist/process_group.cpp); 128 + N stopped by signal N (SIGINT 130, SIGTERM 143)
  // after checkpointing. The README's table says the same.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the message (and usage), or the help text for --help (rc 0)
    return rc == 0 ? 0 : mixprec::kExitUsage;
  } catch (const mp::NumericalError& e) {
    return fail("numerical failure: ", e.what(), mixprec::kExitNumerical);
  } catch (const mp::Error& e) { return fail("error: ", e.what(), 1); } catch (const std::exception& e) {
    return fail("error: ", e.what(), 1);
  }
  return mixprec::exit_code;
}

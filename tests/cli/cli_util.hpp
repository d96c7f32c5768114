#pragma once
// Running the mixprec binary from a test: its exit status and output, a refusal's message, a small corpus.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "test_util.hpp"

namespace mp::test::cli {

namespace fs = std::filesystem;

using Result = mp::test::ShellResult;

// `env`: variable assignments for the command (e.g. "TMPDIR=/x").
inline Result run(const std::string& args, const std::string& env = "") {
  return mp::test::shell((env.empty() ? "" : env + " ") + std::string(MP_CLI_PATH) + " " + args);
}

// A small word-level corpus: a plain-text file with a few sentence patterns.
inline fs::path corpus() {
  static const fs::path f = [] {
    fs::path p = mp::test::scratch_dir("cli", "corpus") / "text.txt";
    std::ofstream os(p);
    const char* w[] = {"and", "the", "lord", "said", "unto", "moses", "go", "forth"};
    for (int i = 0; i < 400; ++i) os << w[i % 8] << " " << w[(i * 3) % 8] << " " << w[(i * 5 + 1) % 8] << " .\n";
    return p;
  }();
  return f;
}

inline void expect_failure(const std::string& args, const std::string& needle) {
  const Result r = run(args);
  EXPECT_NE(r.code, 0) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\nexpected to mention: " << needle << "\ngot:\n"
                                                      << r.output;
}

// The options of a tiny word-LM run on corpus() (one epoch; add flags after it).
inline std::string tiny_lm() {
  return "train --dataset text --data_dir " + corpus().string() +
         " --model lstm --embed_size 16 --hidden_size 16 --batch_size 4 --bptt 8 --epochs 1 --quiet";
}

}  // namespace mp::test::cli

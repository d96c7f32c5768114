// A rank of `mpirun -np 2 mixprec train` that is killed (SIGKILL) or stopped (SIGSTOP) mid-epoch does not hang the
// run (Note [rank failures] in src/dist/process_group.cpp): mpirun ends non-zero within --dist_timeout and a margin,
// naming the rank, the checkpoint written before the fault loads, and one process resumed from it finishes the run.
// The fault comes from the test hook MP_TEST_RANK_FAULT=RANK:STEP:KILL|STOP (src/train/train_loop.cpp). Real
// OpenMPI runs of the mixprec binary on Fashion-MNIST; skipped only in a build without MPI.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mp/train/safetensors.hpp"
#include "dist/mpi_cli.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using mp::test::scratch_dir;

namespace {

using mp::test::kHaveMpi;
using mp::test::kMixprec;
using mp::test::kMpiexec;

// The timeout the runs are given, and how long past it (start-up and three steps on 2 shared cores, MPI_Abort's
// tear-down) a run may take at most: a hang would instead last until the outer `timeout 90`.
constexpr int kDistTimeout = 5;  // a few seconds, above the ranks' start-up skew on 2 shared cores
constexpr double kMarginSeconds = 25;

struct Timed {
  mp::test::ShellResult result;
  double seconds = 0;
};

Timed timed(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  Timed t{mp::test::shell(cmd), 0};
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

const std::string kEnv = "OMP_NUM_THREADS=1 MP_KERNEL_PATHS=pinned timeout 90 ";

// 8 steps of 64 samples (2 ranks x 32), checkpointing every 2 steps.
std::string common(const fs::path& dir) {
  return "--dataset fashion-mnist --model mlp --train_subset 1024 --eval_batch_size 1000 --num_workers 0 --quiet "
         "--epochs 1 --max_steps_per_epoch 8 --seed 7 --precision fp32 --checkpoint_every 2 --dist_timeout " +
         std::to_string(kDistTimeout) + " --checkpoint_dir " + dir.string() + " ";
}

// Two ranks; rank `rank` meets `fault` ("KILL" or "STOP") as it begins step 4 (steps 1 to 3 done, checkpoint at
// step 2).
Timed two_ranks_with_a_fault(const fs::path& dir, const std::string& fault, int rank = 1) {
  return timed("MP_TEST_RANK_FAULT=" + std::to_string(rank) + ":4:" + fault + " " + kEnv + kMpiexec +
               " --allow-run-as-root --oversubscribe -x MP_TEST_RANK_FAULT -np 2 " + kMixprec + " train " +
               common(dir) + "--batch_size 32");
}

// The step numbers of a run log's step records.
std::vector<int64_t> steps_of(const fs::path& log) {
  std::vector<int64_t> out;
  std::ifstream is(log);
  for (std::string line; std::getline(is, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("type", "") == "step") out.push_back(j.at("step").get<int64_t>());
  }
  return out;
}

// The checkpoint the fault left is whole and stands at step 2; one process at the same global batch resumes from it
// and trains steps 3 to 8.
void expect_the_checkpoint_resumes(const fs::path& dir) {
  const fs::path ckpt = dir / "checkpoint.safetensors";
  ASSERT_TRUE(fs::exists(ckpt)) << "no checkpoint in " << dir;
  const mp::train::SafetensorsFile f = mp::train::load_safetensors(ckpt.string());  // throws if damaged
  EXPECT_EQ(f.metadata.at("global_step"), "2");
  for (const auto& e : fs::directory_iterator(dir))  // no half-written file beside it
    EXPECT_EQ(e.path().filename(), "checkpoint.safetensors") << "left in " << dir;
  const fs::path log = dir / "resume.jsonl";
  const Timed rest =
      timed(kEnv + kMixprec + " train " + common(dir) + "--batch_size 64 --resume --log " + log.string());
  ASSERT_EQ(rest.result.code, 0) << rest.result.output;
  const std::vector<int64_t> steps = steps_of(log);
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 4, 5, 6, 7, 8}));
}

}  // namespace

// SIGSTOP: the stopped rank is alive to OpenMPI, so only --dist_timeout ends the run: rank 0 names rank 1 and the
// run ends with status 4 (mpirun passes on MPI_Abort's status).
TEST(RankFailures, AStoppedRankEndsTheRunWithinTheTimeoutNamingIt) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp-fault", "stop");
  const Timed r = two_ranks_with_a_fault(dir, "STOP");
  std::printf("stopped rank: mpirun exited %d after %.1f s\n", r.result.code, r.seconds);
  EXPECT_EQ(r.result.code, 4) << r.result.output;
  EXPECT_LT(r.seconds, kDistTimeout + kMarginSeconds) << r.result.output;
  EXPECT_NE(r.result.output.find("rank 0 of 2: error: waited 5 s (--dist_timeout)"), std::string::npos)
      << r.result.output;
  EXPECT_NE(r.result.output.find("did not arrive: rank 1"), std::string::npos) << r.result.output;
  expect_the_checkpoint_resumes(dir);
  fs::remove_all(dir);
}

// Rank 0 stopped: rank 1, which hears rank 0's announcements, names it.
TEST(RankFailures, AStoppedRankZeroIsNamedByTheOthers) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp-fault", "stop0");
  const Timed r = two_ranks_with_a_fault(dir, "STOP", 0);
  std::printf("stopped rank 0: mpirun exited %d after %.1f s\n", r.result.code, r.seconds);
  EXPECT_EQ(r.result.code, 4) << r.result.output;
  EXPECT_LT(r.seconds, kDistTimeout + kMarginSeconds) << r.result.output;
  EXPECT_NE(r.result.output.find("rank 1 of 2: error: waited 5 s (--dist_timeout)"), std::string::npos)
      << r.result.output;
  EXPECT_NE(r.result.output.find("did not arrive: rank 0"), std::string::npos) << r.result.output;
  expect_the_checkpoint_resumes(dir);
  fs::remove_all(dir);
}

// SIGKILL: OpenMPI usually notices the dead rank and ends rank 0 itself with its own message naming rank 1; should
// it not, rank 0's timeout does (status 4, "did not arrive: rank 1"). Either way: non-zero, in time, rank 1 named.
TEST(RankFailures, AKilledRankEndsTheRunWithinTheTimeoutNamingIt) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  const fs::path dir = scratch_dir("dp-fault", "kill");
  const Timed r = two_ranks_with_a_fault(dir, "KILL");
  std::printf("killed rank: mpirun exited %d after %.1f s\n", r.result.code, r.seconds);
  EXPECT_NE(r.result.code, 0) << r.result.output;
  EXPECT_NE(r.result.code, 124) << "the run hung until `timeout` ended it:\n" << r.result.output;
  EXPECT_LT(r.seconds, kDistTimeout + kMarginSeconds) << r.result.output;
  const bool named = r.result.output.find("process rank 1") != std::string::npos ||
                     r.result.output.find("did not arrive: rank 1") != std::string::npos;
  EXPECT_TRUE(named) << r.result.output;
  expect_the_checkpoint_resumes(dir);
  fs::remove_all(dir);
}

TEST(RankFailures, ATimeoutOutsideItsRangeIsRefused) {
  if (!kHaveMpi) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
  for (const char* bad : {"0", "-1", "inf"}) {
    const mp::test::ShellResult r =
        mp::test::shell(kEnv + kMixprec +
                        " train --dataset fashion-mnist --model mlp --train_subset 256 "
                        "--epochs 1 --max_steps_per_epoch 1 --num_workers 0 --dist_timeout " +
                        bad);
    EXPECT_EQ(r.code, 1) << bad << ": " << r.output;
    EXPECT_NE(r.output.find("--dist_timeout must be a number of seconds in (0, 86400]"), std::string::npos)
        << bad << ": " << r.output;
  }
}

// The group of a run on a device (Note [device groups] in src/dist/device_group.cpp): the CPU and a single process use
// the world itself; the local rank comes from the launcher's environment; a bare --device cuda picks one GPU per
// process only under a launcher. The routed group itself needs NCCL and several GPUs (not here).
#include <gtest/gtest.h>

#include <cstdlib>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;

namespace {

// Sets an environment variable for a scope, restoring what was there.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace

TEST(DeviceGroup, TheCpuAndASingleProcessUseTheWorldItself) {
  dist::ProcessGroup& world = dist::world();
  EXPECT_EQ(dist::group_for_device(world, kCPU).get(), &world);
  if (world.size() == 1) { EXPECT_EQ(dist::group_for_device(world, Device{DeviceType::cuda, 0}).get(), &world); }
}

TEST(DeviceGroup, LocalRankFromTheLaunchersEnvironment) {
  const ScopedEnv a("OMPI_COMM_WORLD_LOCAL_RANK", ""), b("MPI_LOCALRANKID", ""), c("SLURM_LOCALID", "");
  EXPECT_EQ(dist::local_rank(), 0);
  {
    const ScopedEnv s("SLURM_LOCALID", "5");
    EXPECT_EQ(dist::local_rank(), 5);
    const ScopedEnv o("OMPI_COMM_WORLD_LOCAL_RANK", "3");  // OpenMPI's comes first
    EXPECT_EQ(dist::local_rank(), 3);
  }
}

TEST(DeviceGroup, ABareCudaPicksAGpuPerProcessOnlyUnderALauncher) {
  const Device cuda0{DeviceType::cuda, 0}, cuda1{DeviceType::cuda, 1};
  EXPECT_EQ(dist::rank_device(kCPU, false), kCPU);
  EXPECT_EQ(dist::rank_device(cuda1, true), cuda1);  // named by the user: kept
  if (!dist::launched_by_mpi()) { EXPECT_EQ(dist::rank_device(cuda0, false), cuda0); }
}

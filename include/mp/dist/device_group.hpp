#pragma once
// The process group of a data-parallel run on a device (Note [device groups] in src/dist/device_group.cpp).
#include <memory>

#include "mp/dist/process_group.hpp"

namespace mp::dist {

/// This process's index among the ranks on its machine, from the launcher's environment (OpenMPI's
/// OMPI_COMM_WORLD_LOCAL_RANK, MPICH's MPI_LOCALRANKID, Slurm's SLURM_LOCALID); 0 when none says.
int local_rank();

/// The device a run given `device` uses in this process: `device` itself, except a bare "cuda" (index 0, not named
/// by the user: `named_index` false) under a launcher, which becomes cuda:(local_rank() mod the GPUs here), one GPU per
/// process on each machine.
Device rank_device(Device device, bool named_index);

/// The group a run on `device` uses: `world` itself on the CPU or for a single process; on a GPU under several ranks,
/// a group that sends CPU tensors through `world` (MPI) and GPU tensors through NCCL (dist::nccl_group), so the same
/// data-parallel code serves both. Collective: every rank calls it.
std::shared_ptr<ProcessGroup> group_for_device(ProcessGroup& world, Device device);

}  // namespace mp::dist

#pragma once
// Collectives of GPU tensors through NCCL (issue 26 item 7). Note [NCCL groups] in src/dist/nccl_group.cpp.
#include <memory>

#include "mp/dist/process_group.hpp"

namespace mp::dist {

/// Whether this build of mixprec has NCCL (a CUDA build that found nccl.h and libnccl).
bool built_with_nccl();

/// A group of the same processes as `world` whose collectives take tensors on `device` (cuda:N, this process's GPU)
/// through NCCL; its communicator's id is made by world's rank 0 and broadcast over `world` (MPI, or nothing for a
/// single process). Collective by nature: every rank of `world` calls it. Throws mp::Error without NCCL or a GPU,
/// naming the fix.
std::unique_ptr<ProcessGroup> nccl_group(ProcessGroup& world, Device device);

}  // namespace mp::dist

#pragma once
// The processes of a data-parallel run and the collectives it needs (issue 26): one process per rank,
// started by `mpirun -np N` (OpenMPI; Slurm's srun likewise), or the single process of an ordinary run.
//
// Note [process groups]
// world() is the group of every process of the run: MPI's COMM_WORLD when the process was started by an MPI
// launcher (its environment says so: OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK) and mixprec was built with
// MPI, else a group of one whose collectives do nothing (so a single process needs no MPI and behaves exactly
// as before). MPI is initialised on first use (MPI_THREAD_FUNNELED: only the thread that called world() talks
// to MPI; OpenMP threads run kernels) and finalised at exit. Collectives take CPU tensors (a CUDA tensor is
// refused until NCCL lands); every rank must call the same collectives in the same order with tensors of the
// same shapes and dtypes, or MPI deadlocks or errs, so the callers check their configs agree first.
#include <memory>
#include <span>
#include <string>

#include "mp/tensor/tensor.hpp"

namespace mp::dist {

/// The exit status of a process that waited in a collective past its timeout: another rank died or hangs
/// (Note [rank failures] in src/dist/process_group.cpp).
inline constexpr int kExitRankFailure = 4;

/// A collective in flight (ProcessGroup::start_all_reduce_sum). Its buffer must stay alive and untouched until it
/// completes; destroying it unfinished waits for it first.
class Pending {
 public:
  virtual ~Pending() = default;
  /// Lets the library move it along (MPI_Test); whether it has completed.
  virtual bool test() = 0;
  /// Returns once it has completed.
  virtual void wait() = 0;
};

/// A group of processes that take part in collectives together.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  /// This process's index in the group, 0 <= rank() < size().
  virtual int rank() const = 0;
  /// The number of processes.
  virtual int size() const = 0;
  /// What backs the group: "single process" or "MPI (OpenMPI 4.1.4)".
  virtual std::string describe() const = 0;
  /// In place on every rank: each tensor becomes the mean of its values over the ranks. Floating tensors,
  /// contiguous, on the CPU; summed in f32 (f64 for f64 tensors) whatever their dtype, in one message for all
  /// of them, then divided by size() and rounded once to the tensor's dtype.
  virtual void all_reduce_mean(std::span<const Tensor> tensors) = 0;
  /// all_reduce_mean sent and summed in `wire` (f32: all_reduce_mean itself; bf16 or f16: Note [16-bit sums in MPI] in
  /// src/dist/process_group.cpp): each value widened to f32, divided by size() and rounded once to `wire` before the
  /// sum (so N values each within f16's range sum within it), summed in `wire` (each partial sum rounded), then
  /// rounded to the tensor's dtype. f64 tensors are sent in f64 whatever `wire` is. A single process does nothing.
  virtual void all_reduce_mean_in(std::span<const Tensor> tensors, DType wire) = 0;
  /// Starts summing `buffer` in place over the ranks without waiting (MPI_Iallreduce): f32, f64, bf16 or f16 (16-bit
  /// sums: Note [16-bit sums in MPI], each partial sum rounded to the buffer's dtype), contiguous, on the CPU, the same
  /// numel on every rank. Completes in the order started; MPI progresses it only inside MPI calls of
  /// this process (Note [bucketed gradient all-reduce] in src/train/grad_buckets.cpp), so call test() meanwhile.
  virtual std::unique_ptr<Pending> start_all_reduce_sum(const Tensor& buffer) = 0;
  /// In place: every rank's tensors get the values of rank `root`'s (any dtype, contiguous, on the CPU).
  virtual void broadcast(std::span<const Tensor> tensors, int root) = 0;
  /// Sums `buffer` over the ranks and hands each rank its block of the sum (MPI_Reduce_scatter): `buffer` (f32 or
  /// f64, contiguous, on the CPU, the same numel on every rank) is cut into size() blocks of counts[r] elements in rank
  /// order; `out` (buffer's dtype, contiguous, counts[rank()] elements) receives block rank() summed. `counts` is the
  /// same on every rank and adds up to buffer's numel.
  virtual void reduce_scatter_sum(const Tensor& buffer, const Tensor& out, std::span<const int64_t> counts) = 0;
  /// In place on every rank (MPI_Allgatherv): `buffer` (any dtype, contiguous, on the CPU, the same numel on every
  /// rank) is cut into size() blocks of counts[r] elements in rank order; rank r's block r is copied into every
  /// rank's block r. `counts` is the same on every rank and adds up to buffer's numel.
  virtual void all_gather(const Tensor& buffer, std::span<const int64_t> counts) = 0;
  /// Every rank's `mine` (any dtype, contiguous, on the CPU, counts[rank()] elements) into rank `root`'s `out` (mine's
  /// dtype, contiguous, the sum of counts elements), in rank order (MPI_Gatherv). `out` is ignored on the other ranks
  /// (pass an undefined tensor): only the root holds the whole.
  virtual void gather(const Tensor& mine, const Tensor& out, std::span<const int64_t> counts, int root) = 0;
  /// Returns when every rank has called it.
  virtual void barrier() = 0;
  /// Bounds the wait of every later collective (and Pending) to `seconds` (Note [rank failures] in
  /// src/dist/process_group.cpp): a rank that waits longer prints which collective it waited in and the ranks that
  /// did not arrive, then ends the run with kExitRankFailure. 0 (the default) waits without bound.
  virtual void set_timeout(double seconds) = 0;
  /// Ends every process of the run with exit status `status` (MPI_Abort): what a rank that fails alone does, since
  /// the others may be waiting in a collective it will never join. A single process returns (its caller exits).
  virtual void abort(int status) = 0;
};

/// Whether this process was started by an MPI launcher (Note [process groups]).
bool launched_by_mpi();
/// Whether this build of mixprec can join an MPI run.
bool built_with_mpi();
/// Every process of the run (Note [process groups]). Throws mp::Error when an MPI launcher started the
/// process but this build has no MPI, naming the fix.
ProcessGroup& world();

}  // namespace mp::dist

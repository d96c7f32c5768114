// The process groups of data-parallel runs (include/mp/dist/process_group.hpp): MPI's COMM_WORLD or a single
// process.
#include "mp/dist/process_group.hpp"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#if defined(MP_HAVE_MPI)
#include <mpi.h>
#endif

#include "mp/core/error.hpp"
#include "mp/core/half.hpp"
#include "mp/ops/ops.hpp"

namespace mp::dist {
namespace {

// CPU, contiguous, and (for reductions) floating: what the collectives take.
void check_operand(const Tensor& t, const char* op, bool floating) {
  MP_CHECK(t.device().is_cpu(), "dist::", op, ": expected CPU tensors, got one on ", t.device().str(),
           "; move it to the CPU first (collectives of device tensors come with NCCL)");
  MP_CHECK(t.is_contiguous(), "dist::", op, ": expected contiguous tensors, got ", t.describe());
  MP_CHECK(!floating || is_floating(t.dtype()), "dist::", op, ": expected floating tensors, got ", t.describe());
}

// What all_reduce_mean_in sends: f32, or a 16-bit float.
void check_wire(DType wire) {
  MP_CHECK(wire == DType::f32 || wire == DType::bf16 || wire == DType::f16,
           "dist::all_reduce_mean_in: expected f32, bf16 or f16 to send gradients in, got ", dtype_name(wire));
}

void check_sum_buffer(const Tensor& t) {
  check_operand(t, "start_all_reduce_sum", true);
  MP_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64 || t.dtype() == DType::bf16 || t.dtype() == DType::f16,
           "dist::start_all_reduce_sum: expected an f32, f64, bf16 or f16 buffer, got ", t.describe());
  MP_CHECK(t.numel() <= INT32_MAX, "dist::start_all_reduce_sum: ", t.numel(),
           " elements are beyond one MPI message (2^31); use smaller buckets");
}

// The blocks of a reduce-scatter or gather: one count per rank, adding up to the buffer's numel; each within one
// MPI message.
void check_blocks(const Tensor& buffer, std::span<const int64_t> counts, int ranks, const char* op) {
  MP_CHECK(static_cast<int>(counts.size()) == ranks, "dist::", op, ": expected one block count per rank (", ranks,
           "), got ", counts.size());
  int64_t total = 0;
  for (const int64_t c : counts) {
    MP_CHECK(c >= 0, "dist::", op, ": block counts must be >= 0, got ", c);
    total += c;
  }
  MP_CHECK(total == buffer.numel(), "dist::", op, ": the block counts add up to ", total, " elements, the buffer has ",
           buffer.numel(), "; pass counts that cover it");
  MP_CHECK(total <= INT32_MAX, "dist::", op, ": ", total, " elements are beyond one MPI message (2^31)");
}

void check_reduce_scatter(const Tensor& buffer, const Tensor& out, std::span<const int64_t> counts, int rank,
                          int ranks) {
  check_operand(buffer, "reduce_scatter_sum", true);
  check_operand(out, "reduce_scatter_sum", true);
  MP_CHECK(buffer.dtype() == DType::f32 || buffer.dtype() == DType::f64,
           "dist::reduce_scatter_sum: expected an f32 or f64 buffer, got ", buffer.describe());
  check_blocks(buffer, counts, ranks, "reduce_scatter_sum");
  MP_CHECK(out.dtype() == buffer.dtype() && out.numel() == counts[static_cast<size_t>(rank)],
           "dist::reduce_scatter_sum: expected an output of ", counts[static_cast<size_t>(rank)], " ",
           dtype_name(buffer.dtype()), " elements (this rank's block), got ", out.describe());
}

// gather's operands: this rank's block, and on the root the whole.
void check_gather(const Tensor& mine, const Tensor& out, std::span<const int64_t> counts, int rank, int ranks,
                  bool root) {
  check_operand(mine, "gather", false);
  MP_CHECK(static_cast<int>(counts.size()) == ranks && mine.numel() == counts[static_cast<size_t>(rank)],
           "dist::gather: expected this rank's block of ",
           static_cast<int>(counts.size()) == ranks ? counts[static_cast<size_t>(rank)] : -1, " elements and ", ranks,
           " counts, got ", mine.describe(), " and ", counts.size(), " counts");
  if (!root) return;
  check_operand(out, "gather", false);
  MP_CHECK(out.dtype() == mine.dtype(), "dist::gather: the output is ", out.describe(), ", the blocks ",
           dtype_name(mine.dtype()));
  check_blocks(out, counts, ranks, "gather");
}

// What a single process's collectives return: already complete.
struct Done final : Pending {
  bool test() override { return true; }
  void wait() override {}
};

class SingleProcess final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string describe() const override { return "single process"; }
  void all_reduce_mean(std::span<const Tensor> ts) override {
    for (const Tensor& t : ts) check_operand(t, "all_reduce_mean", true);
  }
  void all_reduce_mean_in(std::span<const Tensor> ts, DType wire) override {
    check_wire(wire);
    all_reduce_mean(ts);
  }
  std::unique_ptr<Pending> start_all_reduce_sum(const Tensor& buffer) override {
    check_sum_buffer(buffer);
    return std::make_unique<Done>();
  }
  void broadcast(std::span<const Tensor> ts, int root) override {
    MP_CHECK(root == 0, "dist::broadcast: root ", root, " is not a rank of a single process (0)");
    for (const Tensor& t : ts) check_operand(t, "broadcast", false);
  }
  void reduce_scatter_sum(const Tensor& buffer, const Tensor& out, std::span<const int64_t> counts) override {
    check_reduce_scatter(buffer, out, counts, 0, 1);
    if (out.raw_data() != buffer.raw_data()) Tensor(out).copy_(buffer.reshape(out.sizes()));
  }
  void all_gather(const Tensor& buffer, std::span<const int64_t> counts) override {
    check_operand(buffer, "all_gather", false);
    check_blocks(buffer, counts, 1, "all_gather");
  }
  void gather(const Tensor& mine, const Tensor& out, std::span<const int64_t> counts, int root) override {
    MP_CHECK(root == 0, "dist::gather: root ", root, " is not a rank of a single process (0)");
    check_gather(mine, out, counts, 0, 1, true);
    if (out.raw_data() != mine.raw_data()) Tensor(out).copy_(mine.reshape(out.sizes()));
  }
  void barrier() override {}
  void abort(int /*status*/) override {}
};

#if defined(MP_HAVE_MPI)

// Note [16-bit sums in MPI]
// MPI has no 16-bit float type, so bf16 and f16 buffers travel as MPI_UINT16_T words and are summed by user-defined
// operations (MPI_Op_create, commutative): each element of both operands widened to f32 (exact), added in f32, and
// rounded once back to the 16-bit format (round to nearest even: mp/core/half.hpp's conversions, the reference every
// tensor conversion matches). So each partial sum MPI forms is rounded to 16 bits, as NCCL's bf16/f16 all-reduce
// rounds it; with two ranks each element is one rounded addition. f16 overflow in the sum is the caller's to avoid:
// all_reduce_mean_in divides by the rank count before it (Note [16-bit gradient communication] in
// src/train/data_parallel.cpp). The operations are created once, with the world, and freed by MPI_Finalize.
void sum_bf16(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = detail::float_to_bf16_bits(detail::bf16_bits_to_float(a[i]) + detail::bf16_bits_to_float(b[i]));
}

void sum_f16(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = detail::float_to_half_bits(detail::half_bits_to_float(a[i]) + detail::half_bits_to_float(b[i]));
}

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  MP_FAIL("MPI: ", call, " failed: ", std::string(text, static_cast<size_t>(len)));
}

// MPI_Finalize at exit, after every user of the group is gone.
struct MpiFinalizer {
  ~MpiFinalizer() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
};

// An MPI_Iallreduce in flight; holds its buffer so that the memory outlives the request.
class MpiPending final : public Pending {
 public:
  explicit MpiPending(Tensor buffer) : buffer_(std::move(buffer)) {}
  MPI_Request* request() { return &request_; }
  ~MpiPending() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
  }

 private:
  Tensor buffer_;
  MPI_Request request_ = MPI_REQUEST_NULL;
};

std::vector<int> ints(std::span<const int64_t> counts) { return {counts.begin(), counts.end()}; }

// Blocks of elements as MPI_BYTE counts and displacements (any dtype travels as bytes).
struct Blocks {
  std::vector<int> counts, displs;
};

Blocks byte_blocks(const Tensor& buffer, std::span<const int64_t> counts) {
  const auto es = static_cast<int64_t>(buffer.element_size());
  MP_CHECK(buffer.numel() * es <= INT32_MAX, "dist: a buffer of ", buffer.numel() * es,
           " bytes is beyond one MPI message (2^31)");
  Blocks b;
  int64_t at = 0;
  for (const int64_t c : counts) {
    b.counts.push_back(static_cast<int>(c * es));
    b.displs.push_back(static_cast<int>(at * es));
    at += c;
  }
  return b;
}

class MpiWorld final : public ProcessGroup {
 public:
  MpiWorld() {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // errors become mp::Error, not an abort
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    if (const size_t cut = v.find_first_of(",\n"); cut != std::string::npos) v.resize(cut);
    library_ = v;
    check_mpi(MPI_Op_create(&sum_bf16, 1, &sum_bf16_), "MPI_Op_create");
    check_mpi(MPI_Op_create(&sum_f16, 1, &sum_f16_), "MPI_Op_create");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return "MPI (" + library_ + "), " + std::to_string(size_) + " ranks"; }

  void all_reduce_mean(std::span<const Tensor> ts) override {
    // One message per accumulation type: every tensor widened into one buffer, summed, divided, rounded back.
    for (const Tensor& t : ts) check_operand(t, "all_reduce_mean", true);
    for (const bool wide : {false, true}) {
      const DType acc = wide ? DType::f64 : DType::f32;
      std::vector<Tensor> group;
      int64_t n = 0;
      for (const Tensor& t : ts)
        if ((t.dtype() == DType::f64) == wide) {
          group.push_back(t);
          n += t.numel();
        }
      if (n == 0) continue;
      Tensor buf = empty({n}, {.dtype = acc});
      int64_t off = 0;
      for (const Tensor& t : group) {
        buf.narrow(0, off, t.numel()).copy_(t.reshape({t.numel()}));
        off += t.numel();
      }
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf.raw_data(), static_cast<int>(n), wide ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD),
                "MPI_Allreduce");
      mul_(buf, 1.0 / static_cast<double>(size_));
      off = 0;
      for (const Tensor& t : group) {
        Tensor dst = t.reshape({t.numel()});
        dst.copy_(buf.narrow(0, off, t.numel()));
        off += t.numel();
      }
    }
  }

  void all_reduce_mean_in(std::span<const Tensor> ts, DType wire) override {
    check_wire(wire);
    if (wire == DType::f32) return all_reduce_mean(ts);
    for (const Tensor& t : ts) check_operand(t, "all_reduce_mean_in", true);
    std::vector<Tensor> wide, narrow;  // f64 tensors keep f64 (all_reduce_mean); the others go in `wire`
    int64_t n = 0;
    for (const Tensor& t : ts) {
      (t.dtype() == DType::f64 ? wide : narrow).push_back(t);
      if (t.dtype() != DType::f64) n += t.numel();
    }
    if (!wide.empty()) all_reduce_mean(wide);
    if (n == 0) return;
    MP_CHECK(n <= INT32_MAX, "dist::all_reduce_mean_in: ", n, " elements are beyond one MPI message (2^31)");
    // Note [16-bit gradient communication]: widened, divided by N in f32, rounded once to the wire
    Tensor f32 = empty({n}, {.dtype = DType::f32});
    int64_t off = 0;
    for (const Tensor& t : narrow) {
      f32.narrow(0, off, t.numel()).copy_(t.reshape({t.numel()}));
      off += t.numel();
    }
    mul_(f32, 1.0 / static_cast<double>(size_));
    Tensor buf = f32.to(wire);
    check_mpi(
        MPI_Allreduce(MPI_IN_PLACE, buf.raw_data(), static_cast<int>(n), MPI_UINT16_T, op_for(wire), MPI_COMM_WORLD),
        "MPI_Allreduce");
    off = 0;
    for (const Tensor& t : narrow) {
      Tensor dst = t.reshape({t.numel()});
      dst.copy_(buf.narrow(0, off, t.numel()));
      off += t.numel();
    }
  }

  std::unique_ptr<Pending> start_all_reduce_sum(const Tensor& buffer) override {
    check_sum_buffer(buffer);
    auto p = std::make_unique<MpiPending>(buffer);
    const DType d = buffer.dtype();
    const MPI_Datatype type = d == DType::f64 ? MPI_DOUBLE : d == DType::f32 ? MPI_FLOAT : MPI_UINT16_T;
    const MPI_Op op = d == DType::f64 || d == DType::f32 ? MPI_SUM : op_for(d);
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buffer.raw_data(), static_cast<int>(buffer.numel()), type, op,
                             MPI_COMM_WORLD, p->request()),
              "MPI_Iallreduce");
    return p;
  }

  void broadcast(std::span<const Tensor> ts, int root) override {
    MP_CHECK(root >= 0 && root < size_, "dist::broadcast: root ", root, " is not a rank (0..", size_ - 1, ")");
    for (const Tensor& t : ts) {
      check_operand(t, "broadcast", false);
      const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
      MP_CHECK(bytes <= INT32_MAX, "dist::broadcast: a tensor of ", bytes, " bytes is beyond one MPI message (2^31)");
      check_mpi(MPI_Bcast(t.raw_data(), static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }

  void reduce_scatter_sum(const Tensor& buffer, const Tensor& out, std::span<const int64_t> counts) override {
    check_reduce_scatter(buffer, out, counts, rank_, size_);
    const std::vector<int> cs = ints(counts);
    const bool wide = buffer.dtype() == DType::f64;
    check_mpi(MPI_Reduce_scatter(buffer.raw_data(), out.raw_data(), cs.data(), wide ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD),
              "MPI_Reduce_scatter");
  }

  void all_gather(const Tensor& buffer, std::span<const int64_t> counts) override {
    check_operand(buffer, "all_gather", false);
    check_blocks(buffer, counts, size_, "all_gather");
    const Blocks b = byte_blocks(buffer, counts);
    check_mpi(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, buffer.raw_data(), b.counts.data(), b.displs.data(), MPI_BYTE,
                             MPI_COMM_WORLD),
              "MPI_Allgatherv");
  }

  void gather(const Tensor& mine, const Tensor& out, std::span<const int64_t> counts, int root) override {
    MP_CHECK(root >= 0 && root < size_, "dist::gather: root ", root, " is not a rank (0..", size_ - 1, ")");
    check_gather(mine, out, counts, rank_, size_, rank_ == root);
    const auto es = static_cast<int64_t>(mine.element_size());
    if (rank_ != root) {
      check_mpi(MPI_Gatherv(mine.raw_data(), static_cast<int>(mine.numel() * es), MPI_BYTE, nullptr, nullptr, nullptr,
                            MPI_BYTE, root, MPI_COMM_WORLD),
                "MPI_Gatherv");
      return;
    }
    const Blocks b = byte_blocks(out, counts);
    check_mpi(MPI_Gatherv(mine.raw_data(), static_cast<int>(mine.numel() * es), MPI_BYTE, out.raw_data(),
                          b.counts.data(), b.displs.data(), MPI_BYTE, root, MPI_COMM_WORLD),
              "MPI_Gatherv");
  }

  void barrier() override { check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  void abort(int status) override { MPI_Abort(MPI_COMM_WORLD, status); }

 private:
  // The sum of 16-bit words holding `d` (Note [16-bit sums in MPI]).
  MPI_Op op_for(DType d) const { return d == DType::bf16 ? sum_bf16_ : sum_f16_; }

  int rank_ = 0, size_ = 1;
  std::string library_;
  MPI_Op sum_bf16_ = MPI_OP_NULL, sum_f16_ = MPI_OP_NULL;
};

#endif  // MP_HAVE_MPI

}  // namespace

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

bool built_with_mpi() {
#if defined(MP_HAVE_MPI)
  return true;
#else
  return false;
#endif
}

ProcessGroup& world() {
  static std::unique_ptr<ProcessGroup> group;
  static std::once_flag once;
  std::call_once(once, [] {
    if (!launched_by_mpi()) {
      group = std::make_unique<SingleProcess>();
      return;
    }
#if defined(MP_HAVE_MPI)
    static MpiFinalizer finalizer;  // MPI_Finalize at exit (MpiWorld's destructor makes no MPI call)
    group = std::make_unique<MpiWorld>();
#else
    MP_FAIL("this process was started by an MPI launcher (mpirun, srun), but this build of mixprec has no MPI; "
            "install libopenmpi-dev (scripts/setup.sh does) and rebuild, or run without the launcher");
#endif
  });
  return *group;
}

}  // namespace mp::dist

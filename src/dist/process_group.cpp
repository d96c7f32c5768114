// The process groups of data-parallel runs (include/mp/dist/process_group.hpp): MPI's COMM_WORLD or a single
// process.
//
// Note [rank failures]
// A rank that dies or hangs (killed, stopped, deadlocked) must not leave the others waiting forever in a collective.
// The rule: every collective is started non-blocking and completed by finish(), which polls it with MPI_Test against
// a deadline of set_timeout() seconds (--dist_timeout); a rank that passes it prints what it waited in and who did
// not come, then MPI_Abort()s the run with kExitRankFailure (4), so mpirun tears every rank down and exits 4. Who did
// not come: each collective is numbered (the same on every rank, as they call the same ones in order), and on entry a
// rank announces its number point to point on a duplicate communicator: ranks > 0 to rank 0, rank 0 to every rank.
// So rank 0 names every rank whose last announced collective is behind its own, and another rank can tell whether
// rank 0 came (2 (N - 1) eight-byte messages per collective, drained while waiting). Why not a watchdog thread: MPI
// is initialised MPI_THREAD_FUNNELED, and only the waiting thread may ask MPI who arrived. What mpirun does itself:
// a rank that dies (SIGKILL, a crash) is usually noticed by OpenMPI's runtime, which kills the others at once and
// exits non-zero ("mpirun noticed that process rank 1 ... exited on signal 9"), before any timeout; a rank that is
// stopped (SIGSTOP) or deadlocked is alive to the runtime, and only the timeout ends the run. Checkpoints are written
// to a temporary file and renamed (save_checkpoint), so a run ended this way keeps its last complete checkpoint, and
// --resume continues from it.
#include "mp/dist/process_group.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#if defined(MP_HAVE_MPI)
#include <mpi.h>
#endif

#include "dist/collective_checks.hpp"
#include "mp/core/error.hpp"
#include "mp/core/half.hpp"
#include "mp/ops/ops.hpp"

namespace mp::dist {
namespace {

using detail::check_blocks;
using detail::check_gather;
using detail::check_operand;
using detail::check_reduce_scatter;
using detail::check_sum_buffer;

// What all_reduce_mean_in sends: f32, or a 16-bit float.
void check_wire(DType wire) {
  MP_CHECK(wire == DType::f32 || wire == DType::bf16 || wire == DType::f16,
           "dist::all_reduce_mean_in: expected f32, bf16 or f16 to send gradients in, got ", dtype_name(wire));
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
  void set_timeout(double /*seconds*/) override {}
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
    b[i] = ::mp::detail::float_to_bf16_bits(::mp::detail::bf16_bits_to_float(a[i]) +
                                            ::mp::detail::bf16_bits_to_float(b[i]));
}

void sum_f16(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = ::mp::detail::float_to_half_bits(::mp::detail::half_bits_to_float(a[i]) +
                                            ::mp::detail::half_bits_to_float(b[i]));
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

// Completes `request` within the group's timeout (Note [rank failures]); `what` names the collective.
class Finisher {
 public:
  virtual ~Finisher() = default;
  virtual void finish(MPI_Request* request, const char* what) = 0;
};

// An MPI_Iallreduce in flight; holds its buffer so that the memory outlives the request.
class MpiPending final : public Pending {
 public:
  MpiPending(Tensor buffer, Finisher& owner) : buffer_(std::move(buffer)), owner_(owner) {}
  MPI_Request* request() { return &request_; }
  ~MpiPending() override {
    if (request_ == MPI_REQUEST_NULL) return;
    try {
      owner_.finish(&request_, "all-reduce of a gradient bucket");
    } catch (const std::exception&) {  // an MPI error while unwinding: the error being thrown already says more
    }
  }
  bool test() override {
    if (request_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }
  void wait() override {
    if (request_ != MPI_REQUEST_NULL) owner_.finish(&request_, "all-reduce of a gradient bucket");
  }

 private:
  Tensor buffer_;
  Finisher& owner_;
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

class MpiWorld final : public ProcessGroup, public Finisher {
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
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &arrivals_), "MPI_Comm_dup");  // Note [rank failures]: announcements
    arrived_.assign(static_cast<size_t>(size_), 0);
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
      MPI_Request r = announce();
      check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf.raw_data(), static_cast<int>(n), wide ? MPI_DOUBLE : MPI_FLOAT,
                               MPI_SUM, MPI_COMM_WORLD, &r),
                "MPI_Iallreduce");
      finish(&r, "all_reduce_mean");
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
    MPI_Request r = announce();  // Note [rank failures]
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf.raw_data(), static_cast<int>(n), MPI_UINT16_T, op_for(wire),
                             MPI_COMM_WORLD, &r),
              "MPI_Iallreduce");
    finish(&r, "all_reduce_mean_in");
    off = 0;
    for (const Tensor& t : narrow) {
      Tensor dst = t.reshape({t.numel()});
      dst.copy_(buf.narrow(0, off, t.numel()));
      off += t.numel();
    }
  }

  std::unique_ptr<Pending> start_all_reduce_sum(const Tensor& buffer) override {
    check_sum_buffer(buffer);
    auto p = std::make_unique<MpiPending>(buffer, *this);
    *p->request() = announce();
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
      MPI_Request r = announce();
      check_mpi(MPI_Ibcast(t.raw_data(), static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &r), "MPI_Ibcast");
      finish(&r, "broadcast");
    }
  }

  void reduce_scatter_sum(const Tensor& buffer, const Tensor& out, std::span<const int64_t> counts) override {
    check_reduce_scatter(buffer, out, counts, rank_, size_);
    const std::vector<int> cs = ints(counts);
    const bool wide = buffer.dtype() == DType::f64;
    MPI_Request r = announce();
    check_mpi(MPI_Ireduce_scatter(buffer.raw_data(), out.raw_data(), cs.data(), wide ? MPI_DOUBLE : MPI_FLOAT, MPI_SUM,
                                  MPI_COMM_WORLD, &r),
              "MPI_Ireduce_scatter");
    finish(&r, "reduce_scatter_sum");
  }

  void all_gather(const Tensor& buffer, std::span<const int64_t> counts) override {
    check_operand(buffer, "all_gather", false);
    check_blocks(buffer, counts, size_, "all_gather");
    const Blocks b = byte_blocks(buffer, counts);
    MPI_Request r = announce();
    check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, buffer.raw_data(), b.counts.data(), b.displs.data(), MPI_BYTE,
                              MPI_COMM_WORLD, &r),
              "MPI_Iallgatherv");
    finish(&r, "all_gather");
  }

  void gather(const Tensor& mine, const Tensor& out, std::span<const int64_t> counts, int root) override {
    MP_CHECK(root >= 0 && root < size_, "dist::gather: root ", root, " is not a rank (0..", size_ - 1, ")");
    check_gather(mine, out, counts, rank_, size_, rank_ == root);
    const auto es = static_cast<int64_t>(mine.element_size());
    if (rank_ != root) {
      MPI_Request r = announce();
      check_mpi(MPI_Igatherv(mine.raw_data(), static_cast<int>(mine.numel() * es), MPI_BYTE, nullptr, nullptr, nullptr,
                             MPI_BYTE, root, MPI_COMM_WORLD, &r),
                "MPI_Igatherv");
      finish(&r, "gather");
      return;
    }
    const Blocks b = byte_blocks(out, counts);
    MPI_Request r = announce();
    check_mpi(MPI_Igatherv(mine.raw_data(), static_cast<int>(mine.numel() * es), MPI_BYTE, out.raw_data(),
                           b.counts.data(), b.displs.data(), MPI_BYTE, root, MPI_COMM_WORLD, &r),
              "MPI_Igatherv");
    finish(&r, "gather");
  }

  void barrier() override {
    MPI_Request r = announce();
    check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &r), "MPI_Ibarrier");
    finish(&r, "barrier");
  }

  void set_timeout(double seconds) override { timeout_ = seconds; }

  void abort(int status) override { MPI_Abort(MPI_COMM_WORLD, status); }

  // Note [rank failures]: polls `request` until it completes, or the timeout passes and the run ends.
  void finish(MPI_Request* request, const char* what) override {
    if (timeout_ <= 0) {
      check_mpi(MPI_Wait(request, MPI_STATUS_IGNORE), "MPI_Wait");
      return;
    }
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    const auto limit = std::chrono::duration<double>(timeout_);
    for (uint64_t polls = 0;; ++polls) {
      int done = 0;
      check_mpi(MPI_Test(request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done != 0) return;
      if (polls % 256 != 255) continue;
      drain();
      if (Clock::now() - start > limit) timed_out(what);
    }
  }

 private:
  static constexpr int kArrivalTag = 2601;

  // Numbers the collective about to start and announces it (Note [rank failures]); returns MPI_REQUEST_NULL for the
  // caller's request.
  MPI_Request announce() {
    ++seq_;
    arrived_[static_cast<size_t>(rank_)] = seq_;
    if (timeout_ <= 0) return MPI_REQUEST_NULL;
    while (!sends_.empty()) {  // the announcements already delivered (eight bytes: at once, unless a peer is gone)
      int done = 0;
      check_mpi(MPI_Test(&sends_.front().request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done == 0) break;
      sends_.pop_front();
    }
    for (int to = 0; to < size_; ++to) {
      if (to == rank_ || (rank_ != 0 && to != 0)) continue;
      sends_.push_back({std::make_unique<int64_t>(seq_), MPI_REQUEST_NULL});
      check_mpi(MPI_Isend(sends_.back().seq.get(), 1, MPI_INT64_T, to, kArrivalTag, arrivals_, &sends_.back().request),
                "MPI_Isend");
    }
    drain();
    return MPI_REQUEST_NULL;
  }

  // Receives the announcements that have come.
  void drain() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, kArrivalTag, arrivals_, &flag, &st), "MPI_Iprobe");
      if (flag == 0) return;
      int64_t seq = 0;
      check_mpi(MPI_Recv(&seq, 1, MPI_INT64_T, st.MPI_SOURCE, kArrivalTag, arrivals_, MPI_STATUS_IGNORE), "MPI_Recv");
      int64_t& last = arrived_[static_cast<size_t>(st.MPI_SOURCE)];
      last = std::max(last, seq);
    }
  }

  // The deadline passed: say who did not come, and end the run.
  [[noreturn]] void timed_out(const char* what) {
    drain();
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || (rank_ != 0 && r != 0)) continue;
      const int64_t last = arrived_[static_cast<size_t>(r)];
      if (last >= seq_) continue;
      missing += (missing.empty() ? "rank " : ", rank ") + std::to_string(r) + " (its last collective: #" +
                 std::to_string(last) + ")";
    }
    std::string who;
    if (!missing.empty())
      who = "; did not arrive: " + missing;
    else if (rank_ == 0)
      who = "; every rank announced it, so one of them stopped inside it";
    else
      who = "; rank 0 arrived, and its message names the ranks that did not";
    std::fflush(stdout);
    std::fprintf(stderr,
                 "mixprec: rank %d of %d: error: waited %g s (--dist_timeout) in collective #%lld (%s)%s: a rank died "
                 "or hangs (killed, stopped, deadlocked, or far slower than the others); ending the run with exit "
                 "status %d. The last checkpoint in --checkpoint_dir is intact: restart the rank's machine or process "
                 "and continue with --resume (on any number of ranks), or raise --dist_timeout if it was only slow\n",
                 rank_, size_, timeout_, static_cast<long long>(seq_), what, who.c_str(), kExitRankFailure);
    std::fflush(stderr);
    std::signal(SIGALRM, SIG_DFL);  // should MPI_Abort itself hang, this process still ends
    alarm(30);
    MPI_Abort(MPI_COMM_WORLD, kExitRankFailure);
    std::_Exit(kExitRankFailure);
  }

  struct Send {
    std::unique_ptr<int64_t> seq;  // the announced number: stays put until the send completes
    MPI_Request request;
  };

  // The sum of 16-bit words holding `d` (Note [16-bit sums in MPI]).
  MPI_Op op_for(DType d) const { return d == DType::bf16 ? sum_bf16_ : sum_f16_; }

  int rank_ = 0, size_ = 1;
  std::string library_;
  MPI_Op sum_bf16_ = MPI_OP_NULL, sum_f16_ = MPI_OP_NULL;
  double timeout_ = 0;  // seconds; 0 = unbounded
  MPI_Comm arrivals_ = MPI_COMM_NULL;
  int64_t seq_ = 0;               // the collectives this rank has started
  std::vector<int64_t> arrived_;  // per rank, the last collective it announced (that this rank has heard of)
  std::deque<Send> sends_;
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

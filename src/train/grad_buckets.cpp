// Gradients averaged over the ranks in buckets all-reduced during backward (src/train/grad_buckets.hpp).
//
// Note [bucketed gradient all-reduce]
// With --bucket_mb M > 0 a data-parallel run averages gradients as PyTorch's DDP Reducer does:
//   1. Buckets. The parameters, in reverse registration order (the order backward finalises their gradients), are cut
//      into buckets of about M MiB of f32 (a larger parameter is a bucket alone); each bucket owns one contiguous f32
//      buffer (f64 for f64 parameters), allocated once.
//   2. Launch. A post-accumulate hook on each parameter marks it ready; when a bucket's parameters are all ready its
//      gradients are copied into the buffer and an MPI_Iallreduce (sum) starts. Buckets start strictly in order:
//      every rank must start MPI collectives in the same order, so one that fills early waits for the earlier ones.
//      Only the backward of an optimizer step's last micro-batch is armed: --grad_accum communicates once per step.
//   3. Finish. After backward, buckets still waiting (a parameter that got no gradient in this pass: an unused one,
//      PyTorch's find_unused_parameters problem) start with zeros in its place, so no rank waits forever; then every
//      request is waited for, the sums are multiplied by 1/N and each gradient gets its slice back, rounded once to
//      its dtype; a parameter without a gradient keeps none, as in a single process (DataParallel::average_gradients
//      then refuses ranks that disagree on which parameters have one). Cost: a bucket behind an unused parameter,
//      and every later one, overlaps nothing.
//   4. Values. The arithmetic of ProcessGroup::all_reduce_mean, which --bucket_mb 0 uses after backward: 16-bit
//      gradients widened to f32 (so fp16 cannot overflow in the sum and needs no division before it), summed in f32,
//      times 1/N, rounded once. Bucketing changes which message carries an element, not the additions, except that
//      MPI may pick another reduction order for another message size when N > 2; with N = 2 each element is one
//      commutative addition, so bucketed and unbucketed gradients are bitwise equal. With --grad_comm_dtype bf16 or
//      fp16 the arithmetic is ProcessGroup::all_reduce_mean_in's (Note [16-bit gradient communication] in
//      data_parallel.cpp): the f32 buffer is multiplied by 1/N and rounded once into the bucket's 16-bit buffer,
//      which is what is sent and summed; the sum is widened back into the f32 buffer. The same roundings in the same
//      order as the unbucketed path, so with N = 2 the two are again bitwise equal.
//   5. Progress. OpenMPI here (4.1, shared-memory transport, non-blocking collectives in libnbc; `ompi_info`: "OMPI
//      progress: no") has no progress thread: a started all-reduce advances only while this process is inside an MPI
//      call. Each hook therefore calls MPI_Test on the buckets in flight, so the exchange moves on between backward's
//      nodes instead of all at once in finish(). On shared memory that does not hide it: the exchange is copying and
//      adding done by the same cores that run backward, so it moves into backward (the word LM's wait after backward
//      halves, its hooks take as much longer) and step times do not change (bench/RESULTS.md "Bucketed gradient
//      all-reduce", bench/dp_scaling.sh, whose MP_BUCKET_PROGRESS=0 leaves the MPI_Test calls out). The calls stay:
//      they cost nothing measurable there, and without them an MPI without a progress thread overlaps nothing on any
//      transport (where the exchange runs on other hardware than the cores, a NIC, overlap is what buckets are for).
#include "train/grad_buckets.hpp"

#include <chrono>
#include <cstdlib>
#include <string>

#include "mp/autograd/node.hpp"
#include "mp/core/error.hpp"
#include "mp/ops/ops.hpp"

namespace mp::train::detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Bucket {
  std::vector<size_t> params;    // indices into State::params
  std::vector<int64_t> offsets;  // of each parameter in the buffer
  Tensor buffer;                 // the flattened gradients, f32 (f64 for f64 parameters)
  Tensor sent;  // with a 16-bit wire (f32 buckets, N > 1; one rank sends nothing): buffer / N rounded, all-reduced
  int64_t waiting = 0;  // parameters not yet ready in the armed pass
  std::unique_ptr<dist::Pending> inflight;
};

}  // namespace

struct GradBuckets::State {
  State(dist::ProcessGroup& w, DType d) : world(w), wire(d) {}
  dist::ProcessGroup& world;
  DType wire;
  std::vector<Tensor> params;
  std::vector<Bucket> buckets;
  std::vector<int64_t> bucket_of;  // per parameter, -1: not bucketed (needs no gradient)
  std::vector<char> ready, has_grad;
  size_t next = 0;  // the first bucket not started
  bool armed = false;
  Stats stats;
  double pass_hook_seconds = 0;
  int64_t taken = 0;        // stats.all_reduces at the last take_all_reduces()
  int64_t taken_bytes = 0;  // stats.bytes at the last take_bytes()
  // MPI_Test from the hooks; MP_BUCKET_PROGRESS=0 turns it off to measure what it brings (Note 5)
  bool progress = [] {
    const char* e = std::getenv("MP_BUCKET_PROGRESS");
    return e == nullptr || std::string(e) != "0";
  }();

  void start(Bucket& b) {
    for (size_t k = 0; k < b.params.size(); ++k) {
      const Tensor& p = params[b.params[k]];
      Tensor slice = b.buffer.narrow(0, b.offsets[k], p.numel()).reshape(p.sizes());
      if (has_grad[b.params[k]] != 0)
        slice.copy_(p.grad());
      else
        slice.zero_();
    }
    if (b.sent.defined()) {  // Note [16-bit gradient communication]: divided by N before the sum, rounded once
      mul_(b.buffer, 1.0 / static_cast<double>(world.size()));
      b.sent.copy_(b.buffer);
    }
    const Tensor& msg = b.sent.defined() ? b.sent : b.buffer;
    b.inflight = world.start_all_reduce_sum(msg);
    ++stats.all_reduces;
    stats.bytes += msg.numel() * static_cast<int64_t>(msg.element_size());
  }
  // Starts the buckets whose parameters are all ready, in order.
  void start_ready() {
    while (next < buckets.size() && buckets[next].waiting == 0) start(buckets[next++]);
  }
  void on_ready(size_t i) {
    const auto t = Clock::now();
    MP_CHECK(ready[i] == 0, "data-parallel training: parameter ", i, " (", params[i].describe(),
             ") got a second gradient in the backward pass whose buckets are being all-reduced; call backward once "
             "per micro-batch");
    ready[i] = 1;
    has_grad[i] = 1;
    Bucket& b = buckets[static_cast<size_t>(bucket_of[i])];
    --b.waiting;
    const size_t before = next;
    start_ready();
    stats.started_in_backward += static_cast<int64_t>(next - before);
    if (progress)  // Note [bucketed gradient all-reduce] 5: MPI progresses inside MPI calls only
      for (size_t k = 0; k < next; ++k)
        if (buckets[k].inflight) buckets[k].inflight->test();
    const double spent = seconds_since(t);
    stats.hook_seconds += spent;
    pass_hook_seconds += spent;
  }
};

GradBuckets::GradBuckets(dist::ProcessGroup& world, const std::vector<Tensor>& params, double bucket_mb, DType wire)
    : state_(std::make_shared<State>(world, wire)) {
  MP_CHECK(bucket_mb > 0, "GradBuckets: expected a bucket size > 0 MiB, got ", bucket_mb,
           " (0 means no buckets: one all-reduce after backward)");
  MP_CHECK(wire == DType::f32 || wire == DType::bf16 || wire == DType::f16,
           "GradBuckets: expected gradients sent in f32, bf16 or f16, got ", dtype_name(wire));
  State& s = *state_;
  s.params = params;
  s.bucket_of.assign(params.size(), -1);
  s.ready.assign(params.size(), 0);
  s.has_grad.assign(params.size(), 0);
  const double cap = bucket_mb * 1024.0 * 1024.0;
  double bytes = 0;
  DType acc = DType::f32;
  for (size_t i = params.size(); i-- > 0;) {
    const Tensor& p = params[i];
    if (!p.requires_grad()) continue;
    const DType a = p.dtype() == DType::f64 ? DType::f64 : DType::f32;
    const double b = static_cast<double>(p.numel()) * (a == DType::f64 ? 8 : 4);
    if (s.buckets.empty() || a != acc || (bytes + b > cap && !s.buckets.back().params.empty())) {
      s.buckets.emplace_back();
      bytes = 0;
      acc = a;
    }
    Bucket& bk = s.buckets.back();
    bk.offsets.push_back(bk.params.empty() ? 0 : bk.offsets.back() + params[bk.params.back()].numel());
    bk.params.push_back(i);
    s.bucket_of[i] = static_cast<int64_t>(s.buckets.size() - 1);
    bytes += b;
  }
  for (Bucket& bk : s.buckets) {
    const DType a = params[bk.params.front()].dtype() == DType::f64 ? DType::f64 : DType::f32;
    bk.buffer = empty({bk.offsets.back() + params[bk.params.back()].numel()}, {.dtype = a});
    if (a == DType::f32 && wire != DType::f32 && world.size() > 1)
      bk.sent = empty({bk.buffer.numel()}, {.dtype = wire});
  }
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < params.size(); ++i) {
    if (s.bucket_of[i] < 0) continue;
    autograd::register_post_accumulate_grad_hook(params[i], [weak, i](const Tensor&) {
      if (const auto st = weak.lock(); st && st->armed) st->on_ready(i);
    });
  }
}

GradBuckets::~GradBuckets() {
  // Requests still in flight (an exception between arm() and finish()) are waited for by their destructors.
  state_->buckets.clear();
}

void GradBuckets::arm() {
  State& s = *state_;
  MP_ASSERT(!s.armed, "GradBuckets::arm: already armed (finish() was not called)");
  for (Bucket& b : s.buckets) {
    b.waiting = static_cast<int64_t>(b.params.size());
    b.inflight.reset();
  }
  std::fill(s.ready.begin(), s.ready.end(), 0);
  std::fill(s.has_grad.begin(), s.has_grad.end(), 0);
  s.next = 0;
  s.pass_hook_seconds = 0;
  s.armed = true;
}

bool GradBuckets::armed() const { return state_->armed; }

void GradBuckets::finish() {
  State& s = *state_;
  MP_ASSERT(s.armed, "GradBuckets::finish: not armed");
  const auto t = Clock::now();
  s.armed = false;
  for (size_t i = 0; i < s.params.size(); ++i)
    if (s.bucket_of[i] >= 0 && s.ready[i] == 0) {  // no gradient in this pass: an earlier micro-batch's, or zeros
      s.ready[i] = 1;
      s.has_grad[i] = s.params[i].grad().defined() ? 1 : 0;
      --s.buckets[static_cast<size_t>(s.bucket_of[i])].waiting;
    }
  s.start_ready();
  MP_ASSERT(s.next == s.buckets.size(), "GradBuckets::finish: ", s.buckets.size() - s.next, " buckets not started");
  autograd::NoGradGuard ng;
  const double inv = 1.0 / static_cast<double>(s.world.size());
  for (Bucket& b : s.buckets) {
    b.inflight->wait();
    b.inflight.reset();
    if (b.sent.defined())
      b.buffer.copy_(b.sent);  // the mean already (divided before the sum), widened exactly
    else
      mul_(b.buffer, inv);
    for (size_t k = 0; k < b.params.size(); ++k) {
      const size_t i = b.params[k];
      if (s.has_grad[i] == 0) continue;
      const Tensor& p = s.params[i];
      Tensor g = p.grad();
      g.copy_(b.buffer.narrow(0, b.offsets[k], p.numel()).reshape(p.sizes()));
    }
  }
  s.stats.finish_seconds += seconds_since(t);
}

std::vector<std::vector<size_t>> GradBuckets::layout() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : state_->buckets) out.push_back(b.params);
  return out;
}

const GradBuckets::Stats& GradBuckets::stats() const { return state_->stats; }

int64_t GradBuckets::take_all_reduces() {
  const int64_t n = state_->stats.all_reduces - state_->taken;
  state_->taken = state_->stats.all_reduces;
  return n;
}

int64_t GradBuckets::take_bytes() {
  const int64_t n = state_->stats.bytes - state_->taken_bytes;
  state_->taken_bytes = state_->stats.bytes;
  return n;
}

double GradBuckets::pass_hook_seconds() const { return state_->pass_hook_seconds; }

}  // namespace mp::train::detail

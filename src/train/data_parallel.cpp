// What the ranks of a data-parallel training run agree on and exchange (src/train/data_parallel.hpp).
//
// Note [data-parallel training]
// `mpirun -np N mixprec train ...` trains one model on the N processes of dist::world() (Note [process groups]).
//   1. One run. Every rank compares its config with rank 0's (less data_dir and num_workers, which may differ
//      between machines without changing what is computed), then the size of its data, its resume point and the
//      size of its state; any difference is refused on every rank, naming the ranks and entries. Reason: ranks that
//      differ would call collectives of different sizes (a deadlock or garbage) or silently train different things.
//   2. Data. --batch_size is per rank. Rank r reads its part of each global batch of N x B examples of the epoch
//      order a single process uses, with the augmentation draws a single process gives those positions (Note
//      [data-parallel batches] in src/data/loader.cpp), so N ranks at B see what one process at N x B sees, and a
//      resume on any N with the same global batch continues the same order. The word LM batchifies the text into
//      N x B streams and rank r trains streams [rB, (r+1)B) (the streams are independent; the hidden state is per
//      stream); checkpoints hold the hidden state of all N x B streams (gathered), so they resume on any N.
//   3. Start. Rank 0's parameters and buffers are broadcast once the model is built, before the optimizer and
//      amp::initialize see it (the masters and weight averages start from them). A resumed run reads the checkpoint
//      on every rank (it must be on a file system they all see), then rank 0's model and optimizer state (masters,
//      moments) are broadcast again.
//   4. Steps. Gradients are averaged once per optimizer step (once per step with --grad_accum: only the last
//      micro-batch's backward communicates): with --bucket_mb > 0 in buckets all-reduced during that backward (Note
//      [bucketed gradient all-reduce] in grad_buckets.cpp), with 0 in one all-reduce (ProcessGroup::all_reduce_mean)
//      after it; both compute the same numbers. Then one small all-reduce agrees on the step's loss (the mean of the
//      ranks' means: the global batch's mean loss), on inf/NaN in any rank's loss, on a stop request (a signal
//      reaching some rank) and checks that the same gradients exist everywhere. Everything after it (unscale,
//      clipping by the global norm, the inf/NaN check, the optimizer, the scaler's update, the schedule, the weight
//      EMA) sees the same numbers on every rank, so the weights stay identical without being sent again (with
//      --shard_optimizer a reduce-scatter replaces the all-reduce: Note [sharded optimizer state]). The
//      scaler's found-inf is reduced as well (any rank's inf/NaN skips every rank's step), so the ranks skip the same
//      steps and keep the same scale whatever the reduction does.
//   5. What equals one process at N x B. The mean of the ranks' mean losses is the global batch's mean loss, so the
//      averaged gradient is the global batch's gradient up to rounding: the sums run in another order, and 16-bit
//      gradients (O2 without accumulation) are rounded on each rank, then averaged in f32 and rounded again. Not the
//      same by design: batch norm normalises with each rank's batch statistics (B examples, as PyTorch's DDP without
//      SyncBatchNorm; rank 0's running statistics are the ones saved; --sync_batchnorm normalises with the global
//      batch's instead: Note [synchronised batch norm] in src/nn/batch_norm.cpp). Dropout is keyed by the global batch
//      (Note [draws keyed by the global batch] in src/core/philox.cpp): batch-major activations (the MLP's, GPT's,
//      attention weights) get the masks of one process at N x B, and a resume on any N continues them; the word LM's
//      time-major ones get disjoint masks per rank. Runs with batch norm without --sync_batchnorm, or the word LM with
//      dropout, therefore match a single process statistically, not number for number.
//   6. Output. Rank 0 alone prints, writes the run log, progress bar, checkpoints and last-good files; the others
//      print only their errors. Evaluation of images is sharded: rank 0's batch-norm statistics are broadcast (the
//      model evaluated is the one rank 0 saves), each rank evaluates a contiguous Nth of the test set and the loss
//      sums and correct counts are summed over the ranks, so the metrics are the whole test set's. The word LM's
//      validation carries its hidden state through the text, so every rank evaluates all of it and rank 0 reports.
//   7. Failures. An error that every rank meets together (a config mismatch, a numerical failure agreed in 4) is
//      thrown on every rank; a rank that fails alone ends the whole run (the CLI calls ProcessGroup::abort), since
//      the others may be waiting for it in a collective. A rank that dies or hangs without a word is met by the
//      others' --dist_timeout on every collective (Note [rank failures] in src/dist/process_group.cpp): exit status 4.
//
// Note [16-bit gradient communication]
// --grad_comm_dtype bf16 or fp16 (default fp32) sends the gradients of point 4 in 16 bits: half the bytes of every
// all-reduce message (the run log's grad_bytes per step), for bandwidth-bound links. What it does, on both paths
// (ProcessGroup::all_reduce_mean_in after backward, GradBuckets during it; f64 parameters stay f64):
//   1. Each rank widens its gradient to f32, multiplies by 1/N and rounds once to the wire dtype. Dividing first keeps
//      fp16 in range: N values each at most 65504/N in magnitude sum to at most 65504, where summing first overflows
//      as soon as the ranks' gradients add up past 65504 (two ranks at 40000 give inf, and a dynamic loss scale would
//      halve for nothing). For N a power of two the division is exact (but below fp16's normal range).
//   2. MPI sums the 16-bit values with a user-defined operation (Note [16-bit sums in MPI] in
//      src/dist/process_group.cpp): each partial sum widened to f32, added, rounded back to 16 bits.
//   3. The sum, the mean already, is widened (exactly) and rounded to the gradient's dtype.
// The cost in accuracy, with u the wire's unit roundoff (bf16 2^-8, fp16 2^-11) against f32's 2^-24: each pre-divided
// value is rounded once (relative error <= u) and each of the N - 1 partial sums once more (<= u of the partial sum),
// so the averaged gradient is within about N u of sum |g_r| / N of the f32 average (2u for two ranks): where the ranks'
// gradients cancel, a larger share of the result. fp16 also has a narrow range: values below 2^-14
// (after the division by N) lose relative precision and below 2^-25 become 0, so gradients must carry a loss scale
// (fp16 O2 with dynamic scaling; they are sent before unscaling) or be large enough; and f32 gradients beyond 65504
// (fp32 or O1 runs: f32 weights) overflow to inf even divided (the scaler then skips the step; without one the run
// stops on a numerical failure). bf16 has f32's range and no such limits, but 8 bits of precision. f32 stays the
// default because it changes nothing (the one-process arithmetic of point 5) and costs no accuracy; a 16-bit wire is
// for links where the bytes dominate the step (networks). Its speed on this machine's shared memory is not measured.
#include "train/data_parallel.hpp"

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "mp/autograd/node.hpp"
#include "mp/core/error.hpp"
#include "mp/core/philox.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/optimizer.hpp"

namespace mp::train::detail {
namespace {

std::vector<Tensor> state_tensors(const CheckpointRefs& refs) {
  std::vector<Tensor> ts;
  if (refs.model != nullptr) {
    for (const Tensor& p : refs.model->parameters()) ts.push_back(p);
    for (const Tensor& b : refs.model->buffers()) ts.push_back(b);
  }
  if (refs.optimizer != nullptr)  // the buffers alias the live state
    for (const auto& [index, st] : refs.optimizer->state_dict().state)
      for (const auto& [name, t] : st.buffers) ts.push_back(t);
  return ts;
}

std::string describe_value(const nlohmann::json& j) { return j.is_null() ? std::string("(absent)") : j.dump(); }

}  // namespace

std::string DataParallel::where() const { return "rank " + std::to_string(rank()) + " of " + std::to_string(size()); }

std::string DataParallel::broadcast_string(const std::string& text, int root) const {
  const Tensor len = full({1}, static_cast<double>(text.size()), {.dtype = DType::i64});
  const Tensor lens[1] = {len};
  world_.broadcast(lens, root);
  const int64_t n = len.item<int64_t>();
  if (n == 0) return {};
  const Tensor bytes = empty({n}, {.dtype = DType::u8});
  if (rank() == root) std::memcpy(bytes.raw_data(), text.data(), static_cast<size_t>(n));
  const Tensor bs[1] = {bytes};
  world_.broadcast(bs, root);
  return {static_cast<const char*>(bytes.raw_data()), static_cast<size_t>(n)};
}

std::vector<bool> DataParallel::gather_flags(bool flag) const {
  const Tensor flags = zeros({size()}, {.dtype = DType::f64});
  flags.data_ptr<double>()[rank()] = flag ? 1.0 : 0.0;
  const Tensor fs[1] = {flags};
  world_.all_reduce_mean(fs);  // flag / N at each rank's index: exact for any N in f64 (0 or 1/N)
  std::vector<bool> out(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) out[static_cast<size_t>(r)] = flags.data_ptr<double>()[r] > 0;
  return out;
}

void DataParallel::check_same_run(const std::string& what, const std::string& description) const {
  if (!active()) return;
  const std::string zero = broadcast_string(description, 0);
  const std::vector<bool> differs = gather_flags(description != zero);
  std::string ranks;
  int first = -1;
  for (int r = 0; r < size(); ++r)
    if (differs[static_cast<size_t>(r)]) {
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      if (first < 0) first = r;
    }
  if (first < 0) return;
  const std::string theirs = broadcast_string(description, first);  // every rank can now write the same message
  std::string entries;
  try {
    const nlohmann::json a = nlohmann::json::parse(zero).flatten(), b = nlohmann::json::parse(theirs).flatten();
    int shown = 0;
    nlohmann::json keys = nlohmann::json::object();
    for (const auto& [k, v] : a.items()) keys[k] = true;
    for (const auto& [k, v] : b.items()) keys[k] = true;
    for (const auto& [k, v] : keys.items()) {
      const nlohmann::json va = a.contains(k) ? a[k] : nlohmann::json(), vb = b.contains(k) ? b[k] : nlohmann::json();
      if (va == vb) continue;
      if (shown++ == 6) {
        entries += "; ...";
        break;
      }
      entries += (entries.empty() ? "" : "; ") + k + ": " + describe_value(va) + " on rank 0, " + describe_value(vb) +
                 " on rank " + std::to_string(first);
    }
  } catch (const nlohmann::json::exception&) { entries = "(the descriptions do not parse)"; }
  MP_FAIL("data-parallel training: every rank must run the same ", what, ", but rank",
          ranks.find(',') == std::string::npos ? " " : "s ", ranks, " differ",
          ranks.find(',') == std::string::npos ? "s" : "", " from rank 0 (", entries,
          "); start every rank with the same command and data (mpirun -np N mixprec train ...), and --resume from a "
          "checkpoint every rank can read");
}

void DataParallel::broadcast_model(const nn::Module& model) const {
  if (!active()) return;
  autograd::NoGradGuard ng;
  std::vector<Tensor> ts = model.parameters();
  for (const Tensor& b : model.buffers()) ts.push_back(b);
  world_.broadcast(ts, 0);
}

void DataParallel::broadcast_buffers(const nn::Module& model) const {
  if (!active()) return;
  autograd::NoGradGuard ng;
  world_.broadcast(model.buffers(), 0);
}

std::vector<double> DataParallel::sum(const std::vector<double>& values) const {
  if (!active() || values.empty()) return values;
  const Tensor t = from_vector<double>(values, {static_cast<int64_t>(values.size())});
  const Tensor ts[1] = {t};
  world_.all_reduce_mean(ts);
  std::vector<double> out = t.to_vector<double>();
  for (double& v : out) v *= size();
  return out;
}

void DataParallel::broadcast_state(const CheckpointRefs& refs) const {
  if (!active()) return;
  autograd::NoGradGuard ng;
  world_.broadcast(state_tensors(refs), 0);
}

std::string DataParallel::state_signature(const CheckpointRefs& refs) {
  int64_t values = 0;
  const std::vector<Tensor> ts = state_tensors(refs);
  for (const Tensor& t : ts) values += t.numel() * static_cast<int64_t>(t.element_size());
  return std::to_string(ts.size()) + " tensors, " + std::to_string(values) + " bytes";
}

void DataParallel::shard_random_draws() const {
  default_generator().set_batch_shard(rank(), size());  // Note [draws keyed by the global batch]
}

void DataParallel::agree_on_found_inf(amp::GradScaler& scaler) const {
  if (!active()) return;
  scaler.set_found_inf_agreement([this](bool found) {
    const Tensor f = full({1}, found ? 1.0 : 0.0, {.dtype = DType::f64});
    const Tensor fs[1] = {f};
    world_.all_reduce_mean(fs);
    return f.item<double>() > 0;  // any rank's
  });
}

DataParallel::StepAgreement DataParallel::average_gradients(const std::vector<Tensor>& params, double loss,
                                                            bool loss_nonfinite, bool stop, GradBuckets* buckets,
                                                            const OptimizerShards* shards, DType wire) const {
  if (!active()) {
    if (buckets != nullptr && buckets->armed()) buckets->finish();
    return {loss, loss_nonfinite, stop};
  }
  autograd::NoGradGuard ng;
  std::vector<Tensor> grads;
  double k = 0, s = 0;  // how many gradients, and which (the sum of their 1-based indices)
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    if (!g.is_contiguous() && buckets == nullptr) {
      g = g.contiguous();
      params[i].set_grad(g);
    }
    grads.push_back(g);
    k += 1;
    s += static_cast<double>(i + 1);
  }
  // With buckets, their all-reduces are in flight and complete first (a collective started earlier completes
  // earlier on every rank); they send zeros for a missing gradient, so ranks that disagree still exchange the same
  // sizes and reach the check. Without, the check comes first: one message of differing sizes would hang.
  // comm_wait covers both orders alike: from here (the end of backward) until the gradients are averaged and the step
  // agreed, the wait for the slowest rank included.
  const auto t = std::chrono::steady_clock::now();
  int64_t all_reduces = 0, bytes = 0;
  // what one message of every gradient carries: f64 as f64, the others in the wire dtype (f32 widens 16-bit ones)
  auto message_bytes = [&](DType w) {
    int64_t b = 0;
    for (const Tensor& g : grads) b += g.numel() * (g.dtype() == DType::f64 ? 8 : (w == DType::f32 ? 4 : 2));
    return b;
  };
  auto average = [&] {
    if (buckets != nullptr) {
      MP_ASSERT(buckets->armed(), "average_gradients: the buckets were not armed for the step's last backward");
      buckets->finish();
      all_reduces = buckets->take_all_reduces();  // every start since the last step's, earlier micro-batches included
      bytes = buckets->take_bytes();
    } else if (shards != nullptr) {
      shards->reduce_scatter_gradients();  // Note [sharded optimizer state] 2
      all_reduces = 1;
      bytes = message_bytes(DType::f32);
    } else {
      world_.all_reduce_mean_in(grads, wire);  // Note [16-bit gradient communication]
      all_reduces = 1;
      bytes = message_bytes(wire);
    }
  };
  if (buckets != nullptr) average();
  // Small integers and their squares are exact in f64: a zero variance over the ranks means the same everywhere.
  const Tensor stats = from_vector<double>({loss, loss_nonfinite ? 1.0 : 0.0, stop ? 1.0 : 0.0, k, k * k, s, s * s},
                                           {7}, {.dtype = DType::f64});
  const Tensor st[1] = {stats};
  world_.all_reduce_mean(st);
  const std::vector<double> m = stats.to_vector<double>();
  MP_CHECK(m[4] == m[3] * m[3] && m[6] == m[5] * m[5], "data-parallel training (", where(),
           "): the ranks' backward passes left gradients on different parameters (this rank: ", k, " of ",
           params.size(), "); every rank must run the same model on batches of the same shape");
  if (buckets == nullptr) average();
  const double wait = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  return {m[0], m[1] > 0, m[2] > 0, all_reduces, bytes, wait, buckets != nullptr ? buckets->pass_hook_seconds() : 0.0};
}

Tensor DataParallel::all_gather(const Tensor& t, int64_t dim) const {
  if (!active()) return t;
  autograd::NoGradGuard ng;
  Shape shape = t.sizes();
  const int64_t part = shape[static_cast<size_t>(dim)];
  shape[static_cast<size_t>(dim)] = part * size();
  Tensor out = empty(shape, {.dtype = t.dtype(), .device = t.device()});
  for (int r = 0; r < size(); ++r) {
    const Tensor piece = r == rank() ? t.contiguous().clone() : empty(t.sizes(), {.dtype = t.dtype()});
    const Tensor ps[1] = {piece};
    world_.broadcast(ps, r);
    out.narrow(dim, r * part, part).copy_(piece);
  }
  return out;
}

}  // namespace mp::train::detail

// Sharded optimizer state (src/train/optimizer_shards.hpp).
//
// Note [sharded optimizer state]
// With --shard_optimizer in a data-parallel run (ZeRO stage 1) the state of each parameter (its f32 master under O2,
// its moments) lives on one rank, so each rank keeps about 1/N of it.
//   1. Partition: whole parameters, the largest first to the rank with the fewest elements so far (the same on every
//      rank: a function of the shapes). Reason: the optimizers keep state and run their fused update per tensor, so
//      whole tensors use them unchanged; element-level flat sharding (DeepSpeed) balances exactly but needs every
//      optimizer to update slices of a flat buffer. The cost: a rank's share can exceed 1/N by up to the largest
//      parameter (measured in bench/RESULTS.md).
//   2. Step: after the step's last backward the ranks agree on the loss and on which gradients exist (Note
//      [data-parallel training] 4), then one reduce-scatter leaves each rank the averaged gradients of its own
//      parameters and drops the others' (the optimizer skips a parameter without gradient). Each rank unscales and
//      checks its part (the scaler's found-inf is agreed: any rank's inf/NaN skips every rank's step; without a scaler
//      the non-finite check is summed over the ranks), clips by the global norm (its sum of squares summed over the
//      ranks) and updates its parameters; one all-gather of the weights in their own dtype (16-bit, f32 at O0) then
//      gives every rank identical weights. A skipped step changes nothing and sends nothing. This first version has
//      no overlap with backward: the reduce-scatter runs after it (--bucket_mb does not apply).
//   3. Weight EMA: kept whole on every rank (its f32 averages are not sharded); the owner of a parameter averages its
//      master, the others' average of it drifts (they average its 16-bit rounding) and is replaced by the owner's in
//      an all-gather before every evaluation and checkpoint, so what is evaluated and saved is the unsharded run's.
//   4. Checkpoints: rank 0 gathers the other ranks' state and writes the file a single process writes; a resume, on
//      any N, sharded or not, loads the whole state on every rank, and each rank then keeps its part.
//   5. One process owns everything: no shards are made and the run is the same as without the flag.
#include "train/optimizer_shards.hpp"

#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "mp/autograd/node.hpp"
#include "mp/core/error.hpp"
#include "mp/ops/ops.hpp"

namespace mp::train::detail {
namespace {

int64_t bytes_of(const Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// The bytes of `t` (any layout) at `dst`.
void copy_out(const Tensor& t, char* dst) {
  const Tensor c = t.detach().contiguous();
  if (bytes_of(c) > 0) std::memcpy(dst, c.raw_data(), static_cast<size_t>(bytes_of(c)));
}

// `t` (any layout) takes the values whose bytes are at `src` (t's dtype, contiguous order).
void copy_in(const Tensor& t, const char* src) {
  if (t.numel() == 0) return;
  if (t.is_contiguous()) {
    std::memcpy(t.raw_data(), src, static_cast<size_t>(bytes_of(t)));
    return;
  }
  const Tensor c = empty(t.sizes(), {.dtype = t.dtype()});
  std::memcpy(c.raw_data(), src, static_cast<size_t>(bytes_of(c)));
  Tensor dst = t.detach();
  dst.copy_(c);
}

Tensor bytes_tensor(int64_t n) { return empty({n}, {.dtype = DType::u8}); }

}  // namespace

std::vector<int> partition_by_numel(const std::vector<int64_t>& numels, int ranks) {
  MP_CHECK(ranks >= 1, "partition_by_numel: expected at least one rank, got ", ranks);
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  std::vector<int> owner(numels.size(), 0);
  for (const size_t i : order) {
    const auto least = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = static_cast<int>(least);
    load[least] += numels[i];
  }
  return owner;
}

OptimizerShards::OptimizerShards(dist::ProcessGroup& world, optim::Optimizer& opt)
    : world_(world), opt_(opt), params_(opt.parameters()), numel_(static_cast<size_t>(world.size()), 0) {
  std::vector<int64_t> numels;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MP_CHECK(p.device().is_cpu(), "--shard_optimizer: a parameter (", p.describe(), ") is on ", p.device().str(),
             "; the collectives of sharded training take CPU tensors (device tensors come with NCCL): train on the "
             "CPU, or without --shard_optimizer");
    index_.emplace(p.impl_ptr().get(), i);
    numels.push_back(p.numel());
  }
  owner_ = partition_by_numel(numels, world.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    numel_[static_cast<size_t>(owner_[i])] += numels[i];
    if (owner_[i] != world.rank()) opt.release_state(params_[i]);
  }
}

int OptimizerShards::owner(const Tensor& p) const {
  const auto it = index_.find(p.impl_ptr().get());
  MP_CHECK(it != index_.end(), "--shard_optimizer: ", p.describe(),
           " is trained but is not one of the optimizer's parameters; every trained parameter must have an owner "
           "(Note [sharded optimizer state])");
  return owner_[it->second];
}

void OptimizerShards::reduce_scatter_gradients() const {
  autograd::NoGradGuard ng;
  const int n = world_.size(), me = world_.rank();
  std::vector<std::vector<size_t>> by_rank(static_cast<size_t>(n));
  bool wide = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = params_[i].grad();
    if (!g.defined()) continue;
    by_rank[static_cast<size_t>(owner_[i])].push_back(i);
    wide = wide || g.dtype() == DType::f64;
  }
  std::vector<int64_t> counts(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r)
    for (const size_t i : by_rank[static_cast<size_t>(r)]) counts[static_cast<size_t>(r)] += params_[i].numel();
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const DType acc = wide ? DType::f64 : DType::f32;
  Tensor out = empty({counts[static_cast<size_t>(me)]}, {.dtype = acc});
  {
    const Tensor buf = empty({total}, {.dtype = acc});  // every gradient, widened, the ranks' blocks in rank order
    int64_t off = 0;
    for (const auto& ids : by_rank)
      for (const size_t i : ids) {
        const Tensor g = params_[i].grad();
        buf.narrow(0, off, g.numel()).copy_(g.contiguous().reshape({g.numel()}));
        off += g.numel();
      }
    world_.reduce_scatter_sum(buf, out, counts);
  }
  mul_(out, 1.0 / static_cast<double>(n));
  int64_t off = 0;
  for (const size_t i : by_rank[static_cast<size_t>(me)]) {
    const Tensor& p = params_[i];
    Tensor g = p.grad();
    if (!g.is_contiguous()) {
      g = g.contiguous();
      p.set_grad(g);
    }
    Tensor dst = g.reshape({g.numel()});
    dst.copy_(out.narrow(0, off, g.numel()));  // rounded once to the gradient's dtype
    off += g.numel();
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (owner_[i] != me) params_[i].set_grad(Tensor());
}

void OptimizerShards::all_gather_weights() const {
  autograd::NoGradGuard ng;
  const int n = world_.size(), me = world_.rank();
  std::vector<int64_t> counts(static_cast<size_t>(n), 0);
  for (size_t i = 0; i < params_.size(); ++i) counts[static_cast<size_t>(owner_[i])] += bytes_of(params_[i]);
  std::vector<int64_t> start(static_cast<size_t>(n), 0);
  for (int r = 1; r < n; ++r)
    start[static_cast<size_t>(r)] = start[static_cast<size_t>(r - 1)] + counts[static_cast<size_t>(r - 1)];
  const Tensor buf = bytes_tensor(start.back() + counts.back());
  auto* base = static_cast<char*>(buf.raw_data());
  std::vector<int64_t> at = start;  // where each rank's next parameter goes
  std::vector<int64_t> where(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    int64_t& a = at[static_cast<size_t>(owner_[i])];
    where[i] = a;
    a += bytes_of(params_[i]);
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (owner_[i] == me) copy_out(params_[i], base + where[i]);
  world_.all_gather(buf, counts);
  for (size_t i = 0; i < params_.size(); ++i)
    if (owner_[i] != me) {
      copy_in(params_[i], base + where[i]);
      params_[i].bump_version();
    }
}

double OptimizerShards::sum(double v) const {
  const Tensor t = full({1}, v, {.dtype = DType::f64});
  world_.start_all_reduce_sum(t)->wait();
  return t.item<double>();
}

optim::OptimizerStateDict OptimizerShards::gather_state(int root) const {
  autograd::NoGradGuard ng;
  optim::OptimizerStateDict sd = opt_.state_dict();  // this rank's parameters' state, every group
  const int n = world_.size(), me = world_.rank();
  if (n == 1) return sd;
  // This rank's part: a description (index, step, buffer names) and the buffers' bytes, in that order.
  nlohmann::json desc = nlohmann::json::array();
  std::vector<Tensor> pieces;
  int64_t data_bytes = 0;
  for (const auto& [index, st] : sd.state) {
    const Tensor& p = params_.at(static_cast<size_t>(index));
    MP_ASSERT(owner_[static_cast<size_t>(index)] == me, "gather_state: rank ", me, " holds state of parameter ", index,
              ", which rank ", owner_[static_cast<size_t>(index)], " updates");
    nlohmann::json names = nlohmann::json::array();
    for (const auto& [name, t] : st.buffers) {
      MP_ASSERT(t.dtype() == optim::state_dtype(p.dtype()) && t.sizes() == p.sizes(), "gather_state: state '", name,
                "' of parameter ", index, " is ", t.describe(), ", expected the state dtype and the parameter's shape");
      names.push_back(name);
      pieces.push_back(t);
      data_bytes += bytes_of(t);
    }
    desc.push_back({{"index", index}, {"step", st.step}, {"buffers", names}});
  }
  const std::string text = desc.dump();
  const Tensor sizes = zeros({2 * n}, {.dtype = DType::i64});
  sizes.data_ptr<int64_t>()[2 * me] = static_cast<int64_t>(text.size());
  sizes.data_ptr<int64_t>()[2 * me + 1] = data_bytes;
  const std::vector<int64_t> twos(static_cast<size_t>(n), 2);
  world_.all_gather(sizes, twos);
  std::vector<int64_t> text_counts, data_counts;
  for (int r = 0; r < n; ++r) {
    text_counts.push_back(sizes.data_ptr<int64_t>()[2 * r]);
    data_counts.push_back(sizes.data_ptr<int64_t>()[2 * r + 1]);
  }
  const bool is_root = me == root;
  const Tensor my_text = bytes_tensor(static_cast<int64_t>(text.size()));
  if (!text.empty()) std::memcpy(my_text.raw_data(), text.data(), text.size());
  const Tensor all_text =
      is_root ? bytes_tensor(std::accumulate(text_counts.begin(), text_counts.end(), int64_t{0})) : Tensor();
  world_.gather(my_text, all_text, text_counts, root);
  const Tensor my_data = bytes_tensor(data_bytes);
  int64_t off = 0;
  for (const Tensor& t : pieces) {
    copy_out(t, static_cast<char*>(my_data.raw_data()) + off);
    off += bytes_of(t);
  }
  const Tensor all_data =
      is_root ? bytes_tensor(std::accumulate(data_counts.begin(), data_counts.end(), int64_t{0})) : Tensor();
  world_.gather(my_data, all_data, data_counts, root);
  if (!is_root) return sd;
  int64_t text_at = 0, data_at = 0;
  for (int r = 0; r < n; ++r) {
    const int64_t tn = text_counts[static_cast<size_t>(r)], dn = data_counts[static_cast<size_t>(r)];
    if (r != root) {
      const nlohmann::json part = nlohmann::json::parse(
          std::string(static_cast<const char*>(all_text.raw_data()) + text_at, static_cast<size_t>(tn)));
      const char* data = static_cast<const char*>(all_data.raw_data()) + data_at;
      int64_t used = 0;
      for (const nlohmann::json& e : part) {
        const auto index = e.at("index").get<int64_t>();
        const Tensor& p = params_.at(static_cast<size_t>(index));
        optim::ParamState st;
        st.step = e.at("step").get<int64_t>();
        for (const nlohmann::json& name : e.at("buffers")) {
          const Tensor t = empty(p.sizes(), {.dtype = optim::state_dtype(p.dtype())});
          MP_ASSERT(used + bytes_of(t) <= dn, "gather_state: rank ", r, "'s state is shorter than it describes");
          copy_in(t, data + used);
          used += bytes_of(t);
          st.buffers[name.get<std::string>()] = t;
        }
        sd.state[index] = std::move(st);
      }
      MP_ASSERT(used == dn, "gather_state: rank ", r, " sent ", dn, " bytes of state, its description ", used);
    }
    text_at += tn;
    data_at += dn;
  }
  return sd;
}

void OptimizerShards::all_gather_averages(const optim::ModelEma& ema, const nn::Module& model) const {
  autograd::NoGradGuard ng;
  const int n = world_.size(), me = world_.rank();
  std::unordered_map<const void*, size_t> by_data;  // a parameter by the data it aliases (a tied weight: two names)
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].numel() > 0) by_data.emplace(params_[i].raw_data(), i);
  const nn::StateDict live = model.state_dict();
  std::vector<std::vector<Tensor>> by_rank(static_cast<size_t>(n));  // the averages of each rank's parameters
  for (const auto& [name, t] : live) {
    const auto it = by_data.find(t.raw_data());
    if (t.numel() == 0 || it == by_data.end()) continue;
    const Tensor* a = ema.averages().find(name);
    MP_ASSERT(a != nullptr && a->dtype() == DType::f32 && a->numel() == t.numel(), "all_gather_averages: '", name,
              "' has no f32 average of its size");
    by_rank[static_cast<size_t>(owner_[it->second])].push_back(*a);
  }
  std::vector<int64_t> counts(static_cast<size_t>(n), 0);
  for (int r = 0; r < n; ++r)
    for (const Tensor& a : by_rank[static_cast<size_t>(r)]) counts[static_cast<size_t>(r)] += a.numel();
  const Tensor buf = empty({std::accumulate(counts.begin(), counts.end(), int64_t{0})});
  int64_t off = 0;
  for (int r = 0; r < n; ++r)
    for (const Tensor& a : by_rank[static_cast<size_t>(r)]) {
      if (r == me) buf.narrow(0, off, a.numel()).copy_(a.contiguous().reshape({a.numel()}));
      off += a.numel();
    }
  world_.all_gather(buf, counts);
  off = 0;
  for (int r = 0; r < n; ++r)
    for (const Tensor& a : by_rank[static_cast<size_t>(r)]) {
      if (r != me) {
        Tensor dst = a;
        dst.copy_(buf.narrow(0, off, a.numel()).reshape(a.sizes()));
      }
      off += a.numel();
    }
}

}  // namespace mp::train::detail

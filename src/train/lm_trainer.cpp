// The word-language-model training loop (PyTorch's examples/word_language_model, with mixed precision):
// batchified token streams, truncated back-propagation through time, gradient clipping, perplexity.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "mp/amp/grad_scaler.hpp"
#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"
#include "mp/data/data.hpp"
#include "mp/memory/allocator.hpp"
#include "mp/models/word_lm.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/optim.hpp"
#include "mp/system.hpp"
#include "mp/train/progress.hpp"
#include "train/setup.hpp"
#include "train/train_loop.hpp"

namespace mp::train::detail {
namespace {

constexpr int64_t kEvalStreams = 10;  // the PyTorch example's eval_batch_size

data::Corpus load_text(const TrainConfig& c) {
  const data::CorpusOptions o{.max_vocab = c.max_vocab};
  if (c.dataset == "kjv") return data::load_kjv({.max_vocab = c.max_vocab}, c.data_dir);
  return data::load_corpus(c.data_dir, o);
}

std::shared_ptr<models::WordLM> make_lm(const TrainConfig& c, int64_t vocab) {
  return std::make_shared<models::WordLM>(
      models::WordLMOptions{.vocab_size = vocab,
                            .embed_size = c.embed_size,
                            .hidden_size = c.hidden_size,
                            .num_layers = c.num_layers,
                            .cell = c.model,
                            .dropout = c.dropout,
                            .tie_weights = c.tie_weights,
                            .lstm_impl = nn::lstm_impl_from_flag(c.lstm_impl, device_from_flag(c.device, "--device"))});
}

struct TextEval {
  double loss = 0;
  int64_t tokens = 0;
};

// Mean loss per predicted token over a batchified split, carrying the hidden state across windows.
TextEval evaluate_lm(models::WordLM& model, const amp::AmpOptions& o, const Tensor& source, int64_t bptt) {
  const bool was_training = model.is_training();
  model.eval();
  autograd::NoGradGuard ng;
  nn::LSTMState state;
  double loss_sum = 0;
  int64_t tokens = 0;
  for (int64_t i = 0; i + 1 < source.size(0); i += bptt) {
    data::Batch b = data::bptt_batch(source, i, bptt);
    Tensor logits;
    {
      ForwardScope scope(o);
      auto [y, s] = model.forward(b.input, state);
      logits = y;
      state = s;
    }
    const int64_t n = b.target.numel();
    loss_sum += cross_entropy(logits.to(DType::f32), b.target).item<double>() * static_cast<double>(n);
    tokens += n;
  }
  model.train(was_training);
  MP_CHECK(tokens > 0, "evaluation: the split has too few tokens for one window");
  return {loss_sum / static_cast<double>(tokens), tokens};
}

}  // namespace

RunSummary train_text(const TrainConfig& c, std::ostream& out, const DataParallel& dp) {
  RunSummary sum;
  sum.label = run_label(c);
  sum.config = c;
  sum.metric_name = "perplexity";
  sum.throughput_unit = "tok/s";

  const data::Corpus corpus = load_text(c);
  const Device dev = run_device(c);
  // The token streams are small (8 bytes a token): they live on the device, and the windows are views. A rank of a
  // data-parallel run trains its --batch_size of the N x batch_size streams (Note [data-parallel training] 2).
  const int64_t streams = c.batch_size * dp.size();
  Tensor all_streams = data::batchify(corpus.train, streams);
  if (dp.active()) all_streams = all_streams.narrow(1, dp.rank() * c.batch_size, c.batch_size).contiguous();
  const Tensor train_data = all_streams.to(dev);
  const Tensor val_data = data::batchify(corpus.valid, kEvalStreams).to(dev);
  MP_CHECK(train_data.size(0) >= 2, "train: the training text has ", corpus.train.numel(), " tokens, too few for ",
           streams, " streams",
           dp.active()
               ? " (" + std::to_string(dp.size()) + " ranks x --batch_size " + std::to_string(c.batch_size) + ")"
               : std::string(),
           "; lower --batch_size", dp.active() ? " or use fewer ranks" : "");
  const int64_t baseline = memory::memory_stats(dev).allocated;
  memory::reset_peak_memory_stats(dev);

  manual_seed(c.seed);
  std::shared_ptr<models::WordLM> model = make_lm(c, corpus.vocab.size());
  TrainObjects t = prepare_training(c, *model, dev, dp, out);
  const std::unique_ptr<optim::Optimizer>& opt = t.optimizer;
  const amp::AmpOptions& o = t.amp;
  amp::GradScaler& scaler = *t.scaler;
  const std::vector<Tensor>& params = t.params;
  const std::unique_ptr<optim::ModelEma>& ema = t.ema;

  const int64_t windows = (train_data.size(0) - 1 + c.bptt - 1) / c.bptt;
  const int64_t n = c.grad_accum;  // windows per optimizer step (Note [gradient accumulation])
  MP_CHECK(windows >= n, "train: the training text gives ", windows, " windows of --bptt ", c.bptt,
           ", fewer than one optimizer step of --grad_accum ", n, "; lower --grad_accum or --bptt");
  const int64_t steps_per_epoch =
      c.max_steps_per_epoch > 0 ? std::min(c.max_steps_per_epoch, windows / n) : windows / n;
  const int64_t batches = steps_per_epoch * n;  // the windows each epoch uses
  std::unique_ptr<optim::WarmupSchedule> sched = make_schedule(c, *opt, steps_per_epoch);

  const CheckpointRefs refs{.model = model.get(),
                            .optimizer = opt.get(),
                            .scaler = &scaler,
                            .scheduler = sched.get(),
                            .ema = ema ? &*ema : nullptr};
  Progress pos;
  std::map<std::string, std::string> resumed_metadata;
  nn::LSTMState state;
  if (c.resume) {
    const std::string ckpt = checkpoint_path(c);
    MP_CHECK(std::filesystem::exists(ckpt), "--resume: no checkpoint at '", ckpt, "'; run without --resume first");
    LoadedCheckpoint lc = load_checkpoint(ckpt, refs);
    pos = lc.progress;
    resumed_metadata = lc.metadata;
    // Note [data-parallel training] 2: the state of every stream is saved; a rank takes its streams'
    const auto own_streams = [&](const Tensor& t, const char* name) {
      if (!dp.active()) return t.to(dev);
      MP_CHECK(t.dim() == 3 && t.size(1) == streams, "--resume: checkpoint '", ckpt, "' holds the state of ",
               t.dim() == 3 ? t.size(1) : 0, " token streams (", name, " ", t.describe(), "), but ", dp.size(),
               " ranks x --batch_size ", c.batch_size, " train ", streams,
               ": resume with as many streams in all (ranks x --batch_size) as the run that wrote it");
      return t.narrow(1, dp.rank() * c.batch_size, c.batch_size).contiguous().to(dev);
    };
    if (const Tensor* h = lc.extra.find("lm_state.h")) state.h = own_streams(*h, "lm_state.h");
    if (const Tensor* cc = lc.extra.find("lm_state.c")) state.c = own_streams(*cc, "lm_state.c");
    if (!c.quiet) out << "resuming from " << ckpt << " at epoch " << pos.epoch + 1 << ", batch " << pos.batch << "\n";
  }
  // The hidden state carried across windows is part of a mid-epoch checkpoint (Note [exact resume]).
  // With several ranks, every stream's (gathered on every rank: a collective, at the same steps on each).
  auto state_tensors = [&state, &dp] {
    nn::StateDict e;
    if (state.h.defined()) e.insert("lm_state.h", dp.all_gather(state.h.detach(), 1));
    if (state.c.defined()) e.insert("lm_state.c", dp.all_gather(state.c.detach(), 1));
    return e;
  };
  // Note [data-parallel training] 1, 3, 5
  dp.check_same_run("data and state", nlohmann::ordered_json{{"train_tokens", corpus.train.numel()},
                                                             {"valid_tokens", corpus.valid.numel()},
                                                             {"vocabulary", corpus.vocab.size()},
                                                             {"resume_at", {pos.epoch, pos.batch, pos.global_step}},
                                                             {"state", DataParallel::state_signature(refs)}}
                                          .dump());
  if (c.resume) dp.broadcast_state(refs);
  dp.shard_random_draws();
  TrainLoop loop(c, sum, {scaler, *opt, *sched, params, refs, &dp}, pos, baseline, out, resumed_metadata);
  if (!c.quiet)
    out << sum.label << ": " << amp::opt_level_name(o.opt_level) << (o.opt_level == amp::OptLevel::O0 ? "" : " ")
        << (o.opt_level == amp::OptLevel::O0 ? "" : dtype_name(o.dtype)) << ", loss scale " << o.loss_scale->str()
        << "; " << c.num_layers << "x" << c.hidden_size << " " << c.model << " word LM on " << corpus.name << " ("
        << corpus.train.numel() << " train / " << corpus.valid.numel() << " valid tokens, vocabulary "
        << corpus.vocab.size() << ", " << steps_per_epoch << " steps per epoch"
        << (n == 1 ? std::string() : " of " + std::to_string(n) + " windows") << ")\n";

  for (int64_t epoch = pos.epoch; epoch < c.epochs && !loop.stopped(); ++epoch) {
    const int64_t first = epoch == pos.epoch ? pos.batch : 0;
    // first == batches: checkpointed after the epoch's last step, before its evaluation; the loop
    // below is empty and the epoch ends as it would have.
    if (first == 0) state = {};  // each epoch starts from a zero state (as the PyTorch example)
    model->train();
    loop.begin_epoch(epoch, first, batches);
    double wait = 0;
    for (int64_t b = first; b < batches; ++b) {
      const auto t_data = Clock::now();
      data::Batch batch = data::bptt_batch(train_data, b * c.bptt, c.bptt);
      wait += seconds_since(t_data);
      // the window's loss and the state after it, from its tokens and the state before it
      const auto forward = [&model, &o, &c, batch, start = models::WordLM::detach(state)] {
        Tensor logits;
        nn::LSTMState next;
        {
          ForwardScope scope(o);
          std::tie(logits, next) = model->forward(batch.input, start);
        }
        return std::pair{cross_entropy(logits.to(DType::f32), batch.target, {.label_smoothing = c.label_smoothing}),
                         next};
      };
      // Note [stopping on a numerical failure]
      const std::function<Tensor()> replay = replayable([forward] { return forward().first; });
      Tensor loss;
      std::tie(loss, state) = forward();
      if (!loop.step(loss, b, static_cast<double>(batch.target.numel()), wait, state_tensors, replay)) break;
    }
    if (!loop.end_training(wait)) break;
    const auto t_eval = Clock::now();
    const TextEval ev = evaluate_lm(*model, o, val_data, c.bptt);
    std::optional<TrainLoop::Eval> ema_ev;
    if (ema) {
      const optim::ModelEma::Swap swap = ema->swap_into(*model);
      const TextEval e = evaluate_lm(*model, o, val_data, c.bptt);
      ema_ev = TrainLoop::Eval{e.loss, perplexity(e.loss)};
    }
    loop.end_epoch({ev.loss, perplexity(ev.loss)}, ema_ev, seconds_since(t_eval));
  }
  loop.finish();
  return sum;
}

EvalResult evaluate_text(const TrainConfig& c, const nn::StateDict& weights, const std::string& split,
                         std::ostream& out) {
  const auto t0 = Clock::now();
  const data::Corpus corpus = load_text(c);
  std::shared_ptr<models::WordLM> model = make_lm(c, corpus.vocab.size());
  const amp::AmpOptions o = convert_for_eval(c, *model, weights);
  const Device dev = run_device(c);
  model->to(dev);
  check_weights_fit(c, *model, weights);
  model->load_state_dict(weights, /*strict=*/true);
  const Tensor source = data::batchify(split == "valid" ? corpus.valid : corpus.test, kEvalStreams).to(dev);
  const TextEval ev = evaluate_lm(*model, o, source, c.bptt);
  return {.metric_name = "perplexity",
          .loss = ev.loss,
          .metric = perplexity(ev.loss),
          .examples = ev.tokens,
          .seconds = seconds_since(t0)};
}

}  // namespace mp::train::detail

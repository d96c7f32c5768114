// The GPT training loop (`mixprec train --model gpt-mini --dataset kjv`): a byte-level BPE tokenizer, random
// context windows, next-token cross entropy, validation perplexity per BPE token.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mp/amp/grad_scaler.hpp"
#include "mp/autograd/node.hpp"
#include "mp/core/philox.hpp"
#include "mp/data/bpe.hpp"
#include "mp/data/text.hpp"
#include "mp/memory/allocator.hpp"
#include "mp/models/gpt.hpp"
#include "mp/ops/ops.hpp"
#include "mp/optim/optim.hpp"
#include "mp/system.hpp"
#include "mp/train/safetensors.hpp"
#include "train/setup.hpp"
#include "train/train_loop.hpp"

namespace mp::train::detail {

// Note [GPT training data]
// The dataset's lines in their three splits (kjv: the verses with their case and punctuation; text: the files, or
// the one file's line split, as the word LM reads them), each split one string of its lines joined by "\n" and
// encoded by the run's byte-level BPE tokenizer: the one a checkpoint stores (resume, evaluation: the ids keep
// their meaning), else --tokenizer's file, else one of --max_vocab tokens trained on the training split (0.13 s
// for the KJV at 8192 tokens, and encoding it takes 0.11 s: no token cache is written; RESULTS). Every checkpoint
// stores the tokenizer (metadata kTokenizerKey), so `mixprec generate` needs nothing else.
// A micro-batch is batch_size windows of context + 1 consecutive tokens (inputs, and the next tokens as targets),
// their starts uniform over the training split, drawn from Philox keyed by the seed and the window's global index
// (global step, micro-batch, window): the batches do not depend on where a run resumed, and with N ranks the global
// micro-batch of N x batch_size windows is the one a single process draws at that size, rank r taking windows
// [r B, (r + 1) B). An epoch is epoch_tokens / (windows per optimizer step x context) steps. Validation cuts the
// valid split into consecutive windows of context tokens: mean loss per predicted token, and its perplexity.
namespace {

constexpr const char* kTokenizerKey = "tokenizer";
constexpr int64_t kEvalWindows = 8;  // windows per evaluation batch

struct GptData {
  std::string name;
  data::BpeTokenizer tokenizer;
  Tensor train, valid, test;  // i64 [n]
};

Tensor encode_lines(const data::BpeTokenizer& tok, const std::vector<std::string>& lines) {
  const std::vector<int64_t> ids = tok.encode_lines(lines);
  Tensor t = empty({static_cast<int64_t>(ids.size())}, {.dtype = DType::i64});
  std::copy(ids.begin(), ids.end(), t.data_ptr<int64_t>());
  return t;
}

// The tokenizer a checkpoint stores (nullopt for a file without one).
std::optional<data::BpeTokenizer> stored_tokenizer(const std::string& path,
                                                   const std::map<std::string, std::string>& metadata) {
  const auto it = metadata.find(kTokenizerKey);
  if (it == metadata.end()) return std::nullopt;
  return data::BpeTokenizer::from_json(it->second, "checkpoint '" + path + "': metadata '" + kTokenizerKey + "'");
}

GptData load_gpt_data(const TrainConfig& c, std::optional<data::BpeTokenizer> tokenizer, std::ostream& out) {
  const data::TextSplits s = c.dataset == "kjv" ? data::kjv_splits(c.data_dir) : data::text_splits(c.data_dir);
  const auto t0 = Clock::now();
  std::string how = "stored in the checkpoint";
  if (!tokenizer && !c.tokenizer.empty()) {
    tokenizer = data::BpeTokenizer::load(c.tokenizer);
    how = c.tokenizer;
  } else if (!tokenizer) {
    tokenizer = data::BpeTokenizer::train(s.train, {.vocab_size = c.max_vocab});
    how = "trained on the training split";
  }
  GptData d{s.name, std::move(*tokenizer), {}, {}, {}};
  d.train = encode_lines(d.tokenizer, s.train);
  d.valid = encode_lines(d.tokenizer, s.valid);
  d.test = encode_lines(d.tokenizer, s.test);
  if (!c.quiet)
    out << "tokenizer: byte-level BPE, " << d.tokenizer.vocab_size() << " tokens (" << how << "); " << s.name << ": "
        << d.train.numel() << " train / " << d.valid.numel() << " valid tokens (" << std::fixed << std::setprecision(2)
        << seconds_since(t0) << std::defaultfloat << " s)\n";
  return d;
}

// Micro-batch `k` (global index of the micro-batch in the run) of windows [first, first + count) of the
// global micro-batch: inputs [count, T] and targets [count * T] (Note [GPT training data]).
data::Batch random_windows(const Tensor& tokens, int64_t context, uint64_t seed, int64_t k, int64_t global_windows,
                           int64_t first, int64_t count) {
  const int64_t n = tokens.numel();
  const uint64_t starts = static_cast<uint64_t>(n - context);  // start in [0, n - context - 1]
  Tensor x = empty({count, context}, {.dtype = DType::i64});
  Tensor y = empty({count * context}, {.dtype = DType::i64});
  const int64_t* src = tokens.data_ptr<int64_t>();
  int64_t* xp = x.data_ptr<int64_t>();
  int64_t* yp = y.data_ptr<int64_t>();
  for (int64_t w = 0; w < count; ++w) {
    const uint64_t i = static_cast<uint64_t>(k * global_windows + first + w);
    const uint64_t r = (static_cast<uint64_t>(philox_u32(seed, 0x6770745f77696e64ull, 2 * i)) << 32) |
                       philox_u32(seed, 0x6770745f77696e64ull, 2 * i + 1);
    const int64_t s = static_cast<int64_t>(r % starts);
    std::copy(src + s, src + s + context, xp + w * context);
    std::copy(src + s + 1, src + s + 1 + context, yp + w * context);
  }
  return {x, y};
}

struct GptEval {
  double loss = 0;
  int64_t tokens = 0;
};

// Mean loss per predicted token over consecutive windows of `context` tokens of `source`.
GptEval evaluate_gpt(models::Gpt& model, const amp::AmpOptions& o, const Tensor& source, int64_t context, Device dev) {
  const bool was_training = model.is_training();
  model.eval();
  autograd::NoGradGuard ng;
  const int64_t windows = (source.numel() - 1) / context;
  MP_CHECK(windows > 0, "evaluation: the split has ", source.numel(), " tokens, fewer than one window of --context ",
           context, " + 1");
  double loss_sum = 0;
  int64_t tokens = 0;
  for (int64_t w0 = 0; w0 < windows; w0 += kEvalWindows) {
    const int64_t m = std::min(kEvalWindows, windows - w0);
    const Tensor x = source.narrow(0, w0 * context, m * context).view({m, context}).to(dev);
    const Tensor y = source.narrow(0, w0 * context + 1, m * context).contiguous().to(dev);
    Tensor logits;
    {
      ForwardScope scope(o);
      logits = model.forward(x);
    }
    loss_sum += cross_entropy(logits.to(DType::f32).view({m * context, -1}), y).item<double>() *
                static_cast<double>(m * context);
    tokens += m * context;
  }
  model.train(was_training);
  return {loss_sum / static_cast<double>(tokens), tokens};
}

}  // namespace

RunSummary train_gpt(const TrainConfig& c, std::ostream& out, const DataParallel& dp) {
  RunSummary sum;
  sum.label = run_label(c);
  sum.config = c;
  sum.metric_name = "perplexity";
  sum.throughput_unit = "tok/s";

  std::map<std::string, std::string> resumed_metadata;
  std::optional<data::BpeTokenizer> tokenizer;
  if (c.resume) {
    const std::string ckpt = checkpoint_path(c);
    MP_CHECK(std::filesystem::exists(ckpt), "--resume: no checkpoint at '", ckpt, "'; run without --resume first");
    (void)read_safetensors_header(ckpt, &resumed_metadata);
    tokenizer = stored_tokenizer(ckpt, resumed_metadata);
    MP_CHECK(tokenizer.has_value(), "--resume: checkpoint '", ckpt, "' has no tokenizer (metadata '", kTokenizerKey,
             "'), so its token ids cannot be read back; it was not written by a gpt run");
  }
  const GptData data = load_gpt_data(c, std::move(tokenizer), out);
  const Device dev = run_device(c);
  const models::GptOptions mo = gpt_run_options(c, data.tokenizer.vocab_size());
  const int64_t T = mo.block_size;
  MP_CHECK(data.train.numel() > T + 1, "train: the training text has ", data.train.numel(),
           " tokens, too few for a window of --context ", T, "; lower --context or give more text");
  const int64_t baseline = memory::memory_stats(dev).allocated;
  memory::reset_peak_memory_stats(dev);

  manual_seed(c.seed);
  auto model = std::make_shared<models::Gpt>(mo);
  TrainObjects t = prepare_training(c, *model, dev, dp, out);
  const std::unique_ptr<optim::Optimizer>& opt = t.optimizer;
  const amp::AmpOptions& o = t.amp;
  amp::GradScaler& scaler = *t.scaler;
  const std::vector<Tensor>& params = t.params;
  const std::unique_ptr<optim::ModelEma>& ema = t.ema;

  const int64_t n = c.grad_accum;  // micro-batches per optimizer step (Note [gradient accumulation])
  const int64_t global_windows = c.batch_size * dp.size();
  const int64_t epoch_tokens = c.epoch_tokens > 0 ? c.epoch_tokens : data.train.numel();
  const int64_t per_step = global_windows * n * T;
  MP_CHECK(epoch_tokens >= per_step, "train: an epoch of ", epoch_tokens, " tokens is less than one optimizer step (",
           global_windows, " windows x --context ", T, n > 1 ? " x --grad_accum " + std::to_string(n) : std::string(),
           " = ", per_step, " tokens); raise --epoch_tokens or lower --batch_size");
  const int64_t steps_per_epoch =
      c.max_steps_per_epoch > 0 ? std::min(c.max_steps_per_epoch, epoch_tokens / per_step) : epoch_tokens / per_step;
  const int64_t batches = steps_per_epoch * n;  // micro-batches per epoch
  std::unique_ptr<optim::WarmupSchedule> sched = make_schedule(c, *opt, steps_per_epoch);

  const CheckpointRefs refs{.model = model.get(),
                            .optimizer = opt.get(),
                            .scaler = &scaler,
                            .scheduler = sched.get(),
                            .ema = ema ? &*ema : nullptr};
  Progress pos;
  if (c.resume) {
    const std::string ckpt = checkpoint_path(c);
    LoadedCheckpoint lc = load_checkpoint(ckpt, refs);
    pos = lc.progress;
    if (!c.quiet) out << "resuming from " << ckpt << " at epoch " << pos.epoch + 1 << ", batch " << pos.batch << "\n";
  }
  // Note [data-parallel training] 1, 3, 5
  dp.check_same_run("data and state", nlohmann::ordered_json{{"train_tokens", data.train.numel()},
                                                             {"valid_tokens", data.valid.numel()},
                                                             {"vocabulary", data.tokenizer.vocab_size()},
                                                             {"resume_at", {pos.epoch, pos.batch, pos.global_step}},
                                                             {"state", DataParallel::state_signature(refs)}}
                                          .dump());
  if (c.resume) dp.broadcast_state(refs);
  dp.shard_random_draws();
  TrainLoop loop(c, sum,
                 {.scaler = scaler,
                  .optimizer = *opt,
                  .scheduler = *sched,
                  .params = params,
                  .refs = refs,
                  .dp = &dp,
                  .metadata = {{kTokenizerKey, data.tokenizer.to_json()}}},
                 pos, baseline, out, resumed_metadata);
  if (!c.quiet)
    out << sum.label << ": " << c.model << " (" << mo.n_layer << " layers, " << mo.n_head << " heads, width "
        << mo.n_embd << ", context " << T << ", " << model->num_parameters() << " parameters), "
        << amp::opt_level_name(o.opt_level) << (o.opt_level == amp::OptLevel::O0 ? "" : " ")
        << (o.opt_level == amp::OptLevel::O0 ? "" : dtype_name(o.dtype)) << ", loss scale " << o.loss_scale->str()
        << "; " << steps_per_epoch << " steps of " << per_step << " tokens per epoch\n";

  for (int64_t epoch = pos.epoch; epoch < c.epochs && !loop.stopped(); ++epoch) {
    const int64_t first = epoch == pos.epoch ? pos.batch : 0;
    model->train();
    loop.begin_epoch(epoch, first, batches);
    double wait = 0;
    for (int64_t b = first; b < batches; ++b) {
      const auto t_data = Clock::now();
      const int64_t k = epoch * batches + b;  // the micro-batch's index in the run
      data::Batch batch =
          random_windows(data.train, T, c.seed, k, global_windows, dp.rank() * c.batch_size, c.batch_size);
      batch.input = batch.input.to(dev);
      batch.target = batch.target.to(dev);
      wait += seconds_since(t_data);
      const auto forward = [&model, &o, &c, batch] {
        Tensor logits;
        {
          ForwardScope scope(o);
          logits = model->forward(batch.input);
        }
        return cross_entropy(logits.to(DType::f32).view({batch.target.numel(), -1}), batch.target,
                             {.label_smoothing = c.label_smoothing});
      };
      // Note [stopping on a numerical failure]
      const std::function<Tensor()> replay = replayable(forward);
      const Tensor loss = forward();
      if (!loop.step(loss, b, static_cast<double>(batch.target.numel()), wait, {}, replay)) break;
    }
    if (!loop.end_training(wait)) break;
    const auto t_eval = Clock::now();
    const GptEval ev = evaluate_gpt(*model, o, data.valid, T, dev);
    std::optional<TrainLoop::Eval> ema_ev;
    if (ema) {
      const optim::ModelEma::Swap swap = ema->swap_into(*model);
      const GptEval e = evaluate_gpt(*model, o, data.valid, T, dev);
      ema_ev = TrainLoop::Eval{e.loss, perplexity(e.loss)};
    }
    loop.end_epoch({ev.loss, perplexity(ev.loss)}, ema_ev, seconds_since(t_eval));
  }
  loop.finish();
  return sum;
}

EvalResult evaluate_gpt_checkpoint(const TrainConfig& c, const nn::StateDict& weights,
                                   const std::map<std::string, std::string>& metadata, const std::string& path,
                                   const std::string& split, std::ostream& out) {
  const auto t0 = Clock::now();
  std::optional<data::BpeTokenizer> tok = stored_tokenizer(path, metadata);
  MP_CHECK(tok.has_value() || !c.tokenizer.empty(), "eval: '", path, "' holds no tokenizer (metadata '", kTokenizerKey,
           "'), and a gpt model's token ids mean nothing without the one it was trained with");
  TrainConfig quiet = c;
  quiet.quiet = true;
  const GptData data = load_gpt_data(quiet, std::move(tok), out);
  auto model = std::make_shared<models::Gpt>(gpt_run_options(c, data.tokenizer.vocab_size()));
  const amp::AmpOptions o = convert_for_eval(c, *model, weights);
  const Device dev = run_device(c);
  model->to(dev);
  check_weights_fit(c, *model, weights);
  model->load_state_dict(weights, /*strict=*/true);
  const GptEval ev =
      evaluate_gpt(*model, o, split == "valid" ? data.valid : data.test, model->options().block_size, dev);
  return {.metric_name = "perplexity",
          .loss = ev.loss,
          .metric = perplexity(ev.loss),
          .examples = ev.tokens,
          .seconds = seconds_since(t0)};
}

}  // namespace mp::train::detail

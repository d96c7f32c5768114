// `mixprec generate CKPT`: text from a GPT checkpoint of `mixprec train --model gpt-...` (train::generate).
#include <cstdio>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "mp/train/generate.hpp"

namespace mixprec {

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate",
                                 "Continue a prompt with a GPT checkpoint of `mixprec train --model gpt-...` "
                                 "(nanoGPT's sample.py, with a key/value cache); the text streams to standard output");
  struct Args {
    std::string path;
    mp::train::GenerateOptions g;
    bool quiet = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("checkpoint", a->path, "checkpoint.safetensors of `mixprec train --model gpt-nano|gpt-mini|gpt2`")
      ->required();
  cmd->add_option("--prompt", a->g.prompt, "the text to continue (default: start from <|endoftext|> or a newline)");
  cmd->add_option("--max_new_tokens", a->g.max_new_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", a->g.temperature, "softmax temperature: 0 = greedy, < 1 surer, > 1 wilder")
      ->capture_default_str();
  cmd->add_option("--top_k", a->g.top_k, "draw among the k most likely tokens (0 = all)")->capture_default_str();
  cmd->add_option("--seed", a->g.seed, "seed of the draws (the same seed gives the same text)")->capture_default_str();
  cmd->add_option("--device", a->g.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--precision", a->g.precision, "fp32, or bf16 / fp16 (the weights cast for inference)")
      ->capture_default_str();
  cmd->add_flag("--quiet", a->quiet, "print the text only (no timing line on standard error)");
  cmd->callback([a] {
    const mp::train::GenerateResult r = mp::train::generate(a->path, a->g, std::cout);
    std::cout << "\n" << std::flush;
    if (a->quiet) return;
    std::fprintf(stderr,
                 "mixprec generate: %lld new tokens after a prompt of %lld; prefill %.1f ms, %.2f ms per token "
                 "(%s, %s)%s\n",
                 static_cast<long long>(r.tokens.size()), static_cast<long long>(r.prefill_tokens), r.prefill_ms,
                 r.ms_per_token, a->g.device.c_str(), a->g.precision.c_str(),
                 r.refills == 0 ? "" : "; the context filled up and was cropped to its last half");
  });
}

}  // namespace mixprec

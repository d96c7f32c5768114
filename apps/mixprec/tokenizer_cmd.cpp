// `mixprec tokenizer train|encode|decode`: the byte-level BPE tokenizer from the command line.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "mp/core/error.hpp"
#include "mp/data/bpe.hpp"
#include "mp/data/text.hpp"

namespace mixprec {
namespace {

// A verse or line joined to the next with its newline kept, so that the tokenizer learns line breaks too.
std::vector<std::string> with_newlines(std::vector<std::string> lines) {
  for (std::string& l : lines) l += '\n';
  return lines;
}

}  // namespace

void add_tokenizer_command(CLI::App& app) {
  auto* tok =
      app.add_subcommand("tokenizer", "Byte-level BPE tokenizers (GPT-2's scheme; Hugging Face's tokenizer.json)");
  tok->require_subcommand(1);

  struct TrainArgs {
    std::string dataset = "kjv", data_dir, out = "tokenizer.json";
    int64_t vocab_size = 8192, min_frequency = 2;
  };
  auto t = std::make_shared<TrainArgs>();
  auto* train = tok->add_subcommand("train", "Learn BPE merges from a corpus and write tokenizer.json");
  train->add_option("--dataset", t->dataset, "kjv (Debian's bible-kjv) or text (a UTF-8 file: --data_dir)")
      ->capture_default_str();
  train->add_option("--data_dir", t->data_dir,
                    "kjv: a dump of `bible -l0 \"Gen1:1-Rev22:21\"` (default: run it); text: the file");
  train->add_option("--vocab_size", t->vocab_size, "tokens in all: <|endoftext|>, 256 bytes and the merges")
      ->capture_default_str();
  train->add_option("--min_frequency", t->min_frequency, "a pair seen fewer times is never merged")
      ->capture_default_str();
  train->add_option("--out", t->out, "the tokenizer.json to write (atomically)")->capture_default_str();
  train->callback([t] {
    std::vector<std::string> texts;
    if (t->dataset == "kjv") {
      texts = with_newlines(mp::data::kjv_verses(t->data_dir));
    } else if (t->dataset == "text") {
      MP_CHECK(!t->data_dir.empty(), "--dataset text: give the UTF-8 file with --data_dir FILE");
      texts = with_newlines(mp::data::read_lines(t->data_dir));
    } else {
      MP_FAIL("--dataset: expected kjv or text, got '", t->dataset, "'");
    }
    const auto t0 = std::chrono::steady_clock::now();
    const mp::data::BpeTokenizer bpe =
        mp::data::BpeTokenizer::train(texts, {.vocab_size = t->vocab_size, .min_frequency = t->min_frequency});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    bpe.save(t->out);
    std::printf("%s: %lld tokens (%lld merges) learned from %zu texts in %.1f s\n", t->out.c_str(),
                static_cast<long long>(bpe.vocab_size()), static_cast<long long>(bpe.num_merges()), texts.size(), s);
  });

  struct CodeArgs {
    std::string file, text;
    std::vector<int64_t> ids;
  };
  auto e = std::make_shared<CodeArgs>();
  auto* encode = tok->add_subcommand("encode", "Print the token ids of a text (--text, else standard input)");
  encode->add_option("tokenizer", e->file, "a tokenizer.json")->required();
  encode->add_option("--text", e->text, "the text (default: read standard input)");
  encode->callback([e] {
    const mp::data::BpeTokenizer bpe = mp::data::BpeTokenizer::load(e->file);
    std::string text = e->text;
    if (text.empty()) {
      std::ostringstream ss;
      ss << std::cin.rdbuf();
      text = ss.str();
    }
    const std::vector<int64_t> ids = bpe.encode(text);
    for (size_t i = 0; i < ids.size(); ++i) std::printf(i == 0 ? "%lld" : " %lld", static_cast<long long>(ids[i]));
    std::printf("\n");
  });

  auto d = std::make_shared<CodeArgs>();
  auto* decode = tok->add_subcommand("decode", "Print the text of token ids");
  decode->add_option("tokenizer", d->file, "a tokenizer.json")->required();
  decode->add_option("ids", d->ids, "token ids")->required();
  decode->callback([d] {
    const mp::data::BpeTokenizer bpe = mp::data::BpeTokenizer::load(d->file);
    std::fputs(bpe.decode(d->ids).c_str(), stdout);
    std::printf("\n");
  });
}

}  // namespace mixprec

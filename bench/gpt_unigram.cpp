// The unigram baseline of a GPT run (issue 27: "validation perplexity far below the unigram perplexity"): the
// perplexity on the validation split of a model that predicts every token with its frequency in the training
// split (add-one smoothing, so unseen tokens have a probability), both splits encoded as `mixprec train
// --model gpt-*` encodes them (BpeTokenizer::encode_lines) with the tokenizer a GPT
// checkpoint stores. Prints one JSON object.
// Usage: gpt_unigram CHECKPOINT [kjv|TEXT_PATH]
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "mp/data/bpe.hpp"
#include "mp/data/text.hpp"
#include "mp/train/safetensors.hpp"


int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpt_unigram CHECKPOINT [kjv|TEXT_PATH]\n");
    return 2;
  }
  try {
    std::map<std::string, std::string> meta;
    (void)mp::train::read_safetensors_header(argv[1], &meta);
    const auto it = meta.find("tokenizer");
    if (it == meta.end()) {
      std::fprintf(stderr, "gpt_unigram: '%s' stores no tokenizer: expected a checkpoint of `mixprec train --model gpt-*`\n",
                   argv[1]);
      return 2;
    }
    const mp::data::BpeTokenizer tok = mp::data::BpeTokenizer::from_json(it->second, "checkpoint metadata");
    const std::string data = argc > 2 ? argv[2] : "kjv";
    const mp::data::TextSplits s = data == "kjv" ? mp::data::kjv_splits() : mp::data::text_splits(data);
    const std::vector<int64_t> train = tok.encode_lines(s.train), valid = tok.encode_lines(s.valid);
    const int64_t V = tok.vocab_size();
    std::vector<double> count(static_cast<size_t>(V), 1.0);  // add-one
    for (int64_t t : train) count[static_cast<size_t>(t)] += 1.0;
    const double total = static_cast<double>(train.size()) + static_cast<double>(V);
    double nll = 0;
    for (int64_t t : valid) nll -= std::log(count[static_cast<size_t>(t)] / total);
    nll /= static_cast<double>(valid.size());
    std::printf("{\"dataset\": \"%s\", \"vocab\": %lld, \"train_tokens\": %zu, \"valid_tokens\": %zu, "
                "\"unigram_val_loss\": %.6f, \"unigram_val_perplexity\": %.3f}\n",
                s.name.c_str(), static_cast<long long>(V), train.size(), valid.size(), nll, std::exp(nll));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_unigram: %s\n", e.what());
    return 1;
  }
  return 0;
}

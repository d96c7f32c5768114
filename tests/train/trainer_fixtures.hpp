#pragma once
// Shared by the trainer tests: small generated datasets (an IDX image set, a text corpus), their configs, and
// the exact-resume check (a loss curve through a checkpoint equals the uninterrupted one bit for bit).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "mp/train/trainer.hpp"
#include "test_util.hpp"

namespace trainer_fixtures {

namespace fs = std::filesystem;
using mp::test::scratch_dir;
using mp::train::RunSummary;
using mp::train::TrainConfig;

inline void put_u32be(std::ostream& os, uint32_t v) {
  const unsigned char b[4] = {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
                              static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
  os.write(reinterpret_cast<const char*>(b), 4);
}

// An MNIST-layout IDX dataset of s x s images over noise, 4 classes of shapes at a random position:
// a horizontal bar, a vertical bar, a filled 3x3 square, a plus sign (all invariant under the
// horizontal flip of the augmentation). Easy enough to learn in two short epochs, hard enough to need it.
inline void write_idx_split(const fs::path& dir, const std::string& prefix, int n, int s, unsigned seed) {
  std::ofstream img(dir / (prefix + "-images-idx3-ubyte"), std::ios::binary);
  std::ofstream lab(dir / (prefix + "-labels-idx1-ubyte"), std::ios::binary);
  put_u32be(img, 0x803), put_u32be(img, n), put_u32be(img, s), put_u32be(img, s);
  put_u32be(lab, 0x801), put_u32be(lab, n);
  uint32_t r = seed;
  auto next = [&] { return r = r * 1664525u + 1013904223u, r >> 8; };
  std::vector<unsigned char> px(static_cast<size_t>(s * s));
  for (int i = 0; i < n; ++i) {
    const int k = static_cast<int>(next() % 4);
    for (auto& p : px) p = static_cast<unsigned char>(next() % 60);
    const int cy = 3 + static_cast<int>(next() % (s - 6)), cx = 3 + static_cast<int>(next() % (s - 6));
    for (int dy = -2; dy <= 2; ++dy)
      for (int dx = -2; dx <= 2; ++dx) {
        const bool on = (k == 0 && dy == 0) || (k == 1 && dx == 0) ||
                        (k == 2 && std::abs(dx) <= 1 && std::abs(dy) <= 1) ||
                        (k == 3 && (dx == 0 || dy == 0) && std::abs(dx) + std::abs(dy) <= 1);
        if (on) px[static_cast<size_t>((cy + dy) * s + cx + dx)] = 255;
      }
    img.write(reinterpret_cast<const char*>(px.data()), static_cast<std::streamsize>(px.size()));
    const unsigned char label = static_cast<unsigned char>(k);
    lab.write(reinterpret_cast<const char*>(&label), 1);
  }
}

inline const fs::path& image_data() {
  static const fs::path d = [] {
    fs::path p = scratch_dir("trainer", "idx");
    write_idx_split(p, "train", 384, 12, 1);
    write_idx_split(p, "t10k", 128, 12, 2);
    return p;
  }();
  return d;
}

// A small text corpus with learnable structure (a few repeated sentence patterns).
inline const fs::path& text_data() {
  static const fs::path f = [] {
    fs::path p = scratch_dir("trainer", "text") / "corpus.txt";
    std::ofstream os(p);
    const char* subj[] = {"the king", "a man", "the people", "his son"};
    const char* verb[] = {"went unto", "spake to", "saw", "blessed"};
    const char* obj[] = {"the city", "the lord", "his house", "the land"};
    uint32_t r = 7;
    auto next = [&] { return r = r * 1664525u + 1013904223u, (r >> 8) % 4; };
    for (int i = 0; i < 600; ++i) os << subj[next()] << " " << verb[next()] << " " << obj[next()] << " .\n";
    return p;
  }();
  return f;
}

inline TrainConfig image_config(const std::string& precision) {
  TrainConfig c;
  c.model = "resnet8";
  c.dataset = "mnist";
  c.data_dir = image_data().string();
  c.epochs = 2;
  c.batch_size = 32;
  c.optimizer = "adamw";
  c.lr = 3e-3;
  c.warmup_epochs = 0.25;
  c.precision = mp::train::FieldText<mp::DType>::parse(precision, "precision");
  c.num_workers = 2;
  c.eval_batch_size = 64;
  c.quiet = true;
  c.seed = 3;
  return c;
}

inline TrainConfig text_config(const std::string& precision) {
  TrainConfig c;
  c.model = "lstm";
  c.dataset = "text";
  c.data_dir = text_data().string();
  c.epochs = 2;
  c.batch_size = 4;
  c.bptt = 8;
  c.embed_size = 16;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.dropout = 0.3;  // dropout draws must continue the same random stream after a resume
  c.optimizer = "sgd";
  c.lr = 5;
  c.precision = mp::train::FieldText<mp::DType>::parse(precision, "precision");
  c.quiet = true;
  c.seed = 5;
  return c;
}

// Run `c` uninterrupted, then again stopped after `stop` steps and resumed: the concatenated loss curve
// must equal the uninterrupted one bit for bit, and so must the final evaluation.
inline void expect_exact_resume(TrainConfig c, int64_t stop, const std::string& name) {
  std::ostringstream sink;
  const RunSummary full = mp::train::train(c, sink);
  ASSERT_GT(static_cast<int64_t>(full.step_losses.size()), stop);

  const fs::path dir = scratch_dir("trainer", "resume_" + name);
  c.checkpoint_dir = dir.string();
  c.stop_after_steps = stop;
  const RunSummary first = mp::train::train(c, sink);
  EXPECT_TRUE(first.stopped_early);
  ASSERT_EQ(static_cast<int64_t>(first.step_losses.size()), stop);
  c.stop_after_steps = 0;
  c.resume = true;
  const RunSummary second = mp::train::train(c, sink);
  std::vector<double> joined = first.step_losses;
  joined.insert(joined.end(), second.step_losses.begin(), second.step_losses.end());
  ASSERT_EQ(joined.size(), full.step_losses.size());
  for (size_t i = 0; i < joined.size(); ++i) EXPECT_EQ(joined[i], full.step_losses[i]) << name << " step " << i;
  EXPECT_EQ(second.val_metric, full.val_metric) << name;
  EXPECT_EQ(second.skipped_steps, full.skipped_steps) << name;
  EXPECT_EQ(second.final_loss_scale, full.final_loss_scale) << name;
  // Every epoch's record, the interrupted one included (its train loss averages the steps of both
  // processes: Note [resumed epoch statistics]), as in the uninterrupted run.
  std::vector<mp::train::EpochStats> epochs = first.epochs;
  epochs.insert(epochs.end(), second.epochs.begin(), second.epochs.end());
  ASSERT_EQ(epochs.size(), full.epochs.size()) << name;
  for (size_t i = 0; i < epochs.size(); ++i) {
    EXPECT_EQ(epochs[i].epoch, full.epochs[i].epoch) << name;
    EXPECT_EQ(epochs[i].train_loss, full.epochs[i].train_loss) << name << " epoch " << i + 1;
    EXPECT_EQ(epochs[i].val_loss, full.epochs[i].val_loss) << name << " epoch " << i + 1;
    EXPECT_EQ(epochs[i].val_metric, full.epochs[i].val_metric) << name << " epoch " << i + 1;
    EXPECT_EQ(epochs[i].ema_val_metric, full.epochs[i].ema_val_metric) << name << " epoch " << i + 1;
    EXPECT_GT(epochs[i].seconds, 0) << name << " epoch " << i + 1;
  }
}

}  // namespace trainer_fixtures

// The determinism contract of measured kernel paths (Note [kernel paths chosen by measurement]): a run records
// its paths in its checkpoints, and a resumed run adopts them even where this machine's cache chose otherwise.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "backend/cpu/bf16_policy.hpp"
#include "backend/cpu/kernel_path_file.hpp"
#include "mp/kernel_paths.hpp"
#include "mp/train/safetensors.hpp"
#include "trainer_fixtures.hpp"

using namespace trainer_fixtures;

namespace {

// The cache of a machine that chose otherwise: every one of `chosen` on another path.
void write_contrary_cache(const std::string& file, const std::map<std::string, std::string>& chosen) {
  mp::backend::cpu::PathTable t;
  for (const auto& [key, path] : chosen) t[key] = {path == "native" ? "via_f32" : "native", {}};
  ASSERT_EQ(mp::backend::cpu::store_path_cache(file, mp::backend::cpu::path_cache_identity(), t), "");
}

}  // namespace

TEST(TrainerKernelPaths, ExactResumeReusesTheRecordedPathsOnAMachineThatChoseOtherwise) {
  if (!mp::backend::cpu::onednn_has_native(mp::DType::bf16))
    GTEST_SKIP() << "oneDNN has no bf16 kernels on this CPU (no AVX-512): bf16 has one path, through f32, and a run "
                    "chooses and records none";
  const fs::path cache = scratch_dir("trainer", "kernel_path_cache");
  ::setenv("MP_CACHE_DIR", cache.c_str(), 1);
  mp::set_kernel_path_mode(mp::KernelPathMode::measure);
  mp::reset_kernel_paths();

  TrainConfig c = image_config("bf16");
  c.epochs = 1;
  std::ostringstream sink;
  const RunSummary full = mp::train::train(c, sink);  // measures every bf16 shape of the run
  const std::map<std::string, std::string> chosen = full.kernel_paths.choices;
  ASSERT_FALSE(chosen.empty());
  EXPECT_GT(full.kernel_paths.measured, 0);
  EXPECT_EQ(full.kernel_paths.mode, "measure");

  const fs::path dir = scratch_dir("trainer", "kernel_path_resume");
  c.checkpoint_dir = dir.string();
  c.stop_after_steps = 5;
  // The interrupted process takes the same paths (timings on a busy machine could differ from one process to
  // the next, and are kept out of the cache file then: Note [kernel paths chosen by measurement]).
  mp::reset_kernel_paths();
  mp::adopt_kernel_paths(chosen);
  const RunSummary first = mp::train::train(c, sink);
  EXPECT_EQ(first.kernel_paths.measured, 0);
  std::map<std::string, std::string> md;
  (void)mp::train::read_safetensors_header((dir / "checkpoint.safetensors").string(), &md);
  ASSERT_EQ(md.count("kernel_paths"), 1u);
  // The record holds the shapes used so far (the training step's), each as the uninterrupted run chose it.
  const auto recorded = nlohmann::json::parse(md["kernel_paths"]).get<std::map<std::string, std::string>>();
  ASSERT_FALSE(recorded.empty());
  for (const auto& [key, path] : recorded) EXPECT_EQ(chosen.at(key), path) << key;

  write_contrary_cache(full.kernel_paths.cache_file, chosen);
  mp::reset_kernel_paths();  // the resuming process, on a machine whose cache chose otherwise
  c.stop_after_steps = 0;
  c.resume = true;
  const RunSummary second = mp::train::train(c, sink);
  EXPECT_EQ(second.kernel_paths.from_record, static_cast<int>(recorded.size()));
  for (const auto& [key, path] : recorded) EXPECT_EQ(second.kernel_paths.choices.at(key), path) << key;
  std::vector<double> joined = first.step_losses;
  joined.insert(joined.end(), second.step_losses.begin(), second.step_losses.end());
  ASSERT_EQ(joined.size(), full.step_losses.size());
  for (size_t i = 0; i < joined.size(); ++i) EXPECT_EQ(joined[i], full.step_losses[i]) << "step " << i;
  EXPECT_EQ(second.val_metric, full.val_metric);  // the evaluation's shapes came with the adopted record too

  mp::set_kernel_path_mode(mp::KernelPathMode::pinned);
  mp::reset_kernel_paths();
  ::unsetenv("MP_CACHE_DIR");
}

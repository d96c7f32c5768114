#pragma once
// Training checkpoints: one safetensors file holding the model, the optimizer state (f32 masters and
// moments), the loss scaler, the LR schedule, the random generator and where the run stands, so a
// resumed run continues the loss curve of an uninterrupted one exactly (Note [exact resume] in
// src/train/checkpoint.cpp).
#include <cstdint>
#include <map>
#include <string>

#include "mp/amp/grad_scaler.hpp"
#include "mp/nn/module.hpp"
#include "mp/optim/ema.hpp"
#include "mp/optim/lr_scheduler.hpp"
#include "mp/optim/optimizer.hpp"

namespace mp::train {

/// Where a run stands: the next step is batch `batch` of epoch `epoch`; `global_step` steps were taken.
struct Progress {
  int64_t epoch = 0;        ///< 0-based epoch of the next step
  int64_t batch = 0;        ///< 0-based batch within that epoch of the next step
  int64_t global_step = 0;  ///< optimizer steps attempted so far (skipped ones included)
};

/// The live objects a checkpoint saves and restores (null members are left out).
struct CheckpointRefs {
  nn::Module* model = nullptr;              ///< saved under "model."
  optim::Optimizer* optimizer = nullptr;    ///< saved under "optimizer." (OptimizerStateDict::flatten)
  amp::GradScaler* scaler = nullptr;        ///< saved under "scaler."
  optim::LRScheduler* scheduler = nullptr;  ///< saved under "scheduler."
  optim::ModelEma* ema = nullptr;           ///< the weights' f32 moving average, saved under "ema."
  bool generator = true;                    ///< default_generator()'s seed and offset under "rng."
  /// Saved under "optimizer." instead of optimizer's own state dict when set (a sharded run's state gathered on rank
  /// 0: Note [sharded optimizer state] in src/train/optimizer_shards.cpp); loading ignores it.
  const optim::OptimizerStateDict* optimizer_state = nullptr;
};

/// What load_checkpoint returns besides restoring the live objects.
struct LoadedCheckpoint {
  Progress progress;                            ///< where the saved run stood
  nn::StateDict extra;                          ///< tensors saved under "extra." (prefix removed)
  std::map<std::string, std::string> metadata;  ///< the file's metadata (config JSON under "config")
};

/// The metadata key and value identifying a mixprec training checkpoint.
inline constexpr const char* kCheckpointFormatKey = "format";
/// Format tag written into every checkpoint.
inline constexpr const char* kCheckpointFormat = "mixprec-checkpoint-1";

/// Write a checkpoint atomically (temporary file + rename: an interrupted save never damages the
/// previous file). `extra` holds run-specific tensors (e.g. the LM's hidden state); `metadata` is
/// stored as is next to the progress fields.
void save_checkpoint(const std::string& path, const CheckpointRefs& refs, const Progress& progress,
                     const nn::StateDict& extra = {}, const std::map<std::string, std::string>& metadata = {});

/// Restore every object in `refs` from a checkpoint written by save_checkpoint. The whole file is read
/// and parsed before anything is restored: a file that is not a mixprec checkpoint, is damaged, lacks a
/// section `refs` asks for, or whose tensors do not match the live objects is refused naming the file
/// and the fault (a mismatch found while restoring may leave earlier objects restored: rebuild them).
LoadedCheckpoint load_checkpoint(const std::string& path, const CheckpointRefs& refs);

/// The model's tensors of a checkpoint ("model." prefix removed) and its metadata, for evaluation or
/// conversion without building an optimizer. A plain safetensors file of model weights (no prefix)
/// is accepted as well. `ema`: the weight averages instead (section "ema." of a checkpoint written with
/// --ema_decay; refused naming the file when it has none).
nn::StateDict read_model_state(const std::string& path, std::map<std::string, std::string>* metadata = nullptr,
                               bool ema = false);

}  // namespace mp::train

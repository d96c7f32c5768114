#pragma once
// PyTorch interchange: a model's bare state dict (PyTorch's `load_state_dict` input, saved with safetensors)
// read into a mixprec model (`mixprec train --init_from`, `mixprec eval --model NAME FILE`) and written from a
// checkpoint or a bare file (`mixprec export`). Note [torch names] in src/train/interop.cpp.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mp/core/dtype.hpp"
#include "mp/nn/module.hpp"
#include "mp/nn/state_dict.hpp"

namespace mp::train {

/// How a state dict differs from a module's: names only in the module, names only in the state dict,
/// and names in both whose shapes (or floating vs integer kinds) differ ("name: [3, 4] in the file, [4, 3] in
/// the model"). Each list in the module's (missing, mismatched) or the file's (unexpected) order.
struct StateDictDiff {
  std::vector<std::string> missing;     ///< in the model, not in the file
  std::vector<std::string> unexpected;  ///< in the file, not in the model
  std::vector<std::string> mismatched;  ///< in both, with a different shape or kind (described)
  /// Whether the state dict fits the module exactly (names and shapes).
  bool empty() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
  /// One line per non-empty list, at most `max_each` entries each and then "... and N more".
  std::string describe(size_t max_each = 10) const;
};

/// Compare `state` with `model.state_dict()` by name, shape and kind (floating or integer; a floating dtype
/// may differ: loading converts).
StateDictDiff diff_state_dict(const nn::Module& model, const nn::StateDict& state);

/// What init_from_file loaded.
struct InitFromReport {
  int64_t loaded = 0;         ///< tensors copied into the model
  int64_t model_tensors = 0;  ///< tensors of the model's state dict
  int64_t file_tensors = 0;   ///< model tensors in the file
  StateDictDiff diff;         ///< what did not match (empty for an exact load)
  /// "loaded 12 of 12 tensors from FILE" plus, for a partial load, the lists of what was left out.
  std::string describe(const std::string& path) const;
};

/// Load the model weights of `path` into `model`: the "model." section of a mixprec checkpoint or every tensor
/// of a bare safetensors state dict (what PyTorch's `save_file(model.state_dict())` writes), converting
/// floating dtypes to the model's. `partial` false: every name and shape must match or nothing is loaded and
/// the error lists the differences (StateDictDiff::describe) and names --init_from_partial. `partial` true:
/// the tensors whose name and shape match are loaded, the rest left as initialised; at least one must match.
InitFromReport init_from_file(nn::Module& model, const std::string& path, bool partial);

/// What export_state_dict wrote.
struct ExportStats {
  int64_t tensors = 0;       ///< tensors written
  int64_t converted = 0;     ///< floating tensors whose dtype --dtype changed
  bool from_checkpoint = 0;  ///< the input was a training checkpoint (its "model." section was written)
};

/// Write the bare state dict of `in` (a mixprec checkpoint's "model." section, or a bare state dict file) to
/// `out` atomically, in the model's order, names as they are (Note [torch names]), each tensor in its stored
/// dtype unless `dtype` (floating) is given, which floating tensors are converted to (round to nearest even);
/// integer buffers (num_batches_tracked) are kept. Metadata: "format" = "pt" (what safetensors.torch writes)
/// and the run's "config" when the input has one, so `mixprec eval` still knows the model. `in` == `out` is
/// allowed.
ExportStats export_state_dict(const std::string& in, const std::string& out, std::optional<DType> dtype = {});

/// The floating dtype of a --dtype flag value: f32/fp32, f16/fp16, bf16 or f64; throws naming `flag`.
DType floating_dtype_from_flag(const std::string& value, const char* flag = "--dtype");

}  // namespace mp::train

#pragma once
// The checkpoint inspector: what `mixprec info FILE` prints about a safetensors file.
#include <string>

namespace mp::report {

/// A few lines on what a safetensors file holds, from its header alone: tensors, values, bytes and dtypes;
/// for a training checkpoint also its run (config), position, best epoch and each section (model,
/// optimizer, scaler, scheduler, rng, ema, extra). What `mixprec info FILE` prints.
std::string describe_safetensors_file(const std::string& path);

}  // namespace mp::report

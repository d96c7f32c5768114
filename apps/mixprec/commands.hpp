#pragma once
#include <CLI/CLI.hpp>

namespace mixprec {

/// `mixprec info`: CPU features, GPUs, library versions, and the advised precision per device.
void add_info_command(CLI::App& app);
/// `mixprec demo`: a short training run in f32 and bf16 on a synthetic task (the main job until the
/// data/models issue lands).
void add_demo_command(CLI::App& app);

}  // namespace mixprec

#pragma once
// What a run records of its automatic precision (Note [automatic precision] in src/amp/auto_precision.cpp): the
// checkpoint metadata that --resume replays, the run log's "precision" record and the console line.
#include <cstdint>
#include <string>
#include <vector>

#include "mp/amp/auto_precision.hpp"
#include "mp/train/run_log.hpp"

namespace mp::train::detail {

/// The checkpoint metadata key of the decisions.
inline constexpr const char* kAutoPrecisionKey = "auto_precision";

/// The decisions so far as the metadata's JSON: {"moves": [{module, type, from, to, step, reason}, ...], "streaks":
/// {module: [overflow, underflow], ...}, "observe_next": whether the next step is observed (it follows a skipped one)}.
std::string precision_state_json(const amp::AutoPrecision& ap, bool observe_next);

/// Parse precision_state_json's output into `ap` and `observe_next`; throws naming `what` (the file and key) when it
/// does not parse.
void restore_precision_state(const std::string& json, const std::string& what, amp::AutoPrecision& ap,
                             bool& observe_next);

/// One move in words: "step 12: layer1.0.conv1 (Conv2d) f16 -> f32 (with ...): overflow in ...". `converted` are the
/// modules promote_to_f32 converted (the move's module first; more when weights are tied).
std::string move_text(const amp::PrecisionMove& m, const std::vector<std::string>& converted);

/// The run log's "precision" record of a move made at epoch `epoch` (1-based; docs/RUN_LOG.md).
void write_precision_move(RunLog& log, int64_t epoch, const amp::PrecisionMove& m,
                          const std::vector<std::string>& converted);

}  // namespace mp::train::detail

#pragma once
// The run log's "numerics" records (--numerics_every; the schema: docs/RUN_LOG.md).
#include <cstdint>
#include <vector>

#include "mp/amp/telemetry.hpp"
#include "mp/train/run_log.hpp"

namespace mp::train::detail {

/// Write one "numerics" record per module of `layers`, measured at optimizer step `step` (global, 1-based) of
/// epoch `epoch` (1-based) with loss scale `scale` (1 without scaling).
void write_numerics(RunLog& log, int64_t epoch, int64_t step, double scale,
                    const std::vector<amp::LayerNumerics>& layers);

}  // namespace mp::train::detail

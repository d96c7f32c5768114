// The run log's "numerics" records (train/numerics_log.hpp). Field names and meanings: docs/RUN_LOG.md.
#include "train/numerics_log.hpp"

#include <string>
#include <utility>

namespace mp::train::detail {

void write_numerics(RunLog& log, int64_t epoch, int64_t step, double scale,
                    const std::vector<amp::LayerNumerics>& layers) {
  for (const amp::LayerNumerics& l : layers) {
    std::vector<std::pair<std::string, LogValue>> fields{{"type", std::string("numerics")},
                                                         {"epoch", epoch},
                                                         {"step", step},
                                                         {"module", l.module},
                                                         {"kind", l.type},
                                                         {"dtype", l.dtype},
                                                         {"scale", scale},
                                                         {"act_amax", l.act_amax},
                                                         {"grad_amax", l.grad_amax},
                                                         {"grad_values", l.grad_values},
                                                         {"grad_underflow", l.grad_underflow},
                                                         {"grad_underflow_unscaled", l.grad_underflow_unscaled},
                                                         {"grad_zero", l.grad_zero}};
    if (l.has_update) fields.emplace_back("update_lost", l.update_lost);
    log.write(fields);
  }
}

}  // namespace mp::train::detail

// The MP_CUDA_SYNC_CHECK switch (Note [sync check] in runtime.hpp): plain C++, in every build, so the
// CPU tests check how it is read; runtime.cu does the waiting in CUDA builds.
#include <cstdlib>
#include <string>

#include "backend/cuda/runtime.hpp"
#include "mp/core/error.hpp"

namespace mp::backend::cuda {

bool parse_sync_check(const char* value) {
  if (value == nullptr) return false;
  const std::string v(value);
  if (v.empty() || v == "0") return false;
  if (v == "1") return true;
  MP_FAIL(
      "MP_CUDA_SYNC_CHECK: expected 1 (wait for the device after every kernel launch and library call, and "
      "name the one that faulted) or 0 (off, the default), got '",
      v, "'; set it to 1 or 0, or unset it");
}

bool sync_check_enabled() {
  static const bool on = parse_sync_check(std::getenv("MP_CUDA_SYNC_CHECK"));
  return on;
}

}  // namespace mp::backend::cuda

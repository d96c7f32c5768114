// Note [host synchronisation counter] (runtime.hpp): plain C++, in every build.
#include <atomic>

#include "backend/cuda/runtime.hpp"

namespace mp::backend::cuda {
namespace {
std::atomic<int64_t> g_host_syncs{0};
}  // namespace

void count_host_sync() { g_host_syncs.fetch_add(1, std::memory_order_relaxed); }

int64_t host_sync_count() { return g_host_syncs.load(std::memory_order_relaxed); }

}  // namespace mp::backend::cuda

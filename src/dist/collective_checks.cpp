// The operand checks of every process group's collectives (collective_checks.hpp).
#include "dist/collective_checks.hpp"

#include <cstdint>

#include "mp/core/error.hpp"

namespace mp::dist::detail {

void check_operand(const Tensor& t, const char* op, bool floating, Device where) {
  MP_CHECK(t.device() == where, "dist::", op, ": expected tensors on ", where.str(),
           " (this group's device), got one on ", t.device().str(),
           where.is_cpu() ? "; move it to the CPU first, or use the device's NCCL group (dist::nccl_group)"
                          : "; move it to the group's device first");
  MP_CHECK(t.is_contiguous(), "dist::", op, ": expected contiguous tensors, got ", t.describe());
  MP_CHECK(!floating || is_floating(t.dtype()), "dist::", op, ": expected floating tensors, got ", t.describe());
}

void check_sum_buffer(const Tensor& t, Device where) {
  check_operand(t, "start_all_reduce_sum", true, where);
  MP_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64 || t.dtype() == DType::bf16 || t.dtype() == DType::f16,
           "dist::start_all_reduce_sum: expected an f32, f64, bf16 or f16 buffer, got ", t.describe());
  MP_CHECK(t.numel() <= INT32_MAX, "dist::start_all_reduce_sum: ", t.numel(),
           " elements are beyond one MPI message (2^31); use smaller buckets");
}

void check_blocks(const Tensor& buffer, std::span<const int64_t> counts, int ranks, const char* op) {
  MP_CHECK(static_cast<int>(counts.size()) == ranks, "dist::", op, ": expected one block count per rank (", ranks,
           "), got ", counts.size());
  int64_t total = 0;
  for (const int64_t c : counts) {
    MP_CHECK(c >= 0, "dist::", op, ": block counts must be >= 0, got ", c);
    total += c;
  }
  MP_CHECK(total == buffer.numel(), "dist::", op, ": the block counts add up to ", total, " elements, the buffer has ",
           buffer.numel(), "; pass counts that cover it");
  MP_CHECK(total <= INT32_MAX, "dist::", op, ": ", total, " elements are beyond one MPI message (2^31)");
}

void check_reduce_scatter(const Tensor& buffer, const Tensor& out, std::span<const int64_t> counts, int rank, int ranks,
                          Device where) {
  check_operand(buffer, "reduce_scatter_sum", true, where);
  check_operand(out, "reduce_scatter_sum", true, where);
  MP_CHECK(buffer.dtype() == DType::f32 || buffer.dtype() == DType::f64,
           "dist::reduce_scatter_sum: expected an f32 or f64 buffer, got ", buffer.describe());
  check_blocks(buffer, counts, ranks, "reduce_scatter_sum");
  MP_CHECK(out.dtype() == buffer.dtype() && out.numel() == counts[static_cast<size_t>(rank)],
           "dist::reduce_scatter_sum: expected an output of ", counts[static_cast<size_t>(rank)], " ",
           dtype_name(buffer.dtype()), " elements (this rank's block), got ", out.describe());
}

void check_gather(const Tensor& mine, const Tensor& out, std::span<const int64_t> counts, int rank, int ranks,
                  bool root, Device where) {
  check_operand(mine, "gather", false, where);
  MP_CHECK(static_cast<int>(counts.size()) == ranks && mine.numel() == counts[static_cast<size_t>(rank)],
           "dist::gather: expected this rank's block of ",
           static_cast<int>(counts.size()) == ranks ? counts[static_cast<size_t>(rank)] : -1, " elements and ", ranks,
           " counts, got ", mine.describe(), " and ", counts.size(), " counts");
  if (!root) return;
  check_operand(out, "gather", false, where);
  MP_CHECK(out.dtype() == mine.dtype(), "dist::gather: the output is ", out.describe(), ", the blocks ",
           dtype_name(mine.dtype()));
  check_blocks(out, counts, ranks, "gather");
}

}  // namespace mp::dist::detail

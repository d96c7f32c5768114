#include "backend/cpu/onednn/common.hpp"

#include <oneapi/dnnl/dnnl_debug.h>

#include <array>
#include <cstdlib>
#include <map>
#include <new>

namespace mp::backend::cpu {

dnnl::engine& onednn_engine() {
  // Function-local static: initialised exactly once even when several threads arrive together.
  static dnnl::engine engine = onednn_check(
      "dnnl::engine(cpu, 0)", [] { return std::string("creating the CPU engine"); },
      [] { return dnnl::engine(dnnl::engine::kind::cpu, 0); });
  return engine;
}

// Note [one stream per thread]
// The engine is process-wide, but each thread gets its own dnnl::stream: oneDNN does not promise that one
// stream object may be used by several threads at once, and a CPU stream is only a cheap handle (creating
// one per thread costs nothing measurable). Primitives themselves are immutable and may run concurrently
// from several threads because every primitive here uses scratchpad_mode::user with a per-thread scratchpad.
dnnl::stream& onednn_stream() {
  thread_local dnnl::stream stream = onednn_check(
      "dnnl::stream(engine)", [] { return std::string("creating a CPU stream"); },
      [] { return dnnl::stream(onednn_engine()); });
  return stream;
}

dnnl::memory::data_type to_dnnl(DType t, const char* op) {
  switch (t) {
    case DType::f32: return dnnl::memory::data_type::f32;
    case DType::bf16: return dnnl::memory::data_type::bf16;
    case DType::f16: return dnnl::memory::data_type::f16;
    default: break;
  }
  MP_FAIL(op, ": oneDNN computes in f32, bf16 or f16, got dtype ", dtype_name(t), ". Convert the operands first.");
}

std::string onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

bool onednn_reference_impl(const std::string& impl) {
  return impl.starts_with("ref") || impl.find("ref:") != std::string::npos ||
         impl.find("gemm:ref") != std::string::npos;
}

void throw_onednn_error(const char* call, const dnnl::error& e, const std::string& context) {
  const bool unimplemented = e.status == dnnl_unimplemented;
  MP_FAIL("oneDNN call ", call, " failed with ", dnnl_status2str(e.status), " (", e.what(), ") for ", context,
          unimplemented ? detail::str_cat(". oneDNN ", onednn_version(),
                                          " has no implementation for this combination of shapes, dtypes and "
                                          "layouts on this CPU (its f16 kernels need AVX512-FP16 or AMX-FP16, "
                                          "its bf16 kernels AVX-512); try f32 or contiguous operands.")
                        : std::string("."));
}

namespace {
struct ImplRecord {
  std::mutex mu;
  std::map<std::string, std::string, std::less<>> last;
};
ImplRecord& impl_record() {
  static ImplRecord record;
  return record;
}
}  // namespace

void record_onednn_impl(const std::string& op, const std::string& impl) {
  ImplRecord& r = impl_record();
  std::lock_guard<std::mutex> lock(r.mu);
  r.last[op] = impl;
}

std::string onednn_last_impl(const char* op) {
  ImplRecord& r = impl_record();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.last.find(std::string_view(op));
  return it == r.last.end() ? std::string() : it->second;
}

namespace {
struct AlignedFree {
  void operator()(void* p) const noexcept { ::operator delete (p, std::align_val_t{64}); }
};
struct ScratchBuffer {
  std::unique_ptr<void, AlignedFree> ptr;
  size_t bytes = 0;
};
}  // namespace

void* thread_scratch(ScratchSlot slot, size_t bytes) {
  thread_local std::array<ScratchBuffer, static_cast<size_t>(ScratchSlot::count)> buffers;
  ScratchBuffer& b = buffers[static_cast<size_t>(slot)];
  if (bytes > b.bytes) {
    // Grow geometrically (at least 1.5x) so a slowly growing workload does not reallocate every call.
    size_t want = bytes > b.bytes + b.bytes / 2 ? bytes : b.bytes + b.bytes / 2;
    want = (want + 63) / 64 * 64;
    b.ptr.reset();  // free first: the old contents are not needed
    b.bytes = 0;
    b.ptr.reset(::operator new (want, std::align_val_t{64}));
    b.bytes = want;
  }
  return b.ptr.get();
}

}  // namespace mp::backend::cpu

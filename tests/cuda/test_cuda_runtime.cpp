// The CUDA runtime layer: device discovery, errors without a device, the caching allocator and
// host<->device copies. Tests named NoDevice* run where there is no CUDA device (the build machines,
// and builds without CUDA) and skip on a GPU machine; the others need a GPU and skip without one.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/cuda/allocator.hpp"
#include "backend/cuda/runtime.hpp"
#include "cuda/cuda_test_util.hpp"
#include "mp/mp.hpp"
#include "mp/system.hpp"
#include "test_util.hpp"

using namespace mp;
namespace cu = mp::backend::cuda;

namespace {

const Device kCuda{DeviceType::cuda, 0};

// The runtime tests use cuda:0 itself (no self-check mode).
#undef MP_SKIP_WITHOUT_GPU
#define MP_SKIP_WITHOUT_GPU() MP_SKIP_OR_FAIL_UNLESS(cu::device_count() > 0)
#define MP_SKIP_WITH_GPU() \
  if (cu::device_count() > 0) GTEST_SKIP() << "a CUDA device is present; this test is for machines without one"

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The raw bytes of a CPU tensor (contiguous copy), for bit-exact comparisons in every dtype.
std::vector<unsigned char> bytes_of(const Tensor& t) {
  EXPECT_TRUE(t.device().is_cpu());
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.raw_data());
  return std::vector<unsigned char>(p, p + static_cast<size_t>(c.numel()) * c.element_size());
}

// A CPU tensor of dtype dt with distinct, exactly representable values (negative ones for signed
// types; b8 alternates).
Tensor sample(const Shape& shape, DType dt) {
  const int64_t n = shape_numel(shape);
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(i % 200) - (dt == DType::u8 || dt == DType::b8 ? 0.0 : 100.0);
    v[static_cast<size_t>(i)] = dt == DType::b8 ? static_cast<double>(i % 3 == 0) : x;
  }
  return from_vector(v, shape, {.dtype = DType::f64}).to(dt);
}

}  // namespace

// ---------------------------------------------------------------- every machine

TEST(CudaRuntime, AllocationSizeClasses) {
  EXPECT_EQ(cu::round_allocation_size(0), 0u);
  EXPECT_EQ(cu::round_allocation_size(1), 512u);
  EXPECT_EQ(cu::round_allocation_size(512), 512u);
  EXPECT_EQ(cu::round_allocation_size(513), 1024u);
  EXPECT_EQ(cu::round_allocation_size((size_t{1} << 20) - 1), size_t{1} << 20);  // 512 B steps below 1 MiB
  EXPECT_EQ(cu::round_allocation_size(size_t{1} << 20), size_t{2} << 20);        // 2 MiB steps from 1 MiB
  EXPECT_EQ(cu::round_allocation_size((size_t{2} << 20) + 1), size_t{4} << 20);
  EXPECT_EQ(cu::round_allocation_size(size_t{100} << 20), size_t{100} << 20);
}

TEST(CudaRuntime, DeviceCountIsCachedAndExplained) {
  const int n = cu::device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(cu::device_count(), n);
  EXPECT_EQ(cu::no_device_reason().empty(), n > 0);  // a reason exactly when there is no device
  EXPECT_EQ(cu::no_device_reason(), cu::no_device_reason());
}

TEST(CudaRuntime, OutOfRangeDeviceIsAnError) {
  const std::string msg = test::error_of([] { cu::check_device(Device(DeviceType::cuda, 64), "probe"); });
  EXPECT_TRUE(contains(msg, "probe")) << msg;
  EXPECT_TRUE(contains(msg, "CUDA")) << msg;
  EXPECT_TRUE(contains(msg, "cuda:64")) << msg;
}

// Note [sync check]: how MP_CUDA_SYNC_CHECK is read (the waiting itself runs on a GPU, under gpu-check).
// Note [host synchronisation counter]: CPU work never counts.
TEST(CudaRuntime, HostSyncCounterIgnoresTheCpu) {
  const int64_t before = cu::host_sync_count();
  Tensor t = mp::rand({64, 64});
  t.fill_(2.0);
  EXPECT_GT(mp::sum(mp::matmul(t, t)).item<float>(), 0.0f);
  synchronize(kCPU);
  EXPECT_EQ(cu::host_sync_count(), before);
}

TEST(CudaRuntime, SyncCheckSwitchIsReadStrictly) {
  EXPECT_FALSE(cu::parse_sync_check(nullptr));
  EXPECT_FALSE(cu::parse_sync_check(""));
  EXPECT_FALSE(cu::parse_sync_check("0"));
  EXPECT_TRUE(cu::parse_sync_check("1"));
  const std::string msg = test::error_of([] { cu::parse_sync_check("yes"); });
  EXPECT_TRUE(contains(msg, "MP_CUDA_SYNC_CHECK")) << msg;
  EXPECT_TRUE(contains(msg, "got 'yes'")) << msg;
  EXPECT_TRUE(contains(msg, "expected 1")) << msg;
}

#if defined(MP_HAVE_CUDA)
// In sync-check mode a kernel launch is followed by a wait, and a working op still works (gpu-check runs
// every CUDA test with the switch on; this one says whether it was on).
TEST(CudaRuntime, SyncCheckModeRunsKernels) {
  MP_SKIP_WITHOUT_GPU();
  const Tensor x = mp::arange(0, 1000, 1, {.dtype = DType::f64}).to(kCuda);
  const Tensor y = mp::sum(mp::mul(x, x)).to(kCPU);
  EXPECT_EQ(y.item<double>(), 332833500.0);  // sum of i^2 below 1000, exact in f64
  std::printf("MP_CUDA_SYNC_CHECK is %s\n", cu::sync_check_enabled() ? "on" : "off");
}

// Note [small uploads do not wait]: fill_ (a scalar upload and a broadcast kernel) queued behind a long
// GEMM does not make the host wait for the device; the values arrive.
TEST(CudaRuntime, SmallUploadsDoNotWaitForTheDevice) {
  MP_SKIP_WITHOUT_GPU();
  const Tensor a = mp::rand({4096, 4096}, {.dtype = DType::f32}).to(kCuda);
  Tensor t = mp::empty({1000}, {.dtype = DType::f32, .device = kCuda});
  synchronize(kCuda);
  const int64_t before = cu::host_sync_count();
  const Tensor busy = mp::matmul(a, a);  // ~137 GFLOP of true f32: milliseconds of device work
  for (int i = 1; i <= 20; ++i) t.fill_(static_cast<double>(i));
  EXPECT_EQ(cu::host_sync_count(), before) << "a small upload waited for the device";
  const std::vector<float> v = t.to(kCPU).to_vector<float>();  // one counted wait
  EXPECT_EQ(cu::host_sync_count(), before + 1);
  for (float x : v) ASSERT_EQ(x, 20.0f);
}

TEST(CudaRuntime, FailedCallMessageNamesCallErrorAndRemedy) {
  // 2 = cudaErrorMemoryAllocation, 35 = cudaErrorInsufficientDriver (stable values of the CUDA ABI).
  std::string msg = test::error_of([] { cu::throw_cuda_error(2, "cudaMalloc(&p, n)", __FILE__, __LINE__); });
  EXPECT_TRUE(contains(msg, "cudaMalloc(&p, n)")) << msg;
  EXPECT_TRUE(contains(msg, "cudaErrorMemoryAllocation")) << msg;
  EXPECT_TRUE(contains(msg, "smaller batch")) << msg;
  msg = test::error_of([] { cu::throw_cuda_error(35, "cudaSetDevice(0)", __FILE__, __LINE__); });
  EXPECT_TRUE(contains(msg, "cudaErrorInsufficientDriver")) << msg;
  EXPECT_TRUE(contains(msg, "driver")) << msg;
}
#endif

// ---------------------------------------------------------------- no CUDA device

TEST(CudaRuntime, NoDeviceReasonIsGiven) {
  MP_SKIP_WITH_GPU();
  EXPECT_EQ(cu::device_count(), 0);
  const std::string reason = cu::no_device_reason();
  EXPECT_FALSE(reason.empty());
#if defined(MP_HAVE_CUDA)
  EXPECT_GT(cu::runtime_version(), 0);
#else
  EXPECT_TRUE(contains(reason, "without the CUDA backend")) << reason;
#endif
}

TEST(CudaRuntime, NoDeviceToCudaThrowsWithReason) {
  MP_SKIP_WITH_GPU();
  const Tensor x = ones({2, 3});
  const std::string msg = test::error_of([&] { (void)x.to(kCuda); });
  EXPECT_TRUE(contains(msg, "CUDA")) << msg;
  EXPECT_TRUE(contains(msg, cu::no_device_reason())) << msg;
  EXPECT_TRUE(contains(msg, "to")) << msg;
  // A scalar factory on cuda goes the same way.
  EXPECT_TRUE(contains(test::error_of([] { (void)scalar_tensor(1.0, {.device = kCuda}); }), cu::no_device_reason()));
}

TEST(CudaRuntime, NoDeviceEmptyThrowsWithReason) {
  MP_SKIP_WITH_GPU();
  for (const Shape& shape : {Shape{4, 5}, Shape{0}}) {
    const std::string msg = test::error_of([&] { (void)empty(shape, {.device = kCuda}); });
    EXPECT_TRUE(contains(msg, "CUDA")) << msg;
    EXPECT_TRUE(contains(msg, cu::no_device_reason())) << msg;
  }
  EXPECT_TRUE(contains(test::error_of([] { (void)zeros({3}, {.device = kCuda}); }), "no CUDA device"));
}

TEST(CudaRuntime, NoDeviceQueriesThrowOrReportNothing) {
  MP_SKIP_WITH_GPU();
  EXPECT_TRUE(contains(test::error_of([] { cu::synchronize(kCuda); }), cu::no_device_reason()));
  EXPECT_TRUE(contains(test::error_of([] { (void)cu::device_properties(0); }), "no CUDA device"));
  EXPECT_TRUE(contains(test::error_of([] { cu::DeviceGuard g(kCuda, "guard"); }), "guard"));
  // Statistics and empty_cache are harmless without a device: nothing was ever allocated.
  const memory::MemoryStats s = memory::memory_stats(kCuda);
  EXPECT_EQ(s.allocated, 0);
  EXPECT_EQ(s.reserved, 0);
  EXPECT_EQ(s.num_allocs, 0);
  EXPECT_EQ(test::error_of([] { memory::allocator(kCuda).empty_cache(); }), "(no error)");
  // CPU work is unaffected by a failed CUDA request.
  EXPECT_EQ(sum(ones({3}).to(kCPU)).item<float>(), 3.0f);
}

TEST(CudaRuntime, NoDeviceSystemInfoSaysWhy) {
  MP_SKIP_WITH_GPU();
  const SystemInfo s = system_info();
  EXPECT_TRUE(s.gpus.empty());
#if defined(MP_HAVE_CUDA)
  EXPECT_TRUE(s.cuda_built);
  EXPECT_TRUE(contains(s.cuda_status, "no CUDA device")) << s.cuda_status;
  EXPECT_TRUE(contains(s.cuda_status, cu::no_device_reason())) << s.cuda_status;
  EXPECT_TRUE(contains(s.cuda_status, "CUDA runtime")) << s.cuda_status;
#else
  EXPECT_FALSE(s.cuda_built);
  EXPECT_TRUE(contains(s.cuda_status, "not built")) << s.cuda_status;
#endif
}

// ---------------------------------------------------------------- with a GPU

TEST(CudaRuntime, DeviceProperties) {
  MP_SKIP_WITHOUT_GPU();
  const cu::DeviceProperties& p = cu::device_properties(0);
  EXPECT_EQ(p.index, 0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GE(p.cc_major, 7);  // CUDA 13 runs on compute capability 7.5 and newer
  EXPECT_GT(p.total_memory, size_t{1} << 30);
  EXPECT_GT(p.multiprocessors, 0);
  const SystemInfo s = system_info();
  ASSERT_EQ(static_cast<int>(s.gpus.size()), cu::device_count());
  EXPECT_EQ(s.gpus[0].name, p.name);
  EXPECT_EQ(s.gpus[0].multiprocessors, p.multiprocessors);
  EXPECT_EQ(test::error_of([] { cu::synchronize(kCuda); }), "(no error)");
}

TEST(CudaRuntime, RoundTripEveryDtype) {
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8, DType::b8}) {
    const Tensor x = sample({3, 7, 5}, dt);
    const Tensor g = x.to(kCuda);
    EXPECT_EQ(g.device(), kCuda) << dtype_name(dt);
    EXPECT_EQ(g.dtype(), dt);
    EXPECT_EQ(g.sizes(), x.sizes());
    EXPECT_TRUE(g.is_contiguous());
    const Tensor back = g.to(kCPU);
    EXPECT_TRUE(back.device().is_cpu());
    EXPECT_EQ(bytes_of(back), bytes_of(x)) << dtype_name(dt);
  }
  // Scalars: the factory moves through to(), item() moves back.
  EXPECT_EQ(scalar_tensor(2.5, {.device = kCuda}).item<float>(), 2.5f);
}

TEST(CudaRuntime, StridedSources) {
  MP_SKIP_WITHOUT_GPU();
  const Tensor x = sample({6, 8}, DType::f32);
  // Strided host sources are gathered on the host.
  for (const Tensor& v : {x.t(), x.slice(1, 1, 7, 2), x.select(1, 3), x.narrow(0, 2, 3).unsqueeze(0).expand({4, 3, 8})})
    EXPECT_EQ(bytes_of(v.to(kCuda).to(kCPU)), bytes_of(v)) << v.describe();
  // Strided device sources (views of a device tensor) come back as their elements, in order.
  const Tensor g = x.to(kCuda);
  EXPECT_EQ(bytes_of(g.t().to(kCPU)), bytes_of(x.t()));
  EXPECT_EQ(bytes_of(g.slice(1, 1, 7, 2).to(kCPU)), bytes_of(x.slice(1, 1, 7, 2)));
  EXPECT_EQ(bytes_of(g.select(1, 5).to(kCPU)), bytes_of(x.select(1, 5)));
  EXPECT_EQ(bytes_of(g.narrow(0, 4, 2).to(kCPU)), bytes_of(x.narrow(0, 4, 2)));  // contiguous, offset
  EXPECT_EQ(bytes_of(g.select(0, 1).unsqueeze(0).expand({3, 8}).to(kCPU)),
            bytes_of(x.select(0, 1).unsqueeze(0).expand({3, 8})));
}

TEST(CudaRuntime, ChannelsLastKeepsItsLayout) {
  MP_SKIP_WITHOUT_GPU();
  // As PyTorch's .to (preserve_format): a channels-last tensor arrives channels-last and comes back so,
  // with its logical values; its NHWC bytes travel as one contiguous block.
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor x = sample({2, 3, 4, 5}, dt).contiguous(MemoryFormat::channels_last);
    const Tensor g = x.to(kCuda);
    EXPECT_EQ(g.suggest_memory_format(), MemoryFormat::channels_last) << g.describe();
    const Tensor back = g.to(kCPU);
    EXPECT_EQ(back.suggest_memory_format(), MemoryFormat::channels_last) << back.describe();
    EXPECT_EQ(bytes_of(back), bytes_of(x)) << dtype_name(dt);
  }
  // A strided view of channels-last data (not dense) comes out contiguous, with its values.
  const Tensor x = sample({2, 6, 4, 5}, DType::f32).contiguous(MemoryFormat::channels_last);
  const Tensor v = x.to(kCuda).narrow(1, 1, 3);
  EXPECT_EQ(bytes_of(v.to(kCPU)), bytes_of(x.narrow(1, 1, 3)));
}

TEST(CudaRuntime, EmptyTensors) {
  MP_SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{0}, Shape{3, 0, 2}}) {
    const Tensor g = empty(shape, {.dtype = DType::f16}).to(kCuda);
    EXPECT_EQ(g.device(), kCuda);
    EXPECT_EQ(g.sizes(), shape);
    const Tensor back = g.to(kCPU);
    EXPECT_EQ(back.sizes(), shape);
    EXPECT_EQ(back.numel(), 0);
  }
  EXPECT_EQ(empty({0}, {.device = kCuda}).numel(), 0);
}

TEST(CudaRuntime, LargerThanStagingChunk) {
  MP_SKIP_WITHOUT_GPU();
  // 2.5 staging chunks plus an odd tail, so the pipeline runs full, partial and unaligned chunks.
  const int64_t n = static_cast<int64_t>(cu::kStagingChunkBytes * 5 / 2 / sizeof(int32_t)) + 7;
  const Tensor x = arange(n, {.dtype = DType::i32});
  const Tensor back = x.to(kCuda).to(kCPU);
  EXPECT_EQ(bytes_of(back), bytes_of(x));
  // The same through a strided device source (a span copy of more than one chunk).
  const Tensor m = x.narrow(0, 0, n - 7).view({-1, 2});
  EXPECT_EQ(bytes_of(m.to(kCuda).t().to(kCPU)), bytes_of(m.t()));
}

TEST(CudaRuntime, GradientFlowsBackAcrossDevices) {
  MP_SKIP_WITHOUT_GPU();
  const Tensor x = sample({4}, DType::f64).requires_grad_();
  const Tensor y = x.to(kCuda);
  EXPECT_TRUE(y.requires_grad());
  const Tensor z = y.to(kCPU);
  const Tensor seed = from_vector<double>({1.0, -2.0, 3.0, 0.5}, {4});
  z.backward(seed);
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(x.grad().device().is_cpu());
  EXPECT_EQ(x.grad().to_vector<double>(), seed.to_vector<double>());
}

TEST(CudaAllocator, StatsReuseAndEmptyCache) {
  MP_SKIP_WITHOUT_GPU();
  memory::Allocator& a = memory::allocator(kCuda);
  a.empty_cache();
  a.reset_peak_stats();
  const memory::MemoryStats s0 = a.stats();
  EXPECT_EQ(s0.peak_allocated, s0.allocated);
  // 3 MiB + 4 bytes: a 4 MiB block.
  const int64_t numel = (int64_t{3} << 20) / 4 + 1;
  const int64_t bytes = numel * 4;
  void* first = nullptr;
  {
    const Tensor t = empty({numel}, {.device = kCuda});
    first = t.raw_data();
    const memory::MemoryStats s1 = a.stats();
    EXPECT_EQ(s1.allocated - s0.allocated, bytes);
    EXPECT_EQ(s1.reserved - s0.reserved, int64_t{4} << 20);
    EXPECT_EQ(s1.peak_allocated, s1.allocated);
    EXPECT_EQ(s1.peak_reserved, s1.reserved);
    EXPECT_EQ(s1.num_allocs - s0.num_allocs, 1);
  }
  const memory::MemoryStats s2 = a.stats();
  EXPECT_EQ(s2.allocated, s0.allocated);                   // freed...
  EXPECT_EQ(s2.reserved - s0.reserved, int64_t{4} << 20);  // ...but cached
  EXPECT_EQ(s2.peak_allocated - s0.allocated, bytes);      // the peak remembers it
  {
    // A request of the same size class reuses the cached block: same address, no new reservation.
    const Tensor t = empty({numel + 100}, {.device = kCuda});
    EXPECT_EQ(t.raw_data(), first);
    EXPECT_EQ(a.stats().reserved, s2.reserved);
    // A different class gets a new block: 1000 bytes -> 1024.
    const Tensor small = empty({250}, {.device = kCuda});
    EXPECT_EQ(a.stats().reserved - s2.reserved, 1024);
    EXPECT_EQ(a.stats().allocated - s0.allocated, (numel + 100) * 4 + 1000);
  }
  a.empty_cache();
  const memory::MemoryStats s3 = a.stats();
  EXPECT_EQ(s3.reserved, s0.reserved);
  EXPECT_EQ(s3.allocated, s0.allocated);
  EXPECT_EQ(s3.peak_reserved - s0.reserved, (int64_t{4} << 20) + 1024);
  a.reset_peak_stats();
  EXPECT_EQ(a.stats().peak_reserved, s3.reserved);
  EXPECT_EQ(memory::memory_stats(kCuda).num_allocs, s3.num_allocs);
}

TEST(CudaAllocator, OutOfMemoryMessage) {
  MP_SKIP_WITHOUT_GPU();
  const int64_t absurd = int64_t{1} << 50;  // 1 PiB
  const std::string msg = test::error_of([&] { (void)empty({absurd}, {.dtype = DType::u8, .device = kCuda}); });
  EXPECT_TRUE(contains(msg, "CUDA out of memory")) << msg;
  EXPECT_TRUE(contains(msg, "tried to allocate 1.00 PiB")) << msg;
  EXPECT_TRUE(contains(msg, "cuda:0")) << msg;
  EXPECT_TRUE(contains(msg, "smaller batch")) << msg;
  // Just beyond the device's memory goes through cudaMalloc (and the cache-release retry).
  const int64_t too_big = static_cast<int64_t>(cu::device_properties(0).total_memory) + (int64_t{1} << 30);
  EXPECT_TRUE(contains(test::error_of([&] { (void)empty({too_big}, {.dtype = DType::u8, .device = kCuda}); }),
                       "CUDA out of memory"));
  // The device is still usable afterwards.
  const Tensor x = sample({16}, DType::f32);
  EXPECT_EQ(bytes_of(x.to(kCuda).to(kCPU)), bytes_of(x));
}

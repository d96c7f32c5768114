// The kernel profiler: labels (element-wise op names, "cast" for dtype-changing copies, kernel
// families), call counts, operand bytes, exclusive times, and nothing recorded while off.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "backend/registry.hpp"
#include "mp/core/profiler.hpp"
#include "mp/mp.hpp"

using namespace mp;

namespace {

const profiler::OpStats* find(const std::vector<profiler::OpStats>& s, const std::string& name) {
  for (const auto& o : s)
    if (o.name == name) return &o;
  return nullptr;
}

}  // namespace

TEST(Profiler, RecordsLabelsCallsAndBytes) {
  Tensor a = rand({64, 32}), b = rand({64, 32}), w = rand({32, 16});
  std::vector<profiler::OpStats> s;
  const auto t0 = std::chrono::steady_clock::now();
  {
    profiler::Session session;
    Tensor c = add(a, b);
    c = add(c, a);
    Tensor h = c.to(DType::bf16);
    Tensor m = matmul(a, w);
    Tensor r = sum(m);
    (void)h;
    (void)r;
    s = profiler::snapshot();
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto* add_ = find(s, "add");
  ASSERT_NE(add_, nullptr);
  EXPECT_EQ(add_->calls, 2);
  EXPECT_DOUBLE_EQ(add_->bytes, 2.0 * 3 * 64 * 32 * 4);  // two inputs and one output, f32, per call
  const auto* cast = find(s, "cast");
  ASSERT_NE(cast, nullptr);
  EXPECT_EQ(cast->calls, 1);
  EXPECT_DOUBLE_EQ(cast->bytes, 64.0 * 32 * (4 + 2));
  ASSERT_NE(find(s, "matmul"), nullptr);
  ASSERT_NE(find(s, "sum"), nullptr);
  double total = 0;
  for (const auto& o : s) {
    EXPECT_GE(o.seconds, 0.0) << o.name;
    total += o.seconds;
  }
  EXPECT_LE(total, wall);  // exclusive times never add up to more than the elapsed time
  for (size_t i = 1; i < s.size(); ++i) EXPECT_GE(s[i - 1].seconds, s[i].seconds);  // largest first
}

TEST(Profiler, OffRecordsNothingAndSessionRestores) {
  profiler::reset();
  EXPECT_FALSE(profiler::enabled());
  Tensor a = rand({8});
  (void)add(a, a);
  EXPECT_TRUE(profiler::snapshot().empty());
  {
    profiler::Session s;
    EXPECT_TRUE(profiler::enabled());
    (void)mul(a, a);
  }
  EXPECT_FALSE(profiler::enabled());
  ASSERT_EQ(profiler::snapshot().size(), 1u);  // the table survives the session for reading
  EXPECT_EQ(profiler::snapshot()[0].name, "mul");
  profiler::reset();
  EXPECT_TRUE(profiler::snapshot().empty());
}

// Note [device time in the profiler]: a kernel called for a CUDA device is charged the time between two
// timestamps queued on the device, exclusive of nested device regions, and read when the table is read.
// A fake timer whose timestamps the test sets stands in for CUDA events, so this runs without a GPU
// (with a CUDA build and no GPU too: the real timer is swapped out for the test and back).
namespace {

struct FakeClock {
  static inline double now = 0;  // the timestamp the next record() takes, in seconds
  static inline int records = 0, released = 0, elapsed_calls = 0;
  static inline std::vector<int> devices;  // the device of every record
};

void* fake_record(int device) {
  ++FakeClock::records;
  FakeClock::devices.push_back(device);
  return new double(FakeClock::now);
}
double fake_elapsed(void* a, void* b) {
  ++FakeClock::elapsed_calls;
  return *static_cast<double*>(b) - *static_cast<double*>(a);
}
void fake_release(void* h) {
  ++FakeClock::released;
  delete static_cast<double*>(h);
}
constexpr profiler::DeviceTimer kFakeTimer{&fake_record, &fake_elapsed, &fake_release};

// Kernels "queued on a device": each advances the fake device clock, the outer one also calls the inner
// one through its slot (as a CUDA kernel entry calling another family's kernel would).
using FakeKernel = void(double);
inline constinit backend::KernelSlot<FakeKernel> fake_inner_slot{"fake_inner"};
inline constinit backend::KernelSlot<FakeKernel> fake_outer_slot{"fake_outer"};
void fake_inner(double seconds) { FakeClock::now += seconds; }
void fake_outer(double seconds) {
  FakeClock::now += seconds;
  fake_inner_slot.get(Device(DeviceType::cuda, 1))(0.25);
  FakeClock::now += seconds;
}

}  // namespace

TEST(Profiler, DeviceKernelsAreTimedByDeviceTimestampsExclusively) {
  fake_inner_slot.set(DeviceType::cuda, &fake_inner);
  fake_outer_slot.set(DeviceType::cuda, &fake_outer);
  fake_inner_slot.set(DeviceType::cpu, &fake_inner);
  const profiler::DeviceTimer* prev = profiler::set_device_timer(&kFakeTimer);
  FakeClock::now = 0;
  FakeClock::records = FakeClock::released = FakeClock::elapsed_calls = 0;
  FakeClock::devices.clear();
  std::vector<profiler::OpStats> s;
  {
    profiler::Session session;
    fake_outer_slot.get(Device(DeviceType::cuda, 1))(1.0);  // 1 + 0.25 (inner) + 1
    fake_inner_slot.get(Device(DeviceType::cuda, 1))(0.5);
    EXPECT_EQ(FakeClock::elapsed_calls, 0);  // nothing waits for the device while recording
    fake_inner_slot.get(kCPU)(100.0);        // a CPU kernel: host time, no timestamps
    s = profiler::snapshot();
  }
  profiler::set_device_timer(prev);
  EXPECT_EQ(FakeClock::records, 6);  // two timestamps per device kernel call
  EXPECT_EQ(FakeClock::released, 6);
  for (int d : FakeClock::devices) EXPECT_EQ(d, 1);
  const auto* outer = find(s, "fake_outer");
  const auto* inner = find(s, "fake_inner");
  ASSERT_NE(outer, nullptr);
  ASSERT_NE(inner, nullptr);
  EXPECT_EQ(outer->calls, 1);
  EXPECT_DOUBLE_EQ(outer->seconds, 2.0);  // 2.25 between its timestamps, less the nested 0.25
  EXPECT_EQ(inner->calls, 3);             // two on the device, one on the CPU
  // Device 0.25 + 0.5; the CPU call's host time is tiny (it only adds to a double), never 100 s.
  EXPECT_GE(inner->seconds, 0.75);
  EXPECT_LT(inner->seconds, 0.75 + 0.5);
  profiler::reset();
}

// Beside a device kernel's device time, the host's time inside the call (queueing it) is kept, exclusive of
// nested device calls: the outer kernel sleeps 5 ms itself and 100 ms inside the inner one.
namespace {
inline constinit backend::KernelSlot<FakeKernel> sleepy_inner_slot{"sleepy_inner"};
inline constinit backend::KernelSlot<FakeKernel> sleepy_outer_slot{"sleepy_outer"};
void sleepy_inner(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }
void sleepy_outer(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  sleepy_inner_slot.get(Device(DeviceType::cuda, 0))(0.1);
}
}  // namespace

TEST(Profiler, DeviceKernelsKeepTheHostTimeOfTheirCallsExclusively) {
  sleepy_inner_slot.set(DeviceType::cuda, &sleepy_inner);
  sleepy_outer_slot.set(DeviceType::cuda, &sleepy_outer);
  const profiler::DeviceTimer* prev = profiler::set_device_timer(&kFakeTimer);
  std::vector<profiler::OpStats> s;
  {
    profiler::Session session;
    sleepy_outer_slot.get(Device(DeviceType::cuda, 0))(0.005);
    s = profiler::snapshot();
  }
  profiler::set_device_timer(prev);
  const auto* outer = find(s, "sleepy_outer");
  const auto* inner = find(s, "sleepy_inner");
  ASSERT_NE(outer, nullptr);
  ASSERT_NE(inner, nullptr);
  EXPECT_GE(inner->host_seconds, 0.1);
  EXPECT_GE(outer->host_seconds, 0.005);
  EXPECT_LT(outer->host_seconds, 0.08) << "the outer call's host time must exclude the nested call's 100 ms";
  profiler::reset();
}

// The op table's runner (tests/ops/op_cases.hpp): every case on every device there is, against the CPU in f64
// (and, on a device other than the CPU, against the CPU in the same dtype under the case's own tolerances);
// and the coverage tests: every kernel registered for a device is reached by some case on that device.
//
// Device instances: `<case>_cpu` runs on the CPU; `<case>_cuda` on cuda:0, or with the CPU standing in under
// MP_CUDA_TESTS_ON_CPU=1 (MP_CUDA_TESTS_DEVICE_THREADS=k: with k OpenMP threads), skipping without either (failing
// under MP_CUDA_TESTS_REQUIRE_GPU=1), as the CUDA tests do (tests/cuda/cuda_test_util.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backend/pointwise_kernels.hpp"
#include "backend/registry.hpp"
#include "op_cases.hpp"

using namespace mp;
using namespace mp::cuda_test;
using mp::op_table::OpCase;

namespace {

// Kernels no case reaches, each with the tests that cover it instead. Keep it short.
struct Exemption {
  const char* op;
  const char* why;
};
const Exemption kExempt[] = {
    // A whole-layer library LSTM with its own state (weights packed by oneDNN / cuDNN, a workspace kept between
    // forward and backward, a cache of plans): not an op on tensors that a case could call.
    {"lstm_library_forward", "tests/cuda/test_cuda_lstm_library.cpp, tests/ops/test_rnn.cpp"},
    {"lstm_library_backward", "tests/cuda/test_cuda_lstm_library.cpp, tests/ops/test_rnn.cpp"},
};
const char* exemption(const std::string& op) {
  for (const Exemption& e : kExempt)
    if (op == e.op) return e.why;
  return nullptr;
}

std::string test_name(const std::string& case_name) {
  std::string s;
  for (char ch : case_name) {
    const bool ok = std::isalnum(static_cast<unsigned char>(ch)) != 0;
    if (ok)
      s += ch;
    else if (!s.empty() && s.back() != '_')
      s += '_';
  }
  while (!s.empty() && s.back() == '_') s.pop_back();
  return s;
}

// Sets the device under test for a scope (cuda_test::dev(): the CPU for the CPU instances).
struct DeviceUnderTest {
  explicit DeviceUnderTest(bool cuda) {
    if (!cuda) device_override() = kCPU;
  }
  ~DeviceUnderTest() { device_override().reset(); }
  DeviceUnderTest(const DeviceUnderTest&) = delete;
  DeviceUnderTest& operator=(const DeviceUnderTest&) = delete;
};

// The inputs that get gradients (OpCheck::grad_inputs, or every floating one).
std::vector<size_t> grad_inputs(const OpCheck& c) {
  std::vector<size_t> gi = c.grad_inputs;
  if (c.grad && gi.empty())
    for (size_t i = 0; i < c.inputs.size(); ++i)
      if (c.inputs[i].defined() && is_floating(c.inputs[i].dtype())) gi.push_back(i);
  return gi;
}

// One run of the case on the device under test: its inputs (leaves), output, and upstream gradient.
struct DeviceRun {
  std::vector<Tensor> in;
  Tensor out;
};

// Forward on dev() (and backward with `go` when given); throws what the op throws.
DeviceRun run_on_device(const OpCheck& c, const std::vector<size_t>& gi, const Tensor& go) {
  DeviceRun r;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    r.in.push_back(on_dev(c.inputs[i], std::find(gi.begin(), gi.end(), i) != gi.end()));
  const DeviceThreads threads;
  r.out = c.fn(r.in);
  if (go.defined() && r.out.defined() && is_floating(r.out.dtype())) r.out.backward(on_dev(go));
  return r;
}

// The reference rounded to the result's dtype (a value beyond the dtype's range is inf there, as the result must
// be); the rounding is within the accuracy tolerance's ulp.
Tensor as_result(const Tensor& ref, const Tensor& result) {
  return ref.defined() && result.defined() && is_floating(result.dtype()) ? ref.to(result.dtype()) : ref;
}

// Check 1 of op_cases.hpp: the case on dev() in dt against the CPU in f64 (or f32).
void check_against_reference(const OpCase& oc, const OpCheck& c, DType dt) {
  const std::vector<size_t> gi = grad_inputs(c);
  auto needs_grad = [&](size_t i) { return std::find(gi.begin(), gi.end(), i) != gi.end(); };
  const DType rdt = oc.reference == op_table::Reference::f64 ? DType::f64 : DType::f32;
  std::vector<Tensor> rin, abs_in;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    const bool fl = t.defined() && is_floating(t.dtype());
    rin.push_back(cpu_leaf(fl ? t.to(rdt) : t, needs_grad(i)));
    if (c.abs_scales) abs_in.push_back(cpu_leaf(fl ? abs(t.to(DType::f64)) : t, needs_grad(i)));
  }
  Tensor want;
  try {
    want = c.fn(rin);
  } catch (const std::exception& e) {
    ADD_FAILURE() << c.name << ": the " << dtype_name(rdt) << " reference threw (test bug?): " << e.what();
    return;
  }
  const bool differentiable = c.grad && want.defined() && is_floating(want.dtype());
  const Tensor go = differentiable ? uniform(want.sizes(), -1.0, 1.0, dt) : Tensor();
  DeviceRun got;
  try {
    got = run_on_device(c, gi, go);
  } catch (const std::exception& e) {
    if (c.f64_may_be_unsupported && dt == DType::f64 && dev().is_cuda() && says_unsupported_f64(e.what())) {
      std::printf("[   NOTE   ] %s: f64 is not supported on %s: %s\n", c.name.c_str(), dev().str().c_str(), e.what());
      return;
    }
    ADD_FAILURE() << c.name << ": the run on " << dev().str() << " threw: " << e.what();
    return;
  }
  Tensor abs_out;
  if (c.abs_scales) abs_out = c.fn(abs_in);
  const std::string what = c.name + " vs the CPU in " + dtype_name(rdt);
  if (!is_floating(want.dtype())) {
    EXPECT_TRUE(identical(what + " forward", got.out, want));
  } else {
    const Tol t = oc.accuracy_out ? oc.accuracy_out(dt) : op_table::accuracy_tol(c.out, dt);
    const Tensor scale = c.abs_scales ? abs_out : c.out_scale ? c.out_scale(rin) : Tensor();
    EXPECT_TRUE(close_to_reference(what + " forward", got.out, as_result(want, got.out), t, scale));
  }
  if (!differentiable) return;
  if (c.abs_scales) abs_out.backward(abs(go.to(DType::f64)));
  try {
    want.backward(go.to(rdt));
  } catch (const std::exception& e) {
    ADD_FAILURE() << c.name << ": the reference backward threw (test bug?): " << e.what();
    return;
  }
  const Tol t = oc.accuracy_grad ? oc.accuracy_grad(dt) : op_table::accuracy_tol(*c.grad, dt);
  for (size_t i : gi) {
    const Tensor rg = rin[i].grad(), dg = got.in[i].grad();
    if (!rg.defined() && !dg.defined()) continue;
    const Tensor gs = c.abs_scales ? abs_in[i].grad() : c.grad_scale ? c.grad_scale(rin, go, i) : Tensor();
    EXPECT_TRUE(close_to_reference(what + " grad of input " + std::to_string(i), dg, as_result(rg, dg), t, gs));
  }
}

struct Instance {
  size_t index;
  bool cuda;
};

std::vector<Instance> instances() {
  std::vector<Instance> v;
  for (size_t i = 0; i < op_table::op_cases().size(); ++i) {
    v.push_back({i, false});
    v.push_back({i, true});
  }
  return v;
}

class OpTable : public ::testing::TestWithParam<Instance> {};

}  // namespace

TEST_P(OpTable, MatchesTheCpu) {
  const Instance p = GetParam();
  if (p.cuda) { MP_SKIP_WITHOUT_GPU(); }
  const OpCase& oc = op_table::op_cases()[p.index];
  const DeviceUnderTest device(p.cuda);
  for (DType dt : oc.dtypes) {
    SCOPED_TRACE(oc.name + " " + dtype_name(dt) + " on " + dev().str() +
                 (p.cuda && self_check_mode() ? " (self-check)" : ""));
    guarded(oc.name + " " + dtype_name(dt), [&] {
      // Inputs drawn from a generator seeded by the case and dtype: the same values whichever tests run before.
      uint64_t h = 1469598103934665603ull;
      for (unsigned char ch : oc.name + " " + dtype_name(dt)) h = (h ^ ch) * 1099511628211ull;
      manual_seed(h);
      OpCheck c = oc.make(dt);
      c.name = oc.name + " " + dtype_name(dt) + " on " + dev().str();
      check_against_reference(oc, c, dt);
      if (p.cuda) check_op(c);  // check 2: against the CPU in dt, the case's own tolerances
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, OpTable, ::testing::ValuesIn(instances()),
                         [](const ::testing::TestParamInfo<Instance>& info) {
                           return test_name(op_table::op_cases()[info.param.index].name) +
                                  (info.param.cuda ? "_cuda" : "_cpu");
                         });

// ================================================================================================ coverage

namespace {

std::mutex g_seen_mutex;
bool g_recording = false;
std::map<std::string, std::set<std::string>> g_seen;  // slot -> its labels seen (element-wise ops, reductions)

void record_call(const char* op, const char* label, Device) {
  const std::lock_guard<std::mutex> lock(g_seen_mutex);
  if (g_recording) g_seen[op].insert(label);
}

// Runs every case on dev() (its first dtype, forward and backward) observing the kernels reached there; returns
// slot -> labels.
std::map<std::string, std::set<std::string>> kernels_reached() {
  {
    const std::lock_guard<std::mutex> lock(g_seen_mutex);
    g_seen.clear();
  }
  const backend::ObserveKernelCalls observe(&record_call);
  for (const OpCase& oc : op_table::op_cases()) {
    guarded(oc.name, [&] {
      const OpCheck c = oc.make(oc.dtypes.front());
      const std::vector<size_t> gi = grad_inputs(c);
      Tensor go;
      if (c.grad) {  // the upstream gradient's shape: a CPU run, not observed
        const Tensor probe = c.fn(c.inputs);
        if (probe.defined() && is_floating(probe.dtype())) go = uniform(probe.sizes(), -1.0, 1.0, probe.dtype());
      }
      {
        const std::lock_guard<std::mutex> lock(g_seen_mutex);
        g_recording = true;
      }
      try {
        (void)run_on_device(c, gi, go);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(g_seen_mutex);
        g_recording = false;
        throw;
      }
      const std::lock_guard<std::mutex> lock(g_seen_mutex);
      g_recording = false;
    });
  }
  const std::lock_guard<std::mutex> lock(g_seen_mutex);
  return g_seen;
}

// Every kernel registered for device type `type` is reached by a case on dev() (the stand-in CPU for cuda in
// self-check mode: the same ops call the same slots), and every element-wise op by some case.
void expect_every_kernel_reached(DeviceType type) {
  const auto seen = kernels_reached();
  std::set<std::string> registered;
  for (const backend::RegisteredKernel& k : backend::registered_kernels())
    if (k.device == type) registered.insert(k.op);
  ASSERT_FALSE(registered.empty()) << "no kernels registered for " << Device(type).str();
  const bool stand_in = type != dev().type;
  for (const std::string& op : registered) {
    if (seen.count(op) != 0) continue;
    if (const char* why = exemption(op)) {
      std::printf("[   NOTE   ] %s: exempt (covered by %s)\n", op.c_str(), why);
      continue;
    }
    // No copy between devices, and no device to make current, when the CPU stands in.
    if (stand_in && (op == "copy_between_devices" || op == "device_scope")) continue;
    ADD_FAILURE() << "kernel '" << op << "' is registered for " << Device(type).str()
                  << " but no case of the op table reaches it there: add one to tests/ops/op_cases_*.cpp";
  }
  for (const Exemption& e : kExempt)
    if (seen.count(e.op) != 0) ADD_FAILURE() << "'" << e.op << "' is exempt but a case reaches it: drop the exemption";
  if (registered.count("pointwise") != 0) {
    const auto it = seen.find("pointwise");
    for (int i = 0; i <= static_cast<int>(backend::PointwiseOp::where); ++i) {
      const char* name = backend::pointwise_op_name(static_cast<backend::PointwiseOp>(i));
      if (it == seen.end() || it->second.count(name) == 0)
        ADD_FAILURE() << "element-wise op '" << name << "' is reached by no case on " << dev().str();
    }
  }
}

}  // namespace

TEST(OpTableCoverage, EveryCpuKernelHasACase) {
  const DeviceUnderTest device(false);
  expect_every_kernel_reached(DeviceType::cpu);
}

TEST(OpTableCoverage, EveryCudaKernelHasACase) {
  bool any = false;
  for (const backend::RegisteredKernel& k : backend::registered_kernels()) any = any || k.device == DeviceType::cuda;
  if (!any) GTEST_SKIP() << "built without the CUDA backend: no CUDA kernels registered";
  MP_SKIP_WITHOUT_GPU();
  const DeviceUnderTest device(true);
  expect_every_kernel_reached(DeviceType::cuda);
}

TEST(OpTableCoverage, NamesAreUniqueTestNames) {
  std::set<std::string> names;
  for (const OpCase& oc : op_table::op_cases())
    EXPECT_TRUE(names.insert(test_name(oc.name)).second) << "two cases are named '" << test_name(oc.name) << "'";
}

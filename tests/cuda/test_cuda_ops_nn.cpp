// CUDA against the CPU, part 2: what the op table (tests/ops/op_cases_linalg_conv_pool.cpp: matmul, linear,
// attention, conv2d, pools) does not check: the TF32 switch, which cuDNN API ran a convolution (tests/CMakeLists.txt
// runs CudaConv.* and the table's conv2d cases again on the legacy calls and with timed engine choice), and that
// channels-last stays channels-last. Tests skip without a CUDA device; MP_CUDA_TESTS_ON_CPU=1 runs them with the CPU
// as the device (self-check).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "mp/core/math_mode.hpp"

using namespace mp;
using namespace mp::cuda_test;

namespace {

// Tolerance of a library GEMM / convolution over K terms: c sqrt(K) u_acc sum|terms| (OpCheck::abs_scales)
// plus `ulps` of the output dtype.
Tol gemm_tol(DType dt, int64_t K, double c, double ulps, const std::string& why) {
  Tol t;
  t.scaled = c * std::sqrt(static_cast<double>(std::max<int64_t>(K, 1))) * acc_roundoff(dt);
  t.ulps = ulps;
  t.why = why;
  return t;
}

}  // namespace

// =============================================================================== matmul / linear

TEST(CudaLinalg, Tf32SwitchChangesOnlyF32Precision) {
  MP_SKIP_WITHOUT_GPU();
  // Note [TF32] (mp/core/math_mode.hpp): `high` lets f32 GEMMs round their inputs to TF32 (10-bit
  // mantissa: relative error 2^-11 per input, 2^-10 per product); `highest` (the default) keeps f32.
  ASSERT_EQ(float32_matmul_precision(), Float32MatmulPrecision::highest) << "the default must be no TF32";
  const int64_t K = 512;
  const Tensor a = uniform({256, K}, -1, 1), b = uniform({K, 192}, -1, 1);
  const Tensor want = matmul(a, b);
  const Tensor scale = matmul(abs(a.to(DType::f64)), abs(b.to(DType::f64)));
  guarded("TF32", [&] {
    set_float32_matmul_precision(Float32MatmulPrecision::high);
    const Tensor tf32 = matmul(on_dev(a), on_dev(b));
    set_float32_matmul_precision(Float32MatmulPrecision::highest);
    const Tensor f32 = matmul(on_dev(a), on_dev(b));
    Tol t = gemm_tol(DType::f32, K, 4, 1, "TF32 products: 2^-10 relative each, random signs: 4 sqrt(K) 2^-11");
    t.scaled = 4 * std::sqrt(static_cast<double>(K)) * std::ldexp(1.0, -11);
    EXPECT_TRUE(close("matmul f32 under TF32 (high)", tf32, want, t, scale));
    EXPECT_TRUE(close("matmul f32 back at highest", f32, want,
                      gemm_tol(DType::f32, K, 2, 1, "f32 GEMM: accumulation order only"), scale));
    if (dev().is_cuda()) {
      // On tensor-core GPUs TF32 really is used: its error is far above f32's on random data.
      const double e_tf32 = amax(abs(tf32.to(kCPU).to(DType::f64) - want.to(DType::f64)), {0, 1}).item<double>();
      const double e_f32 = amax(abs(f32.to(kCPU).to(DType::f64) - want.to(DType::f64)), {0, 1}).item<double>();
      EXPECT_GT(e_tf32, 10 * e_f32) << "TF32 (high) error " << e_tf32 << " vs f32 (highest) error " << e_f32
                                    << ": set_float32_matmul_precision(high) seems to have no effect";
    }
  });
  set_float32_matmul_precision(Float32MatmulPrecision::highest);
}

// =============================================================================== conv2d

// Channels-last convolutions keep the layout: output and data gradient channels-last on the device, as on the CPU
// (their values: the op table's conv2d channels-last cases).
TEST(CudaConv, ChannelsLastLayoutIsKept) {
  MP_SKIP_WITHOUT_GPU();
  constexpr MemoryFormat kCL = MemoryFormat::channels_last;
  const Tensor x = on_dev(uniform({2, 8, 6, 6}, -1, 1, DType::bf16).contiguous(kCL), true);
  const Tensor w = on_dev(uniform({16, 8, 3, 3}, -0.5, 0.5, DType::bf16), true);
  const Tensor y = conv2d(x, w, Tensor(), {.padding = {1, 1}});
  EXPECT_EQ(y.suggest_memory_format(), kCL) << y.describe();
  const Tensor z = relu(add(y, y));  // element-wise ops keep it too (the flat same-layout path)
  EXPECT_EQ(z.suggest_memory_format(), kCL) << z.describe();
  sum(z.to(DType::f32)).backward();
  EXPECT_EQ(x.grad().suggest_memory_format(), kCL) << x.grad().describe();
}

TEST(CudaConv, RunsOnTheChosenApi) {
  MP_SKIP_WITHOUT_GPU();
  if (self_check_mode()) GTEST_SKIP() << "counts cuDNN's calls, which the CPU standing in never makes";
  const char* env = std::getenv("MP_CUDNN_GRAPH");
  const bool graph = env == nullptr || std::string(env) != "0";
  const CudnnConvCounts before = cudnn_conv_counts();
  const Tensor x = on_dev(normal({4, 16, 8, 8}, 0.0, 1.0, DType::bf16).contiguous(MemoryFormat::channels_last), true);
  const Tensor w = on_dev(normal({32, 16, 3, 3}, 0.0, 0.1, DType::bf16), true);
  sum(conv2d(x, w, Tensor(), {.padding = {1, 1}})).backward();
  const CudnnConvCounts after = cudnn_conv_counts();
  EXPECT_EQ(after.calls - before.calls, 3) << "forward, data and weight gradients";
  EXPECT_EQ(after.graph_calls - before.graph_calls, graph ? 3 : 0)
      << (graph ? "the graph API is the default" : "MP_CUDNN_GRAPH=0 asks for the legacy calls");
}

// =============================================================================== pools

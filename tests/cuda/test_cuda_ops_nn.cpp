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

// =============================================================================== attention

// The CUDA attention (Note [CUDA attention]) against the CPU's fused kernel where the op table's small case does not
// reach: rows longer than a block of the row kernel (300 keys), a broadcast bool mask with one row masked entirely
// (zero output and gradients, lse = +inf), dropout (the same Philox draws on both devices: the masks must agree, or
// whole weights differ), a head size whose [T, D] blocks are not 16-byte aligned (D = 12 in f16: the GEMMs go one
// (batch, head) at a time) and Tq != Tk.
TEST(CudaAttention, MaskDropoutAndLongRowsMatchTheCpu) {
  MP_SKIP_WITHOUT_GPU();
  struct Case {
    DType dt;
    int64_t D;
  };
  for (const Case c : {Case{DType::f32, 32}, Case{DType::bf16, 64}, Case{DType::f16, 12}}) {
    SCOPED_TRACE(dtype_name(c.dt));
    const int64_t B = 2, H = 3, Tq = 41, Tk = 300;
    const Tensor q = uniform({B, H, Tq, c.D}, -1, 1, c.dt), k = uniform({B, H, Tk, c.D}, -1, 1, c.dt),
                 v = uniform({B, H, Tk, c.D}, -1, 1, c.dt), w = uniform({B, H, Tq, c.D}, -1, 1, DType::f32);
    Tensor mask = gt(uniform({B, 1, Tq, Tk}, 0, 1), full({}, 0.2));
    mask.narrow(2, 5, 1).narrow(0, 1, 1).fill_(0.0);  // row 5 of batch 1: every key masked
    const AttentionOptions o{.mask = mask, .dropout_p = 0.25};
    const Tensor qc = cpu_leaf(q, true), kc = cpu_leaf(k, true), vc = cpu_leaf(v, true);
    manual_seed(77);
    const Tensor oc = scaled_dot_product_attention(qc, kc, vc, o);
    sum(oc.to(DType::f32) * w).backward();
    guarded("attention " + std::string(dtype_name(c.dt)), [&] {
      const Tensor qd = on_dev(q, true), kd = on_dev(k, true), vd = on_dev(v, true);
      AttentionOptions od = o;
      od.mask = on_dev(mask);
      manual_seed(77);
      const Tensor out = scaled_dot_product_attention(qd, kd, vd, od);
      sum(out.to(DType::f32) * on_dev(w)).backward();
      // 16-bit: the CPU rounds only the weights (bf16 on native kernels) or nothing, CUDA rounds the weights and dS
      // to the input dtype before their products: a few units of 2^-p relative to the largest value. f32: sums
      // of 300 terms in different orders.
      Tol t;
      t.normwise = is_low_precision(c.dt) ? 16 * unit_roundoff(c.dt) : 1e-5;
      t.why = "weights / dS rounded to the input dtype on CUDA (16-bit); summation order (f32): normwise";
      EXPECT_TRUE(close("out", out, oc, t));
      EXPECT_TRUE(close("dq", qd.grad(), qc.grad(), t));
      EXPECT_TRUE(close("dk", kd.grad(), kc.grad(), t));
      EXPECT_TRUE(close("dv", vd.grad(), vc.grad(), t));
      const Tensor masked_row = out.detach().narrow(0, 1, 1).narrow(2, 5, 1).to(kCPU).to(DType::f64);
      EXPECT_EQ(amax(abs(masked_row), {0, 1, 2, 3}).item<double>(), 0.0) << "a row with every key masked";
    });
  }
}

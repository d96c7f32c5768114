// CUDA against the CPU, the library LSTM: mp::lstm_layer_library on cuda (cuDNN's RNN, cuda/cudnn/rnn.cu)
// against the CPU's linear + mp::lstm_layer (the fused path) with the same inputs: forward and every
// gradient in f32, f16 and bf16, with and without biases, T = 1 and 6, a tensor-core-sized layer; the
// inference path; nn::LSTM with LstmImpl::library on cuda against LstmImpl::fused on the CPU; f64 refused.
//
// Every tolerance states its reason (cuda_test_util.hpp). Tests skip without a CUDA device;
// MP_CUDA_TESTS_ON_CPU=1 runs them with the CPU as the device (self-check of the harness: the "device"
// side then runs the same CPU composite, so it compares equal).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "cuda_test_util.hpp"
#include "mp/ops/rnn_library.hpp"

using namespace mp;
using namespace mp::cuda_test;

namespace {

// The op under test on cuda, the CPU's fused composite elsewhere; y, h_T, c_T flattened into one tensor.
Tensor library_or_fused(const std::vector<Tensor>& in) {
  Tensor y, h, c;
  if (in[0].device().is_cuda())
    std::tie(y, h, c) = lstm_layer_library(in[0], in[1], in[2], in[3], in[4], in[5], in[6]);
  else
    std::tie(y, h, c) = lstm_layer(linear(in[0], in[3], in[5]), in[1], in[2], in[4], in[6]);
  return cat({y.reshape({-1}), h.reshape({-1}), c.reshape({-1})}, 0);
}

// Whether cuDNN runs this dtype here; prints why not (bf16 needs cuDNN >= 9.13, Note [cuDNN LSTM
// precision] in cudnn/rnn.cu).
bool dtype_runs(DType dt) {
  if (!dev().is_cuda()) return true;
  const std::string msg = test::error_of([&] {
    const TensorOptions o{.dtype = dt, .device = dev()};
    (void)lstm_layer_library(zeros({1, 1, 8}, o), zeros({1, 8}, o), zeros({1, 8}, {.device = dev()}), zeros({32, 8}, o),
                             zeros({32, 8}, o));
  });
  if (msg == "(no error)") return true;
  std::printf("[   NOTE   ] lstm_layer_library %s does not run on %s: %s\n", dtype_name(dt), dev().str().c_str(),
              msg.c_str());
  EXPECT_NE(msg.find("cuDNN 9.13"), std::string::npos)
      << "only a bf16 RNN missing from an old cuDNN may be refused: " << msg;
  return false;
}

}  // namespace

TEST(CudaLstmLibrary, MatchesCpuFusedForwardAndBackward) {
  MP_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t T, B, I, H;
    bool bias;
  };
  const std::vector<Case> cases = {
      {6, 4, 10, 16, true}, {6, 5, 10, 16, false}, {1, 3, 7, 9, true}, {5, 8, 48, 64, true}};
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    if (!dtype_runs(dt)) continue;
    for (const Case& k : cases) {
      OpCheck chk;
      chk.name = std::string("lstm_layer_library ") + dtype_name(dt) + " T " + std::to_string(k.T) + " B " +
                 std::to_string(k.B) + " I " + std::to_string(k.I) + " H " + std::to_string(k.H) +
                 (k.bias ? "" : " no bias");
      chk.inputs = {uniform({k.T, k.B, k.I}, -1, 1, dt),
                    uniform({k.B, k.H}, -1, 1, dt),
                    uniform({k.B, k.H}, -1, 1, DType::f32),
                    uniform({4 * k.H, k.I}, -0.3, 0.3, dt),
                    uniform({4 * k.H, k.H}, -0.3, 0.3, dt),
                    k.bias ? uniform({4 * k.H}, -0.3, 0.3, dt) : Tensor(),
                    k.bias ? uniform({4 * k.H}, -0.3, 0.3, dt) : Tensor()};
      chk.fn = &library_or_fused;
      // f32 (FMA math, no TF32 at the default matmul precision): the same function, the GEMMs accumulate
      // K = I + H + 2 terms per gate in another order (~sqrt(K) u sum|terms| <= 2 sqrt(K) u (K 0.3 + 1)
      // per step), the activations have slopes <= 1, over T steps: T * 512 u_acc covers K <= 114 with
      // margin. 16-bit: the CPU rounds the input projection and the gates to 16 bits each step, cuDNN keeps
      // them in f32 but rounds c to 16 bits each step (and c_T on the way out, |c| < 4: 2 ulp(dt, 1)); both
      // round h: a few 16-bit ulps at |values| <= 1, contracted over the steps by the forget gate.
      chk.out = Tol{.ulps = 4,
                    .atol = is_low_precision(dt) ? 8 * ulp(dt, 1.0) : static_cast<double>(k.T) * 512 * acc_roundoff(dt),
                    .why =
                        "T recurrent steps of GEMMs + gates in another order (16-bit: gates rounded on the CPU, "
                        "c rounded by cuDNN)"};
      // Gradients, relative to the largest element: the same sums backward over T steps (f32); 16-bit:
      // the CPU's backward rounds dG, dh and dW to 16 bits per step, cuDNN returns 16-bit gradients.
      chk.grad = Tol{.ulps = 4,
                     .normwise = is_low_precision(dt) ? 24 * unit_roundoff(dt)
                                                      : static_cast<double>(k.T) * 2048 * acc_roundoff(dt),
                     .why = "backward through T steps (relative to the largest gradient)"};
      check_op(chk);
    }
  }
}

TEST(CudaLstmLibrary, InferenceMatchesTrainingAndRepeatsBitForBit) {
  MP_SKIP_WITHOUT_GPU();
  // Without gradients the inference mode runs (no reserve space); with them the training mode. Both
  // compute the same function; cuDNN may pick other kernels for the two modes (4 ulps + GEMM order).
  // The same call twice (the cached plan) gives identical bits.
  const int64_t T = 7, B = 6, I = 12, H = 20;
  const std::vector<Tensor> in = {uniform({T, B, I}, -1, 1),      uniform({B, H}, -1, 1),
                                  uniform({B, H}, -1, 1),         uniform({4 * H, I}, -0.3, 0.3),
                                  uniform({4 * H, H}, -0.3, 0.3), uniform({4 * H}, -0.3, 0.3),
                                  uniform({4 * H}, -0.3, 0.3)};
  guarded("lstm_layer_library inference vs training", [&] {
    std::vector<Tensor> d;
    for (const Tensor& t : in) d.push_back(on_dev(t));
    Tensor infer_a, infer_b;
    {
      autograd::NoGradGuard ng;
      infer_a = library_or_fused(d);
      infer_b = library_or_fused(d);
    }
    EXPECT_TRUE(identical("inference twice", infer_a, infer_b.to(kCPU)));
    d[3].requires_grad_(true);
    const Tensor train = library_or_fused(d);
    EXPECT_TRUE(close("training vs inference", train, infer_a.to(kCPU),
                      Tol{.ulps = 4,
                          .atol = T * 512 * acc_roundoff(DType::f32),
                          .why = "training and inference kernels may accumulate in another order"}));
  });
}

TEST(CudaLstmLibrary, NnLstmLibraryOnCudaMatchesFusedOnCpu) {
  MP_SKIP_WITHOUT_GPU();
  guarded("nn::LSTM library (cuda) vs fused (cpu)", [] {
    manual_seed(21);
    nn::LSTM cpu(nn::LSTMOptions{.input_size = 10, .hidden_size = 16, .num_layers = 2});
    nn::LSTM gpu(nn::LSTMOptions{.input_size = 10,
                                 .hidden_size = 16,
                                 .num_layers = 2,
                                 .impl = dev().is_cuda() ? nn::LstmImpl::library : nn::LstmImpl::fused});
    gpu.load_state_dict(cpu.state_dict());
    gpu.to(dev());
    const int64_t T = 6, B = 4;
    const Tensor x = uniform({T, B, 10}, -1, 1);
    const Tensor xc = cpu_leaf(x, true), xd = on_dev(x, true);
    auto [oc, sc] = cpu.forward(xc);
    auto [od, sd] = gpu.forward(xd);
    // Two stacked layers: the second layer's inputs already differ by the first's error (2x one layer).
    const Tol out{.ulps = 4, .atol = 2 * T * 512 * acc_roundoff(DType::f32), .why = "two layers of T GEMM steps"};
    EXPECT_TRUE(close("nn::LSTM output", od, oc, out));
    EXPECT_TRUE(close("nn::LSTM h_n", sd.h, sc.h, out));
    EXPECT_TRUE(close("nn::LSTM c_n", sd.c, sc.c, out));
    const Tensor go = uniform({T, B, 16}, -1, 1);
    add(sum(mul(oc, go)), sum(sc.c)).backward();
    add(sum(mul(od, on_dev(go))), sum(sd.c)).backward();
    const Tol grad{.ulps = 4,
                   .normwise = 2 * T * 2048 * acc_roundoff(DType::f32),
                   .why = "backward through two layers of T steps (relative to the largest gradient)"};
    EXPECT_TRUE(close("nn::LSTM grad of x", xd.grad(), xc.grad(), grad));
    const auto pc = cpu.named_parameters(), pd = gpu.named_parameters();
    ASSERT_EQ(pc.size(), pd.size());
    for (size_t i = 0; i < pc.size(); ++i)
      EXPECT_TRUE(close("nn::LSTM grad of " + pc[i].first, pd[i].second.grad(), pc[i].second.grad(), grad));
  });
}

TEST(CudaLstmLibrary, SecondBackwardThroughOneForwardIsRefused) {
  MP_SKIP_WITHOUT_GPU();
  if (!dev().is_cuda()) GTEST_SKIP() << "self-check mode: the CPU's graphs may be back-propagated twice (tests/ops)";
  // Note [cuDNN reserve space is consumed] in cudnn/rnn.cu: the first backward works, the second says why not.
  std::vector<Tensor> in = {uniform({3, 2, 4}, -1, 1),
                            uniform({2, 8}, -1, 1),
                            uniform({2, 8}, -1, 1),
                            uniform({32, 4}, -0.3, 0.3),
                            uniform({32, 8}, -0.3, 0.3),
                            Tensor(),
                            Tensor()};
  for (Tensor& t : in) t = on_dev(t, t.defined());
  const Tensor loss = sum(library_or_fused(in));
  const std::vector<Tensor> wrt(in.begin(), in.begin() + 5);
  guarded("first backward", [&] { (void)autograd::grad({loss}, wrt, {}, true); });
  const std::string msg = test::error_of([&] { (void)autograd::grad({loss}, wrt, {}, true); });
  EXPECT_NE(msg.find("second backward"), std::string::npos) << msg;
}

TEST(CudaLstmLibrary, RefusesF64NamingTheDtypesThatWork) {
  MP_SKIP_WITHOUT_GPU();
  if (!dev().is_cuda()) GTEST_SKIP() << "self-check mode: the CPU refuses f64 with its own message (tests/ops)";
  const TensorOptions o{.dtype = DType::f64, .device = dev()};
  const std::string msg = test::error_of([&] {
    (void)lstm_layer_library(zeros({2, 2, 4}, o), zeros({2, 4}, o), zeros({2, 4}, o), zeros({16, 4}, o),
                             zeros({16, 4}, o));
  });
  for (const char* part : {"lstm_layer_library on cuda", "f64", "f32, f16 or bf16", "mp::lstm_layer"})
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

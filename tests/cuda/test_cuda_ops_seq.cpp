// CUDA against the CPU, part 4: the sequence-model ops. embedding (i64 / i32 indices, repeated indices,
// padding_idx, out-of-range errors with the CPU's message), dropout (the mask drawn on the device equals
// the CPU's bit for bit, the generator ends at the same offset) and the recurrent cells (lstm_gates,
// lstm_cell, gru_cell, rnn_tanh_cell, lstm_layer), forward and backward in f32, f16, bf16 and f64.
//
// Every tolerance states its reason (cuda_test_util.hpp). Tests skip without a CUDA device;
// MP_CUDA_TESTS_ON_CPU=1 runs them with the CPU as the device (self-check).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"

using namespace mp;
using namespace mp::cuda_test;

// =============================================================================== embedding / dropout

TEST(CudaIndex, EmbeddingForwardBackwardAndErrors) {
  MP_SKIP_WITHOUT_GPU();
  struct Case {
    const char* name;
    int64_t V, D;
    Shape idx;
    int64_t padding;
  };
  const std::vector<Case> cases = {
      {"V 50, D 33, [7, 9] indices (many repeats)", 50, 33, {7, 9}, -1},
      {"V 1000, D 8, [4, 300]", 1000, 8, {4, 300}, -1},
      {"V 20, D 257, [64] padding_idx 3", 20, 257, {64}, 3},
      {"V 5, D 16, [2000] (heavy repeats)", 5, 16, {2000}, -1},
  };
  for (DType dt : kFloatTypes) {
    for (DType it : {DType::i64, DType::i32}) {
      for (const Case& k : cases) {
        const Tensor idx = integers(k.idx, 0, k.V, it);
        std::map<int64_t, int64_t> counts;
        for (int64_t i : idx.to_vector<int64_t>()) ++counts[i];
        int64_t R = 1;
        for (const auto& kv : counts) R = std::max(R, kv.second);
        OpCheck chk;
        chk.name = std::string("embedding ") + dtype_name(dt) + " " + dtype_name(it) + " indices, " + k.name;
        chk.inputs = {uniform({k.V, k.D}, -1, 1, dt), idx};
        const int64_t pad = k.padding;
        chk.fn = [pad](const std::vector<Tensor>& in) { return embedding(in[0], in[1], pad); };
        chk.out = exact("a gather");
        chk.bit_exact_output = true;
        // Rows hit R times sum R gradient rows (f32 accumulation) in another order, rounded once.
        chk.grad = reduction_tol(dt, R, 2, "; embedding backward: repeated indices add rows");
        chk.abs_scales = true;
        chk.grad_inputs = {0};
        check_op(chk);
      }
    }
  }
  // Note [deferred device checks]: checking the indices costs no host synchronisation; an out-of-range
  // index is reported at the next one (below).
  if (dev().is_cuda()) {
    const Tensor w = on_dev(uniform({10, 4}, -1, 1)), idx = on_dev(integers({20}, 0, 10));
    mp::synchronize(dev());
    const int64_t before = backend::cuda::host_sync_count();
    const Tensor e = embedding(w, idx);
    EXPECT_EQ(backend::cuda::host_sync_count(), before) << "the index check waited for the device";
    EXPECT_EQ(e.to(kCPU).sizes(), (Shape{20, 4}));  // the read-back runs the check: no error
  }
  // An out-of-range index: the device throws the CPU's message (the first bad index, its position, V).
  for (DType it : {DType::i64, DType::i32}) {
    const Tensor w = uniform({10, 4}, -1, 1);
    Tensor idx = integers({20}, 0, 10, it);
    idx.narrow(0, 6, 1).fill_(10);
    idx.narrow(0, 15, 1).fill_(-1);
    const std::string cpu_msg = test::error_of([&] { (void)embedding(w, idx); });
    const std::string dev_msg = test::error_of([&] { (void)embedding(on_dev(w), on_dev(idx)).to(kCPU); });
    EXPECT_NE(cpu_msg, "(no error)");
    EXPECT_EQ(dev_msg, cpu_msg) << dtype_name(it) << " indices";
  }
}

TEST(CudaIndex, DropoutMaskIsTheCpuMaskBitForBit) {
  MP_SKIP_WITHOUT_GPU();
  // Note [dropout mask]: element i keeps its value when philox_uniform(seed, offset, i) >= p; the same
  // counter-based stream on both devices, so with the same seed the outputs, gradients and the
  // generator's position afterwards are identical.
  struct Case {
    Shape s;
    uint64_t offset;  // generator offset before the call (6: not a multiple of 4)
  };
  const std::vector<Case> shapes = {{{1037}, 0}, {{37, 29}, 6}, {{(int64_t{1} << 20) + 3}, 0}};
  for (DType dt : kFloatTypes) {
    for (const Case& k : shapes) {
      if (k.s[0] > 100000 && dt != DType::f32 && dt != DType::bf16) continue;  // large: two dtypes suffice
      for (double p : {0.1, 0.5, 0.9, 1.0}) {
        const std::string what =
            desc("dropout p=" + std::to_string(p).substr(0, 3), dt, k.s) + " offset " + std::to_string(k.offset);
        guarded(what, [&] {
          const Tensor x = uniform(k.s, 0.5, 2, dt);  // nonzero: a dropped element is visible
          const Tensor cx = cpu_leaf(x, true), dx = on_dev(x, true);
          default_generator().set_state(1234, k.offset);
          const Tensor want = dropout(cx, p, true);
          const PhiloxState after_cpu = default_generator().state();
          default_generator().set_state(1234, k.offset);
          const Tensor got = dropout(dx, p, true);
          const PhiloxState after_dev = default_generator().state();
          EXPECT_TRUE(identical(what + " output", got, want));
          EXPECT_EQ(after_dev.offset, after_cpu.offset) << what;
          const Tensor go = uniform(k.s, -1, 1, dt);
          want.backward(go);
          got.backward(on_dev(go));
          EXPECT_TRUE(identical(what + " gradient", dx.grad(), cx.grad()));
        });
      }
    }
  }
  guarded("dropout p = 0 and eval are the identity", [] {
    const Tensor x = on_dev(uniform({100}, -1, 1));
    EXPECT_TRUE(identical("dropout p=0", dropout(x, 0.0, true), x.to(kCPU)));
    EXPECT_TRUE(identical("dropout eval", dropout(x, 0.5, false), x.to(kCPU)));
  });
}

// =============================================================================== recurrent cells

TEST(CudaRnn, LstmGatesCellsAndLayer) {
  MP_SKIP_WITHOUT_GPU();
  const int64_t B = 5, I = 23, H = 37;
  // Gate arithmetic (sigmoid, tanh on each device's libm: <= 5 and 4 ulps, Note in the unary tests):
  // c' = f c + i g and h' = o tanh(c') differ by <= (5 |c| + 20) u with |c| < 2: 32 u absolute, 4 ulps.
  for (DType dt : kFloatTypes) {
    std::vector<DType> cdts = {dt};
    if (is_low_precision(dt)) cdts.push_back(DType::f32);  // 16-bit gates with an f32 cell state
    for (DType cdt : cdts) {
      OpCheck g;
      g.name = std::string("lstm_gates ") + dtype_name(dt) + " gates, " + dtype_name(cdt) + " c";
      g.inputs = {uniform({B, 4 * H}, -3, 3, dt), uniform({B, H}, -2, 2, cdt)};
      g.fn = [](const std::vector<Tensor>& in) {
        auto [h, c] = lstm_gates(in[0], in[1]);
        return cat({h.reshape({-1}), c.reshape({-1})}, 0);
      };
      const DType out_dt = promote_types(dt, cdt);
      g.out = Tol{.ulps = 4, .atol = 32 * acc_roundoff(out_dt), .why = "sigmoid / tanh of each device's libm"};
      g.grad = Tol{.ulps = 4,
                   .atol = 256 * acc_roundoff(out_dt),
                   .why = "gate gradients: products of up to 5 activations, each a few ulps apart, and 1 - s cancels"};
      check_op(g);
    }
    // Cells: the gates come from GEMMs (K = I + H terms of |x w| <= 0.3: <= 2 sqrt(H) u 18 = 220 u apart), then
    // the activations (slopes <= 1 + |c|): 512 u_acc. 16-bit: the GEMM outputs are rounded to 16 bits and
    // may be one ulp apart (ulp(dt, 4) for |gates| < 4), times the slopes: 2 ulp(dt, 4).
    const double atol = is_low_precision(dt) ? 2 * ulp(dt, 4.0) : 512 * acc_roundoff(dt);
    const Tol cell_out{.ulps = 2, .atol = atol, .why = "GEMMs (accumulation order) feeding the gate activations"};
    const Tol cell_grad{.ulps = 2,
                        .normwise = is_low_precision(dt) ? 8 * unit_roundoff(dt) : 2048 * acc_roundoff(dt),
                        .why = "cell gradients through the activations and the GEMMs (relative to the largest)"};
    const std::vector<Tensor> cell_in = {uniform({B, I}, -1, 1, dt),         uniform({B, H}, -1, 1, dt),
                                         uniform({B, H}, -2, 2, dt),         uniform({4 * H, I}, -0.3, 0.3, dt),
                                         uniform({4 * H, H}, -0.3, 0.3, dt), uniform({4 * H}, -0.3, 0.3, dt),
                                         uniform({4 * H}, -0.3, 0.3, dt)};
    OpCheck lc;
    lc.name = std::string("lstm_cell ") + dtype_name(dt);
    lc.inputs = cell_in;
    lc.fn = [](const std::vector<Tensor>& in) {
      auto [h, c] = lstm_cell(in[0], in[1], in[2], in[3], in[4], in[5], in[6]);
      return cat({h.reshape({-1}), c.reshape({-1})}, 0);
    };
    lc.out = cell_out;
    lc.grad = cell_grad;
    lc.f64_may_be_unsupported = true;
    check_op(lc);

    OpCheck gr;
    gr.name = std::string("gru_cell ") + dtype_name(dt);
    gr.inputs = {cell_in[0],
                 cell_in[1],
                 uniform({3 * H, I}, -0.3, 0.3, dt),
                 uniform({3 * H, H}, -0.3, 0.3, dt),
                 uniform({3 * H}, -0.3, 0.3, dt),
                 uniform({3 * H}, -0.3, 0.3, dt)};
    gr.fn = [](const std::vector<Tensor>& in) { return gru_cell(in[0], in[1], in[2], in[3], in[4], in[5]); };
    gr.out = cell_out;
    gr.grad = cell_grad;
    gr.f64_may_be_unsupported = true;
    check_op(gr);

    OpCheck rn;
    rn.name = std::string("rnn_tanh_cell ") + dtype_name(dt);
    rn.inputs = {cell_in[0],
                 cell_in[1],
                 uniform({H, I}, -0.3, 0.3, dt),
                 uniform({H, H}, -0.3, 0.3, dt),
                 uniform({H}, -0.3, 0.3, dt),
                 uniform({H}, -0.3, 0.3, dt)};
    rn.fn = [](const std::vector<Tensor>& in) { return rnn_tanh_cell(in[0], in[1], in[2], in[3], in[4], in[5]); };
    rn.out = cell_out;
    rn.grad = cell_grad;
    rn.f64_may_be_unsupported = true;
    check_op(rn);

    // A whole layer over T = 6 steps (one node; the f32 cell state carries over): the per-step differences
    // add up over the steps (x T); 16-bit: h is rounded to 16 bits each step and feeds the next GEMM.
    const int64_t T = 6, Bl = 4, Hl = 16;
    const DType sdt = dt == DType::f64 ? DType::f64 : DType::f32;
    OpCheck ll;
    ll.name = std::string("lstm_layer ") + dtype_name(dt) + " T 6";
    ll.inputs = {uniform({T, Bl, 4 * Hl}, -1, 1, dt), uniform({Bl, Hl}, -1, 1, dt), uniform({Bl, Hl}, -1, 1, sdt),
                 uniform({4 * Hl, Hl}, -0.4, 0.4, dt), uniform({4 * Hl}, -0.3, 0.3, dt)};
    ll.fn = [](const std::vector<Tensor>& in) {
      auto [y, hT, cT] = lstm_layer(in[0], in[1], in[2], in[3], in[4]);
      return cat({y.reshape({-1}), hT.reshape({-1}), cT.reshape({-1})}, 0);
    };
    ll.out = Tol{.ulps = 4,
                 .atol = is_low_precision(dt) ? 8 * ulp(dt, 1.0) : 6 * 512 * acc_roundoff(dt),
                 .why = "T = 6 recurrent steps of GEMM + gates (16-bit: h rounded each step)"};
    ll.grad = Tol{.ulps = 4,
                  .normwise = is_low_precision(dt) ? 16 * unit_roundoff(dt) : 6 * 2048 * acc_roundoff(dt),
                  .why = "backward through 6 steps (relative to the largest gradient)"};
    ll.f64_may_be_unsupported = true;
    check_op(ll);
  }
}

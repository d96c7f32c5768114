// CUDA against the CPU, part 4: the sequence-model ops beyond the op table (tests/ops/op_cases_reduce_index_rnn.cpp,
// which holds embedding's and the recurrent cells' values and gradients): embedding's index checks (no host
// synchronisation; out-of-range errors with the CPU's message) and dropout (the mask drawn on the device equals the
// CPU's bit for bit, the generator ends at the same offset, a 2^20 + 3 tensor, p = 0 and eval).
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

// Embedding values and gradients: the op table (tests/ops/op_cases_reduce_index_rnn.cpp).
TEST(CudaIndex, EmbeddingIndexChecks) {
  MP_SKIP_WITHOUT_GPU();
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

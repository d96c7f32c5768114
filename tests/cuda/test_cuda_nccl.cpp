// NCCL on one rank (issue 26 item 7; Note [NCCL groups] in src/dist/nccl_group.cpp): the GPU machines here have one
// GPU and NCCL refuses two ranks on one GPU, so this is the smoke test: the communicator starts, every collective
// leaves a one-rank group's tensors as one process has them (a wrong count, type or pointer garbles or faults them),
// and a training step whose gradients are averaged through NCCL equals one without. Runs on cuda:0 itself (no
// self-check mode); skips without a GPU or without NCCL in the build, and without NCCL fails under
// MP_CUDA_TESTS_REQUIRE_GPU=1 on a GPU machine.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/runtime.hpp"
#include "cuda/cuda_test_util.hpp"
#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;
using namespace mp::cuda_test;

namespace {

const Device kCuda{DeviceType::cuda, 0};

#define MP_SKIP_WITHOUT_NCCL()                                                \
  MP_SKIP_OR_FAIL_UNLESS(backend::cuda::device_count() > 0);                  \
  if (!dist::built_with_nccl()) {                                             \
    if (gpu_required()) FAIL() << "a GPU is here but this build has no NCCL"; \
    GTEST_SKIP() << "this build has no NCCL";                                 \
  }

// Distinct values per element, on the GPU in dt.
Tensor values(int64_t n, DType dt) {
  return arange(0, static_cast<double>(n), 1, {.dtype = DType::f64}).to(dt).to(kCuda);
}

}  // namespace

TEST(CudaNccl, OneRankCollectivesKeepTheValues) {
  MP_SKIP_WITHOUT_NCCL();
  dist::ProcessGroup& world = dist::world();
  ASSERT_EQ(world.size(), 1) << "run this test as one process";
  const std::unique_ptr<dist::ProcessGroup> g = dist::nccl_group(world, kCuda);
  EXPECT_NE(g->describe().find("NCCL"), std::string::npos) << g->describe();
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->size(), 1);
  for (const DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dt));
    // Integers below 256 are exact in every dtype: a mean over one rank is the value itself.
    const Tensor a = values(255, dt), b = values(1037, DType::f32);
    const Tensor a0 = a.clone(), b0 = b.clone();
    const Tensor both[] = {a, b};
    g->all_reduce_mean(both);
    EXPECT_TRUE(identical("all_reduce_mean", a, a0));
    EXPECT_TRUE(identical("all_reduce_mean (f32 beside)", b, b0));
    g->broadcast(both, 0);
    EXPECT_TRUE(identical("broadcast", a, a0));
    const int64_t counts[] = {a.numel()};
    g->all_gather(a, counts);
    EXPECT_TRUE(identical("all_gather", a, a0));
    const Tensor whole = zeros({a.numel()}, {.dtype = dt, .device = kCuda});
    g->gather(a, whole, counts, 0);
    EXPECT_TRUE(identical("gather", whole, a0));
  }
  const Tensor buf = values(4099, DType::f32), buf0 = buf.clone();
  const std::unique_ptr<dist::Pending> p = g->start_all_reduce_sum(buf);
  p->wait();
  EXPECT_TRUE(p->test());
  EXPECT_TRUE(identical("start_all_reduce_sum", buf, buf0));
  const Tensor out = zeros({4099}, {.device = kCuda});
  const int64_t n[] = {4099};
  g->reduce_scatter_sum(buf, out, n);
  EXPECT_TRUE(identical("reduce_scatter_sum", out, buf0));
  g->barrier();
  // A CPU tensor is refused naming the group's device.
  const Tensor cpu[] = {zeros({3})};
  EXPECT_NE(test::error_of([&] { g->all_reduce_mean(cpu); }).find("expected tensors on cuda:0"), std::string::npos);
}

TEST(CudaNccl, TrainingStepWithGradientsAveragedThroughNcclEqualsOneWithout) {
  MP_SKIP_WITHOUT_NCCL();
  const std::unique_ptr<dist::ProcessGroup> g = dist::nccl_group(dist::world(), kCuda);
  const Tensor x = uniform({32, 20}, -1, 1).to(kCuda), y = integers({32}, 0, 5).to(kCuda);
  std::vector<Tensor> trained;
  for (const bool through_nccl : {false, true}) {
    manual_seed(3);
    nn::Sequential model(std::make_shared<nn::Linear>(20, 16), std::make_shared<nn::ReLU>(),
                         std::make_shared<nn::Linear>(16, 5));
    model.to(kCuda);
    optim::SGD opt(model.parameters(), {.lr = 0.1, .momentum = 0.9});
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      cross_entropy(model.forward(x), y).backward();
      if (through_nccl) {
        std::vector<Tensor> grads;
        for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
        g->all_reduce_mean(grads);
      }
      opt.step();
    }
    std::vector<Tensor> flat;
    for (const Tensor& p : model.parameters()) flat.push_back(p.detach().reshape({-1}));
    trained.push_back(cat(flat, 0));
  }
  EXPECT_TRUE(identical("weights after two steps", trained[1], trained[0]));
}

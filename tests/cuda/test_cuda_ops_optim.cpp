// CUDA against the CPU, optimizers and loss scaling: the contracts that are not one op's values within a tolerance.
// The fused steps' values (SGD, Adam, AdamW, amsgrad; every state buffer; masters; f32 gradients of 16-bit
// parameters), unscaling, the underflow statistics and clip_grad_norm_ are op-table cases
// (tests/ops/op_cases_optim_amp.cpp). Here: a mixed parameter list in one step (one launch per dtype pair),
// stochastic rounding's draws shared by both devices, and the GradScaler's skip decisions and scale.
//
// Tests skip without a CUDA device; MP_CUDA_TESTS_ON_CPU=1 runs them with the CPU as the device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_util.hpp"
#include "ops/optim_tol.hpp"

using namespace mp;
using namespace mp::cuda_test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Shapes of the parameters of one optimizer: a scalar, a vector tail, a matrix and (for f32) a tensor
// larger than one block of the multi-tensor kernels.
std::vector<Shape> param_shapes(DType dt) {
  std::vector<Shape> s = {{1}, {1037}, {33, 65}};
  if (dt == DType::f32) s.push_back({(int64_t{1} << 18) + 3});
  return s;
}

// The same parameters on the CPU and on the device (leaves requiring grad).
struct Twins {
  std::vector<Tensor> cpu, dev;
};

Twins make_params(DType dt) {
  Twins t;
  for (const Shape& s : param_shapes(dt)) {
    const Tensor v = uniform(s, -1, 1, dt);
    t.cpu.push_back(cpu_leaf(v, true));
    t.dev.push_back(on_dev(v, true));
  }
  return t;
}

// Fresh gradients (the same values on both devices), in `gdt`.
void set_grads(const Twins& t, DType gdt, double scale = 1.0) {
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    const Tensor g = mul(uniform(t.cpu[i].sizes(), -1, 1, DType::f64), scale).to(gdt);
    t.cpu[i].set_grad(cpu_leaf(g));
    t.dev[i].set_grad(on_dev(g));
  }
}

// Compare parameters, every state buffer and the masters after a step.
// `buffer_atol`: an extra absolute allowance of the state buffers (see the callers).
void compare_state(const std::string& what, const optim::Optimizer& copt, const optim::Optimizer& dopt, const Twins& t,
                   bool master, int steps, double buffer_atol = 0.0) {
  for (size_t i = 0; i < t.cpu.size(); ++i) {
    const std::string w = what + " param " + std::to_string(i) + " " + shape_str(t.cpu[i].sizes());
    const DType dt = t.cpu[i].dtype();
    EXPECT_TRUE(close(w + " value", t.dev[i], t.cpu[i], param_tol(dt, master, steps)));
    const optim::ParamState* cs = copt.state(t.cpu[i]);
    const optim::ParamState* ds = dopt.state(t.dev[i]);
    ASSERT_TRUE(cs != nullptr && ds != nullptr) << w << ": no optimizer state";
    EXPECT_EQ(ds->step, cs->step) << w;
    EXPECT_EQ(ds->buffers.size(), cs->buffers.size()) << w;
    for (const auto& [name, buf] : cs->buffers) {
      auto it = ds->buffers.find(name);
      if (it == ds->buffers.end()) {
        ADD_FAILURE() << w << ": the device state lacks '" << name << "'";
        continue;
      }
      EXPECT_EQ(it->second.device(), dev()) << w << " " << name << " must live on the device";
      Tol bt = state_tol(buf.dtype(), steps);
      bt.atol += buffer_atol;
      EXPECT_TRUE(close(w + " " + name, it->second, buf, bt));
    }
  }
}

}  // namespace

// =============================================================================== SGD / Adam

// One step updates every parameter in one launch per (parameter dtype, gradient dtype) pair (Note [CUDA
// multi-tensor launch]): a mixed list as O2 leaves it (16-bit weights with f32 masters and f32 gradients beside
// f32 batch-norm parameters), a 16-bit parameter of several chunks, an empty one, an f64 one and a transposed
// (non-contiguous) one, which is updated through a contiguous copy written back.
TEST(CudaOptim, MixedParametersInOneStepMatchTheCpu) {
  MP_SKIP_WITHOUT_GPU();
  struct P {
    Shape shape;
    DType dt, gdt;
    bool transposed;
  };
  const std::vector<P> ps = {{{33, 65}, DType::bf16, DType::f32, false},
                             {{1037}, DType::f32, DType::f32, false},
                             {{(int64_t{1} << 15) + 5}, DType::f16, DType::f16, false},
                             {{0}, DType::bf16, DType::bf16, false},
                             {{7}, DType::f64, DType::f64, false},
                             {{19, 23}, DType::f32, DType::f32, true},
                             {{64}, DType::f32, DType::f32, false}};
  for (bool adam : {false, true}) {
    const std::string what = std::string(adam ? "AdamW" : "SGD momentum") + ", mixed parameters, f32 masters";
    guarded(what, [&] {
      Twins t;
      for (const P& p : ps) {
        const Tensor v = uniform(p.shape, -1, 1, p.dt);
        if (!p.transposed) {
          t.cpu.push_back(cpu_leaf(v, true));
          t.dev.push_back(on_dev(v, true));
          continue;
        }
        Tensor c = cpu_leaf(v).t(), d = on_dev(v).t();  // leaves whose storage is column-major
        t.cpu.push_back(c.requires_grad_(true));
        t.dev.push_back(d.requires_grad_(true));
      }
      std::unique_ptr<optim::Optimizer> copt, dopt;
      if (adam) {
        copt = std::make_unique<optim::AdamW>(t.cpu, optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
        dopt = std::make_unique<optim::AdamW>(t.dev, optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
      } else {
        copt = std::make_unique<optim::SGD>(t.cpu, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
        dopt = std::make_unique<optim::SGD>(t.dev, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      }
      copt->set_master_weights(true);
      dopt->set_master_weights(true);
      for (int step = 1; step <= 2; ++step) {
        for (size_t i = 0; i < ps.size(); ++i) {
          const Tensor g = uniform(t.cpu[i].sizes(), -1, 1, DType::f64).to(ps[i].gdt);
          t.cpu[i].set_grad(cpu_leaf(g));
          t.dev[i].set_grad(on_dev(g));
        }
        copt->step();
        dopt->step();
        EXPECT_FALSE(t.dev[5].is_contiguous()) << what << ": the transposed parameter keeps its layout";
        compare_state(what + " step " + std::to_string(step), *copt, *dopt, t, true, step);
      }
    });
  }
}

// Note [stochastic rounding]: 16-bit parameters without masters, rounded with the same random words per
// element on both devices (SGD and Adam; the vector path and the element-wise tail). The f32 values
// before rounding may differ by the FMA contraction's few f32 ulps (see above), which moves the
// outcome of an element's draw only when the draw falls within those ulps of its threshold: a chance
// of ~2^-13 or less per element and step. So the parameters agree within one 16-bit ulp per step and
// almost all elements bit for bit, while independent draws would disagree on about a third of them.
TEST(CudaOptim, StochasticRoundingMatchesTheCpu) {
  MP_SKIP_WITHOUT_GPU();
  for (DType dt : {DType::bf16, DType::f16}) {
    for (bool adam : {false, true}) {
      const std::string what =
          std::string(adam ? "Adam" : "SGD") + ", " + dtype_name(dt) + " params, stochastic rounding";
      guarded(what, [&] {
        const Twins t = make_params(dt);
        std::unique_ptr<optim::Optimizer> copt, dopt;
        if (adam) {
          copt = std::make_unique<optim::Adam>(t.cpu, optim::AdamOptions{.lr = 1e-3});
          dopt = std::make_unique<optim::Adam>(t.dev, optim::AdamOptions{.lr = 1e-3});
        } else {
          copt = std::make_unique<optim::SGD>(t.cpu, optim::SGDOptions{.lr = 1e-3, .momentum = 0.9});
          dopt = std::make_unique<optim::SGD>(t.dev, optim::SGDOptions{.lr = 1e-3, .momentum = 0.9});
        }
        copt->set_stochastic_rounding(true, 77);
        dopt->set_stochastic_rounding(true, 77);
        for (int step = 1; step <= 3; ++step) {
          set_grads(t, dt);
          copt->step();
          dopt->step();
          int64_t n = 0, same = 0;
          for (size_t i = 0; i < t.cpu.size(); ++i) {
            const std::string w = what + " step " + std::to_string(step) + " param " + std::to_string(i);
            EXPECT_TRUE(close(w, t.dev[i], t.cpu[i], param_tol(dt, false, step)));
            const std::vector<double> c = t.cpu[i].to_vector<double>(), d = t.dev[i].to(kCPU).to_vector<double>();
            for (size_t j = 0; j < c.size(); ++j) same += c[j] == d[j];
            n += static_cast<int64_t>(c.size());
          }
          EXPECT_GE(static_cast<double>(same), 0.99 * static_cast<double>(n))
              << what << " step " << step << ": " << n - same << " of " << n << " elements rounded differently";
        }
      });
    }
  }
}

// =============================================================================== loss scaling

TEST(CudaAmp, UnscaleMatchesTheCpuAndFindsInfNaNAnywhere) {
  MP_SKIP_WITHOUT_GPU();
  // Gradients of several tensors of several dtypes, scaled by S = 1024 (a power of two: unscaling is
  // exact, so the unscaled gradients must be identical).
  struct Poison {
    const char* name;
    size_t tensor;
    int64_t index;  // -1: last element
    double value;
  };
  const std::vector<Poison> poisons = {
      {"none", 0, 0, 0.0},
      {"inf in the last element of a vector tail", 1, -1, kInf},
      {"-inf first element of the large tensor", 3, 0, -kInf},
      {"NaN in the middle of an f16 gradient", 2, 700, kNaN},
      {"NaN in a one-element gradient", 0, 0, kNaN},
      {"inf in a bf16 gradient", 4, 11, kInf},
  };
  const std::vector<std::pair<Shape, DType>> grads = {{{1}, DType::f32},
                                                      {{1037}, DType::f32},
                                                      {{33, 65}, DType::f16},
                                                      {{(int64_t{1} << 20) + 3}, DType::f32},
                                                      {{129}, DType::bf16}};
  for (const Poison& p : poisons) {
    for (bool explicit_unscale : {true, false}) {
      const std::string what =
          std::string("GradScaler ") + p.name + (explicit_unscale ? ", unscale_ then step" : ", step only (fused)");
      guarded(what, [&] {
        Twins t;
        for (const auto& [s, dt] : grads) {
          const Tensor v = uniform(s, -1, 1, dt);
          t.cpu.push_back(cpu_leaf(v, true));
          t.dev.push_back(on_dev(v, true));
        }
        for (size_t i = 0; i < t.cpu.size(); ++i) {
          Tensor g = mul(uniform(t.cpu[i].sizes(), -1, 1, DType::f64), 1024.0).to(t.cpu[i].dtype());
          if (p.value != 0.0 && i == p.tensor) {
            const int64_t k = p.index < 0 ? g.numel() - 1 : p.index;
            g.view({-1}).narrow(0, k, 1).fill_(p.value);
          }
          t.cpu[i].set_grad(cpu_leaf(g));
          t.dev[i].set_grad(on_dev(g));
        }
        optim::SGD copt(t.cpu, {.lr = 0.5}), dopt(t.dev, {.lr = 0.5});
        amp::GradScaler cs({.init_scale = 1024.0}), ds({.init_scale = 1024.0});
        if (explicit_unscale) {
          cs.unscale_(copt);
          ds.unscale_(dopt);
          if (p.value == 0.0) {
            for (size_t i = 0; i < t.cpu.size(); ++i)
              EXPECT_TRUE(
                  identical(what + " unscaled gradient " + std::to_string(i), t.dev[i].grad(), t.cpu[i].grad()));
          }
        }
        const bool c_stepped = cs.step(copt), d_stepped = ds.step(dopt);
        EXPECT_EQ(c_stepped, p.value == 0.0) << what << " (CPU)";
        EXPECT_EQ(d_stepped, c_stepped) << what << ": the device " << (d_stepped ? "stepped" : "skipped");
        cs.update();
        ds.update();
        EXPECT_EQ(ds.get_scale(), cs.get_scale()) << what;
        for (size_t i = 0; i < t.cpu.size(); ++i)
          EXPECT_TRUE(close(what + " parameter " + std::to_string(i), t.dev[i], t.cpu[i],
                            Tol{.ulps = 1,
                                .atol = 2 * acc_roundoff(t.cpu[i].dtype()),
                                .why = "w - lr g / S (exact unscaling; FMA contraction may drop one rounding)"}));
      });
    }
  }
}

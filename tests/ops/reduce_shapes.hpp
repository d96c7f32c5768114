// The reductions' shapes and tolerances of the op table (tests/ops/op_cases_reduce_index_rnn.cpp).
#pragma once
#include <functional>
#include <vector>

#include "cuda/cuda_test_util.hpp"

namespace mp::cuda_test {

struct ReduceShape {
  const char* name;
  Shape leaf;
  std::function<Tensor(const Tensor&)> view;
  Shape dims;
  bool keepdim;
};

inline const std::vector<ReduceShape>& reduce_shapes() {
  static const std::vector<ReduceShape> v = {
      {"[1037] all", {1037}, [](const Tensor& t) { return t; }, {}, false},
      {"[33, 65] dim 1 (rows)", {33, 65}, [](const Tensor& t) { return t; }, {1}, false},
      {"[33, 65] dim 0 (columns)", {33, 65}, [](const Tensor& t) { return t; }, {0}, false},
      {"[33, 65] dims {0, 1} keepdim", {33, 65}, [](const Tensor& t) { return t; }, {0, 1}, true},
      {"[4, 5, 6, 7] dims {1, 3} keepdim", {4, 5, 6, 7}, [](const Tensor& t) { return t; }, {1, 3}, true},
      {"[4, 5, 6, 7] dims {0, 2}", {4, 5, 6, 7}, [](const Tensor& t) { return t; }, {0, 2}, false},
      {"[65, 33]^T dim 1", {65, 33}, [](const Tensor& t) { return t.t(); }, {1}, false},
      {"[8, 1, 9] -> [8, 5, 9] dim 1 (stride 0)",
       {8, 1, 9},
       [](const Tensor& t) {
         return t.expand({8, 5, 9});
       },
       {1},
       false},
      {"[8, 1, 9] -> [8, 5, 9] dims {0, 2}",
       {8, 1, 9},
       [](const Tensor& t) {
         return t.expand({8, 5, 9});
       },
       {0, 2},
       false},
  };
  return v;
}

inline int64_t reduced_count(const Shape& viewed, const Shape& dims) {
  if (dims.empty()) return shape_numel(viewed);
  int64_t k = 1;
  for (int64_t d : dims) k *= viewed[static_cast<size_t>(d < 0 ? d + static_cast<int64_t>(viewed.size()) : d)];
  return k;
}

// The gradient of a reduction is the upstream gradient expanded (exact); for the broadcast leaf it is
// also summed over the 5 broadcast copies.
inline Tol reduce_grad_tol(DType dt) {
  Tol t;
  t.ulps = 1;
  t.atol = 4 * 5 * acc_roundoff(dt);
  t.why =
      "expanded upstream gradient (exact), summed over <= 5 broadcast copies (order differs: <= 4 u_acc * 5 "
      "absolute for |g| < 1) and rounded once";
  return t;
}

}  // namespace mp::cuda_test

// The op table, reductions, indexing and recurrent cells (tests/ops/op_cases.hpp): sum / mean over rows, columns,
// several dims, transposed and broadcast views; var, sum_squares, max / argmax with ties and NaN; embedding (i64 and
// i32 indices, repeats, padding_idx); dropout (the Philox mask, the same on every device); the LSTM gates, the
// LSTM / GRU / tanh-RNN cells and a whole lstm_layer; large sums (exact on small integers), integer sums, sum_to_size;
// cat / stack / split / chunk / unbind. Folded from the hand-written CUDA tests with their tolerances and reasons;
// tests/cuda/test_cuda_ops_reduce.cpp keeps the contracts that are not one op's values (max with its indices and
// gradient, NaN propagation through every reduction).
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "op_cases.hpp"
#include "reduce_shapes.hpp"

namespace mp::op_table {

using namespace cuda_test;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

std::vector<OpCase> reduce_index_rnn_cases() {
  std::vector<OpCase> cases;
  for (size_t si = 0; si < reduce_shapes().size(); ++si) {
    for (const bool is_mean : {false, true}) {
      const ReduceShape& s = reduce_shapes()[si];
      cases.push_back({std::string(is_mean ? "mean " : "sum ") + s.name, all_floats(), [&s, is_mean](DType dt) {
                         const Tensor x = uniform(s.leaf, -1, 1, dt);
                         const int64_t K = reduced_count(s.view(x).sizes(), s.dims);
                         OpCheck chk;
                         chk.inputs = {x};
                         chk.fn = [&s, is_mean](const std::vector<Tensor>& in) {
                           const Tensor v = s.view(in[0]);
                           if (s.dims.empty() && !s.keepdim) return is_mean ? mean(v) : sum(v);
                           return is_mean ? mean(v, s.dims, s.keepdim) : sum(v, s.dims, s.keepdim);
                         };
                         chk.out = reduction_tol(dt, K);
                         chk.out_scale = [&s, is_mean, K](const std::vector<Tensor>& in) {
                           const Tensor a = abs(s.view(in[0]).detach().to(DType::f64));
                           const Tensor t = s.dims.empty() ? sum(a) : sum(a, s.dims, s.keepdim);
                           return is_mean ? mul(t, 1.0 / static_cast<double>(K)) : t;
                         };
                         chk.grad = reduce_grad_tol(dt);
                         return chk;
                       }});
    }
  }
  // A large sum (2^20 + 7 terms: many blocks and a tail).
  cases.push_back({"sum [2^20 + 7] all", {DType::f32, DType::bf16, DType::f64}, [](DType dt) {
                     const int64_t n = (int64_t{1} << 20) + 7;
                     OpCheck chk;
                     chk.inputs = {uniform({n}, -1, 1, dt)};
                     chk.fn = [](const std::vector<Tensor>& in) { return sum(in[0]); };
                     chk.out = reduction_tol(dt, n);
                     chk.out_scale = [](const std::vector<Tensor>& in) { return sum(abs(in[0].to(DType::f64))); };
                     return chk;
                   }});
  // var over every shape that reduces at least 2 values: two passes (mean, then squared deviations): the mean's
  // difference enters at second order, each term adds one rounding of the square: c = 4; 16-bit: the mean,
  // deviations and squares are rounded to the 16-bit dtype (identically, given the same mean; a mean one ulp apart
  // shifts every deviation): 2 ulps. Gradient 2 (x - mean) g / (K - 1): the devices' means differ by a rounding
  // (16-bit: the mean is rounded and may be one ulp apart), which shifts every x - mean: absolute 4 ulp(2) / (K - 1)
  // for 16-bit (|mean| < 2, |g| < 1), 8 u_acc otherwise; plus one rounding.
  for (size_t si = 0; si < reduce_shapes().size(); ++si) {
    const ReduceShape& s = reduce_shapes()[si];
    if (s.dims.empty()) continue;
    cases.push_back(
        {std::string("var ") + s.name, all_floats(), [&s](DType dt) {
           const Tensor x = uniform(s.leaf, -1, 2, dt);
           const int64_t K = reduced_count(s.view(x).sizes(), s.dims);
           OpCheck chk;
           chk.inputs = {x};
           chk.fn = [&s](const std::vector<Tensor>& in) { return var(s.view(in[0]), s.dims, 1, s.keepdim); };
           chk.out = reduction_tol(dt, K, 4, "; two passes");
           if (is_low_precision(dt)) chk.out.ulps = 2;
           // The mean's rounding d <= u(dt) |mean| (|x| <= 2) adds d^2 K / (K - 1) to a variance: seen where the
           // values are equal (the broadcast shape, whose exact variance is 0).
           chk.out.atol = 2 * std::pow(2 * unit_roundoff(dt), 2);
           chk.out.why += "; the mean's rounding squared";
           chk.out_scale = [&s](const std::vector<Tensor>& in) {
             return var(s.view(in[0]).detach().to(DType::f64), s.dims, 1, s.keepdim);
           };
           chk.grad =
               Tol{.ulps = 1,
                   .atol = is_low_precision(dt) ? 4 * ulp(dt, 2.0) / static_cast<double>(K - 1) : 8 * acc_roundoff(dt),
                   .why = "gradient of var: x - mean shifts with the mean's rounding"};
           return chk;
         }});
  }
  cases.push_back({"sum_squares [61, 17]^T", all_floats(), [](DType dt) {
                     OpCheck chk;
                     chk.inputs = {uniform({61, 17}, -2, 2, dt)};
                     chk.fn = [](const std::vector<Tensor>& in) { return sum_squares(in[0].t()); };
                     chk.out = reduction_tol(dt == DType::f64 ? DType::f64 : DType::f32, 1037);
                     chk.out_scale = [](const std::vector<Tensor>& in) {
                       return sum(square(in[0].detach().to(DType::f64)));
                     };
                     chk.grad = exact("2 g x: exact products");
                     return chk;
                   }});
  // Large sums: random data within the rounding bound, and small integers exactly. Integers in [-4, 4]: every
  // partial sum of fewer than 2^22 terms is an integer below 2^24 in magnitude, exact in f32 in any order, so the
  // devices must agree bit for bit (16-bit: the same rounding of the same exact sum): a lost or double-counted block
  // changes the result, where the random data's bound c sqrt(K) u sum|x| could hide a small one. Few outputs with
  // long rows, many outputs with long columns, and a transposed view of those.
  cases.push_back({"sum_squares [2^21 + 3]", {DType::f32, DType::bf16, DType::f64}, [](DType dt) {
                     const int64_t n = (int64_t{1} << 21) + 3;
                     OpCheck chk;
                     chk.inputs = {uniform({n}, 0, 1, dt)};
                     chk.fn = [](const std::vector<Tensor>& in) { return sum_squares(in[0]); };
                     chk.out = reduction_tol(dt == DType::f64 ? DType::f64 : DType::f32, n);
                     chk.out_scale = [](const std::vector<Tensor>& in) { return sum(square(in[0].to(DType::f64))); };
                     return chk;
                   }});
  const int64_t big = (int64_t{1} << 22) - 3, long_row = (int64_t{1} << 20) + 1;
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> exact_sums = {
      {"sum [2^22 - 3]", [](const Tensor& x) { return sum(x); }},
      {"mean [2^22 - 3]", [](const Tensor& x) { return is_floating(x.dtype()) ? mean(x) : sum(x); }},
      {"sum [3, 2^20 + 1] dim 1",
       [long_row](const Tensor& x) {
         return sum(x.narrow(0, 0, 3 * long_row).view({3, long_row}), {1});
       }},
      {"sum [65537, 63] dim 0",
       [](const Tensor& x) {
         return sum(x.narrow(0, 0, 65537 * 63).view({65537, 63}), {0});
       }},
      {"sum [65537, 63]^T dim 1",
       [](const Tensor& x) {
         return sum(x.narrow(0, 0, 65537 * 63).view({65537, 63}).t(), {1});
       }},
  };
  for (const auto& [name, f] : exact_sums) {
    cases.push_back({"exact " + name + " of small integers",
                     {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i64},
                     [f, big](DType dt) {
                       OpCheck chk;
                       chk.inputs = {integers({big}, -4, 5, dt)};
                       chk.fn = [f](const std::vector<Tensor>& in) { return f(in[0]); };
                       chk.out = exact("integer partial sums below 2^24: exact in any order");
                       chk.bit_exact_output = true;
                       return chk;
                     }});
  }
  cases.push_back({"exact sum_squares [2^21 + 5] of small integers", {DType::bf16}, [](DType dt) {
                     // |v| <= 2: squares <= 4, partial sums <= 4 (2^21 + 5) < 2^24: exact.
                     OpCheck chk;
                     chk.inputs = {integers({(int64_t{1} << 21) + 5}, -2, 3, dt)};
                     chk.fn = [](const std::vector<Tensor>& in) { return sum_squares(in[0]); };
                     chk.out = exact("integer partial sums below 2^24: exact in any order");
                     chk.bit_exact_output = true;
                     return chk;
                   }});
  // Integer sums are exact in i64.
  for (const auto& [name, f] : std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>>{
           {"all", [](const Tensor& x) { return sum(x); }},
           {"dim 0", [](const Tensor& x) { return sum(x, {0}); }},
           {"dim 1 of the transpose", [](const Tensor& x) { return sum(x.t(), {0}); }}}) {
    cases.push_back({"integer sum [33, 65] " + name, {DType::i64, DType::i32, DType::u8}, [f](DType dt) {
                       OpCheck chk;
                       chk.inputs = {integers({33, 65}, 0, 3, dt)};
                       chk.fn = [f](const std::vector<Tensor>& in) { return f(in[0]); };
                       chk.out = exact("integer sums: exact");
                       chk.bit_exact_output = true;
                       return chk;
                     }});
  }
  cases.push_back({"sum_to_size [4, 5, 6] -> [5, 1]", all_floats(), [](DType dt) {
                     OpCheck chk;
                     chk.inputs = {uniform({4, 5, 6}, -1, 1, dt)};
                     chk.fn = [](const std::vector<Tensor>& in) { return sum_to_size(in[0], {5, 1}); };
                     chk.out = reduction_tol(dt, 24);
                     chk.out_scale = [](const std::vector<Tensor>& in) {
                       return sum_to_size(abs(in[0].detach().to(DType::f64)), {5, 1});
                     };
                     chk.grad = exact("the upstream gradient expanded");
                     return chk;
                   }});
  cases.push_back({"sum_squares [1037]", all_floats(), [](DType dt) {
                     OpCheck chk;
                     chk.inputs = {uniform({1037}, -1, 1, dt)};
                     chk.fn = [](const std::vector<Tensor>& in) { return sum_squares(in[0]); };
                     chk.out = reduction_tol(dt, 1037, 2, "; squares: one more rounding each (or an FMA)");
                     chk.out.ulps = 2;
                     chk.out_scale = [](const std::vector<Tensor>& in) { return sum_squares(in[0].to(DType::f64)); };
                     chk.grad = Tol{.ulps = 1, .why = "2 g x: exact products up to one rounding"};
                     return chk;
                   }});
  // max / amax / argmax with ties (values from a small set) and NaN (NaN wins; the first extreme's index).
  for (const bool nan : {false, true}) {
    const std::string tag = nan ? " with NaN" : " with ties";
    cases.push_back({"max dim 1 values" + tag, all_floats(), [nan](DType dt) {
                       OpCheck chk;
                       Tensor x = from_set({17, 33}, {-2, -1, 0, 0.5, 1, 3}, dt);
                       if (nan) x.select(0, 3).narrow(0, 5, 1).fill_(kNaN);
                       chk.inputs = {x};
                       chk.fn = [](const std::vector<Tensor>& in) { return max(in[0], 1).first; };
                       chk.out = exact("a selection");
                       chk.bit_exact_output = true;
                       if (!nan) chk.grad = exact("the gradient goes to the first maximum");
                       return chk;
                     }});
    cases.push_back({"argmax dim 0" + tag, all_floats(), [nan](DType dt) {
                       OpCheck chk;
                       Tensor x = from_set({17, 33}, {-2, -1, 0, 0.5, 1, 3}, dt);
                       if (nan) x.select(0, 3).narrow(0, 5, 1).fill_(kNaN);
                       chk.inputs = {x};
                       chk.fn = [](const std::vector<Tensor>& in) { return argmax(in[0], 0); };
                       chk.out = exact("indices of the first extreme");
                       chk.bit_exact_output = true;
                       return chk;
                     }});
    cases.push_back({"amin / amax dims {0, 1}" + tag, all_floats(), [nan](DType dt) {
                       OpCheck chk;
                       Tensor x = from_set({17, 33}, {-2, -1, 0, 0.5, 1, 3}, dt);
                       if (nan) x.select(0, 3).narrow(0, 5, 1).fill_(kNaN);
                       chk.inputs = {x};
                       chk.fn = [](const std::vector<Tensor>& in) {
                         return stack({amax(in[0], {0, 1}), amin(in[0].t(), {0, 1})}, 0);
                       };
                       chk.out = exact("selections");
                       chk.bit_exact_output = true;
                       return chk;
                     }});
  }
  // amax / amin over every shape that reduces, on values from a small set (ties everywhere: the gradient splits
  // evenly among them), floats and integers; argmax of a transposed view; a long arg reduction.
  for (size_t si = 0; si < reduce_shapes().size(); ++si) {
    const ReduceShape& s = reduce_shapes()[si];
    if (s.dims.empty()) continue;
    for (const bool is_max : {true, false}) {
      cases.push_back(
          {std::string(is_max ? "amax " : "amin ") + s.name + " with ties",
           {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i64, DType::i32},
           [&s, is_max](DType dt) {
             OpCheck chk;
             chk.inputs = {is_floating(dt) ? from_set(s.leaf, {-3, -1, 0, 2, 2.5}, dt) : integers(s.leaf, -3, 3, dt)};
             chk.fn = [&s, is_max](const std::vector<Tensor>& in) {
               return is_max ? amax(s.view(in[0]), s.dims, s.keepdim) : amin(s.view(in[0]), s.dims, s.keepdim);
             };
             chk.out = exact("a selection");
             chk.bit_exact_output = true;
             // g / count * hit: exact, then the broadcast leaf's sum.
             if (is_floating(dt)) chk.grad = reduce_grad_tol(dt);
             return chk;
           }});
    }
  }
  for (const int64_t dim : {0, 1, -1}) {
    cases.push_back(
        {"argmax dim " + (dim < 0 ? "last" : std::to_string(dim)) + " of a transposed view with ties",
         {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i64, DType::i32},
         [dim](DType dt) {
           OpCheck chk;
           chk.inputs = {is_floating(dt) ? from_set({33, 65}, {-3, -1, 0, 2, 2.5}, dt) : integers({33, 65}, -3, 3, dt)};
           chk.fn = [dim](const std::vector<Tensor>& in) { return max(in[0].t(), dim).second; };
           chk.out = exact("indices of the first extreme");
           chk.bit_exact_output = true;
           return chk;
         }});
  }
  cases.push_back({"argmax and max() of [2, 300001]", {DType::f32}, [](DType dt) {
                     OpCheck chk;
                     chk.inputs = {from_set({2, 300001}, {-1, 0, 1, 5}, dt)};
                     chk.fn = [](const std::vector<Tensor>& in) {
                       return cat({argmax(in[0], 1).to(DType::f64), max(in[0]).reshape({1}).to(DType::f64)}, 0);
                     };
                     chk.out = exact("indices of the first extreme and a selection");
                     chk.bit_exact_output = true;
                     return chk;
                   }});
  // cat (with dtype promotion and an empty input), stack, split / chunk / unbind: copies.
  cases.push_back(
      {"cat dim 0 with a wider dtype and an empty input", all_floats(), [](DType dt) {
         const DType other = dt == DType::f32 ? DType::f16 : DType::f32;
         OpCheck chk;
         chk.inputs = {uniform({3, 7}, -2, 2, dt), uniform({5, 7}, -2, 2, other), zeros({0}, {.dtype = dt})};
         chk.fn = [](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[2]}, 0); };
         chk.out = exact("copies and exact widening casts");
         // The f32 gradient of a 16-bit input rounds to it once, identically on both: slack only.
         chk.grad = Tol{.ulps = 1, .why = "slices of the upstream gradient, cast back"};
         chk.grad_inputs = {0, 1};
         return chk;
       }});
  cases.push_back({"cat dim 1 of transposed views", all_floats(), [](DType dt) {
                     OpCheck chk;
                     chk.inputs = {uniform({6, 4}, -2, 2, dt), uniform({9, 4}, -2, 2, dt)};
                     chk.fn = [](const std::vector<Tensor>& in) { return cat({in[0].t(), in[1].t()}, 1); };
                     chk.out = exact("copies");
                     chk.grad = exact("slices of the upstream gradient");
                     return chk;
                   }});
  cases.push_back({"stack dim 1", all_floats(), [](DType dt) {
                     OpCheck chk;
                     chk.inputs = {uniform({5, 3}, -2, 2, dt), uniform({5, 3}, -2, 2, dt), uniform({5, 3}, -2, 2, dt)};
                     chk.fn = [](const std::vector<Tensor>& in) { return stack({in[0], in[1], in[2]}, 1); };
                     chk.out = exact("copies");
                     chk.grad = exact("slices of the upstream gradient");
                     return chk;
                   }});
  cases.push_back({"split / chunk / unbind, recombined", all_floats(), [](DType dt) {
                     OpCheck chk;
                     chk.inputs = {uniform({10, 6}, -2, 2, dt)};
                     chk.fn = [](const std::vector<Tensor>& in) {
                       const auto parts = split(in[0], 4, 0);    // 4, 4, 2 rows
                       const auto cols = chunk(parts[1], 3, 1);  // 3 column pairs
                       const auto rows = unbind(parts[2], 0);    // 2 rows of 6
                       return cat({parts[0].t().contiguous().view({-1}), cols[2].contiguous().view({-1}) * 2.0,
                                   stack({rows[1], rows[0]}, 0).view({-1})},
                                  0);
                     };
                     chk.out = exact("views, copies and an exact product");
                     chk.grad = exact("slices of the upstream gradient into one buffer per node");
                     return chk;
                   }});
  // embedding.
  struct Emb {
    const char* name;
    int64_t V, D;
    Shape idx;
    int64_t padding;
  };
  const std::vector<Emb> embs = {
      {"V 50, D 33, [7, 9] indices (many repeats)", 50, 33, {7, 9}, -1},
      {"V 1000, D 8, [4, 300]", 1000, 8, {4, 300}, -1},
      {"V 20, D 257, [64] padding_idx 3", 20, 257, {64}, 3},
      {"V 5, D 16, [2000] (heavy repeats)", 5, 16, {2000}, -1},
  };
  for (const DType it : {DType::i64, DType::i32}) {
    for (const Emb& k : embs) {
      cases.push_back(
          {std::string("embedding ") + dtype_name(it) + " indices, " + k.name, all_floats(), [k, it](DType dt) {
             const Tensor idx = integers(k.idx, 0, k.V, it);
             std::map<int64_t, int64_t> counts;
             for (int64_t i : idx.to_vector<int64_t>()) ++counts[i];
             int64_t R = 1;
             for (const auto& kv : counts) R = std::max(R, kv.second);
             OpCheck chk;
             chk.inputs = {uniform({k.V, k.D}, -1, 1, dt), idx};
             const int64_t pad = k.padding;
             chk.fn = [pad](const std::vector<Tensor>& in) { return embedding(in[0], in[1], pad); };
             chk.out = exact("a gather");
             chk.bit_exact_output = true;
             // Rows hit R times sum R gradient rows (f32 accumulation) in another order, rounded once.
             chk.grad = reduction_tol(dt, R, 2, "; embedding backward: repeated indices add rows");
             chk.abs_scales = true;
             chk.grad_inputs = {0};
             return chk;
           }});
    }
  }
  // dropout (Note [dropout mask]): element i keeps its value when philox_uniform(seed, offset, i) >= p, on every
  // device and dtype, so the same generator state gives the same mask; offset 6 is not a multiple of 4.
  for (const double p : {0.1, 0.5, 1.0}) {
    for (const uint64_t offset : {uint64_t{0}, uint64_t{6}}) {
      cases.push_back(
          {"dropout p " + std::to_string(p).substr(0, 3) + " offset " + std::to_string(offset) + " [37, 29]",
           all_floats(), [p, offset](DType dt) {
             OpCheck chk;
             chk.inputs = {uniform({37, 29}, 0.5, 2, dt)};  // nonzero: a dropped element is visible
             chk.fn = [p, offset](const std::vector<Tensor>& in) {
               default_generator().set_state(1234, offset);
               return dropout(in[0], p, true);
             };
             chk.out = exact("the same mask; x / (1 - p): one IEEE operation");
             chk.bit_exact_output = true;
             chk.grad = exact("the same mask and scale");
             return chk;
           }});
    }
  }
  // The LSTM gates, cells and a layer (folded from test_cuda_ops_seq.cpp, CudaRnn.LstmGatesCellsAndLayer).
  for (const bool f32_state : {false, true}) {
    cases.push_back({std::string("lstm_gates [5, 148]") + (f32_state ? " with an f32 cell state" : ""),
                     f32_state ? std::vector<DType>{DType::f16, DType::bf16} : all_floats(), [f32_state](DType dt) {
                       const int64_t B = 5, H = 37;
                       const DType cdt = f32_state ? DType::f32 : dt;
                       OpCheck g;
                       g.inputs = {uniform({B, 4 * H}, -3, 3, dt), uniform({B, H}, -2, 2, cdt)};
                       g.fn = [](const std::vector<Tensor>& in) {
                         auto [h, c] = lstm_gates(in[0], in[1]);
                         return cat({h.reshape({-1}), c.reshape({-1})}, 0);
                       };
                       // Gate arithmetic (sigmoid, tanh on each device's libm: <= 5 and 4 ulps, Note in the unary
                       // cases): c' = f c + i g and h' = o tanh(c') differ by <= (5 |c| + 20) u with |c| < 2: 32 u
                       // absolute, 4 ulps.
                       const DType out_dt = promote_types(dt, cdt);
                       g.out = Tol{
                           .ulps = 4, .atol = 32 * acc_roundoff(out_dt), .why = "sigmoid / tanh of each device's libm"};
                       g.grad = Tol{.ulps = 4,
                                    .atol = 256 * acc_roundoff(out_dt),
                                    .why =
                                        "gate gradients: products of up to 5 activations, each a few ulps apart, and "
                                        "1 - s cancels"};
                       return g;
                     }});
  }
  enum class Cell { lstm, gru, rnn_tanh };
  for (const Cell cell : {Cell::lstm, Cell::gru, Cell::rnn_tanh}) {
    const char* name = cell == Cell::lstm ? "lstm_cell" : cell == Cell::gru ? "gru_cell" : "rnn_tanh_cell";
    cases.push_back(
        {std::string(name) + " B 5, I 23, H 37", all_floats(), [cell](DType dt) {
           const int64_t B = 5, I = 23, H = 37;
           const int64_t G = cell == Cell::lstm ? 4 : cell == Cell::gru ? 3 : 1;
           // Cells: the gates come from GEMMs (K = I + H terms of |x w| <= 0.3: <= 2 sqrt(H) u 18 = 220 u
           // apart), then the activations (slopes <= 1 + |c|): 512 u_acc. 16-bit: the GEMM outputs are
           // rounded to 16 bits and may be one ulp apart (ulp(dt, 4) for |gates| < 4), times the
           // slopes: 2 ulp(dt, 4).
           const double atol = is_low_precision(dt) ? 2 * ulp(dt, 4.0) : 512 * acc_roundoff(dt);
           OpCheck chk;
           chk.inputs = {uniform({B, I}, -1, 1, dt), uniform({B, H}, -1, 1, dt)};
           if (cell == Cell::lstm) chk.inputs.push_back(uniform({B, H}, -2, 2, dt));
           for (const Shape& s : {Shape{G * H, I}, Shape{G * H, H}, Shape{G * H}, Shape{G * H}})
             chk.inputs.push_back(uniform(s, -0.3, 0.3, dt));
           chk.fn = [cell](const std::vector<Tensor>& in) {
             if (cell == Cell::gru) return gru_cell(in[0], in[1], in[2], in[3], in[4], in[5]);
             if (cell == Cell::rnn_tanh) return rnn_tanh_cell(in[0], in[1], in[2], in[3], in[4], in[5]);
             auto [h, c] = lstm_cell(in[0], in[1], in[2], in[3], in[4], in[5], in[6]);
             return cat({h.reshape({-1}), c.reshape({-1})}, 0);
           };
           chk.out = Tol{.ulps = 2, .atol = atol, .why = "GEMMs (accumulation order) feeding the gate activations"};
           chk.grad = Tol{.ulps = 2,
                          .normwise = is_low_precision(dt) ? 8 * unit_roundoff(dt) : 2048 * acc_roundoff(dt),
                          .why =
                              "cell gradients through the activations and the GEMMs (relative to the "
                              "largest)"};
           chk.f64_may_be_unsupported = true;
           return chk;
         }});
  }
  // A whole layer over T = 6 steps (one node; the f32 cell state carries over): the per-step differences add up
  // over the steps (x T); 16-bit: h is rounded to 16 bits each step and feeds the next GEMM.
  cases.push_back(
      {"lstm_layer T 6, B 4, H 16", all_floats(), [](DType dt) {
         const int64_t T = 6, Bl = 4, Hl = 16;
         const DType sdt = dt == DType::f64 ? DType::f64 : DType::f32;
         OpCheck ll;
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
         return ll;
       }});
  return cases;
}

}  // namespace mp::op_table

// The op table, element-wise ops (tests/ops/op_cases.hpp): every unary and binary op, forward and backward,
// in f32/f16/bf16/f64, on contiguous, transposed and broadcast (stride 0) operands, vector tails, misaligned
// large tensors, special values (inf, NaN, signed zero), ties, comparisons, where, integers, in-place ops on
// strided targets. Folded from tests/cuda/test_cuda_ops.cpp (CudaPointwise.*), tolerances and reasons unchanged.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "op_cases.hpp"

namespace mp::op_table {

using namespace cuda_test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A view of a leaf (applied on both devices), so ops see strided or broadcast operands.
struct View {
  const char* name;
  Shape leaf_shape;
  std::function<Tensor(const Tensor&)> apply;
};

// 1037 = 17 * 61: not a multiple of 8 (vector tails); the transposed and the broadcast (stride 0)
// views go through the general strided path.
const std::vector<View>& unary_views() {
  static const std::vector<View> v = {
      {"contiguous [1037]", {1037}, [](const Tensor& t) { return t; }},
      {"transposed [61, 17]^T", {61, 17}, [](const Tensor& t) { return t.t(); }},
      {"broadcast [8, 1, 9] -> [8, 5, 9]",
       {8, 1, 9},
       [](const Tensor& t) {
         return t.expand({8, 5, 9});
       }},
  };
  return v;
}

// A 16-bit result computed from the same f32 values on both devices rounds identically; f32 results
// that differ by a few ulps round to equal or adjacent 16-bit values.
Tol per_dtype(DType dt, double f32_ulps, double f64_ulps, double ulps16, double atol_f32, double atol_f64,
              double atol16, const std::string& why) {
  Tol t;
  t.ulps = dt == DType::f32 ? f32_ulps : dt == DType::f64 ? f64_ulps : ulps16;
  t.atol = dt == DType::f32 ? atol_f32 : dt == DType::f64 ? atol_f64 : atol16;
  t.why = why;
  return t;
}

struct UnaryCase {
  std::string name;
  std::function<Tensor(const Tensor&)> fn;
  double lo, hi;
  std::function<Tol(DType)> fwd, bwd;
};

// The unary ops with their tolerances. CUDA's documented maximum errors (CUDA C++ Programming Guide,
// "Mathematical Functions", default flags: -prec-div=true, -prec-sqrt=true, no fast math): expf 2,
// logf 1, tanhf 2, erff 2, powf 4 ulp; +, -, *, /, sqrt correctly rounded (0 ulp). The CPU's float
// transcendentals (fast_math.hpp, Note [fast float transcendentals]): fast_exp 1.03, fast_log 0.97,
// fast_tanh 1.08, fast_sigmoid 1.46, fast_erf 1.0 ulp; glibc powf < 1 ulp. Two results each within
// e1 and e2 ulps of the exact value are within e1 + e2 of each other: that sum, rounded up, is the
// f32 allowance. f64: CUDA's double exp/log 1, tanh/erf/pow 2 ulp, glibc < 1 ulp.
std::vector<UnaryCase> unary_cases() {
  auto ex = [](DType) { return exact(); };
  const double u = std::ldexp(1.0, -24), u64 = std::ldexp(1.0, -53);
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, -4, 4, ex, ex},
      {"abs", [](const Tensor& x) { return abs(x); }, -4, 4, ex, ex},
      {"relu", [](const Tensor& x) { return relu(x); }, -4, 4, ex, ex},
      {"square", [](const Tensor& x) { return square(x); }, -4, 4, ex, ex},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.1, 4, ex, ex},
      {"clamp(-1, 1.5)", [](const Tensor& x) { return clamp(x, -1.0, 1.5); }, -4, 4, ex, ex},
      {"x + 2.5", [](const Tensor& x) { return x + 2.5; }, -4, 4, ex, ex},
      {"x * -1.5", [](const Tensor& x) { return x * -1.5; }, -4, 4, ex, ex},
      {"2 - x", [](const Tensor& x) { return 2.0 - x; }, -4, 4, ex, ex},
      {"x / 3", [](const Tensor& x) { return x / 3.0; }, -4, 4, ex, ex},
      {"pow(x, 3)", [](const Tensor& x) { return pow(x, 3.0); }, -2, 2,
       [](DType dt) { return libm_tol(dt, 6, 3, "powf: CUDA 4 ulp + glibc < 1 ulp"); },
       [](DType) { return exact("backward 3 g x^2 uses x*x (PowScalarFn's p == 2 path): exact"); }},
      {"pow(x, 0.5)", [](const Tensor& x) { return pow(x, 0.5); }, 0.1, 4, ex,
       [](DType dt) {
         Tol t = libm_tol(dt, 7, 4, "backward g * 0.5 x^-0.5: powf (CUDA 4 + glibc < 1 ulp) and the products");
         if (is_low_precision(dt)) t.ulps = 2;  // pow's 16-bit value may differ by 1 ulp, the products round again
         return t;
       }},
      {"pow(x, 1.7)", [](const Tensor& x) { return pow(x, 1.7); }, 0.1, 4,
       [](DType dt) { return libm_tol(dt, 6, 3, "powf: CUDA 4 ulp + glibc < 1 ulp"); },
       [](DType dt) {
         Tol t = libm_tol(dt, 7, 4, "backward g * 1.7 x^0.7: powf (CUDA 4 + glibc < 1 ulp) and two products");
         if (is_low_precision(dt)) t.ulps = 2;  // pow's 16-bit value may differ by 1 ulp, the products round again
         return t;
       }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.1, 4,
       [](DType dt) {
         return libm_tol(dt, 2, 1,
                         "1/sqrt(x): correctly rounded sqrt and division on both (exact), but CUDA's "
                         "rsqrtf (2 ulp) may stand in for 1/sqrtf under other flags");
       },
       [](DType dt) {
         return per_dtype(dt, 8, 4, 4, 0, 0, 0,
                          "backward -g y^3 / 2 from y = rsqrt(x): y may differ by 2 ulp (f32) "
                          "or 1 ulp (16-bit), cubed: 3x, plus the products' roundings");
       }},
      {"exp", [](const Tensor& x) { return exp(x); }, -4, 4,
       [](DType dt) { return libm_tol(dt, 4, 2, "expf: CUDA 2 ulp + fast_exp 1.03 ulp"); },
       [](DType dt) {
         return per_dtype(dt, 5, 3, 2, 0, 0, 0, "backward g * exp(x): the forward's difference plus one product");
       }},
      {"log", [](const Tensor& x) { return log(x); }, 0.1, 4,
       [](DType dt) {
         return libm_tol(dt, 3, 2, "logf: CUDA 1 ulp + fast_log 0.97 ulp (both relative to the result)");
       },
       [](DType) { return exact("backward g / x: one correctly rounded division"); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }, -4, 4,
       [](DType dt) { return libm_tol(dt, 4, 3, "tanhf: CUDA 2 ulp + fast_tanh 1.08 ulp"); },
       [u, u64](DType dt) {
         // g (1 - y^2): y may differ by 4 f32 ulps (<= 4 * 2^-24 absolute, |y| < 1), so 1 - y^2 by 8 * 2^-24 plus
         // an FMA contraction's 2^-24: absolute, as 1 - y^2 cancels near |y| = 1. 16-bit: y may differ by one
         // 16-bit ulp (<= 2^-p below 1), so 1 - y^2 by 2 * 2^-p (|g| < 1).
         return per_dtype(
             dt, 2, 2, 1, 10 * u, 10 * u64, 2 * unit_roundoff(dt),
             "backward g (1 - y^2) with y = tanh(x) from the forward: absolute, 1 - y^2 cancels near |y| = 1");
       }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -6, 6,
       [](DType dt) {
         return libm_tol(dt, 5, 3,
                         "GPU sigmoid = expf(-|x|) (2 ulp), e / (1 + e) and 1 - q: <= 3.5 ulp; CPU "
                         "fast_sigmoid 1.46 ulp");
       },
       [u, u64](DType dt) {
         return per_dtype(dt, 3, 2, 1, 7 * u, 7 * u64, 2 * unit_roundoff(dt),
                          "backward g y (1 - y): y may differ by 5 f32 ulps (16-bit: 1 ulp <= 2^-p), absolute as 1 - y "
                          "cancels near y = 1");
       }},
      {"gelu", [](const Tensor& x) { return gelu(x); }, -4, 4,
       [u, u64](DType dt) {
         // x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)): erff CUDA 2 + fast_erf 1 ulp (<= 3 * 2^-24 absolute, |erf| < 1)
         // and the rounding of 1 + erf on each device (2 * 2^-24): 5 * 2^-24, times 0.5 |x| <= 2 -> 10 * 2^-24
         // absolute (1 + erf cancels for x < 0), plus the products' roundings. 16-bit: one ulp after rounding
         // plus the same absolute term where the result is tiny.
         return per_dtype(dt, 3, 3, 1, 16 * u, 16 * u64, 16 * u,
                          "erf of CUDA (2 ulp) vs fast_erf (1 ulp), absolute: 1 + erf(x / sqrt 2) cancels for x < 0");
       },
       [u, u64](DType dt) {
         return per_dtype(dt, 3, 3, 1, 16 * u, 16 * u64, 16 * u,
                          "backward g (Phi(x) + x phi(x)): the erf difference as in the forward (absolute), expf "
                          "(CUDA 2 + fast_exp 1.03 ulp) in phi, all in f32 from the same 16-bit inputs");
       }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApproximate::tanh); }, -4, 4,
       [u, u64](DType dt) {
         // 0.5 x (1 + tanh(k (x + a x^3))): tanhf CUDA 2 + fast_tanh 1.08 ulp (<= 4 * 2^-24 absolute, |tanh| < 1),
         // the inner polynomial's roundings (FMA contraction differs), and 1 + tanh cancels for x < 0: absolute,
         // times 0.5 |x| <= 2, as for the exact gelu above.
         return per_dtype(dt, 3, 3, 1, 16 * u, 16 * u64, 16 * u,
                          "tanh of CUDA (2 ulp) vs fast_tanh (1.08 ulp), absolute: 1 + tanh(...) cancels for x < 0");
       },
       [u, u64](DType dt) {
         return per_dtype(dt, 3, 3, 1, 16 * u, 16 * u64, 16 * u,
                          "backward 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2): the tanh difference as in the "
                          "forward (absolute: 1 + t and 1 - t^2 cancel), all in f32 from the same 16-bit inputs");
       }},
  };
}

// Gradient of a broadcast input: the sum over K broadcast positions of per-element gradients of
// magnitude <= M that may each differ by elem_ulps ulps of dt (ulp <= 2 u M); the f32 (f64)
// accumulation order differs (2 sqrt(K) u_acc K M); then one rounding to dt.
Tol broadcast_grad_tol(DType dt, int64_t K, double M, double elem_ulps) {
  Tol t;
  t.ulps = std::max(1.0, elem_ulps);
  t.atol = static_cast<double>(K) * M * elem_ulps * 2 * unit_roundoff(dt) +
           2 * std::sqrt(static_cast<double>(K)) * acc_roundoff(dt) * static_cast<double>(K) * M;
  t.why = "gradient of a broadcast input: a sum of " + std::to_string(K) +
          " per-element gradients (summation order differs), rounded once to the input's dtype";
  return t;
}

// Binary ops: name, op, input ranges, a bound of |per-element gradient| for |g| < 1 (for broadcast sums), forward
// tolerance, per-element gradient differences in ulps (f32, 16-bit).
struct BinaryCase {
  std::string name;
  std::function<Tensor(const Tensor&, const Tensor&)> fn;
  double alo, ahi, blo, bhi;
  double grad_bound;
  std::function<Tol(DType)> fwd;
  double grad_elem_ulps_f32, grad_elem_ulps16;
};

std::vector<BinaryCase> binary_cases() {
  const double u = std::ldexp(1.0, -24);
  auto ex = [](DType) { return exact(); };
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, -2, 2, -2, 2, 1, ex, 0, 0},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, -2, 2, -2, 2, 1, ex, 0, 0},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, -2, 2, -2, 2, 2, ex, 0, 0},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, -2, 2, 0.5, 2, 8, ex, 0, 0},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, -2, 2, -2, 2, 1, ex, 0, 0},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, -2, 2, -2, 2, 1, ex, 0, 0},
      {"add(alpha = 0.3)", [](const Tensor& a, const Tensor& b) { return add(a, b, 0.3); }, -2, 2, -2, 2, 1,
       [u](DType dt) {
         // a + 0.3 b: either device may fuse it into one FMA (nvcc does by default, GCC in the AVX-512 loops):
         // the product's rounding (<= 2^-24 |0.3 b| <= 0.6 * 2^-24) may be missing on one side.
         return per_dtype(dt, 1, 1, 1, 2 * u, 2 * std::ldexp(1.0, -53), 2 * u,
                          "a + alpha b may be one FMA on one device and two roundings on the other");
       },
       0, 0},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, 0.5, 2, -1.5, 1.5, 10,
       [](DType dt) { return libm_tol(dt, 6, 3, "powf: CUDA 4 ulp + glibc < 1 ulp"); }, 12, 3},
  };
}

struct BinaryShapes {
  const char* name;
  Shape a, b;
  bool transpose_a;  // a's leaf is stored transposed
  int64_t K;         // the largest number of broadcast positions summed in a gradient
};

const std::vector<BinaryShapes>& binary_shapes() {
  static const std::vector<BinaryShapes> v = {
      {"same shape [1037]", {1037}, {1037}, false, 1},
      {"[16, 33] + [33]", {16, 33}, {33}, false, 16},
      {"[5, 1, 7] + [1, 6, 1]", {5, 1, 7}, {1, 6, 1}, false, 35},
      {"[16, 33] (transposed leaf) + [16, 33]", {33, 16}, {16, 33}, true, 1},
      {"[] (0-dim) + [40, 3]", {}, {40, 3}, false, 120},
  };
  return v;
}

// Values with ties, NaN, infinities and signed zeros, for comparisons and special-value propagation.
const std::vector<double>& special_values() {
  static const std::vector<double> v = {kNaN, kInf, -kInf, 0.0, -0.0, 1.0, -1.0, 100.0, -100.0, 1e-30};
  return v;
}

}  // namespace

std::vector<OpCase> pointwise_cases() {
  std::vector<OpCase> cases;
  for (const UnaryCase& c : unary_cases()) {
    for (const View& v : unary_views()) {
      // The broadcast view's gradient is a sum over 5 copies (the reduction cases cover that path): forward only.
      const bool broadcast = v.leaf_shape.size() == 3;
      cases.push_back({c.name + " " + v.name, all_floats(), [c, v, broadcast](DType dt) {
                         OpCheck chk;
                         chk.inputs = {uniform(v.leaf_shape, c.lo, c.hi, dt)};
                         chk.fn = [c, v](const std::vector<Tensor>& in) { return c.fn(v.apply(in[0])); };
                         chk.out = c.fwd(dt);
                         if (!broadcast) chk.grad = c.bwd(dt);
                         return chk;
                       }});
    }
  }
  for (const BinaryCase& c : binary_cases()) {
    for (const BinaryShapes& s : binary_shapes()) {
      cases.push_back(
          {c.name + " " + s.name, all_floats(), [c, s](DType dt) {
             OpCheck chk;
             chk.inputs = {uniform(s.a, c.alo, c.ahi, dt), uniform(s.b, c.blo, c.bhi, dt)};
             const bool tr = s.transpose_a;
             chk.fn = [c, tr](const std::vector<Tensor>& in) { return c.fn(tr ? in[0].t() : in[0], in[1]); };
             chk.out = c.fwd(dt);
             const double eu = is_low_precision(dt) ? c.grad_elem_ulps16 : c.grad_elem_ulps_f32;
             if (s.K > 1)
               chk.grad = broadcast_grad_tol(dt, s.K, c.grad_bound, eu);
             else if (eu == 0)
               chk.grad = exact("element-wise gradients of IEEE operations");
             else
               chk.grad =
                   Tol{.ulps = eu, .why = "element-wise gradients through powf/logf (CUDA vs glibc) and products"};
             return chk;
           }});
      if (s.K > 1) {
        // Against f64: a 16-bit gradient of a broadcast input sums K per-element gradients that were each rounded
        // to the dtype (both devices alike, as PyTorch does), and cancellation in the sum can make it small while
        // those roundings are not: measured 6.3e-3 on a 0-dim bf16 mul gradient of 0.12 (120 terms). A random walk
        // of K roundings of at most u |term| <= u M: 4 sqrt(K) M u bounds it.
        const double K = static_cast<double>(s.K), M = c.grad_bound;
        const double e16 = c.grad_elem_ulps16, e32 = c.grad_elem_ulps_f32;
        cases.back().accuracy_grad = [K, M, e16, e32](DType dt) {
          const double eu = is_low_precision(dt) ? e16 : e32;
          Tol t = op_table::accuracy_tol(broadcast_grad_tol(dt, static_cast<int64_t>(K), M, eu), dt);
          if (is_low_precision(dt)) {
            t.atol += 4 * std::sqrt(K) * M * unit_roundoff(dt);
            t.why += "; + 4 sqrt(K) M u(dt): the K per-element gradients rounded to the dtype before the sum";
          }
          return t;
        };
      }
    }
  }
  // Mixed dtypes: the result has the promoted dtype and is computed in it; the gradients come back in each
  // input's dtype. The case's dtype is the first input's.
  const std::vector<std::pair<DType, DType>> mixes = {
      {DType::f16, DType::f32}, {DType::bf16, DType::f16}, {DType::f32, DType::f64}, {DType::bf16, DType::f32}};
  for (const auto& [da, db] : mixes) {
    for (const std::string op : {"add", "mul", "maximum"}) {
      const DType b_dt = db;
      cases.push_back(
          {op + " " + dtype_name(da) + " x " + dtype_name(db) + " [16, 33] with [33]", {da}, [op, b_dt](DType a_dt) {
             OpCheck chk;
             chk.inputs = {uniform({16, 33}, -2, 2, a_dt), uniform({33}, -2, 2, b_dt)};
             chk.fn = [op](const std::vector<Tensor>& in) {
               return op == "add" ? in[0] + in[1] : op == "mul" ? in[0] * in[1] : maximum(in[0], in[1]);
             };
             chk.out = exact("one IEEE operation in the promoted dtype on exactly converted inputs");
             chk.grad =
                 broadcast_grad_tol(a_dt == DType::f64 || b_dt == DType::f64 ? DType::f64 : DType::bf16, 16, 2, 0);
             return chk;
           }});
    }
  }
  // Integer and float mixes: i64 with f32 computes in f32.
  cases.push_back({"add f32 x i64 [16, 33] with [33]", {DType::f32}, [](DType dt) {
                     OpCheck chk;
                     chk.inputs = {uniform({16, 33}, -2, 2, dt), integers({33}, -50, 50, DType::i64)};
                     chk.fn = [](const std::vector<Tensor>& in) { return in[0] + in[1]; };
                     chk.out = exact();
                     return chk;
                   }});
  // Ties of maximum / minimum split the gradient.
  for (const std::string op : {"maximum", "minimum"}) {
    cases.push_back({op + " with ties [300]", all_floats(), [op](DType dt) {
                       OpCheck chk;
                       chk.inputs = {from_set({300}, {-1, 0, 0.5, 2}, dt), from_set({300}, {-1, 0, 0.5, 2}, dt)};
                       const bool is_max = op == "maximum";
                       chk.fn = [is_max](const std::vector<Tensor>& in) {
                         return is_max ? maximum(in[0], in[1]) : minimum(in[0], in[1]);
                       };
                       chk.out = exact("a selection");
                       chk.grad = exact("g, 0 or g / 2 (ties): exact");
                       return chk;
                     }});
  }
  // Comparisons: small value sets (equal elements occur), NaN in the float sets (every comparison with NaN is
  // false, except ne); [16, 33] against [33], and transposed against a column. Bit-identical results.
  using Cmp = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, Cmp>> cmps = {
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }}};
  const std::vector<std::pair<DType, DType>> pairs = {
      {DType::f32, DType::f32}, {DType::f16, DType::f16}, {DType::bf16, DType::bf16}, {DType::f64, DType::f64},
      {DType::f16, DType::f32}, {DType::i64, DType::i64}, {DType::i32, DType::i64},   {DType::f32, DType::i64},
      {DType::u8, DType::u8},   {DType::b8, DType::b8}};
  for (const auto& [da, db] : pairs) {
    for (const auto& [name, f] : cmps) {
      for (const bool transposed : {false, true}) {
        const DType b_dt = db;
        const Cmp fn = f;
        cases.push_back({name + " " + dtype_name(da) + " x " + dtype_name(db) + (transposed ? " transposed" : ""),
                         {da},
                         [b_dt, fn, transposed](DType a_dt) {
                           auto sample = [](DType dt, const Shape& s) {
                             if (dt == DType::b8) return integers(s, 0, 2, DType::b8);
                             if (!is_floating(dt)) return integers(s, 0, 3, dt);
                             return from_set(s, {-1, 0, 1.5, 2, kNaN}, dt);
                           };
                           OpCheck chk;
                           chk.inputs = {sample(a_dt, {16, 33}), sample(b_dt, {33})};
                           chk.fn = [fn, transposed](const std::vector<Tensor>& in) {
                             return transposed ? fn(in[0].t(), in[1].unsqueeze(1)) : fn(in[0], in[1]);
                           };
                           chk.out = exact("a comparison");
                           chk.bit_exact_output = true;
                           return chk;
                         }});
      }
    }
  }
  // where(cond, a, b): cond of any dtype (nonzero = true), broadcasting, promotion; gradients to a and b.
  for (DType cdt : {DType::b8, DType::f32, DType::i64}) {
    cases.push_back(
        {std::string("where cond ") + dtype_name(cdt) + " [16, 33] / [33]", all_floats(), [cdt](DType dt) {
           OpCheck chk;
           chk.inputs = {integers({16, 1}, 0, 2, cdt), uniform({16, 33}, -2, 2, dt), uniform({33}, -2, 2, DType::f32)};
           chk.fn = [](const std::vector<Tensor>& in) { return where(in[0], in[1], in[2]); };
           chk.out = exact("a selection");
           chk.grad = broadcast_grad_tol(dt, 16, 1, 0);
           chk.grad_inputs = {1, 2};
           return chk;
         }});
  }
  // Integer arithmetic is exact; integer division and exp give f32.
  using Int2 = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, Int2>> int_ops = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }},
      {"div (-> f32)", [](const Tensor& a, const Tensor& b) { return a / b; }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"x * 3", [](const Tensor& a, const Tensor&) { return a * 3.0; }},
      {"neg", [](const Tensor& a, const Tensor&) { return neg(a); }},
      {"abs(a - b)", [](const Tensor& a, const Tensor& b) { return abs(a - b); }},
      {"exp (-> f32)", [](const Tensor& a, const Tensor&) { return exp(a); }}};
  for (const auto& [name, f] : int_ops) {
    std::vector<DType> dts = {DType::i64, DType::i32, DType::u8};
    if (name == "neg" || name == "abs(a - b)") dts.pop_back();  // not on unsigned
    const Int2 fn = f;
    const bool is_exp = name == "exp (-> f32)";
    cases.push_back({"integer " + name, dts, [fn, is_exp](DType dt) {
                       OpCheck chk;
                       chk.inputs = {integers({16, 33}, 0, 15, dt), integers({33}, 1, 9, dt)};
                       chk.fn = [fn](const std::vector<Tensor>& in) { return fn(in[0], in[1]); };
                       if (is_exp)
                         chk.out = libm_tol(DType::f32, 4, 2, "expf: CUDA 2 + fast_exp 1.03 ulp");
                       else {
                         chk.out = exact("integer arithmetic (division: one IEEE division in f32)");
                         chk.bit_exact_output = true;
                       }
                       return chk;
                     }});
  }
  // In-place ops on strided targets: add_ with a broadcast f32 source, add_ with alpha 0.5 (a power of two:
  // exact), mul_ by a scalar, axpby_ (a running-statistics update), each on [13, 10] = a transposed slice.
  using InPlace = std::function<void(Tensor&, const Tensor&)>;
  const std::vector<std::pair<std::string, InPlace>> in_place = {
      {"add_ broadcast f32 source", [](Tensor& v, const Tensor& o) { add_(v, o.unsqueeze(1)); }},
      {"add_ alpha 0.5", [](Tensor& v, const Tensor& o) { add_(v, o.unsqueeze(1), 0.5); }},
      {"mul_ -3", [](Tensor& v, const Tensor&) { mul_(v, -3.0); }},
      {"axpby_ 0.9 0.1", [](Tensor& v, const Tensor& o) {
         axpby_(v, 0.9, o.unsqueeze(1).expand({13, 10}), 0.1);
       }}};
  for (const auto& [name, f] : in_place) {
    const InPlace fn = f;
    const bool axpby = name.rfind("axpby", 0) == 0;
    cases.push_back({"in-place " + name + " strided target", all_floats(), [fn, axpby](DType dt) {
                       OpCheck chk;
                       chk.inputs = {uniform({20, 13}, -2, 2, dt), uniform({13}, -2, 2, DType::f32)};
                       chk.fn = [fn](const std::vector<Tensor>& in) {
                         Tensor base = in[0].clone();
                         Tensor view = base.t().slice(1, 1, 20, 2);
                         fn(view, in[1]);
                         return base;
                       };
                       if (axpby) {
                         const double u = std::ldexp(1.0, -24);
                         chk.out = per_dtype(dt, 1, 1, 1, 8 * u, 8 * std::ldexp(1.0, -53), 8 * u,
                                             "a x + b y may be FMAs on one device and two roundings on the other");
                       } else {
                         chk.out = exact("IEEE operations on the same inputs");
                         chk.bit_exact_output = true;
                       }
                       return chk;
                     }});
  }
  // Special values propagate: selections and IEEE operations identical (NaN matches NaN); transcendentals at
  // inf, 0, +-100 (over/underflow) and NaN: the special results are exact on both (exp(inf) = inf, exp(-100) = 0
  // in f32, log(0) = -inf, log(-1) = NaN, sigmoid/tanh saturate).
  using Special = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::tuple<std::string, Special, bool>> specials = {
      {"relu", [](const Tensor& x, const Tensor&) { return relu(x); }, true},
      {"maximum", [](const Tensor& x, const Tensor& y) { return maximum(x, y); }, true},
      {"minimum", [](const Tensor& x, const Tensor& y) { return minimum(x, y); }, true},
      {"clamp", [](const Tensor& x, const Tensor&) { return clamp(x, -2.0, 3.0); }, true},
      {"div", [](const Tensor& x, const Tensor& y) { return x / y; }, true},
      {"sqrt", [](const Tensor& x, const Tensor&) { return sqrt(x); }, true},
      {"exp", [](const Tensor& x, const Tensor&) { return exp(x); }, false},
      {"log", [](const Tensor& x, const Tensor&) { return log(x); }, false},
      {"tanh", [](const Tensor& x, const Tensor&) { return tanh(x); }, false},
      {"sigmoid", [](const Tensor& x, const Tensor&) { return sigmoid(x); }, false},
      {"abs (backward: sign)", [](const Tensor& x, const Tensor&) { return abs(x); }, true}};
  for (const auto& [name, f, is_exact] : specials) {
    const Special fn = f;
    const bool ex = is_exact;
    cases.push_back({name + " special values", all_floats(), [fn, ex](DType dt) {
                       const std::vector<double>& sv = special_values();
                       const int64_t n = static_cast<int64_t>(sv.size());
                       OpCheck chk;
                       chk.inputs = {make(sv, {n}, dt), make(std::vector<double>(sv.rbegin(), sv.rend()), {n}, dt)};
                       chk.fn = [fn](const std::vector<Tensor>& in) { return fn(in[0], in[1]); };
                       if (ex) {
                         chk.out = exact("selections and IEEE operations: identical, NaN matches NaN");
                         chk.bit_exact_output = true;
                       } else {
                         chk.out =
                             libm_tol(dt, 5, 3, "as the unary tests; the special values themselves must match exactly");
                       }
                       return chk;
                     }});
  }
  // Large and misaligned: 2^20 + 3 elements (many blocks of the vectorised path plus a tail); narrow(0, 1, ...)
  // starts one element past a 16-byte boundary (the vector path must check alignment or fall back).
  const int64_t n = (int64_t{1} << 20) + 3;
  using Large = std::function<Tensor(const Tensor&, const Tensor&)>;
  const std::vector<std::tuple<std::string, Large, bool>> large = {
      {"add [2^20 + 3]", [](const Tensor& a, const Tensor& b) { return a + b; }, true},
      {"mul misaligned [2^20 + 2]",
       [n](const Tensor& a, const Tensor& b) { return a.narrow(0, 1, n - 1) * b.narrow(0, 0, n - 1); }, true},
      {"exp misaligned [2^20 + 2]", [n](const Tensor& a, const Tensor&) { return exp(a.narrow(0, 1, n - 1)); }, false},
      {"cast to f32 misaligned [2^20]",
       [n](const Tensor& a, const Tensor&) { return a.narrow(0, 3, n - 3).to(DType::f32); }, true},
      {"add_ misaligned target [2^20 + 3]",
       [n](const Tensor& a, const Tensor& b) {
         Tensor c = a.clone();
         Tensor v = c.narrow(0, 1, n - 1);
         add_(v, b.narrow(0, 0, n - 1));
         return c;
       },
       true}};
  for (const auto& [name, f, is_exact] : large) {
    const Large fn = f;
    const bool ex = is_exact;
    cases.push_back({"large " + name, {DType::f32, DType::f16, DType::bf16}, [fn, ex, n](DType dt) {
                       OpCheck chk;
                       chk.inputs = {uniform({n}, -2, 2, dt), uniform({n}, -2, 2, dt)};
                       chk.fn = [fn](const std::vector<Tensor>& in) { return fn(in[0], in[1]); };
                       if (ex) {
                         chk.out = exact();
                         chk.bit_exact_output = true;
                       } else {
                         chk.out = libm_tol(dt, 4, 2, "expf: CUDA 2 + fast_exp 1.03 ulp");
                       }
                       return chk;
                     }});
  }
  return cases;
}

}  // namespace mp::op_table

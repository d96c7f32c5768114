#include "backend/cpu/onednn/matmul.hpp"

#include <cstring>

#include "mp/core/half.hpp"

namespace mp::backend::cpu {

namespace {

using dnnl::memory;

// A matmul operand (A: rows=m, cols=k; B: rows=k, cols=n; C: rows=m, cols=n) after canonicalisation:
// a batch-broadcast operand (batch stride 0) has batch 1, and strides of size-1 dims are replaced by the
// values a dense layout would have, so views that differ only there share one cached primitive. The batch
// stride stays 0 for a broadcast operand (and becomes m*k etc. when batch is 1), so the key tells them apart.
struct Operand {
  int64_t batch = 1, rows = 0, cols = 0;
  int64_t st[3] = {0, 0, 0};
};

Operand canonical(int64_t batch, int64_t rows, int64_t cols, const int64_t st[3]) {
  Operand op{batch > 1 && st[0] == 0 ? 1 : batch, rows, cols, {st[0], st[1], st[2]}};
  if (cols == 1) op.st[2] = 1;
  if (rows == 1) op.st[1] = op.st[2] == 1 ? cols : 1;
  if (batch <= 1) op.st[0] = rows * cols;
  return op;
}

// Elements spanned by one matrix of the operand.
int64_t span(const Operand& op) { return (op.rows - 1) * op.st[1] + (op.cols - 1) * op.st[2] + 1; }

// Layouts oneDNN matmul runs fast as they are: row-major or column-major (row-major only for C) with a
// leading dimension at least the dense one, and matrices of a batch that do not overlap. Others (including
// column-major C, which only oneDNN's reference kernel takes) are packed.
bool row_major(const Operand& op) { return op.st[2] == 1 && op.st[1] >= op.cols; }
bool col_major(const Operand& op) { return op.st[1] == 1 && op.st[2] >= op.rows; }
bool onednn_friendly(const Operand& op, bool is_c) {
  const bool inner = row_major(op) || (!is_c && col_major(op));
  return inner && (op.batch == 1 || op.st[0] >= span(op));
}

bool is_dense(const Operand& op) {
  return op.st[2] == 1 && op.st[1] == op.cols && (op.batch == 1 || op.st[0] == op.rows * op.cols);
}

Operand densified(const Operand& op) { return {op.batch, op.rows, op.cols, {op.rows * op.cols, op.cols, 1}}; }

struct MatmulKey {
  int64_t batch, m, n, k;
  int64_t ab_dtype, c_dtype, bias_dtype;  // bias_dtype = -1 without bias
  int64_t accumulate, relu;
  int64_t a_st[3], b_st[3], c_st[3];  // canonical strides
  bool operator==(const MatmulKey&) const = default;
};

struct MatmulPlan {
  dnnl::matmul prim;
  memory::desc md[3];  // descriptors of A, B, C the primitive was built with (packed ones are dense)
  memory::desc bias_md, scratch_md;
  bool pack[3] = {false, false, false};  // operand i is copied to/from a dense per-thread buffer
  std::string impl;
};

using MatmulCache = PrimitiveCache<MatmulKey, MatmulPlan>;

MatmulCache& cache() {
  onednn_engine();  // constructed first, so destroyed after the cached primitives
  static MatmulCache c;
  return c;
}

std::string describe(const MatmulArgs& a) {
  auto st = [](const int64_t s[3]) { return detail::str_cat("(", s[0], ",", s[1], ",", s[2], ")"); };
  return detail::str_cat(
      "matmul batch=", a.batch, " m=", a.m, " n=", a.n, " k=", a.k, " A ", dtype_name(a.a_dtype), " strides ",
      st(a.a_strides), ", B ", dtype_name(a.b_dtype), " strides ", st(a.b_strides), ", C ", dtype_name(a.c_dtype),
      " strides ", st(a.c_strides), a.accumulate ? ", accumulate" : "",
      a.has_bias ? detail::str_cat(", bias ", dtype_name(a.bias_dtype)) : std::string(), a.relu ? ", relu" : "");
}

void validate(const MatmulArgs& a) {
  MP_CHECK(a.batch >= 0 && a.m >= 0 && a.n >= 0 && a.k >= 0, "matmul: sizes must be non-negative, got ", describe(a));
  MP_CHECK(a.a_dtype == a.b_dtype, "matmul: A and B must have the same dtype, got A ", dtype_name(a.a_dtype), " and B ",
           dtype_name(a.b_dtype), "; convert one of them");
  to_dnnl(a.a_dtype, "matmul (A, B)");
  to_dnnl(a.c_dtype, "matmul (C)");
  MP_CHECK(a.c_dtype == DType::f32 || a.c_dtype == a.a_dtype, "matmul: ", dtype_name(a.a_dtype), " A and B with a ",
           dtype_name(a.c_dtype), " C is not supported (C must be f32 or the dtype of A and B); use an f32 C (or ",
           dtype_name(a.c_dtype), " inputs)");
  if (a.has_bias) {
    to_dnnl(a.bias_dtype, "matmul (bias)");
    MP_CHECK(a.bias_dtype == DType::f32 || a.bias_dtype == a.a_dtype,
             "matmul: the bias must be f32 or the dtype of A and B, got ", describe(a), "; pass an f32 bias");
  }
  for (int i = 0; i < 3; ++i)
    MP_CHECK(a.a_strides[i] >= 0 && a.b_strides[i] >= 0 && a.c_strides[i] >= 0,
             "matmul: strides must be non-negative, got ", describe(a));
  MP_CHECK(!(a.accumulate && a.relu), "matmul: a ReLU epilogue cannot be combined with accumulation, got ",
           describe(a));
  MP_CHECK(a.batch <= 1 || a.c_strides[0] != 0 || a.m == 0 || a.n == 0,
           "matmul: C cannot be broadcast over the batch (C batch stride 0 with batch ", a.batch, ")");
  MP_CHECK((a.m <= 1 || a.c_strides[1] != 0) && (a.n <= 1 || a.c_strides[2] != 0),
           "matmul: C must not overlap itself (zero row or column stride), got ", describe(a));
}

void check_pointers(const MatmulArgs& a, const void* pa, const void* pb, const void* pc, const void* bias) {
  if (a.batch == 0 || a.m == 0 || a.n == 0) return;
  MP_CHECK(pc != nullptr, "matmul: C is null");
  MP_CHECK(a.k == 0 || (pa != nullptr && pb != nullptr), "matmul: A or B is null");
  MP_CHECK(!a.has_bias || bias != nullptr, "matmul: has_bias is set but bias is null");
}

memory::desc operand_md(const Operand& op, bool three_d, memory::data_type dt) {
  if (!three_d) return memory::desc({op.rows, op.cols}, dt, {op.st[1], op.st[2]});
  const int64_t batch_stride = op.batch == 1 ? op.rows * op.cols : op.st[0];  // broadcast: any value works
  return memory::desc({op.batch, op.rows, op.cols}, dt, {batch_stride, op.st[1], op.st[2]});
}

MatmulPlan build_plan(const MatmulArgs& args, const Operand ops[3]) {
  const bool three_d = args.batch > 1;
  const memory::data_type dts[3] = {to_dnnl(args.a_dtype), to_dnnl(args.b_dtype), to_dnnl(args.c_dtype)};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (args.accumulate || args.relu) {
    dnnl::post_ops po;
    if (args.accumulate) po.append_sum(1.0f);
    // The ReLU runs on the f32 accumulator (+ bias) before C is rounded to its dtype; rounding is
    // monotonic and keeps 0, so this equals rounding first and applying ReLU to C.
    if (args.relu) po.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(po);
  }
  MatmulPlan plan;
  if (args.has_bias)
    plan.bias_md = three_d ? memory::desc({1, 1, args.n}, to_dnnl(args.bias_dtype), memory::format_tag::abc)
                           : memory::desc({1, args.n}, to_dnnl(args.bias_dtype), memory::format_tag::ab);
  // First try: give oneDNN every operand whose layout it accepts as is. If it has no kernel for that
  // combination, retry with every non-dense operand packed (when that changes anything).
  bool repack_differs = false;
  for (int i = 0; i < 3; ++i) repack_differs |= !onednn_friendly(ops[i], i == 2) != !is_dense(ops[i]);
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (int i = 0; i < 3; ++i) {
      plan.pack[i] = attempt == 0 ? !onednn_friendly(ops[i], i == 2) : !is_dense(ops[i]);
      plan.md[i] = operand_md(plan.pack[i] ? densified(ops[i]) : ops[i], three_d, dts[i]);
    }
    try {
      // A zero bias descriptor (no bias) disables the bias term.
      const dnnl::matmul::primitive_desc pd(onednn_engine(), plan.md[0], plan.md[1], plan.bias_md, plan.md[2], attr);
      plan.impl = pd.impl_info_str();
      plan.scratch_md = pd.scratchpad_desc();
      plan.prim = dnnl::matmul(pd);
      record_onednn_impl("matmul", plan.impl);
      return plan;
    } catch (const dnnl::error& e) {
      if (attempt == 1 || e.status != dnnl_unimplemented || !repack_differs)
        throw_onednn_error(attempt == 1 ? "dnnl::matmul (operands packed)" : "dnnl::matmul", e, describe(args));
    }
  }
  MP_FAIL("matmul: unreachable: both attempts at ", describe(args), " returned");
}

// Copy a [batch, rows, cols] matrix stack between two strided layouts (elements of `bytes` bytes).
template <class T>
void copy_strided_t(const T* src, const int64_t ss[3], T* dst, const int64_t ds[3], int64_t batch, int64_t rows,
                    int64_t cols) {
#pragma omp parallel for collapse(2) if (batch * rows * cols > 65536)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r) {
      const T* s = src + b * ss[0] + r * ss[1];
      T* d = dst + b * ds[0] + r * ds[1];
      for (int64_t c = 0; c < cols; ++c) d[c * ds[2]] = s[c * ss[2]];
    }
}

void copy_strided(size_t bytes, const void* src, const int64_t ss[3], void* dst, const int64_t ds[3], int64_t batch,
                  int64_t rows, int64_t cols) {
  if (bytes == 2)
    copy_strided_t(static_cast<const uint16_t*>(src), ss, static_cast<uint16_t*>(dst), ds, batch, rows, cols);
  else
    copy_strided_t(static_cast<const uint32_t*>(src), ss, static_cast<uint32_t*>(dst), ds, batch, rows, cols);
}

float load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::bf16: return static_cast<float>(static_cast<const BFloat16*>(p)[i]);
    case DType::f16: return static_cast<float>(static_cast<const Half*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

void store(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::bf16: static_cast<BFloat16*>(p)[i] = BFloat16(v); break;
    case DType::f16: static_cast<Half*>(p)[i] = Half(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

// k == 0: the product is zero, so C = (accumulate ? C : 0) + bias. oneDNN is not asked (it would leave C
// untouched for an empty reduction).
void matmul_empty_k(const MatmulArgs& a, void* c, const void* bias) {
  for (int64_t b = 0; b < a.batch; ++b)
    for (int64_t i = 0; i < a.m; ++i)
      for (int64_t j = 0; j < a.n; ++j) {
        const int64_t idx = b * a.c_strides[0] + i * a.c_strides[1] + j * a.c_strides[2];
        float v = a.accumulate ? load(c, a.c_dtype, idx) : 0.0f;
        if (a.has_bias) v += load(bias, a.bias_dtype, j);
        if (a.relu && !(v >= 0.0f)) v = v != v ? v : 0.0f;  // ReLU (NaN stays NaN, as in oneDNN's)
        store(c, a.c_dtype, idx, v);
      }
}

// The problem as handed to oneDNN. Note [column-major C]: when C is column-major (a transposed view) and
// there is no bias, C^T = B^T A^T is computed instead: the same primitive writes C in place, where giving
// oneDNN the column-major C directly selects its slow reference kernel.
struct Prepared {
  MatmulKey key{};
  Operand ops[3];         // canonical A, B, C of the problem oneDNN solves
  int64_t st[3][3] = {};  // their strides as given (B^T, A^T, C^T when swapped)
  bool swapped = false;
};

Prepared prepare(const MatmulArgs& args) {
  Prepared p;
  const Operand c = canonical(args.batch, args.m, args.n, args.c_strides);
  p.swapped = !args.has_bias && !row_major(c) && col_major(c);
  const int64_t m = p.swapped ? args.n : args.m, n = p.swapped ? args.m : args.n;
  const int64_t* a = p.swapped ? args.b_strides : args.a_strides;
  const int64_t* b = p.swapped ? args.a_strides : args.b_strides;
  const int64_t* cs = args.c_strides;
  const int s1 = p.swapped ? 2 : 1, s2 = p.swapped ? 1 : 2;  // swapped: rows and columns exchange strides
  const int64_t st[3][3] = {{a[0], a[s1], a[s2]}, {b[0], b[s1], b[s2]}, {cs[0], cs[s1], cs[s2]}};
  std::memcpy(p.st, st, sizeof(st));
  p.ops[0] = canonical(args.batch, m, args.k, p.st[0]);
  p.ops[1] = canonical(args.batch, args.k, n, p.st[1]);
  p.ops[2] = canonical(args.batch, m, n, p.st[2]);
  // oneDNN needs C's batch in A or B: when both are broadcast, A is expanded (packed) over the batch.
  if (args.batch > 1 && p.ops[0].batch == 1 && p.ops[1].batch == 1) p.ops[0].batch = args.batch;
  MatmulKey& k = p.key;
  k.batch = args.batch;
  k.m = m;
  k.n = n;
  k.k = args.k;
  k.ab_dtype = static_cast<int64_t>(args.a_dtype);
  k.c_dtype = static_cast<int64_t>(args.c_dtype);
  k.bias_dtype = args.has_bias ? static_cast<int64_t>(args.bias_dtype) : -1;
  k.accumulate = args.accumulate ? 1 : 0;
  k.relu = args.relu ? 1 : 0;
  for (int i = 0; i < 3; ++i) {
    k.a_st[i] = p.ops[0].st[i];
    k.b_st[i] = p.ops[1].st[i];
    k.c_st[i] = p.ops[2].st[i];
  }
  return p;
}

std::shared_ptr<const MatmulPlan> get_plan(const MatmulArgs& args, const Prepared& p) {
  return cache().get_or_create(p.key, [&] { return build_plan(args, p.ops); });
}

}  // namespace

MatmulArgs MatmulArgs::contiguous(int64_t batch, int64_t m, int64_t n, int64_t k, DType ab_dtype, DType c_dtype) {
  MatmulArgs a;
  a.batch = batch;
  a.m = m;
  a.n = n;
  a.k = k;
  a.a_dtype = a.b_dtype = ab_dtype;
  a.c_dtype = c_dtype;
  const int64_t as[3] = {m * k, k, 1}, bs[3] = {k * n, n, 1}, cs[3] = {m * n, n, 1};
  for (int i = 0; i < 3; ++i) {
    a.a_strides[i] = as[i];
    a.b_strides[i] = bs[i];
    a.c_strides[i] = cs[i];
  }
  return a;
}

void matmul(const MatmulArgs& args, const void* a, const void* b, void* c, const void* bias) {
  validate(args);
  check_pointers(args, a, b, c, bias);
  if (args.batch == 0 || args.m == 0 || args.n == 0) return;
  if (args.k == 0) return matmul_empty_k(args, c, bias);

  const Prepared p = prepare(args);
  const std::shared_ptr<const MatmulPlan> plan = get_plan(args, p);

  const void* user[3] = {p.swapped ? b : a, p.swapped ? a : b, c};
  const ScratchSlot slots[3] = {ScratchSlot::input0, ScratchSlot::input1, ScratchSlot::output};
  const size_t elem[3] = {dtype_size(args.a_dtype), dtype_size(args.b_dtype), dtype_size(args.c_dtype)};
  void* data[3] = {const_cast<void*>(user[0]), const_cast<void*>(user[1]), c};
  for (int i = 0; i < 3; ++i) {
    if (!plan->pack[i]) continue;
    const Operand& op = p.ops[i];
    data[i] = thread_scratch(slots[i], static_cast<size_t>(op.batch * op.rows * op.cols) * elem[i]);
    // A and B are always read; C only when its old value feeds the sum post-op.
    if (i < 2 || args.accumulate)
      copy_strided(elem[i], user[i], p.st[i], data[i], densified(op).st, op.batch, op.rows, op.cols);
  }

  onednn_check(
      "dnnl::matmul::execute", [&] { return describe(args); },
      [&] {
        std::unordered_map<int, memory> exec_args = {{DNNL_ARG_SRC, wrap_memory(plan->md[0], data[0])},
                                                     {DNNL_ARG_WEIGHTS, wrap_memory(plan->md[1], data[1])},
                                                     {DNNL_ARG_DST, wrap_memory(plan->md[2], data[2])}};
        if (args.has_bias) exec_args.emplace(DNNL_ARG_BIAS, wrap_memory(plan->bias_md, bias));
        if (const size_t sp = md_bytes(plan->scratch_md); sp > 0)
          exec_args.emplace(DNNL_ARG_SCRATCHPAD,
                            wrap_memory(plan->scratch_md, thread_scratch(ScratchSlot::scratchpad, sp)));
        dnnl::stream& s = onednn_stream();
        plan->prim.execute(s, exec_args);
        s.wait();
      });

  if (plan->pack[2]) {
    const Operand& op = p.ops[2];
    copy_strided(elem[2], data[2], densified(op).st, c, p.st[2], op.batch, op.rows, op.cols);
  }
}

std::string matmul_impl_info(const MatmulArgs& args) {
  validate(args);
  if (args.batch == 0 || args.m == 0 || args.n == 0 || args.k == 0) return std::string();
  const Prepared p = prepare(args);
  return get_plan(args, p)->impl;
}

CacheStats matmul_cache_stats() { return cache().stats(); }

}  // namespace mp::backend::cpu

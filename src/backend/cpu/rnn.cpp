// CPU kernels of the fused recurrent-cell arithmetic (LSTM gates). Rows of the batch are cut into
// blocks of kBlock hidden units; per block each operand is brought into a compute-type buffer
// (bulk-converted when 16-bit), the shared MP_HD functor runs over plain arrays, and the results are
// stored (converted when the destination is not the compute type). The functors' sigmoid/tanh are
// the vectorisable fast_math.hpp ones for float, so the lane loops vectorise; being compute-bound
// (5 transcendentals per unit) they also get AVX-512 and AVX2 copies (Note [AVX-512 element-wise loops]).
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "backend/cpu/loops.hpp"
#include "backend/rnn_kernels.hpp"

namespace mp::backend::cpu {
namespace {

// Typed view of one contiguous operand: base pointer, dtype and element size.
struct Operand {
  char* base;
  DType dtype;
  int64_t esize;
  explicit Operand(const Tensor& t)
      : base(static_cast<char*>(t.raw_data())), dtype(t.dtype()), esize(static_cast<int64_t>(t.element_size())) {}
  char* at(int64_t i) const { return base + i * esize; }
};

// Where a block of n results of type C goes: straight into the destination when it already is C
// (no copy), else into `buf` to be stored afterwards by finish().
template <class C>
C* out_ptr(const Operand& o, int64_t i, C* buf) {
  return o.dtype == dtype_of<C>() ? reinterpret_cast<C*>(o.at(i)) : buf;
}
template <class C>
void finish(const Operand& o, int64_t i, int64_t n, const C* vals) {
  if (o.dtype != dtype_of<C>()) store_block<C>(o.at(i), 1, o.dtype, n, vals);
}

// Run body(b, j0, n) over (batch row, block of hidden units) pairs, in parallel when large.
template <class Body>
void for_each_row_block(int64_t B, int64_t H, Body&& body) {
  const int64_t nblk = (H + kBlock - 1) / kBlock;
  const int64_t work = B * nblk;
  // Each hidden unit reads 5 and writes 2 values and evaluates 5 transcendentals: count 4H per row.
  const bool parallel = B * 4 * H >= kParallelGrain && !omp_in_parallel();
#pragma omp parallel for if (parallel) schedule(static)
  for (int64_t w = 0; w < work; ++w) {
    const int64_t b = w / nblk, j0 = (w % nblk) * kBlock;
    body(b, j0, std::min(kBlock, H - j0));
  }
}

// The forward functor over n lanes of plain arrays (vectorised; force-inlined for call_isa).
template <class C>
struct LstmForwardLanes {
  MP_FORCE_INLINE void operator()(const C* gi, const C* gf, const C* gg, const C* go, const C* cp, C* hp, C* cn,
                                  int64_t n) const {
    const LstmGatesForwardFn<C> fn{};
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) fn(gi[j], gf[j], gg[j], go[j], cp[j], hp[j], cn[j]);
  }
};

// The backward functor over n lanes; in = {gi, gf, gg, go, c, dh, dcn}, out = {dgi, dgf, dgg, dgo, dc}.
template <class C>
struct LstmBackwardLanes {
  MP_FORCE_INLINE void operator()(const C* const* in, C* const* out, int64_t n) const {
    const C *gi = in[0], *gf = in[1], *gg = in[2], *go = in[3], *cp = in[4], *dh = in[5], *dcn = in[6];
    C *di = out[0], *df = out[1], *dgg = out[2], *dgo = out[3], *dcx = out[4];
    const LstmGatesBackwardFn<C> fn{};
#pragma omp simd
    for (int64_t j = 0; j < n; ++j)
      fn(gi[j], gf[j], gg[j], go[j], cp[j], dh[j], dcn[j], di[j], df[j], dgg[j], dgo[j], dcx[j]);
  }
};

// Whether the float lane loops take their vector copy (AVX-512 or AVX2; double calls libm: no gain).
template <class C>
bool lanes_vector() {
  return std::is_same_v<C, float> && vector_loops_enabled();
}

template <class C>
void lstm_forward_impl(const Tensor& h_out, const Tensor& c_out, const Tensor& gates, const Tensor& c) {
  const int64_t B = c.size(0), H = c.size(1);
  const Operand g(gates), cc(c), ho(h_out), co(c_out);
  const bool vec = lanes_vector<C>();
  for_each_row_block(B, H, [&](int64_t b, int64_t j0, int64_t n) {
    alignas(64) C buf[5][kBlock];
    alignas(64) C hbuf[kBlock], cbuf[kBlock];
    const int64_t grow = b * 4 * H + j0, row = b * H + j0;
    const C* gi = load_block<C>(g.at(grow), 1, g.dtype, n, buf[0]);
    const C* gf = load_block<C>(g.at(grow + H), 1, g.dtype, n, buf[1]);
    const C* gg = load_block<C>(g.at(grow + 2 * H), 1, g.dtype, n, buf[2]);
    const C* go = load_block<C>(g.at(grow + 3 * H), 1, g.dtype, n, buf[3]);
    const C* cp = load_block<C>(cc.at(row), 1, cc.dtype, n, buf[4]);
    C* hp = out_ptr<C>(ho, row, hbuf);
    C* cn = out_ptr<C>(co, row, cbuf);
    call_isa(vec, LstmForwardLanes<C>{}, gi, gf, gg, go, cp, hp, cn, n);
    finish<C>(ho, row, n, hp);
    finish<C>(co, row, n, cn);
  });
}

template <class C>
void lstm_backward_impl(const Tensor& dgates, const Tensor& dc, const Tensor& dh_out, const Tensor& dc_out,
                        const Tensor& gates, const Tensor& c) {
  const int64_t B = c.size(0), H = c.size(1);
  const Operand g(gates), cc(c), dho(dh_out), dco(dc_out), dg(dgates), dcp(dc);
  const bool vec = lanes_vector<C>();
  for_each_row_block(B, H, [&](int64_t b, int64_t j0, int64_t n) {
    alignas(64) C buf[7][kBlock];
    alignas(64) C obuf[5][kBlock];
    const int64_t grow = b * 4 * H + j0, row = b * H + j0;
    const C* in[7] = {load_block<C>(g.at(grow), 1, g.dtype, n, buf[0]),
                      load_block<C>(g.at(grow + H), 1, g.dtype, n, buf[1]),
                      load_block<C>(g.at(grow + 2 * H), 1, g.dtype, n, buf[2]),
                      load_block<C>(g.at(grow + 3 * H), 1, g.dtype, n, buf[3]),
                      load_block<C>(cc.at(row), 1, cc.dtype, n, buf[4]),
                      load_block<C>(dho.at(row), 1, dho.dtype, n, buf[5]),
                      load_block<C>(dco.at(row), 1, dco.dtype, n, buf[6])};
    C* out[5] = {out_ptr<C>(dg, grow, obuf[0]), out_ptr<C>(dg, grow + H, obuf[1]),
                 out_ptr<C>(dg, grow + 2 * H, obuf[2]), out_ptr<C>(dg, grow + 3 * H, obuf[3]),
                 out_ptr<C>(dcp, row, obuf[4])};
    call_isa(vec, LstmBackwardLanes<C>{}, static_cast<const C* const*>(in), static_cast<C* const*>(out), n);
    for (int k = 0; k < 4; ++k) finish<C>(dg, grow + k * H, n, out[k]);
    finish<C>(dcp, row, n, out[4]);
  });
}

bool wants_double(const Tensor& gates, const Tensor& c) {
  return gates.dtype() == DType::f64 || c.dtype() == DType::f64;
}

void lstm_gates_forward_cpu(const Tensor& h_out, const Tensor& c_out, const Tensor& gates, const Tensor& c) {
  if (wants_double(gates, c)) return lstm_forward_impl<double>(h_out, c_out, gates, c);
  lstm_forward_impl<float>(h_out, c_out, gates, c);
}

void lstm_gates_backward_cpu(const Tensor& dgates, const Tensor& dc, const Tensor& dh_out, const Tensor& dc_out,
                             const Tensor& gates, const Tensor& c) {
  if (wants_double(gates, c)) return lstm_backward_impl<double>(dgates, dc, dh_out, dc_out, gates, c);
  lstm_backward_impl<float>(dgates, dc, dh_out, dc_out, gates, c);
}

}  // namespace

MP_REGISTER_KERNEL(lstm_gates_forward_kernel, DeviceType::cpu, &lstm_gates_forward_cpu);
MP_REGISTER_KERNEL(lstm_gates_backward_kernel, DeviceType::cpu, &lstm_gates_backward_cpu);

}  // namespace mp::backend::cpu

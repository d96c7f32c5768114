// CPU kernels of batch norm and layer norm, forward and backward, each one fused pass per phase.
//
// Note [normalisation statistics on the CPU]
// Statistics are computed two-pass (mean, then the mean of squared deviations), not with the
// one-pass E[x^2] - E[x]^2 formula, which cancels catastrophically when |mean| >> std. Every sum
// (statistics and the backward's sum(dy), sum(dy (x - mean))) accumulates in double, even for f32
// data: what matters is the error of the mean relative to the std, and an f32 running sum of n
// values of size |mean| errs by ~sqrt(n) ulp(n |mean|), i.e. ~1e-3 std for mean/std = 1e4 and
// n = 512 (a row of a layer norm) -- measured. Double sums leave only the final rounding of the
// mean to f32 (half an ulp of the mean). The reductions stay vectorised (float -> double lanes) and
// the loops are memory-bound, so the cost is small. 16-bit inputs are converted to f32
// in blocks with the bulk converters; outputs are rounded once when stored.
//
// Batch norm on x [N, C, S]: with S > 1 (NCHW) channels are processed in parallel and the inner
// loops run over the contiguous S = H*W values of each (n, c); with S == 1 ([N, C], channels are
// the contiguous dim) blocks of channels are processed in parallel and rows are streamed.
// Layer norm on x [M, N]: rows in parallel; the weight/bias gradients (column sums over all rows)
// go into per-thread double partials combined in thread order (deterministic for a thread count).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/norm_kernels.hpp"

namespace mp::backend::cpu {
namespace {

// Typed access to one contiguous operand.
struct Operand {
  char* base = nullptr;
  DType dtype = DType::f32;
  int64_t esize = 0;
  Operand() = default;
  explicit Operand(const Tensor& t) {
    if (!t.defined()) return;
    base = static_cast<char*>(t.raw_data());
    dtype = t.dtype();
    esize = static_cast<int64_t>(t.element_size());
  }
  bool defined() const { return base != nullptr; }
  char* at(int64_t i) const { return base + i * esize; }
  // n values from element i as S (a pointer into the tensor when it already is S, else into buf).
  template <class S> const S* load(int64_t i, int64_t n, S* buf) const {
    return load_block<S>(at(i), 1, dtype, n, buf);
  }
  // Destination for n results of type S at element i: the tensor itself when it has type S, else buf.
  template <class S> S* dest(int64_t i, S* buf) const {
    return dtype == dtype_of<S>() ? reinterpret_cast<S*>(at(i)) : buf;
  }
  // Store what dest() handed out (a no-op when it wrote in place).
  template <class S> void commit(int64_t i, int64_t n, const S* vals) const {
    if (dtype != dtype_of<S>()) store_block<S>(at(i), 1, dtype, n, vals);
  }
};

// A contiguous 1-D tensor of n values converted to S; `fill` everywhere when undefined.
template <class S>
std::vector<S> load_vector(const Tensor& t, int64_t n, S fill) {
  std::vector<S> v(static_cast<size_t>(n), fill);
  if (t.defined() && n > 0) {
    const S* p = load_block<S>(static_cast<const char*>(t.raw_data()), 1, t.dtype(), n, v.data());
    if (p != v.data()) std::copy(p, p + n, v.data());
  }
  return v;
}

// sum(v) in double (Note [normalisation statistics on the CPU]).
template <class S>
double block_sum(const S* v, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += static_cast<double>(v[j]);
  return s;
}

// sum((v - mean)^2) in double.
template <class S>
double block_sq_dev(const S* v, int64_t n, S mean) {
  double s = 0;
  const auto m = static_cast<double>(mean);
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) {
    const double d = static_cast<double>(v[j]) - m;
    s += d * d;
  }
  return s;
}

// Adds sum(dy) and sum(dy * (x - mean)) of one block (double accumulation).
template <class S>
void block_grad_sums(const S* dy, const S* x, int64_t n, S mean, double& sdy, double& sdyx) {
  double a = 0, b = 0;
  const auto m = static_cast<double>(mean);
#pragma omp simd reduction(+ : a, b)
  for (int64_t j = 0; j < n; ++j) {
    const auto g = static_cast<double>(dy[j]);
    a += g;
    b += g * (static_cast<double>(x[j]) - m);
  }
  sdy += a;
  sdyx += b;
}

bool go_parallel(int64_t work) { return work >= kParallelGrain && !omp_in_parallel(); }

// Channel-block width of the [N, C] batch-norm path.
constexpr int64_t kChannelBlock = 64;

// ------------------------------------------------------------------------------ batch norm

// Calls f(i, n) for the segments of channel c of x [N, C, S]: element offset i, length n <= kBlock.
template <class F>
void for_channel_segments(int64_t N, int64_t C, int64_t S, int64_t c, F&& f) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j0 = 0; j0 < S; j0 += kBlock) f((n * C + c) * S + j0, std::min(kBlock, S - j0));
}

template <class S>
void bn_forward_spatial(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd, const Tensor& x,
                        const std::vector<S>& w, const std::vector<S>& b, bool training, double eps) {
  const int64_t N = x.size(0), C = x.size(1), SP = x.size(2);
  const double M = static_cast<double>(N * SP);
  const Operand xo(x), yo(y);
  S* mp = mean.data_ptr<S>();
  S* vp = var.data_ptr<S>();
  S* ip = invstd.data_ptr<S>();
#pragma omp parallel for if (go_parallel(x.numel())) schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    alignas(64) S buf[kBlock], obuf[kBlock];
    if (training) {
      double s = 0;
      for_channel_segments(N, C, SP, c, [&](int64_t i, int64_t n) { s += block_sum(xo.load<S>(i, n, buf), n); });
      const S mu = static_cast<S>(s / M);
      double q = 0;
      for_channel_segments(N, C, SP, c, [&](int64_t i, int64_t n) { q += block_sq_dev(xo.load<S>(i, n, buf), n, mu); });
      mp[c] = mu;
      vp[c] = static_cast<S>(q / M);
    }
    const S r = static_cast<S>(1.0 / std::sqrt(static_cast<double>(vp[c]) + eps));
    ip[c] = r;
    const NormAffineFn<S> fn{mp[c], r * w[c], b[c]};
    for_channel_segments(N, C, SP, c, [&](int64_t i, int64_t n) {
      const S* v = xo.load<S>(i, n, buf);
      S* o = yo.dest<S>(i, obuf);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) o[j] = fn(v[j]);
      yo.commit<S>(i, n, o);
    });
  }
}

template <class S>
void bn_forward_rows(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd, const Tensor& x,
                     const std::vector<S>& w, const std::vector<S>& b, bool training, double eps) {
  const int64_t N = x.size(0), C = x.size(1);
  const Operand xo(x), yo(y);
  S* mp = mean.data_ptr<S>();
  S* vp = var.data_ptr<S>();
  S* ip = invstd.data_ptr<S>();
  const int64_t nblk = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for if (go_parallel(x.numel())) schedule(static)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int64_t c0 = blk * kChannelBlock, nc = std::min(kChannelBlock, C - c0);
    alignas(64) S buf[kChannelBlock], obuf[kChannelBlock];
    if (training) {
      double acc[kChannelBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const S* v = xo.load<S>(n * C + c0, nc, buf);
        for (int64_t j = 0; j < nc; ++j) acc[j] += v[j];
      }
      for (int64_t j = 0; j < nc; ++j) mp[c0 + j] = static_cast<S>(acc[j] / static_cast<double>(N));
      double q[kChannelBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const S* v = xo.load<S>(n * C + c0, nc, buf);
        for (int64_t j = 0; j < nc; ++j) {
          const double d = static_cast<double>(v[j]) - static_cast<double>(mp[c0 + j]);
          q[j] += d * d;
        }
      }
      for (int64_t j = 0; j < nc; ++j) vp[c0 + j] = static_cast<S>(q[j] / static_cast<double>(N));
    }
    S mu[kChannelBlock], scale[kChannelBlock], shift[kChannelBlock];
    for (int64_t j = 0; j < nc; ++j) {
      const S r = static_cast<S>(1.0 / std::sqrt(static_cast<double>(vp[c0 + j]) + eps));
      ip[c0 + j] = r;
      mu[j] = mp[c0 + j];
      scale[j] = r * w[c0 + j];
      shift[j] = b[c0 + j];
    }
    for (int64_t n = 0; n < N; ++n) {
      const S* v = xo.load<S>(n * C + c0, nc, buf);
      S* o = yo.dest<S>(n * C + c0, obuf);
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) o[j] = NormAffineFn<S>{mu[j], scale[j], shift[j]}(v[j]);
      yo.commit<S>(n * C + c0, nc, o);
    }
  }
}

template <class S>
void bn_backward_spatial(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                         const Tensor& x, const std::vector<S>& mean, const std::vector<S>& invstd,
                         const std::vector<S>& w, bool training) {
  const int64_t N = x.size(0), C = x.size(1), SP = x.size(2);
  const double M = static_cast<double>(N * SP);
  const Operand xo(x), dyo(dy), dxo(dx);
  S* dwp = dweight.defined() ? dweight.data_ptr<S>() : nullptr;
  S* dbp = dbias.defined() ? dbias.data_ptr<S>() : nullptr;
  const bool need_sums = dwp != nullptr || dbp != nullptr || (training && dxo.defined());
#pragma omp parallel for if (go_parallel(x.numel())) schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    alignas(64) S xbuf[kBlock], dybuf[kBlock], obuf[kBlock];
    const S mu = mean[c], r = invstd[c], wc = w[c];
    double sdy = 0, sdyx = 0;
    if (need_sums)
      for_channel_segments(N, C, SP, c, [&](int64_t i, int64_t n) {
        block_grad_sums(dyo.load<S>(i, n, dybuf), xo.load<S>(i, n, xbuf), n, mu, sdy, sdyx);
      });
    if (dbp) dbp[c] = static_cast<S>(sdy);
    if (dwp) dwp[c] = static_cast<S>(sdyx * r);
    if (!dxo.defined()) continue;
    const double wr = static_cast<double>(wc) * r;
    const NormBackwardFn<S> fn{static_cast<S>(wr), training ? static_cast<S>(-wr * r * r * sdyx / M) : S(0),
                               training ? static_cast<S>(-wr * sdy / M) : S(0), mu};
    for_channel_segments(N, C, SP, c, [&](int64_t i, int64_t n) {
      const S* g = dyo.load<S>(i, n, dybuf);
      const S* v = xo.load<S>(i, n, xbuf);
      S* o = dxo.dest<S>(i, obuf);
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) o[j] = fn(g[j], v[j]);
      dxo.commit<S>(i, n, o);
    });
  }
}

template <class S>
void bn_backward_rows(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                      const std::vector<S>& mean, const std::vector<S>& invstd, const std::vector<S>& w,
                      bool training) {
  const int64_t N = x.size(0), C = x.size(1);
  const double M = static_cast<double>(N);
  const Operand xo(x), dyo(dy), dxo(dx);
  S* dwp = dweight.defined() ? dweight.data_ptr<S>() : nullptr;
  S* dbp = dbias.defined() ? dbias.data_ptr<S>() : nullptr;
  const bool need_sums = dwp != nullptr || dbp != nullptr || (training && dxo.defined());
  const int64_t nblk = (C + kChannelBlock - 1) / kChannelBlock;
#pragma omp parallel for if (go_parallel(x.numel())) schedule(static)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    const int64_t c0 = blk * kChannelBlock, nc = std::min(kChannelBlock, C - c0);
    alignas(64) S xbuf[kChannelBlock], dybuf[kChannelBlock], obuf[kChannelBlock];
    double sdy[kChannelBlock] = {}, sdyx[kChannelBlock] = {};
    if (need_sums)
      for (int64_t n = 0; n < N; ++n) {
        const S* g = dyo.load<S>(n * C + c0, nc, dybuf);
        const S* v = xo.load<S>(n * C + c0, nc, xbuf);
        for (int64_t j = 0; j < nc; ++j) {
          sdy[j] += g[j];
          sdyx[j] += static_cast<double>(g[j]) * (static_cast<double>(v[j]) - static_cast<double>(mean[c0 + j]));
        }
      }
    for (int64_t j = 0; j < nc; ++j) {
      if (dbp) dbp[c0 + j] = static_cast<S>(sdy[j]);
      if (dwp) dwp[c0 + j] = static_cast<S>(sdyx[j] * invstd[c0 + j]);
    }
    if (!dxo.defined()) continue;
    S ca[kChannelBlock], cb[kChannelBlock], cc[kChannelBlock], mu[kChannelBlock];
    for (int64_t j = 0; j < nc; ++j) {
      const double r = invstd[c0 + j], wr = static_cast<double>(w[c0 + j]) * r;
      ca[j] = static_cast<S>(wr);
      cb[j] = training ? static_cast<S>(-wr * r * r * sdyx[j] / M) : S(0);
      cc[j] = training ? static_cast<S>(-wr * sdy[j] / M) : S(0);
      mu[j] = mean[c0 + j];
    }
    for (int64_t n = 0; n < N; ++n) {
      const S* g = dyo.load<S>(n * C + c0, nc, dybuf);
      const S* v = xo.load<S>(n * C + c0, nc, xbuf);
      S* o = dxo.dest<S>(n * C + c0, obuf);
#pragma omp simd
      for (int64_t j = 0; j < nc; ++j) o[j] = NormBackwardFn<S>{ca[j], cb[j], cc[j], mu[j]}(g[j], v[j]);
      dxo.commit<S>(n * C + c0, nc, o);
    }
  }
}

template <class S>
void bn_forward_typed(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd, const Tensor& x,
                      const Tensor& weight, const Tensor& bias, bool training, double eps) {
  const int64_t C = x.size(1);
  const std::vector<S> w = load_vector<S>(weight, C, S(1)), b = load_vector<S>(bias, C, S(0));
  if (x.size(2) == 1) return bn_forward_rows<S>(y, mean, var, invstd, x, w, b, training, eps);
  bn_forward_spatial<S>(y, mean, var, invstd, x, w, b, training, eps);
}

template <class S>
void bn_backward_typed(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                       const Tensor& mean, const Tensor& invstd, const Tensor& weight, bool training) {
  const int64_t C = x.size(1);
  const std::vector<S> w = load_vector<S>(weight, C, S(1));
  const std::vector<S> m = load_vector<S>(mean, C, S(0)), r = load_vector<S>(invstd, C, S(1));
  if (x.size(2) == 1) return bn_backward_rows<S>(dx, dweight, dbias, dy, x, m, r, w, training);
  bn_backward_spatial<S>(dx, dweight, dbias, dy, x, m, r, w, training);
}

void batch_norm_forward_cpu(const Tensor& y, const Tensor& mean, const Tensor& var, const Tensor& invstd,
                            const Tensor& x, const Tensor& weight, const Tensor& bias, bool training, double eps) {
  if (mean.dtype() == DType::f64) return bn_forward_typed<double>(y, mean, var, invstd, x, weight, bias, training, eps);
  bn_forward_typed<float>(y, mean, var, invstd, x, weight, bias, training, eps);
}

void batch_norm_backward_cpu(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                             const Tensor& x, const Tensor& mean, const Tensor& invstd, const Tensor& weight,
                             bool training) {
  if (mean.dtype() == DType::f64)
    return bn_backward_typed<double>(dx, dweight, dbias, dy, x, mean, invstd, weight, training);
  bn_backward_typed<float>(dx, dweight, dbias, dy, x, mean, invstd, weight, training);
}

// ------------------------------------------------------------------------------ layer norm

template <class S>
void ln_forward_typed(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                      const Tensor& bias, double eps) {
  const int64_t M = x.size(0), N = x.size(1);
  const std::vector<S> w = load_vector<S>(weight, N, S(1)), b = load_vector<S>(bias, N, S(0));
  const Operand xo(x), yo(y);
  S* mp = mean.data_ptr<S>();
  S* rp = rstd.data_ptr<S>();
#pragma omp parallel if (go_parallel(x.numel()))
  {
    std::vector<S> xbuf(static_cast<size_t>(N)), obuf(static_cast<size_t>(N));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < M; ++row) {
      const S* v = xo.load<S>(row * N, N, xbuf.data());
      const S mu = static_cast<S>(block_sum(v, N) / static_cast<double>(N));
      const double q = block_sq_dev(v, N, mu);
      const S r = static_cast<S>(1.0 / std::sqrt(q / static_cast<double>(N) + eps));
      mp[row] = mu;
      rp[row] = r;
      S* o = yo.dest<S>(row * N, obuf.data());
      const S* wp = w.data();
      const S* bp = b.data();
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) o[j] = NormAffineFn<S>{mu, r * wp[j], bp[j]}(v[j]);
      yo.commit<S>(row * N, N, o);
    }
  }
}

template <class S>
void ln_backward_typed(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy, const Tensor& x,
                       const Tensor& mean, const Tensor& rstd, const Tensor& weight) {
  const int64_t M = x.size(0), N = x.size(1);
  const std::vector<S> w = load_vector<S>(weight, N, S(1));
  const std::vector<S> mv = load_vector<S>(mean, M, S(0)), rv = load_vector<S>(rstd, M, S(1));
  const Operand xo(x), dyo(dy), dxo(dx);
  const bool need_w = dweight.defined(), need_b = dbias.defined();
  const bool parallel = go_parallel(x.numel());
  const int nt = parallel ? omp_get_max_threads() : 1;
  // Per-thread partial column sums over rows (double: they add up M rows).
  std::vector<std::vector<double>> pw(need_w ? nt : 0), pb(need_b ? nt : 0);
#pragma omp parallel if (parallel)
  {
    const int tid = omp_get_thread_num();
    std::vector<S> xbuf(static_cast<size_t>(N)), dybuf(static_cast<size_t>(N)), obuf(static_cast<size_t>(N));
    double* aw = nullptr;
    double* ab = nullptr;
    if (need_w) {
      pw[tid].assign(static_cast<size_t>(N), 0.0);
      aw = pw[tid].data();
    }
    if (need_b) {
      pb[tid].assign(static_cast<size_t>(N), 0.0);
      ab = pb[tid].data();
    }
    const S* wp = w.data();
#pragma omp for schedule(static)
    for (int64_t row = 0; row < M; ++row) {
      const S* v = xo.load<S>(row * N, N, xbuf.data());
      const S* g = dyo.load<S>(row * N, N, dybuf.data());
      const S mu = mv[row], r = rv[row];
      if (aw != nullptr)
        for (int64_t j = 0; j < N; ++j) aw[j] += static_cast<double>(g[j]) * ((v[j] - mu) * r);
      if (ab != nullptr)
        for (int64_t j = 0; j < N; ++j) ab[j] += g[j];
      if (!dxo.defined()) continue;
      // With gw = dy * w: dx = r (gw - mean(gw) - xhat mean(gw xhat)); see NormBackwardFn.
      double sg = 0, sgx = 0;
      const auto md = static_cast<double>(mu);
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t j = 0; j < N; ++j) {
        const auto gw = static_cast<double>(g[j] * wp[j]);
        sg += gw;
        sgx += gw * (static_cast<double>(v[j]) - md);
      }
      const double dN = static_cast<double>(N);
      const S cb = static_cast<S>(-static_cast<double>(r) * r * r * sgx / dN);
      const S cc = static_cast<S>(-static_cast<double>(r) * sg / dN);
      S* o = dxo.dest<S>(row * N, obuf.data());
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) o[j] = NormBackwardFn<S>{wp[j] * r, cb, cc, mu}(g[j], v[j]);
      dxo.commit<S>(row * N, N, o);
    }
  }
  auto combine = [&](std::vector<std::vector<double>>& parts, const Tensor& out) {
    S* op = out.data_ptr<S>();
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (const auto& p : parts)
        if (!p.empty()) s += p[static_cast<size_t>(j)];
      op[j] = static_cast<S>(s);
    }
  };
  if (need_w) combine(pw, dweight);
  if (need_b) combine(pb, dbias);
}

void layer_norm_forward_cpu(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                            const Tensor& weight, const Tensor& bias, double eps) {
  if (mean.dtype() == DType::f64) return ln_forward_typed<double>(y, mean, rstd, x, weight, bias, eps);
  ln_forward_typed<float>(y, mean, rstd, x, weight, bias, eps);
}

void layer_norm_backward_cpu(const Tensor& dx, const Tensor& dweight, const Tensor& dbias, const Tensor& dy,
                             const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight) {
  if (mean.dtype() == DType::f64) return ln_backward_typed<double>(dx, dweight, dbias, dy, x, mean, rstd, weight);
  ln_backward_typed<float>(dx, dweight, dbias, dy, x, mean, rstd, weight);
}

}  // namespace

MP_REGISTER_KERNEL(batch_norm_forward_kernel, DeviceType::cpu, &batch_norm_forward_cpu);
MP_REGISTER_KERNEL(batch_norm_backward_kernel, DeviceType::cpu, &batch_norm_backward_cpu);
MP_REGISTER_KERNEL(layer_norm_forward_kernel, DeviceType::cpu, &layer_norm_forward_cpu);
MP_REGISTER_KERNEL(layer_norm_backward_kernel, DeviceType::cpu, &layer_norm_backward_cpu);

}  // namespace mp::backend::cpu

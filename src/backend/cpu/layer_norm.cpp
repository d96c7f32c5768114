// CPU kernels of layer norm, forward and backward (batch norm: batch_norm.cpp).
// Layer norm on x [M, N]: rows in parallel, two-pass statistics with double sums (Note [normalisation statistics
// on the CPU] in batch_norm.cpp); the weight/bias gradients (column sums over all rows) go into per-thread double
// partials combined in thread order (deterministic for a thread count).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/loops.hpp"
#include "backend/cpu/norm_common.hpp"
#include "backend/norm_kernels.hpp"

namespace mp::backend::cpu {
namespace {

using namespace norm_detail;

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

MP_REGISTER_KERNEL(layer_norm_forward_kernel, DeviceType::cpu, &layer_norm_forward_cpu);
MP_REGISTER_KERNEL(layer_norm_backward_kernel, DeviceType::cpu, &layer_norm_backward_cpu);

}  // namespace mp::backend::cpu

// oneDNN matmul against a double-precision reference: f32, bf16, strided/transposed views, batch broadcast,
// accumulation, bias, edge cases, errors, caching, thread safety and the AMX kernel choice.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/bf16_policy.hpp"
#include "backend/cpu/onednn/matmul.hpp"
#include "mp/core/half.hpp"

namespace mp::backend::cpu {
namespace {

// A strided buffer of `dtype` whose values are kept in a float mirror (exactly representable in `dtype`).
struct Buffer {
  DType dtype = DType::f32;
  std::vector<float> values;   // the mirror, used by the reference
  std::vector<uint8_t> bytes;  // what the kernel sees

  Buffer(DType t, int64_t elements, std::mt19937& rng) : dtype(t), values(elements), bytes(elements * dtype_size(t)) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int64_t i = 0; i < elements; ++i) set(i, dist(rng));
  }
  void set(int64_t i, float v) {
    if (dtype == DType::bf16) {
      const BFloat16 h(v);
      values[i] = static_cast<float>(h);  // the reference sees the rounded input
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    } else if (dtype == DType::f16) {
      const Half h(v);
      values[i] = static_cast<float>(h);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    } else {
      values[i] = v;
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    }
  }
  float get(int64_t i) const {  // read back what the kernel wrote
    if (dtype == DType::bf16) {
      BFloat16 h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      return static_cast<float>(h);
    }
    if (dtype == DType::f16) {
      Half h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      return static_cast<float>(h);
    }
    float v;
    std::memcpy(&v, bytes.data() + 4 * i, 4);
    return v;
  }
  void* data() { return bytes.data(); }
};

int64_t extent(int64_t batch, int64_t rows, int64_t cols, const int64_t st[3]) {
  return 1 + (batch - 1) * st[0] + (rows - 1) * st[1] + (cols - 1) * st[2];
}

// Runs `args` on random data and compares every element of C with a double reference.
//
// Tolerances. Every product of two bf16 numbers is exact in f32, so bf16 and f32 inputs differ only in
// the f32 accumulation order: the error of a k-term f32 sum is at most k*u*sum|a*b| (u = 2^-24) and
// about sqrt(k)*u*sum|a*b| typically; we allow 1e-5*sqrt(k) (~170x the typical value, still far below the
// O(1) error any indexing bug gives) relative to scale = sum|a*b| + |bias| + |old C|, which stays
// meaningful when the sum cancels. A bf16 C adds the output rounding: at most half an ulp = 2^-9 |c|;
// we allow 2^-8 |c| because the f32 value being rounded is itself slightly off (f16: 2^-11, allowed 2^-10).
// f16 products are exact in f32 too (11 x 11 significant bits).
void check_matmul(const MatmulArgs& args, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  Buffer a(args.a_dtype, extent(args.batch, args.m, args.k, args.a_strides), rng);
  Buffer b(args.b_dtype, extent(args.batch, args.k, args.n, args.b_strides), rng);
  Buffer c(args.c_dtype, extent(args.batch, args.m, args.n, args.c_strides), rng);
  Buffer bias(args.bias_dtype, args.n, rng);
  const Buffer c_old = c;
  matmul(args, a.data(), b.data(), c.data(), args.has_bias ? bias.data() : nullptr);

  const double rel = 1e-5 * std::sqrt(static_cast<double>(std::max<int64_t>(args.k, 1)));
  const double out_rel = args.c_dtype == DType::bf16  ? std::ldexp(1.0, -8)
                         : args.c_dtype == DType::f16 ? std::ldexp(1.0, -10)
                                                      : 0.0;
  int failures = 0;
  for (int64_t bb = 0; bb < args.batch; ++bb)
    for (int64_t i = 0; i < args.m; ++i)
      for (int64_t j = 0; j < args.n; ++j) {
        double ref = 0, scale = 0;
        for (int64_t p = 0; p < args.k; ++p) {
          const double x = a.values[bb * args.a_strides[0] + i * args.a_strides[1] + p * args.a_strides[2]];
          const double y = b.values[bb * args.b_strides[0] + p * args.b_strides[1] + j * args.b_strides[2]];
          ref += x * y;
          scale += std::abs(x * y);
        }
        if (args.has_bias) {
          ref += bias.values[j];
          scale += std::abs(bias.values[j]);
        }
        const int64_t ci = bb * args.c_strides[0] + i * args.c_strides[1] + j * args.c_strides[2];
        if (args.accumulate) {
          ref += c_old.values[ci];
          scale += std::abs(c_old.values[ci]);
        }
        const double got = c.get(ci);
        const double tol = rel * scale + out_rel * std::abs(ref) + 1e-30;
        if (!(std::abs(got - ref) <= tol) && ++failures <= 5)
          ADD_FAILURE() << "C[" << bb << "," << i << "," << j << "] = " << got << ", reference " << ref
                        << ", tolerance " << tol;
      }
  EXPECT_EQ(failures, 0) << "mismatches (first 5 shown above)";
  // Elements of C's buffer that are not part of C must stay untouched.
  std::vector<bool> in_c(c.values.size(), false);
  for (int64_t bb = 0; bb < args.batch; ++bb)
    for (int64_t i = 0; i < args.m; ++i)
      for (int64_t j = 0; j < args.n; ++j)
        in_c[bb * args.c_strides[0] + i * args.c_strides[1] + j * args.c_strides[2]] = true;
  for (size_t e = 0; e < in_c.size(); ++e)
    if (!in_c[e]) { ASSERT_EQ(c.get(static_cast<int64_t>(e)), c_old.values[e]) << "gap element " << e << " written"; }
}

constexpr DType kF32 = DType::f32, kBf16 = DType::bf16;

struct DtypeCase {
  DType ab, c;
};
const DtypeCase kDtypeCases[] = {{kF32, kF32}, {kBf16, kF32}, {kBf16, kBf16}};

// oneDNN 3.x has bf16 matmuls on AVX-512 CPUs only; on others (AMD Zen 3: AVX2) creating the primitive fails
// with an mp::Error naming the call, and the library computes bf16 through f32 there. The bf16 cases run where the
// library's probe (onednn_has_native, src/backend/cpu/bf16_policy.cpp) finds the kernels.
bool onednn_bf16_matmul() { return onednn_has_native(DType::bf16); }

bool runs_here(const DtypeCase& d) { return d.ab != kBf16 || onednn_bf16_matmul(); }

TEST(OnednnMatmul, ContiguousAllDtypes) {
  for (const auto& d : kDtypeCases) {
    if (!runs_here(d)) continue;
    for (const auto& [batch, m, n, k] : {std::tuple{1, 7, 5, 3}, {1, 33, 17, 65}, {3, 16, 24, 40}, {2, 1, 9, 130}}) {
      SCOPED_TRACE(detail::str_cat(dtype_name(d.ab), "->", dtype_name(d.c), " ", batch, "x", m, "x", n, "x", k));
      check_matmul(MatmulArgs::contiguous(batch, m, n, k, d.ab, d.c));
    }
  }
}

TEST(OnednnMatmul, TransposedAndStridedViews) {
  for (const auto& d : kDtypeCases) {
    if (!runs_here(d)) continue;
    SCOPED_TRACE(detail::str_cat(dtype_name(d.ab), "->", dtype_name(d.c)));
    const int64_t m = 19, n = 23, k = 37;
    MatmulArgs t = MatmulArgs::contiguous(1, m, n, k, d.ab, d.c);
    MatmulArgs a = t;  // A^T storage: A is a transposed view of a [k, m] matrix
    a.a_strides[1] = 1, a.a_strides[2] = m;
    check_matmul(a);
    MatmulArgs b = t;  // B is a transposed view of a [n, k] matrix (the x W^T of a linear layer)
    b.b_strides[1] = 1, b.b_strides[2] = k;
    check_matmul(b);
    MatmulArgs ab = a;  // both transposed, in a batch of 3
    ab.batch = 3, ab.a_strides[0] = m * k, ab.b_strides[0] = n * k, ab.b_strides[1] = 1, ab.b_strides[2] = k;
    ab.c_strides[0] = m * n;
    check_matmul(ab);
    MatmulArgs ld = t;  // padded leading dimensions (column slices of wider matrices)
    ld.a_strides[1] = k + 5, ld.b_strides[1] = n + 3, ld.c_strides[1] = n + 7;
    check_matmul(ld);
    MatmulArgs ct = t;  // column-major C: computed as C^T = B^T A^T in place
    ct.c_strides[1] = 1, ct.c_strides[2] = m;
    check_matmul(ct);
    ct.has_bias = true;  // ... and with a bias: C is packed
    check_matmul(ct);
    MatmulArgs odd = t;  // layouts oneDNN does not take: every other column, a broadcast row
    odd.a_strides[2] = 2, odd.a_strides[1] = 2 * k + 1;
    odd.b_strides[1] = 0;
    odd.c_strides[2] = 3, odd.c_strides[1] = 3 * n;
    odd.accumulate = true;
    check_matmul(odd);
    MatmulArgs bodd = odd;  // the same in a batch with overlapping A matrices
    bodd.batch = 2, bodd.a_strides[0] = 5, bodd.b_strides[0] = k * n, bodd.c_strides[0] = 3 * n * m;
    check_matmul(bodd);
  }
}

TEST(OnednnMatmul, BatchBroadcast) {
  for (const auto& d : kDtypeCases) {
    if (!runs_here(d)) continue;
    SCOPED_TRACE(detail::str_cat(dtype_name(d.ab), "->", dtype_name(d.c)));
    MatmulArgs args = MatmulArgs::contiguous(4, 9, 11, 13, d.ab, d.c);
    args.b_strides[0] = 0;  // shared weight
    check_matmul(args);
    args = MatmulArgs::contiguous(4, 9, 11, 13, d.ab, d.c);
    args.a_strides[0] = 0;
    check_matmul(args);
    args.b_strides[0] = 0;  // both broadcast: every C matrix is the same product
    check_matmul(args);
    args.b_strides[1] = 1, args.b_strides[2] = 13;  // broadcast and transposed
    check_matmul(args);
  }
}

TEST(OnednnMatmul, AccumulateAndBias) {
  for (const auto& d : kDtypeCases)
    for (DType bias_dtype : {kF32, kBf16}) {
      if ((d.ab == kF32 && bias_dtype == kBf16) || !runs_here(d)) continue;
      SCOPED_TRACE(detail::str_cat(dtype_name(d.ab), "->", dtype_name(d.c), " bias ", dtype_name(bias_dtype)));
      MatmulArgs args = MatmulArgs::contiguous(1, 17, 29, 31, d.ab, d.c);
      args.accumulate = true;
      check_matmul(args);
      args.has_bias = true, args.bias_dtype = bias_dtype;
      check_matmul(args);
      args.accumulate = false;
      check_matmul(args);
      args = MatmulArgs::contiguous(3, 5, 8, 6, d.ab, d.c);  // batched, with a transposed B
      args.b_strides[1] = 1, args.b_strides[2] = 6;
      args.has_bias = true, args.bias_dtype = bias_dtype, args.accumulate = true;
      check_matmul(args);
    }
}

TEST(OnednnMatmul, EmptyReductionAndEmptyOutput) {
  for (const auto& d : kDtypeCases) {
    MatmulArgs args = MatmulArgs::contiguous(2, 3, 4, 0, d.ab, d.c);
    check_matmul(args);  // C = 0
    args.has_bias = true;
    args.accumulate = true;
    check_matmul(args);  // C += bias
    float c = 42;
    matmul(MatmulArgs::contiguous(1, 0, 5, 7), nullptr, nullptr, &c, nullptr);  // nothing to do
    EXPECT_EQ(c, 42.0f);
  }
}

TEST(OnednnMatmul, ErrorsNameTheProblem) {
  std::vector<float> buf(64);
  auto expect_error = [&](const MatmulArgs& args, const std::string& needle) {
    try {
      matmul(args, buf.data(), buf.data(), buf.data(), nullptr);
      ADD_FAILURE() << "expected an mp::Error mentioning " << needle;
    } catch (const Error& e) { EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what(); }
  };
  expect_error(MatmulArgs::contiguous(1, 2, 2, 2, DType::i32, kF32), "i32");
  expect_error(MatmulArgs::contiguous(1, 2, 2, 2, kF32, kBf16), "bf16 C");
  MatmulArgs mixed = MatmulArgs::contiguous(1, 2, 2, 2);
  mixed.b_dtype = kBf16;
  expect_error(mixed, "same dtype");
  MatmulArgs neg = MatmulArgs::contiguous(1, 2, 2, 2);
  neg.a_strides[1] = -1;
  expect_error(neg, "non-negative");
  MatmulArgs bcast_c = MatmulArgs::contiguous(2, 2, 2, 2);
  bcast_c.c_strides[0] = 0;
  expect_error(bcast_c, "broadcast");
  MatmulArgs no_bias = MatmulArgs::contiguous(1, 2, 2, 2);
  no_bias.has_bias = true;
  expect_error(no_bias, "bias is null");
  MatmulArgs f16_c = MatmulArgs::contiguous(1, 2, 2, 2, kBf16, DType::f16);
  expect_error(f16_c, "f16 C");
  EXPECT_EQ(to_dnnl(DType::f16, "test"), dnnl::memory::data_type::f16);
  try {
    to_dnnl(DType::f64, "conv2d (input)");
    ADD_FAILURE() << "expected an mp::Error for f64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("conv2d (input)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f64"), std::string::npos) << e.what();
  }
}

// f16 operands reach oneDNN 3.x, which has f16 matmul kernels on CPUs with AVX512-FP16 or AMX-FP16: the
// product is right wherever a primitive is created, and a CPU without one says so in an mp::Error that names
// the oneDNN call and the problem.
TEST(OnednnMatmul, F16ComputesOrSaysWhy) {
  for (const auto& [ab, c] : {DtypeCase{DType::f16, kF32}, DtypeCase{DType::f16, DType::f16}}) {
    const MatmulArgs args = MatmulArgs::contiguous(2, 33, 17, 65, ab, c);
    SCOPED_TRACE(detail::str_cat("f16 -> ", dtype_name(c)));
    std::string impl;
    try {
      impl = matmul_impl_info(args);
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const char* part : {"dnnl::matmul", "f16", "unimplemented"})
        EXPECT_NE(msg.find(part), std::string::npos) << part << " missing from: " << msg;
      std::printf("[   INFO   ] no f16 matmul on this CPU: %s\n", msg.c_str());
      continue;
    }
    EXPECT_FALSE(impl.empty());
    std::printf("[   INFO   ] f16 -> %s matmul runs on %s\n", dtype_name(c), impl.c_str());
    check_matmul(args);
  }
}

TEST(OnednnCommon, ReferenceImplementationsAreRecognised) {
  for (const char* ref : {"ref:any", "ref_int8:any", "gemm:ref", "x64:gemm:ref", "ref"})
    EXPECT_TRUE(onednn_reference_impl(ref)) << ref;
  for (const char* fast : {"brg:avx512_core_amx", "gemm:jit", "jit:avx512_core", "x64:gemm:jit", "brgconv:avx512_core",
                           "brg_matmul:avx512_core_bf16", ""})
    EXPECT_FALSE(onednn_reference_impl(fast)) << fast;
  EXPECT_EQ(onednn_version().substr(0, 2), "3.");
}

TEST(OnednnCommon, FailedOnednnCallsBecomeErrorsNamingCallAndShapes) {
  try {
    onednn_check(
        "dnnl::fake_call", [] { return std::string("shape [2,3]"); },
        []() -> int { throw dnnl::error(dnnl_invalid_arguments, "bad descriptor"); });
    ADD_FAILURE() << "expected an mp::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* part : {"dnnl::fake_call", "shape [2,3]", "bad descriptor", "invalid_arguments"})
      EXPECT_NE(msg.find(part), std::string::npos) << part << " missing from: " << msg;
  }
  EXPECT_EQ(onednn_check(
                "ok", [] { return std::string(); }, [] { return 42; }),
            42);
  EXPECT_EQ(to_dnnl(DType::bf16), dnnl::memory::data_type::bf16);
  EXPECT_EQ(to_dnnl(DType::f32), dnnl::memory::data_type::f32);
}

TEST(OnednnCommon, PrimitiveCacheEvictsLeastRecentlyUsed) {
  struct Key {
    int64_t v;
    bool operator==(const Key&) const = default;
  };
  PrimitiveCache<Key, int> cache(2);
  int builds = 0;
  auto get = [&](int64_t v) {
    return *cache.get_or_create(Key{v}, [&] {
      ++builds;
      return static_cast<int>(v);
    });
  };
  EXPECT_EQ(get(1), 1);
  EXPECT_EQ(get(2), 2);
  EXPECT_EQ(get(1), 1);  // hit: 1 becomes the most recent
  EXPECT_EQ(get(3), 3);  // evicts 2
  EXPECT_EQ(builds, 3);
  EXPECT_EQ(get(1), 1);
  EXPECT_EQ(builds, 3);
  EXPECT_EQ(get(2), 2);  // rebuilt
  EXPECT_EQ(builds, 4);
  EXPECT_EQ(cache.stats().size, 2u);
}

TEST(OnednnMatmul, PrimitiveIsBuiltOncePerConfiguration) {
  const MatmulArgs args = MatmulArgs::contiguous(2, 12, 10, 14, onednn_bf16_matmul() ? kBf16 : kF32, kF32);
  check_matmul(args);
  const CacheStats before = matmul_cache_stats();
  check_matmul(args, 2);
  check_matmul(args, 3);
  const CacheStats after = matmul_cache_stats();
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.hits, before.hits + 2);
  MatmulArgs t = args;  // different strides: a different primitive
  t.b_strides[1] = 1, t.b_strides[2] = 14;
  check_matmul(t);
  EXPECT_EQ(matmul_cache_stats().misses, after.misses + 1);
}

TEST(OnednnMatmul, ConcurrentCallsFromSeveralThreads) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int r = 0; r < 3; ++r)
        check_matmul(MatmulArgs::contiguous(2, 24 + t % 2, 20, 36, t % 2 && onednn_bf16_matmul() ? kBf16 : kF32, kF32),
                     10 * t + r);
    });
  for (auto& th : threads) th.join();
}

bool cpu_has_amx_bf16() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) return line.find(" amx_bf16") != std::string::npos;
  return false;
}

TEST(OnednnMatmul, Bf16UsesAmxWhenTheCpuHasIt) {
  if (!onednn_bf16_matmul()) GTEST_SKIP() << "oneDNN has no bf16 matmul on this CPU (no AVX-512)";
  const MatmulArgs args = MatmulArgs::contiguous(1, 128, 128, 128, kBf16, kF32);
  const std::string impl = matmul_impl_info(args);
  EXPECT_FALSE(impl.empty());
  check_matmul(args);
  EXPECT_FALSE(onednn_last_impl("matmul").empty());
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "no amx_bf16 in /proc/cpuinfo; oneDNN chose " << impl;
  EXPECT_NE(impl.find("amx"), std::string::npos) << "oneDNN chose " << impl;
  MatmulArgs bf16_out = args;
  bf16_out.c_dtype = kBf16;
  EXPECT_NE(matmul_impl_info(bf16_out).find("amx"), std::string::npos) << matmul_impl_info(bf16_out);
}

}  // namespace
}  // namespace mp::backend::cpu

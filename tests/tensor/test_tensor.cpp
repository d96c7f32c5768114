#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <sstream>

#include "mp/mp.hpp"
#include "test_util.hpp"

using namespace mp;

TEST(Tensor, FactoriesShapeAndValues) {
  Tensor z = zeros({2, 3});
  EXPECT_EQ(z.sizes(), (Shape{2, 3}));
  EXPECT_EQ(z.strides(), (Shape{3, 1}));
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.dtype(), DType::f32);
  EXPECT_TRUE(z.device().is_cpu());
  for (float v : z.to_vector<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : ones({4}).to_vector<float>()) EXPECT_EQ(v, 1.0f);
  for (double v : full({3}, 2.5, {.dtype = DType::f64}).to_vector<double>()) EXPECT_EQ(v, 2.5);
  auto ar = arange(5).to_vector<int64_t>();
  EXPECT_EQ(ar, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(0.0, 1.0, 0.25, {.dtype = DType::f32}).numel(), 4);
  EXPECT_EQ(scalar_tensor(3.0).dim(), 0);
  EXPECT_EQ(scalar_tensor(3.0).item<float>(), 3.0f);
}

TEST(Tensor, AllDtypesRoundTrip) {
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8, DType::b8}) {
    Tensor t = arange(0.0, 6.0, 1.0, {.dtype = dt}).reshape({2, 3});
    EXPECT_EQ(t.dtype(), dt);
    EXPECT_EQ(t.element_size(), dtype_size(dt));
    auto v = t.to(DType::f64).to_vector<double>();
    for (int i = 0; i < 6; ++i) EXPECT_EQ(v[i], dt == DType::b8 ? (i != 0 ? 1.0 : 0.0) : i) << dtype_name(dt);
  }
}

TEST(Tensor, ViewsShareStorage) {
  Tensor a = arange(0.0, 24.0, 1.0, {.dtype = DType::f32}).reshape({2, 3, 4});
  Tensor t = a.transpose(0, 2);
  EXPECT_EQ(t.sizes(), (Shape{4, 3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(t.is_alias_of(a));
  EXPECT_EQ(t.contiguous().to_vector<float>()[1], 12.0f);  // t[0,0,1] = a[1,0,0]
  Tensor n = a.narrow(2, 1, 2);
  EXPECT_EQ(n.sizes(), (Shape{2, 3, 2}));
  EXPECT_EQ(n.contiguous().to_vector<float>()[0], 1.0f);
  Tensor s = a.slice(1, 0, 3, 2);
  EXPECT_EQ(s.sizes(), (Shape{2, 2, 4}));
  EXPECT_EQ(s.contiguous().to_vector<float>()[4], 8.0f);
  Tensor e = ones({3, 1}).expand({2, 3, 4});
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_EQ(sum(e).item<float>(), 24.0f);
  Tensor sel = a.select(0, 1);
  EXPECT_EQ(sel.sizes(), (Shape{3, 4}));
  EXPECT_EQ(sel.to_vector<float>()[0], 12.0f);
  EXPECT_EQ(a.permute({2, 0, 1}).sizes(), (Shape{4, 2, 3}));
  EXPECT_EQ(a.flatten(1).sizes(), (Shape{2, 12}));
  EXPECT_EQ(a.unsqueeze(1).sizes(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(a.unsqueeze(1).squeeze(1).sizes(), (Shape{2, 3, 4}));
  // Writing through a view changes the base.
  a.narrow(0, 0, 1).fill_(7.0);
  EXPECT_EQ(a.to_vector<float>()[11], 7.0f);
  EXPECT_EQ(a.to_vector<float>()[12], 12.0f);
}

TEST(Tensor, FillZeroFastPathMatchesGenericFill) {
  // fill_(0) on contiguous host memory is a memset; the result must equal the generic path's in
  // every dtype, touch only the tensor's own range, and leave -0.0 to the generic path.
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8, DType::b8}) {
    Tensor a = ones({3, 5}, {.dtype = dt});
    a.narrow(0, 1, 1).fill_(0.0);  // contiguous view in the middle of the storage
    const std::vector<double> v = a.to(DType::f64).to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], i >= 5 && i < 10 ? 0.0 : 1.0) << dtype_name(dt) << " " << i;
    Tensor t = ones({4, 3}, {.dtype = dt}).t();  // not contiguous: generic path
    t.fill_(0.0);
    EXPECT_EQ(sum(t.to(DType::f64)).item<double>(), 0.0) << dtype_name(dt);
  }
  Tensor z = ones({4});
  const uint64_t v0 = z.version();
  z.fill_(0.0);
  EXPECT_GT(z.version(), v0);
  z.fill_(-0.0);
  for (float f : z.to_vector<float>()) EXPECT_TRUE(std::signbit(f));
}

TEST(Tensor, ReshapeCopiesOnlyWhenNeeded) {
  Tensor a = arange(0.0, 12.0, 1.0, {.dtype = DType::f32}).reshape({3, 4});
  EXPECT_TRUE(a.reshape({4, 3}).is_alias_of(a));
  EXPECT_TRUE(a.reshape({-1}).is_alias_of(a));
  Tensor t = a.t();
  EXPECT_FALSE(t.reshape({12}).is_alias_of(a));
  EXPECT_EQ(t.reshape({12}).to_vector<float>()[1], 4.0f);
  EXPECT_THROW(t.view({12}), Error);
}

TEST(Tensor, CastsRoundToNearestEven) {
  Tensor a = from_vector<float>({1.0f, 1.00390625f, 1.01171875f, 70000.0f, 1e-8f}, {5});
  auto bf = a.to(DType::bf16).to_vector<BFloat16>();
  EXPECT_EQ(static_cast<float>(bf[0]), 1.0f);
  EXPECT_EQ(static_cast<float>(bf[1]), 1.0f);       // tie -> even
  EXPECT_EQ(static_cast<float>(bf[2]), 1.015625f);  // tie -> even (up)
  auto h = a.to(DType::f16).to_vector<Half>();
  EXPECT_TRUE(std::isinf(static_cast<float>(h[3])));  // overflow -> inf
  EXPECT_EQ(static_cast<float>(h[4]), 0.0f);          // below half subnormals (2^-25 ~ 3e-8)
}

TEST(Tensor, RandomIsSeededAndDeterministic) {
  manual_seed(42);
  Tensor a = randn({1000});
  manual_seed(42);
  Tensor b = randn({1000});
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  Tensor c = randn({1000});
  EXPECT_NE(a.to_vector<float>(), c.to_vector<float>());
  const double m = mean(a).item<double>();
  EXPECT_NEAR(m, 0.0, 0.15);  // 1000 samples: std of mean 0.032, bound ~4.7 sigma
  Tensor u = rand({10000}, {}, 2.0, 3.0);
  EXPECT_GE(amin(u, {}).item<float>(), 2.0f);
  EXPECT_LT(amax(u, {}).item<float>(), 3.0f);
  Tensor r = randint(0, 10, {1000});
  EXPECT_GE(amin(r, {}).item<int64_t>(), 0);
  EXPECT_LE(amax(r, {}).item<int64_t>(), 9);
}

TEST(Tensor, Printing) {
  std::ostringstream os;
  os << arange(0.0, 3.0, 1.0, {.dtype = DType::f32});
  EXPECT_NE(os.str().find("shape=[3]"), std::string::npos);
  EXPECT_NE(os.str().find("f32"), std::string::npos);
  EXPECT_NE(os.str().find("2"), std::string::npos);
}

TEST(Tensor, ErrorsNameOpExpectedAndGot) {
  Tensor a = zeros({2, 3});
  try {
    a.view({4, 2});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("view"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[4, 2]"), std::string::npos);
  }
  try {
    (void)(zeros({2, 3}) + zeros({4}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos);
  }
  EXPECT_THROW(a.data_ptr<double>(), Error);
  EXPECT_THROW(a.size(5), Error);
  EXPECT_THROW(Tensor().sizes(), Error);
  EXPECT_THROW(dtype_from_string("f8"), Error);
  EXPECT_THROW(Device("tpu"), Error);
  EXPECT_THROW(a.to(Device("cuda:0")), Error);
}

TEST(Memory, PeakStatsTrackAllocations) {
  memory::reset_peak_memory_stats();
  const auto before = memory::memory_stats();
  {
    Tensor big = empty({1 << 20});  // 4 MiB
    const auto during = memory::memory_stats();
    EXPECT_GE(during.allocated - before.allocated, 4 << 20);
  }
  const auto after = memory::memory_stats();
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak_allocated - before.allocated, 4 << 20);
}

// Empty tensors are contiguous whatever their strides, and every view of one exists (PyTorch's rule):
// a [5, 0] tensor gets strides [1, 1], which the general rule called non-contiguous, so views and
// the K = 0 matmul that reshapes it failed.
TEST(Tensor, EmptyTensorsAreContiguousAndViewable) {
  const Tensor a = zeros({5, 0});
  EXPECT_TRUE(a.is_contiguous());
  EXPECT_EQ(a.view({0, 5}).sizes(), (Shape{0, 5}));
  EXPECT_EQ(a.reshape({0}).numel(), 0);
  EXPECT_EQ(a.view({5, 0}).strides(), a.strides());
  const Tensor p = matmul(zeros({5, 0}), zeros({0, 7}));  // an empty sum: all zeros
  EXPECT_EQ(p.sizes(), (Shape{5, 7}));
  for (float v : p.to_vector<float>()) EXPECT_EQ(v, 0.0f);
  const Tensor q = matmul(zeros({2, 5, 0}).to(DType::bf16), zeros({2, 0, 3}).to(DType::bf16));
  EXPECT_EQ(q.sizes(), (Shape{2, 5, 3}));
  for (float v : q.to_vector<float>()) EXPECT_EQ(v, 0.0f);
}

// A shape's strides count a 0 as 1, so a tensor without elements can still have strides beyond int64 (found by the
// fuzz targets of the file readers: a signed overflow in empty()).
TEST(Tensor, EmptyRefusesShapesWhoseStridesOrBytesOverflow) {
  constexpr int64_t k62 = int64_t{1} << 62;
  EXPECT_TRUE(shape_fits({}, 8));
  EXPECT_TRUE(shape_fits({0, k62, 1}, 4));
  EXPECT_TRUE(shape_fits({k62}, 1));
  EXPECT_FALSE(shape_fits({0, k62, 2}, 1));  // the outer stride is 2^63
  EXPECT_FALSE(shape_fits({k62}, 2));        // 2^63 bytes
  EXPECT_FALSE(shape_fits({-1}, 1));
  mp::test::expect_error([&] { (void)empty({0, k62, 4}); }, {"empty: shape [0, 4611686018427387904, 4]", "64 bits"});
  EXPECT_EQ(empty({0, k62, 1}).numel(), 0);
}

TEST(Tensor, TransposingCopiesAndCastsMatchElementByElement) {
  // Note [transposing copies]: copies whose input is unit-stride along another dim than the output's go tile by
  // tile. Every dtype pair, sizes that are no multiple of the tile, an outer dim, into a transposed output too: each
  // element equals the flat cast of its source element.
  manual_seed(4);
  const DType dts[] = {DType::f32, DType::bf16, DType::f16};
  for (const DType from : dts)
    for (const DType to : dts) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      const Tensor src = randn({3, 131, 259}).to(from);
      const std::vector<double> flat = src.to(to).to_vector<double>();  // [3, 131, 259], cast without transposing
      Tensor out = empty({3, 259, 131}, {.dtype = to});
      out.copy_(src.permute({0, 2, 1}));
      const std::vector<double> got = out.to_vector<double>();
      Tensor out_t = empty({3, 259, 131}, {.dtype = to}).permute({0, 2, 1});  // a transposed destination
      out_t.copy_(src);
      const std::vector<double> got_t = out_t.permute({0, 2, 1}).contiguous().to_vector<double>();
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t i = 0; i < 259; ++i)
          for (int64_t j = 0; j < 131; ++j) {
            const size_t o = static_cast<size_t>((b * 259 + i) * 131 + j),
                         s = static_cast<size_t>((b * 131 + j) * 259 + i);
            ASSERT_EQ(got[o], flat[s]) << "b " << b << " i " << i << " j " << j;
            ASSERT_EQ(got_t[o], flat[s]) << "transposed destination, b " << b << " i " << i << " j " << j;
          }
    }
  // Channels-last and back, and a broadcast (stride-0) input.
  const Tensor x = randn({2, 70, 9, 11});
  EXPECT_EQ(x.contiguous(MemoryFormat::channels_last).contiguous().to_vector<float>(), x.to_vector<float>());
  const Tensor v = randn({300});
  const std::vector<float> vv = v.to_vector<float>(),
                           e = v.unsqueeze(1).expand({300, 200}).contiguous().to_vector<float>();
  for (size_t i = 0; i < 300; ++i)
    for (size_t j = 0; j < 200; ++j) ASSERT_EQ(e[i * 200 + j], vv[i]);
}

// Note [row copies]: a cast between f32 and bf16/f16 whose rows are unit-stride on both sides converts whole rows
// with the bulk converters; it must agree bit for bit with the scalar conversion (round to nearest even, NaNs kept
// NaN, -0, infinities, subnormals) on every 16-bit pattern widened and on f32 patterns around every rounding tie,
// through a transpose of outer dims and in long rows split into pieces.
TEST(Tensor, RowCastsMatchTheScalarConversion) {
  for (DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    auto widen = [dt](uint16_t b) {
      return dt == DType::bf16 ? detail::bf16_bits_to_float(b) : detail::half_bits_to_float(b);
    };
    auto narrow = [dt](float f) {
      return dt == DType::bf16 ? detail::float_to_bf16_bits(f) : detail::float_to_half_bits(f);
    };
    // Every 16-bit pattern, as [2, 4, 128, 64] permuted to [2, 128, 4, 64]: rows of 64 elements.
    Tensor h = empty({2, 4, 128, 64}, {.dtype = dt});
    auto* hb = static_cast<uint16_t*>(h.raw_data());
    for (uint32_t i = 0; i < 65536; ++i) hb[i] = static_cast<uint16_t>(i);
    const Tensor hp = h.permute({0, 2, 1, 3});
    const Tensor w = hp.to(DType::f32);
    ASSERT_TRUE(w.is_contiguous());
    const auto wv = w.to_vector<float>();
    const auto* hb_p = static_cast<const uint16_t*>(hp.contiguous().raw_data());
    size_t wrong = 0;
    for (size_t i = 0; i < wv.size(); ++i) {
      const float r = widen(hb_p[i]);
      wrong += std::isnan(r) ? !std::isnan(wv[i]) : std::memcmp(&r, &wv[i], 4) != 0;
    }
    EXPECT_EQ(wrong, 0u) << "widening";
    // f32 patterns: each widened value, its neighbours one f32 ulp away and the midpoints to the next 16-bit value
    // (ties), in one long contiguous row (pieces) and through the same permute.
    std::vector<float> f;
    for (uint32_t i = 0; i < 65536; i += 3) {
      const float v = widen(static_cast<uint16_t>(i)), u = widen(static_cast<uint16_t>(i + 1));
      f.insert(f.end(), {v, std::nextafter(v, INFINITY), std::nextafter(v, -INFINITY), v + (u - v) / 2});
    }
    f.resize(f.size() / 128 * 128);
    const Tensor x = from_vector(f, {2, static_cast<int64_t>(f.size()) / 128, 64});
    for (const Tensor& src : {x, x.permute({1, 0, 2})}) {
      const Tensor n16 = src.to(dt);
      ASSERT_TRUE(n16.is_contiguous());
      const Tensor srcc = src.contiguous();
      const auto* sv = srcc.data_ptr<float>();
      const auto* nb = static_cast<const uint16_t*>(n16.raw_data());
      size_t bad = 0;
      for (int64_t i = 0; i < n16.numel(); ++i) {
        const uint16_t r = narrow(sv[i]);
        bad += std::isnan(sv[i]) ? !std::isnan(widen(nb[i])) : r != nb[i];
      }
      EXPECT_EQ(bad, 0u) << "narrowing, " << (src.is_contiguous() ? "contiguous" : "permuted");
    }
  }
}

// Note [row copies]: a copy within one dtype whose rows are unit-stride on both sides (here attention's
// [B, T, H, D] -> [B, H, T, D], rows of D = 40) moves the bytes: every bit pattern survives, NaN payloads and
// -0 included, in every dtype; a long contiguous row goes in pieces, and rows shorter than 64 bytes take the
// element-wise loop with the same values.
TEST(Tensor, SameDtypeCopiesKeepEveryBit) {
  for (DType dt : {DType::bf16, DType::f16, DType::f32, DType::f64, DType::i64, DType::u8}) {
    SCOPED_TRACE(dtype_name(dt));
    for (int64_t D : {40, 3, 70000}) {
      const int64_t B = 2, T = D > 1000 ? 2 : 5, H = 3;
      Tensor x = empty({B, T, H, D}, {.dtype = dt});
      auto* bytes = static_cast<uint8_t*>(x.raw_data());
      const size_t n = static_cast<size_t>(x.numel()) * dtype_size(dt);
      for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);  // NaNs, -0, ...
      const Tensor y = x.permute({0, 2, 1, 3}).contiguous();
      ASSERT_TRUE(y.is_contiguous());
      const size_t es = dtype_size(dt);
      const auto* yb = static_cast<const uint8_t*>(y.raw_data());
      size_t wrong = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t t = 0; t < T; ++t) {
            if (D < 64 / static_cast<int64_t>(es)) continue;  // the loop's rows: values, not bits (NaNs)
            const size_t src = static_cast<size_t>(((b * T + t) * H + h) * D) * es;
            const size_t dst = static_cast<size_t>(((b * H + h) * T + t) * D) * es;
            wrong += std::memcmp(bytes + src, yb + dst, static_cast<size_t>(D) * es) != 0;
          }
      EXPECT_EQ(wrong, 0u) << "D " << D;
      if (!is_floating(dt) || D < 64 / static_cast<int64_t>(es)) {
        const Tensor ref = x.to(DType::f64).permute({0, 2, 1, 3}).contiguous();
        const auto a = y.to(DType::f64).to_vector<double>(), r = ref.to_vector<double>();
        for (size_t i = 0; i < a.size(); ++i)
          if (!(std::isnan(a[i]) && std::isnan(r[i]))) { ASSERT_EQ(a[i], r[i]) << i; }
      }
    }
  }
}

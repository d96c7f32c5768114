// convert_safetensors: f32 -> bf16 halves the data and rounds to nearest even exactly like Tensor::to,
// integer tensors and metadata survive, f32 -> f16 -> f32 stays within f16 precision, in-place works.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "mp/core/error.hpp"
#include "mp/train/convert.hpp"
#include "mp/train/safetensors.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using mp::DType;
using mp::Tensor;
using mp::test::scratch_dir;

namespace {

std::string tensor_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.raw_data()), static_cast<size_t>(c.numel()) * c.element_size());
}

int64_t data_bytes(const std::string& path, DType* only = nullptr) {
  int64_t n = 0;
  for (const auto& i : mp::train::read_safetensors_header(path))
    if (only == nullptr || i.dtype == *only) n += i.nbytes;
  return n;
}

}  // namespace

TEST(Convert, F32ToBf16HalvesRoundsToNearestEvenKeepsIntegers) {
  const fs::path dir = scratch_dir("convert", "bf16");
  const std::string in = (dir / "in.safetensors").string(), out = (dir / "out.safetensors").string();
  // Hand-picked ties: bf16 keeps 8 significant bits, so 1 + 2^-8 lies halfway between 1 and 1 + 2^-7
  // (even: 1), 1 + 3*2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (even: 1 + 2^-6); 1 + 2^-8 + 2^-20 is
  // above the tie (rounds up to 1 + 2^-7).
  const float t1 = 1.f + std::ldexp(1.f, -8), t2 = 1.f + 3 * std::ldexp(1.f, -8), t3 = t1 + std::ldexp(1.f, -20);
  const Tensor ties = mp::from_vector<float>({t1, t2, t3, -t1, -t2}, {5});
  const Tensor w = mp::randn({256, 64});
  const Tensor idx = mp::randint(-5, 5, {100});
  const Tensor mask = mp::randint(0, 2, {10}).to(DType::b8);
  const Tensor w64 = mp::randn({8}, {.dtype = DType::f64});
  mp::train::save_safetensors(in, {{"ties", ties}, {"w", w}, {"idx", idx}, {"mask", mask}, {"w64", w64}},
                              {{"format", "pt"}, {"config", "{\"model\": \"mlp\"}"}});
  const mp::train::ConvertStats s = mp::train::convert_safetensors(in, out, DType::bf16);
  EXPECT_EQ(s.tensors, 5);
  EXPECT_EQ(s.converted, 3);  // ties, w, w64
  EXPECT_EQ(s.bytes_in, static_cast<int64_t>(fs::file_size(in)));
  EXPECT_EQ(s.bytes_out, static_cast<int64_t>(fs::file_size(out)));

  const auto f = mp::train::load_safetensors(out);
  EXPECT_EQ(f.tensors.keys(), (std::vector<std::string>{"ties", "w", "idx", "mask", "w64"}));
  EXPECT_EQ(f.tensors.at("ties").to_vector<float>(),
            (std::vector<float>{1.f, 1.f + std::ldexp(1.f, -6), 1.f + std::ldexp(1.f, -7), -1.f,
                                -1.f - std::ldexp(1.f, -6)}));
  for (const char* name : {"ties", "w", "w64"}) {
    const Tensor& t = f.tensors.at(name);
    EXPECT_EQ(t.dtype(), DType::bf16) << name;
    // Bit-identical to Tensor::to on the original (the library's one rounding routine).
    const Tensor orig = name == std::string("ties") ? ties : name == std::string("w") ? w : w64;
    EXPECT_EQ(tensor_bytes(t), tensor_bytes(orig.to(DType::bf16))) << name;
  }
  EXPECT_EQ(f.tensors.at("idx").dtype(), DType::i64);
  EXPECT_EQ(tensor_bytes(f.tensors.at("idx")), tensor_bytes(idx));
  EXPECT_EQ(f.tensors.at("mask").dtype(), DType::b8);
  EXPECT_EQ(tensor_bytes(f.tensors.at("mask")), tensor_bytes(mask));
  // Metadata kept exactly, plus the new dtype.
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{
                            {"format", "pt"}, {"config", "{\"model\": \"mlp\"}"}, {"dtype", "bf16"}}));
  // f32 data exactly halves (f64 quarters); integer data is the same size.
  DType f32 = DType::f32, bf16 = DType::bf16, i64 = DType::i64;
  EXPECT_EQ(data_bytes(out, &bf16), data_bytes(in, &f32) / 2 + 8 * 2);
  EXPECT_EQ(data_bytes(out, &i64), data_bytes(in, &i64));
  EXPECT_LT(s.bytes_out, s.bytes_in * 55 / 100);  // dominated by the 256x64 f32 weight
}

TEST(Convert, F16RoundTripWithinHalfPrecisionInPlace) {
  const fs::path dir = scratch_dir("convert", "f16");
  const std::string path = (dir / "m.safetensors").string();
  // Magnitudes from 1e-4 to 1e4: inside f16's normal range (6.1e-5 .. 65504), where round to nearest
  // has a relative error of at most 2^-11 (half of f16's 10-bit mantissa ulp).
  const Tensor mag = mp::rand({1000}, {}, -4, 4);
  std::vector<float> vals;
  for (float e : mag.to_vector<float>()) vals.push_back((vals.size() % 2 ? -1.f : 1.f) * std::pow(10.f, e));
  const Tensor x = mp::from_vector<float>(vals, {10, 100});
  mp::train::save_safetensors(path, {{"x", x}});
  const auto s1 = mp::train::convert_safetensors(path, path, DType::f16);  // in place
  EXPECT_EQ(s1.converted, 1);
  EXPECT_EQ(mp::train::load_safetensors(path).tensors.at("x").dtype(), DType::f16);
  mp::train::convert_safetensors(path, path, DType::f32);
  const auto f = mp::train::load_safetensors(path);
  const Tensor& back = f.tensors.at("x");
  ASSERT_EQ(back.dtype(), DType::f32);
  ASSERT_EQ(back.sizes(), (mp::Shape{10, 100}));
  const auto b = back.to_vector<float>();
  double worst = 0;
  for (size_t i = 0; i < vals.size(); ++i)
    worst = std::max(worst, std::abs(double(b[i]) - vals[i]) / std::abs(vals[i]));
  EXPECT_LE(worst, std::ldexp(1.0, -11));
  EXPECT_GT(worst, 0.0);  // it did go through f16
  EXPECT_EQ(f.metadata.at("dtype"), "f32");
  // Converting to the dtype it already has changes no tensor.
  EXPECT_EQ(mp::train::convert_safetensors(path, path, DType::f32).converted, 0);
}

TEST(Convert, RefusesIntegerTargetAndMissingInput) {
  const fs::path dir = scratch_dir("convert", "refuse");
  const std::string path = (dir / "m.safetensors").string();
  mp::train::save_safetensors(path, {{"x", mp::zeros({2})}});
  EXPECT_THROW(mp::train::convert_safetensors(path, path, DType::i32), mp::Error);
  EXPECT_THROW(mp::train::convert_safetensors((dir / "absent.safetensors").string(), path, DType::bf16), mp::Error);
  EXPECT_EQ(mp::train::load_safetensors(path).tensors.at("x").dtype(), DType::f32);  // untouched
}

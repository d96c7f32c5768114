// Tensor factories. Random ones draw from the counter-based Philox stream: element i of a draw
// reserved at generator offset o is a pure function of (seed, o, i), so every device and every
// thread partitioning produce the same numbers.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "mp/core/philox.hpp"
#include "mp/tensor/tensor.hpp"

namespace mp {

Tensor empty(const Shape& shape, TensorOptions opt) {
  for (int64_t s : shape) MP_CHECK(s >= 0, "empty: negative size in shape ", shape_str(shape));
  MP_CHECK(shape_fits(shape, dtype_size(opt.dtype)), "empty: shape ", shape_str(shape), " of ", dtype_name(opt.dtype),
           " has strides or bytes beyond 64 bits; expected a shape whose size product (zeros counted as 1) fits");
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(opt.dtype);
  auto st = std::make_shared<Storage>();
  st->data = memory::DataPtr(opt.device, bytes);
  Tensor t(std::make_shared<TensorImpl>(std::move(st), 0, shape, format_strides(shape, opt.memory_format), opt.dtype));
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor full(const Shape& shape, double v, TensorOptions opt) {
  const bool rg = opt.requires_grad;
  opt.requires_grad = false;
  Tensor t = empty(shape, opt);
  t.fill_(v);
  if (rg) t.requires_grad_(true);
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions opt) { return full(shape, 0.0, opt); }
Tensor ones(const Shape& shape, TensorOptions opt) { return full(shape, 1.0, opt); }

Tensor scalar_tensor(double v, TensorOptions opt) {
  Tensor t = empty({}, {.dtype = opt.dtype});
  visit_dtype(opt.dtype, [&]<class T>() { *static_cast<T*>(t.raw_data()) = scalar_cast<T>(v); });
  if (!opt.device.is_cpu()) t = t.to(opt.device);
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor empty_like(const Tensor& t) { return empty(t.sizes(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor zeros_like(const Tensor& t) { return zeros(t.sizes(), {.dtype = t.dtype(), .device = t.device()}); }
Tensor ones_like(const Tensor& t) { return ones(t.sizes(), {.dtype = t.dtype(), .device = t.device()}); }

Tensor arange(double start, double end, double step, TensorOptions opt) {
  MP_CHECK(step != 0.0, "arange: step must be nonzero");
  MP_CHECK((end - start) * step >= 0, "arange: the range [", start, ", ", end, ") is empty or backwards for step ",
           step);
  const auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor t = empty({n}, {.dtype = opt.dtype});
  visit_dtype(opt.dtype, [&]<class T>() {
    T* p = static_cast<T*>(t.raw_data());
    for (int64_t i = 0; i < n; ++i) p[i] = scalar_cast<T>(start + static_cast<double>(i) * step);
  });
  if (!opt.device.is_cpu()) t = t.to(opt.device);
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor arange(int64_t n, TensorOptions opt) { return arange(0.0, static_cast<double>(n), 1.0, opt); }

namespace {

// Fills a new tensor with map(draw i) where draw i is element i of fill's stream at the reserved
// offset (philox_fill_uniform / philox_fill_normal: one Philox call per 4 draws), chunk by chunk.
// Each element depends only on (seed, offset, i), as Note [Philox stream convention] requires.
template <class Map>
Tensor random_fill(const Shape& shape, TensorOptions opt, const char* op,
                   void (*fill)(uint64_t, uint64_t, float*, size_t), Map map) {
  MP_CHECK(is_floating(opt.dtype), op, ": expected a floating dtype, got ", dtype_name(opt.dtype));
  Tensor t = empty(shape, {.dtype = opt.dtype});
  const int64_t n = t.numel();
  const PhiloxState st = default_generator().reserve(static_cast<uint64_t>(n));
  constexpr int64_t kChunk = 4096;  // a multiple of 4: chunks start on Philox blocks
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  visit_floating(opt.dtype, op, [&]<class T>() {
    T* p = static_cast<T*>(t.raw_data());
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t i0 = c * kChunk, len = std::min(kChunk, n - i0);
      float draws[kChunk];
      fill(st.seed, st.offset + static_cast<uint64_t>(i0), draws, static_cast<size_t>(len));
      for (int64_t j = 0; j < len; ++j) p[i0 + j] = scalar_cast<T>(map(draws[j]));
    }
  });
  if (!opt.device.is_cpu()) t = t.to(opt.device);
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

}  // namespace

Tensor rand(const Shape& shape, TensorOptions opt, double low, double high) {
  return random_fill(shape, opt, "rand", &philox_fill_uniform,
                     [low, high](float u) { return low + (high - low) * static_cast<double>(u); });
}

Tensor randn(const Shape& shape, TensorOptions opt, double mean, double std) {
  return random_fill(shape, opt, "randn", &philox_fill_normal,
                     [mean, std](float z) { return mean + std * static_cast<double>(z); });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opt) {
  MP_CHECK(high > low, "randint: expected low < high, got [", low, ", ", high, ")");
  Tensor t = empty(shape, {.dtype = opt.dtype});
  const int64_t n = t.numel();
  const PhiloxState st = default_generator().reserve(static_cast<uint64_t>(n));
  const uint64_t seed = st.seed, offset = st.offset;
  const auto range = static_cast<double>(high - low);
  visit_dtype(opt.dtype, [&]<class T>() {
    T* p = static_cast<T*>(t.raw_data());
    for (int64_t i = 0; i < n; ++i) {
      const auto v =
          low + static_cast<int64_t>(std::floor(philox_uniform(seed, offset, static_cast<uint64_t>(i)) * range));
      p[i] = scalar_cast<T>(std::min(v, high - 1));
    }
  });
  if (!opt.device.is_cpu()) t = t.to(opt.device);
  return t;
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opt) {
  MP_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
           " values do not fill shape ", shape_str(shape), " (", shape_numel(shape), " elements)");
  Tensor t = empty(shape, {.dtype = dtype_of<T>()});
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(T));
  if (opt.dtype != dtype_of<T>()) t = t.to(opt.dtype);
  if (!opt.device.is_cpu()) t = t.to(opt.device);
  if (opt.requires_grad) t.requires_grad_(true);
  return t;
}

template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);
template Tensor from_vector<Half>(const std::vector<Half>&, const Shape&, TensorOptions);
template Tensor from_vector<BFloat16>(const std::vector<BFloat16>&, const Shape&, TensorOptions);

Tensor from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner) {
  auto st = std::make_shared<Storage>();
  st->data = memory::DataPtr(kCPU, data, static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), std::move(owner));
  return Tensor(std::make_shared<TensorImpl>(std::move(st), 0, shape, contiguous_strides(shape), dtype));
}

}  // namespace mp

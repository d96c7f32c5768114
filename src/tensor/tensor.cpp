#include "mp/tensor/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/pointwise_kernels.hpp"
#include "tensor/copy_into.hpp"

namespace mp {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

bool shape_fits(const Shape& s, size_t element_size) {
  int64_t extent = 1, numel = 1, bytes = 0;
  for (int64_t v : s) {
    if (v < 0 || __builtin_mul_overflow(extent, std::max<int64_t>(v, 1), &extent)) return false;
    numel *= v;  // numel <= extent
  }
  return !__builtin_mul_overflow(numel, static_cast<int64_t>(element_size), &bytes);
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

const char* memory_format_name(MemoryFormat f) {
  return f == MemoryFormat::channels_last ? "channels_last" : "contiguous";
}

Shape format_strides(const Shape& s, MemoryFormat f) {
  if (f == MemoryFormat::contiguous) return contiguous_strides(s);
  MP_CHECK(s.size() == 4, "channels_last memory format: expected a 4-D shape [N, C, H, W], got ", shape_str(s),
           "; use MemoryFormat::contiguous for other ranks");
  const int64_t C = std::max<int64_t>(s[1], 1), H = std::max<int64_t>(s[2], 1), W = std::max<int64_t>(s[3], 1);
  return {H * W * C, 1, W * C, C};
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  MP_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " is out of range for a tensor with ", ndim, " dims (expected -", n,
           " <= dim < ", n, ")");
  return dim < 0 ? dim + n : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape r(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MP_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    r[i] = da == 1 ? db : da;
  }
  return r;
}

// TensorImpl's constructor and destructor are defined in src/autograd/engine.cpp with the other members that touch
// the autograd slot (both destroy it): AutogradMeta is complete only there.

TensorImpl& Tensor::impl() const {
  MP_CHECK(impl_ != nullptr, "use of an undefined Tensor (default-constructed or an absent gradient)");
  return *impl_;
}

int64_t Tensor::size(int64_t d) const { return sizes()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element is out of place (PyTorch agrees)
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (sizes()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= sizes()[i];
  }
  return true;
}

bool Tensor::is_contiguous(MemoryFormat f) const {
  if (f == MemoryFormat::contiguous) return is_contiguous();
  if (dim() != 4) return false;
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (int64_t d : {1, 3, 2, 0}) {  // innermost first: C, W, H, N
    if (sizes()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= sizes()[d];
  }
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  if (dim() != 4 || !is_contiguous(MemoryFormat::channels_last)) return MemoryFormat::contiguous;
  if (!is_contiguous()) return MemoryFormat::channels_last;
  // Dense in both layouts (C == 1, or H == W == 1: the same bytes either way): the strides of the size-1 dims
  // tell which one was asked for (contiguous(channels_last) and empty(..., channels_last) set them exactly).
  const Shape cl = format_strides(sizes(), MemoryFormat::channels_last);
  return strides() == cl && cl != contiguous_strides(sizes()) ? MemoryFormat::channels_last : MemoryFormat::contiguous;
}

void* Tensor::raw_data() const {
  return static_cast<char*>(impl().storage_->data.get()) + impl().offset_ * static_cast<int64_t>(element_size());
}

void Tensor::check_dtype(DType expected, const char* op) const {
  MP_CHECK(dtype() == expected, op, ": expected a tensor of dtype ", dtype_name(expected), ", got ",
           dtype_name(dtype()), " (", describe(), ")");
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined Tensor";
  return "Tensor" + shape_str(sizes()) + " " + dtype_name(dtype()) + " " + device().str();
}

// ---------------------------------------------------------------- copies
namespace detail {

void copy_into(const Tensor& out, const Tensor& src) {
  Tensor s = src.expand(out.sizes());
  MP_CHECK(out.device() == src.device(), "copy_: source on ", src.device().str(), ", destination on ",
           out.device().str(), "; use .to(device) to move tensors between devices");
  const Tensor ins[1] = {s};
  const DType compute =
      is_floating(out.dtype()) || is_floating(src.dtype()) ? promote_types(out.dtype(), src.dtype()) : DType::i64;
  backend::pointwise_kernel.get(out.device())(backend::PointwiseOp::copy, out, std::span<const Tensor>(ins, 1), compute,
                                              {});
}

}  // namespace detail

Tensor& Tensor::copy_(const Tensor& src) {
  // Across devices (loading host weights into a model on a GPU, or back): move the source first, as
  // PyTorch's copy_ does; the element-wise copy then converts the dtype on the destination device.
  detail::copy_into(*this, src.device() == device() ? src.detach() : src.detach().to(device()));
  bump_version();
  return *this;
}

Tensor& Tensor::fill_(double v) {
  // Zeroing contiguous host memory is a memset (+0.0 is all-zero bits in every dtype); the generic
  // path broadcasts an f64 scalar through the cast loop, ~10x slower for the gradient buffers.
  if (v == 0.0 && !std::signbit(v) && device().is_cpu() && is_contiguous()) {
    if (numel() > 0) std::memset(raw_data(), 0, static_cast<size_t>(numel()) * element_size());
    bump_version();
    return *this;
  }
  detail::copy_into(*this,
                    scalar_tensor(v, {.dtype = is_floating(dtype()) ? DType::f64 : DType::i64, .device = device()}));
  bump_version();
  return *this;
}

Tensor Tensor::detach() const {
  return Tensor(std::make_shared<TensorImpl>(storage(), storage_offset(), sizes(), strides(), dtype()));
}

template <class T>
T Tensor::item() const {
  MP_CHECK(numel() == 1, "item: expected a tensor with one element, got ", describe());
  Tensor c = to(kCPU);
  T r{};
  visit_dtype(dtype(), [&]<class S>() { r = scalar_cast<T>(*static_cast<const S*>(c.raw_data())); });
  return r;
}

double Tensor::item_double() const { return item<double>(); }

template <class T>
std::vector<T> Tensor::to_vector() const {
  // Device tensors come to the host first (the host reads the bytes below).
  Tensor c = detach().to(kCPU).to(dtype_of<T>()).contiguous();
  const T* p = static_cast<const T*>(c.raw_data());
  return std::vector<T>(p, p + c.numel());
}

#define MP_INSTANTIATE_TENSOR_ACCESS(T) \
  template T Tensor::item<T>() const;   \
  template std::vector<T> Tensor::to_vector<T>() const;
MP_INSTANTIATE_TENSOR_ACCESS(float)
MP_INSTANTIATE_TENSOR_ACCESS(double)
MP_INSTANTIATE_TENSOR_ACCESS(Half)
MP_INSTANTIATE_TENSOR_ACCESS(BFloat16)
MP_INSTANTIATE_TENSOR_ACCESS(int64_t)
MP_INSTANTIATE_TENSOR_ACCESS(int32_t)
MP_INSTANTIATE_TENSOR_ACCESS(uint8_t)
MP_INSTANTIATE_TENSOR_ACCESS(bool)
#undef MP_INSTANTIATE_TENSOR_ACCESS

}  // namespace mp

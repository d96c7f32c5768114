#pragma once
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "mp/core/device.hpp"
#include "mp/core/dtype.hpp"
#include "mp/memory/allocator.hpp"

namespace mp {

/// Sizes or strides of a tensor (elements, not bytes).
using Shape = std::vector<int64_t>;

/// "[2, 3, 4]".
std::string shape_str(const Shape& s);
/// Product of the sizes (1 for a scalar).
int64_t shape_numel(const Shape& s);
/// Row-major contiguous strides of a shape.
Shape contiguous_strides(const Shape& s);
/// Whether a tensor of shape `s` with `element_size`-byte elements can be made: no negative size, and its strides
/// (in any memory format: products of sizes, a 0 counted as 1) and its byte count fit in int64. empty() refuses
/// other shapes; a reader of a file checks it first, to refuse naming the file (a shape [0, 2^62, 4] holds no
/// element but has a stride of 2^64).
bool shape_fits(const Shape& s, size_t element_size);

/// Memory layout of a dense tensor, as PyTorch's torch.memory_format. Logical dims never change: a
/// channels-last activation is still indexed [N, C, H, W]; only the strides say where elements live.
enum class MemoryFormat : uint8_t {
  contiguous,     ///< row-major over the logical dims (NCHW for 4-D activations)
  channels_last,  ///< 4-D only: NHWC in memory, strides {H*W*C, 1, W*C, C} (what oneDNN's AMX convolutions read)
};
/// "contiguous" / "channels_last".
const char* memory_format_name(MemoryFormat f);
/// Dense strides of a shape in a memory format; channels_last needs 4 dims (throws naming the shape otherwise).
Shape format_strides(const Shape& s, MemoryFormat f);
/// Wrap a possibly negative dim into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
/// The broadcast of two shapes (NumPy rules); throws naming `op` when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

namespace autograd {
class Node;
struct AutogradMeta;
}  // namespace autograd

/// Reference-counted bytes shared by a tensor and its views.
struct Storage {
  memory::DataPtr data;
  /// Byte count.
  size_t nbytes() const { return data.size(); }
};

/// The state behind a Tensor handle.
class TensorImpl {
 public:
  TensorImpl(std::shared_ptr<Storage> storage, int64_t offset, Shape sizes, Shape strides, DType dtype);
  ~TensorImpl();
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  ///< in elements
  Shape sizes_;
  Shape strides_;
  DType dtype_;
  uint64_t version_ = 0;  ///< bumped by in-place writes
  std::unique_ptr<autograd::AutogradMeta> autograd_;
};

/// An n-dimensional strided array on a device, with an autograd slot. A Tensor is a cheap
/// shared handle: copies alias the same data (as in PyTorch). A default-constructed Tensor is
/// "undefined".
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  /// Whether the handle refers to a tensor.
  bool defined() const { return impl_ != nullptr; }
  /// Sizes per dim.
  const Shape& sizes() const { return impl().sizes_; }
  /// Size of one dim (negative dims count from the end).
  int64_t size(int64_t dim) const;
  /// Strides per dim, in elements.
  const Shape& strides() const { return impl().strides_; }
  /// Stride of one dim.
  int64_t stride(int64_t dim) const;
  /// Number of dims.
  int64_t dim() const { return static_cast<int64_t>(impl().sizes_.size()); }
  /// Number of elements.
  int64_t numel() const { return shape_numel(impl().sizes_); }
  /// Element type.
  DType dtype() const { return impl().dtype_; }
  /// Device of the data.
  Device device() const { return impl().storage_->data.device(); }
  /// Offset of element 0 in the storage, in elements.
  int64_t storage_offset() const { return impl().offset_; }
  /// Bytes per element.
  size_t element_size() const { return dtype_size(dtype()); }
  /// Whether the elements are laid out row-major without gaps.
  bool is_contiguous() const;
  /// Whether the elements are dense in memory format f (size-1 dims may have any stride, as in PyTorch).
  bool is_contiguous(MemoryFormat f) const;
  /// channels_last when the tensor is 4-D and dense channels-last but not plain contiguous; where the two
  /// layouts coincide (C == 1, or H == W == 1) channels_last only when the strides are exactly
  /// format_strides(sizes(), channels_last); contiguous otherwise. Ops give their outputs (and gradients)
  /// this format, so a channels-last activation stays channels-last.
  MemoryFormat suggest_memory_format() const;
  /// Pointer to element 0 (bytes).
  void* raw_data() const;
  /// Typed pointer to element 0; throws when T is not the tensor's dtype.
  template <class T>
  T* data_ptr() const {
    check_dtype(dtype_of<T>(), "data_ptr");
    return static_cast<T*>(raw_data());
  }
  /// The shared storage.
  const std::shared_ptr<Storage>& storage() const { return impl().storage_; }
  /// Whether two handles share storage.
  bool is_alias_of(const Tensor& o) const { return storage() == o.storage(); }
  /// The implementation object.
  TensorImpl& impl() const;
  /// Shared implementation pointer (autograd uses it).
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  /// Version counter (incremented by in-place ops).
  uint64_t version() const { return impl().version_; }
  /// Mark an in-place write.
  void bump_version() const { ++impl().version_; }

  // ---- views (share storage; differentiable) ----
  /// Same data, new shape (one dim may be -1); requires compatible strides (see reshape).
  Tensor view(const Shape& shape) const;
  /// view() when possible, else a contiguous copy.
  Tensor reshape(const Shape& shape) const;
  /// Reorder dims.
  Tensor permute(const Shape& dims) const;
  /// Swap two dims.
  Tensor transpose(int64_t d0, int64_t d1) const;
  /// Transpose of a 2-D tensor.
  Tensor t() const;
  /// Elements [start, start+length) of dim.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  /// Python-style slice of one dim: [start, end) with step (negative start/end count from the end).
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  /// Index one position of dim, removing the dim.
  Tensor select(int64_t dim, int64_t index) const;
  /// Broadcast size-1 dims to `shape` (stride 0), adding leading dims; -1 keeps a size.
  Tensor expand(const Shape& shape) const;
  /// Like expand to other's shape.
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  /// Insert a size-1 dim.
  Tensor unsqueeze(int64_t dim) const;
  /// Remove a size-1 dim.
  Tensor squeeze(int64_t dim) const;
  /// Flatten dims [start, end] into one.
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  /// This tensor if contiguous, else a contiguous copy.
  Tensor contiguous() const;
  /// This tensor if its strides are f's (format_strides), a restrided view when it is dense in f already
  /// (only size-1 dims differ), else a copy in that format; differentiable.
  Tensor contiguous(MemoryFormat f) const;
  /// A contiguous copy with its own storage.
  Tensor clone() const;
  /// Convert element type (a no-op returning *this when equal); differentiable. The result keeps the
  /// memory format (suggest_memory_format()).
  Tensor to(DType dtype) const;
  /// Copy to a device (cpu, or cuda with the CUDA backend and a GPU; a clear error otherwise). A
  /// channels-last tensor stays channels-last (as PyTorch's preserve_format); others come out contiguous.
  Tensor to(Device device) const;
  /// The value of a one-element tensor as T.
  template <class T>
  T item() const;
  /// The value of a one-element tensor as double.
  double item_double() const;
  /// Copy the elements (row-major) into a vector of T (converting).
  template <class T>
  std::vector<T> to_vector() const;

  // ---- autograd ----
  /// Whether gradients flow to/through this tensor.
  bool requires_grad() const;
  /// Mark a leaf as requiring a gradient (returns *this).
  Tensor& requires_grad_(bool on = true);
  /// The accumulated gradient (undefined until a backward reaches it).
  Tensor grad() const;
  /// Replace the gradient (undefined to clear).
  void set_grad(const Tensor& g) const;
  /// The node that produced this tensor (null for leaves).
  std::shared_ptr<autograd::Node> grad_fn() const;
  /// Whether this tensor was created by the user rather than by a differentiable op.
  bool is_leaf() const;
  /// Same data, cut from the graph.
  Tensor detach() const;
  /// Backpropagate from this tensor (a scalar unless `gradient` is given).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  /// Set a name for debugging and error messages.
  std::string name() const;

  // ---- in-place (not differentiable; used by optimizers and initialisers under NoGradGuard) ----
  /// Copy src (broadcast, converting dtype) into this tensor's elements.
  Tensor& copy_(const Tensor& src);
  /// Set every element to v.
  Tensor& fill_(double v);
  /// Set every element to 0.
  Tensor& zero_() { return fill_(0.0); }

  /// Short description: "Tensor[2, 3] f32 cpu".
  std::string describe() const;
  /// Throw naming `op` when the dtype differs from `expected`.
  void check_dtype(DType expected, const char* op) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

/// Print shape, dtype, device and (up to a limit) the values.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

/// Options for factory functions.
struct TensorOptions {
  DType dtype = DType::f32;
  Device device = kCPU;
  bool requires_grad = false;
  MemoryFormat memory_format = MemoryFormat::contiguous;  ///< strides of new tensors (channels_last: 4-D only)
};

/// Uninitialised tensor.
Tensor empty(const Shape& shape, TensorOptions opt = {});
/// Tensor of zeros.
Tensor zeros(const Shape& shape, TensorOptions opt = {});
/// Tensor of ones.
Tensor ones(const Shape& shape, TensorOptions opt = {});
/// Tensor filled with v.
Tensor full(const Shape& shape, double v, TensorOptions opt = {});
/// [start, end) with step, as a 1-D tensor (dtype defaults to i64 for integer args only if given).
Tensor arange(double start, double end, double step = 1.0, TensorOptions opt = {.dtype = DType::i64});
/// arange(0, n).
Tensor arange(int64_t n, TensorOptions opt = {.dtype = DType::i64});
/// Uniform [low, high) from the counter-based generator (same stream on every device).
Tensor rand(const Shape& shape, TensorOptions opt = {}, double low = 0.0, double high = 1.0);
/// Normal(mean, std) from the counter-based generator.
Tensor randn(const Shape& shape, TensorOptions opt = {}, double mean = 0.0, double std = 1.0);
/// Random integers in [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opt = {.dtype = DType::i64});
/// Copy a host buffer of T into a new tensor of dtype_of<T>() (or opt.dtype, converting).
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opt = {.dtype = dtype_of<T>()});
/// Wrap an existing host buffer without copying; `owner` keeps it alive.
Tensor from_blob(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner = nullptr);
/// A 0-dim tensor holding v.
Tensor scalar_tensor(double v, TensorOptions opt = {});
/// Tensor like t (shape, dtype, device) but uninitialised / zeros / ones.
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);

}  // namespace mp

#pragma once
#include <cstddef>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mp/tensor/tensor.hpp"

namespace mp::nn {

/// An insertion-ordered map from dotted names ("layer1.0.conv1.weight") to tensors: what
/// Module::state_dict() returns and load_state_dict() reads (PyTorch's OrderedDict).
class StateDict {
 public:
  using Item = std::pair<std::string, Tensor>;

  StateDict() = default;
  /// Build from (name, tensor) pairs in order; throws on a repeated name.
  StateDict(std::initializer_list<Item> items);

  /// Append an entry; throws naming the key when it already exists.
  void insert(std::string name, Tensor t);
  /// Set an entry (appended when new, replaced in place when present).
  void set(const std::string& name, Tensor t);
  /// Whether `name` is present.
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  /// The tensor under `name`, or null when absent.
  const Tensor* find(const std::string& name) const;
  /// The tensor under `name`; throws listing a few keys when absent.
  const Tensor& at(const std::string& name) const;
  /// Remove an entry (no-op when absent); order of the others is kept.
  void erase(const std::string& name);
  /// Number of entries.
  size_t size() const { return items_.size(); }
  /// Whether there are no entries.
  bool empty() const { return items_.empty(); }
  /// Names in insertion order.
  std::vector<std::string> keys() const;
  /// A deep copy: every tensor cloned (detached), so later in-place updates do not show through.
  StateDict clone() const;

  /// Entries in insertion order.
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  /// End of the entries.
  std::vector<Item>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace mp::nn

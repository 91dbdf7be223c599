// A sample and a batch as torch.utils.data sees them: named fields, each a Tensor (a scalar is a
// 0-d tensor). The default collate stacks the samples of a batch field by field into tensors
// [batch_size, ...] of the same dtypes (torch's default_collate for a dict of tensors).
#pragma once

#include <nodal/tensor.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nodal::data {

/// Named tensors in the order they were added. Copying a Sample copies handles, not bytes.
class Sample {
 public:
  /// Adds a field. Throws UsageError when `name` is empty or already there.
  Sample& add(std::string name, Tensor value);
  /// A scalar: a 0-d private tensor (f64, i64).
  Sample& add(std::string name, double value);
  Sample& add(std::string name, std::int64_t value);

  /// The field called `name`. Throws UsageError naming the fields there are when it is missing.
  const Tensor& operator[](std::string_view name) const;
  bool contains(std::string_view name) const noexcept;
  const std::vector<std::pair<std::string, Tensor>>& fields() const noexcept { return fields_; }
  std::size_t size() const noexcept { return fields_.size(); }

 private:
  std::vector<std::pair<std::string, Tensor>> fields_;
};

/// A batch: fields [rows, ...] (a scalar field becomes a 1-d tensor [rows]); `number` is its place
/// in the epoch (0, 1, ...). With workers its tensors are in the job's arena, written there by the
/// worker, read here in place; the memory goes back to the arena when the last copy of a field's
/// tensor is dropped.
class Batch : public Sample {
 public:
  std::int64_t number = 0;
  /// Rows: the first dimension of the first field (0 for a batch without fields).
  std::int64_t rows() const noexcept;
};

}  // namespace nodal::data

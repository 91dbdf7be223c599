#include "batch_maker.hpp"

#include <optional>

namespace nodal::data::detail {

Batch BatchMaker::make(std::span<const std::int64_t> indices, std::int64_t& current) {
  if (collate_ != nullptr) {
    std::vector<Sample> samples;
    samples.reserve(indices.size());
    for (std::int64_t index : indices) {
      current = index;
      samples.push_back(dataset_.get(index));
    }
    current = -1;
    return collate_(std::move(samples));
  }
  std::optional<Sample> first;
  if (layout_.empty()) {
    current = indices.front();
    first = dataset_.get(indices.front());
    for (const auto& [name, tensor] : first->fields()) layout_.push_back({name, tensor.dtype(), tensor.shape()});
  }
  const auto rows = static_cast<std::int64_t>(indices.size());
  Batch batch;
  std::vector<Tensor> whole;
  for (const Field& field : layout_) {
    std::vector<std::int64_t> shape{rows};
    shape.insert(shape.end(), field.shape.begin(), field.shape.end());
    whole.push_back(shared_ ? Tensor::empty_shared(shape, field.dtype) : Tensor::empty(shape, field.dtype));
    batch.add(field.name, whole.back());
  }
  for (std::int64_t k = 0; k < rows; ++k) {
    Sample row;
    for (std::size_t f = 0; f < layout_.size(); ++f) {
      row.add(layout_[f].name, whole[f].slice(k, k + 1).reshape(layout_[f].shape));
    }
    current = indices[static_cast<std::size_t>(k)];
    if (k == 0 && first) {
      copy_into(*first, row, current);
    } else {
      dataset_.get_into(current, row);
    }
  }
  current = -1;
  return batch;
}

}  // namespace nodal::data::detail

#include "batch_maker.hpp"

#include <optional>

namespace nodal::data::detail {

void BatchMaker::learn_layout(const Sample& sample) {
  for (const auto& [name, tensor] : sample.fields()) layout_.push_back({name, tensor.dtype(), tensor.shape()});
}

Batch BatchMaker::allocate(std::int64_t rows, std::vector<Sample>& row_views) const {
  Batch batch;
  std::vector<Tensor> whole;
  for (const Field& field : layout_) {
    std::vector<std::int64_t> shape{rows};
    shape.insert(shape.end(), field.shape.begin(), field.shape.end());
    whole.push_back(shared_ ? Tensor::empty_shared(shape, field.dtype) : Tensor::empty(shape, field.dtype));
    batch.add(field.name, whole.back());
  }
  row_views.assign(static_cast<std::size_t>(rows), Sample{});
  for (std::int64_t k = 0; k < rows; ++k) {
    for (std::size_t f = 0; f < layout_.size(); ++f) {
      row_views[static_cast<std::size_t>(k)].add(layout_[f].name, whole[f].slice(k, k + 1).reshape(layout_[f].shape));
    }
  }
  return batch;
}

Batch BatchMaker::make(std::span<const std::int64_t> indices, std::int64_t& current) {
  if (collate_ != nullptr) {
    std::vector<Sample> samples;
    samples.reserve(indices.size());
    for (std::int64_t index : indices) {
      current = index;
      samples.push_back(dataset_->get(index));
    }
    current = -1;  // collating
    return collate_(std::move(samples));
  }
  std::optional<Sample> first;
  if (layout_.empty()) {
    current = indices.front();
    first = dataset_->get(indices.front());
    learn_layout(*first);
  }
  current = -1;  // allocating: not a sample's fault
  std::vector<Sample> rows;
  Batch batch = allocate(static_cast<std::int64_t>(indices.size()), rows);
  for (std::size_t k = 0; k < rows.size(); ++k) {
    current = indices[k];
    if (k == 0 && first) {
      copy_into(*first, rows[k], current);
    } else {
      dataset_->get_into(current, rows[k]);
    }
  }
  current = -1;
  return batch;
}

Batch BatchMaker::stack(std::vector<Sample>&& samples, std::int64_t first) {
  if (collate_ != nullptr) return collate_(std::move(samples));
  if (layout_.empty()) learn_layout(samples.front());
  std::vector<Sample> rows;
  Batch batch = allocate(static_cast<std::int64_t>(samples.size()), rows);
  for (std::size_t k = 0; k < rows.size(); ++k) copy_into(samples[k], rows[k], first + static_cast<std::int64_t>(k));
  return batch;
}

}  // namespace nodal::data::detail

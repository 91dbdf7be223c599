#include <nodal/data/dataset.hpp>

#include <nodal/errors.hpp>

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace nodal::data {

void copy_into(const Sample& sample, const Sample& row, std::int64_t index) {
  for (const auto& [name, destination] : row.fields()) {
    if (!sample.contains(name)) {
      throw UsageError(fmt::format("sample {} has no field '{}', which the batch's first sample had", index, name));
    }
    const Tensor& source = sample[name];
    if (source.dtype() != destination.dtype() || source.shape() != destination.shape()) {
      throw UsageError(fmt::format(
          "sample {}'s field '{}' is {} [{}], the batch's is {} [{}]: the default collate needs samples of one "
          "shape (pass a custom collate otherwise)",
          index, name, dtype_name(source.dtype()), fmt::join(source.shape(), ", "), dtype_name(destination.dtype()),
          fmt::join(destination.shape(), ", ")));
    }
    const Tensor contiguous = source.contiguous();
    std::memcpy(destination.data(), contiguous.data(), destination.nbytes());
  }
  if (sample.size() != row.size()) {
    throw UsageError(fmt::format("sample {} has {} fields, the batch's first sample {}", index, sample.size(), row.size()));
  }
}

void Dataset::get_into(std::int64_t index, const Sample& row) { copy_into(get(index), row, index); }

}  // namespace nodal::data

#include <nodal/data/sample.hpp>

#include <nodal/errors.hpp>

#include <fmt/format.h>

namespace nodal::data {

Sample& Sample::add(std::string name, Tensor value) {
  if (name.empty()) throw UsageError("Sample::add: a field needs a name");
  if (contains(name)) throw UsageError(fmt::format("Sample::add: the sample has a field '{}' already", name));
  fields_.emplace_back(std::move(name), std::move(value));
  return *this;
}

Sample& Sample::add(std::string name, double value) {
  Tensor t = Tensor::empty({}, DType::f64);
  *t.data_ptr<double>() = value;
  return add(std::move(name), std::move(t));
}

Sample& Sample::add(std::string name, std::int64_t value) {
  Tensor t = Tensor::empty({}, DType::i64);
  *t.data_ptr<std::int64_t>() = value;
  return add(std::move(name), std::move(t));
}

bool Sample::contains(std::string_view name) const noexcept {
  for (const auto& [field, tensor] : fields_) {
    if (field == name) return true;
  }
  return false;
}

const Tensor& Sample::operator[](std::string_view name) const {
  std::string names;
  for (const auto& [field, tensor] : fields_) {
    if (field == name) return tensor;
    names += (names.empty() ? "" : ", ") + field;
  }
  throw UsageError(fmt::format("no field '{}' (the fields: {})", name, names.empty() ? "none" : names));
}

std::int64_t Batch::rows() const noexcept {
  if (fields().empty() || fields().front().second.dim() == 0) return 0;
  return fields().front().second.shape()[0];
}

}  // namespace nodal::data

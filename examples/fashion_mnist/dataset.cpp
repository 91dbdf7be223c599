#include "dataset.hpp"

#include <nodal/data/worker_info.hpp>

#include <array>
#include <stdexcept>

#include <fmt/format.h>

namespace fashion_mnist {
namespace {

// The training set's pixel mean and standard deviation (of pixel / 255), the usual constants.
constexpr float kPixelMean = 0.2860F;
constexpr float kPixelStd = 0.3530F;

/// pixel -> normalised value, computed once: a lookup is exact and cheaper than the arithmetic.
std::array<float, 256> normalisation_table() {
  std::array<float, 256> table{};
  for (int v = 0; v < 256; ++v) table[v] = (static_cast<float>(v) / 255.0F - kPixelMean) / kPixelStd;
  return table;
}

}  // namespace

void normalise(const std::uint8_t* pixels, std::size_t count, float* out) {
  static const std::array<float, 256> table = normalisation_table();
  for (std::size_t i = 0; i < count; ++i) out[i] = table[pixels[i]];
}

FashionTrain::FashionTrain(const Split& train, std::int64_t size, DatasetDrill drill)
    : train_(&train), size_(size), drill_(drill) {}

nodal::data::Sample FashionTrain::get(std::int64_t index) {
  nodal::data::Sample row;
  row.add("image", nodal::Tensor::empty({kImageSize}, nodal::DType::f32));
  row.add("label", nodal::Tensor::empty({}, nodal::DType::i32));
  get_into(index, row);
  return row;
}

void FashionTrain::get_into(std::int64_t index, const nodal::data::Sample& row) {
  if (index == drill_.sample) {
    const std::optional<nodal::data::WorkerInfo> worker = nodal::data::worker_info();
    if (worker && worker->epoch == drill_.epoch) {
      throw std::runtime_error(fmt::format("failure drill: the dataset of trainer {} fails on sample {} at step {}",
                                           drill_.trainer, index, drill_.step));
    }
  }
  const auto sample = static_cast<std::size_t>(index);
  normalise(train_->pixels.data() + sample * kImageSize, kImageSize, row["image"].data_ptr<float>());
  *row["label"].data_ptr<std::int32_t>() = train_->labels[sample];
}

}  // namespace fashion_mnist

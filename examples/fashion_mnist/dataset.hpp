// The training set as a nodal::data::Dataset: the DataLoader's workers (forkserver children of
// the trainer, which share its decoded pixels copy-on-write) normalise each image straight into
// its row of the batch in the arena, and the trainer reads the batch in place.
#pragma once

#include <nodal/data/dataset.hpp>

#include <cstddef>
#include <cstdint>

#include "idx.hpp"

namespace fashion_mnist {

/// Pixels u8 -> f32 (pixel / 255 - mean) / std, with the training set's mean and std: what the
/// dataset does to every training image and the trainer to the test set.
void normalise(const std::uint8_t* pixels, std::size_t count, float* out);

/// The failure drill in a DataLoader worker: sample `sample` throws in epoch `epoch` (each sample
/// comes once per epoch, so this is one batch of one trainer: the one of global step `step`).
struct DatasetDrill {
  std::int64_t epoch = -1;  ///< -1: no drill
  std::int64_t sample = -1;
  std::int64_t step = -1;   ///< named in the error
  int trainer = -1;
};

/// The first `size` training samples: "image" f32 [784] (normalised) and "label" i32 (a 0-d
/// tensor: 0..9). A batch of them is image f32 [rows, 784] and label i32 [rows].
class FashionTrain : public nodal::data::Dataset {
 public:
  /// `train` must outlive the dataset (the workers see it as it was when the fork server started).
  FashionTrain(const Split& train, std::int64_t size, DatasetDrill drill = {});
  std::int64_t size() const override { return size_; }
  nodal::data::Sample get(std::int64_t index) override;
  /// Normalises image `index` into row["image"] and writes row["label"]. Throws the drill's
  /// std::runtime_error in the drill's epoch (nodal::data::worker_info()).
  void get_into(std::int64_t index, const nodal::data::Sample& row) override;

 private:
  const Split* train_;
  std::int64_t size_;
  DatasetDrill drill_;
};

}  // namespace fashion_mnist

// torch.utils.data's datasets in C++: a map-style Dataset (a size and the sample at an index) and
// an IterableDataset (a stream of samples per worker).
#pragma once

#include <nodal/data/sample.hpp>

#include <cstdint>
#include <optional>

namespace nodal::data {

/// A map-style dataset: `size()` samples, any of which `get` makes.
///
/// get_into is how a sample reaches its batch without a copy: the DataLoader hands it views of
/// the batch's row (fields of the shapes and dtypes of the dataset's samples, in the arena) and
/// the dataset writes the sample there. The default calls get() and copies its fields in (one
/// copy, as torch's collate stacks); override it to decode straight into the batch.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::int64_t size() const = 0;
  /// The sample at `index` (0 <= index < size()). Every sample has the same fields, shapes and
  /// dtypes when the default collate batches them.
  virtual Sample get(std::int64_t index) = 0;
  /// Writes sample `index` into `row` (views of one row of the batch being made). The default:
  /// get(index), then each field copied in. Throws UsageError when a field is missing or has
  /// another shape or dtype than the row's.
  virtual void get_into(std::int64_t index, const Sample& row);
};

/// An iterable dataset (torch's IterableDataset): each worker streams samples of its own, and the
/// DataLoader batches each worker's stream (a worker's last batch may be short, unless
/// drop_last). Shard by the worker in start() so that workers do not repeat each other, as
/// torch's get_worker_info() is used for.
class IterableDataset {
 public:
  virtual ~IterableDataset() = default;
  /// Starts a pass over the data for worker `worker` of `workers` (0 of 1 without workers) in
  /// epoch `epoch`.
  virtual void start(int worker, int workers, std::int64_t epoch) = 0;
  /// The next sample of the pass; nullopt at its end.
  virtual std::optional<Sample> next() = 0;
};

/// Copies `sample`'s fields into `row`'s (same names, shapes and dtypes). Throws UsageError naming
/// the field and both shapes otherwise.
void copy_into(const Sample& sample, const Sample& row, std::int64_t index);

}  // namespace nodal::data

// torch.utils.data's map-style dataset in C++: a size and the sample at an index. (torch's
// IterableDataset, a stream of samples per worker, is not here yet.)
#pragma once

#include <nodal/data/sample.hpp>

#include <cstdint>

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

/// Copies `sample`'s fields into `row`'s (same names, shapes and dtypes). Throws UsageError naming
/// the field and both shapes otherwise.
void copy_into(const Sample& sample, const Sample& row, std::int64_t index);

}  // namespace nodal::data

// Making one batch from a dataset: with the default collate, each sample written into its row
// of the batch (Dataset::get_into; the batch's layout comes from the first sample, got whole);
// with a custom collate, the samples got and handed to it. Used by the DataLoader's workers (the
// batch in the arena) and by a DataLoader without workers (in private memory). Internal.
#pragma once

#include <nodal/data/dataset.hpp>
#include <nodal/data/sample.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace nodal::data::detail {

class BatchMaker {
 public:
  /// `shared`: the batch's tensors in the job's arena (a worker's), else in private memory.
  /// `dataset`: nullptr for a maker that only stacks (an IterableDataset's).
  BatchMaker(Dataset* dataset, Batch (*collate)(std::vector<Sample>&&), bool shared)
      : dataset_(dataset), collate_(collate), shared_(shared) {}

  /// The batch of `indices` (not empty). `current` is the sample being loaded, for an error's
  /// message (-1 outside the samples). Throws what the dataset or the collate throws, UsageError
  /// for a sample whose fields differ from the first one's.
  Batch make(std::span<const std::int64_t> indices, std::int64_t& current);
  /// The batch of samples got whole (an IterableDataset's): the custom collate's, or each copied
  /// into its row. Throws UsageError naming sample `first + k` for one whose fields differ.
  Batch stack(std::vector<Sample>&& samples, std::int64_t first);

 private:
  /// A batch of `rows` rows laid out as layout_, and the rows' views of it.
  Batch allocate(std::int64_t rows, std::vector<Sample>& row_views) const;
  void learn_layout(const Sample& sample);

  struct Field {
    std::string name;
    DType dtype;
    std::vector<std::int64_t> shape;
  };
  Dataset* dataset_;
  Batch (*collate_)(std::vector<Sample>&&);
  bool shared_;
  std::vector<Field> layout_;  ///< from the first sample this maker saw
};

}  // namespace nodal::data::detail

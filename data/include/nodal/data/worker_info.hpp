// Which DataLoader worker this is, asked from inside a dataset (torch.utils.data.get_worker_info).
#pragma once

#include <cstdint>
#include <optional>

namespace nodal::data {

struct WorkerInfo {
  int id = 0;           ///< 0 .. num_workers-1
  int num_workers = 1;  ///< the DataLoader's num_workers
  std::uint64_t seed = 0;  ///< the worker's seed (DataLoaderOptions::worker_init_fn says how it is drawn)
  /// The epoch whose batch (or stream) the worker is making; in worker_init_fn, the epoch the
  /// workers were started for. Not in torch: there a dataset's own set_epoch reaches per-epoch
  /// workers because each epoch pickles the dataset anew, while nodal's forkserver workers are
  /// copies of the dataset as it was when the fork server started, and persistent workers of the
  /// first epoch's, so a dataset that varies by epoch asks here.
  std::int64_t epoch = 0;
};

/// In a DataLoader worker process: who it is. nullopt in any other process, also while the
/// DataLoader loads in the calling process (num_workers 0), as torch's get_worker_info() is None.
std::optional<WorkerInfo> worker_info() noexcept;

namespace detail {
/// Set by the worker's loop (a worker process is single-threaded).
void set_worker_info(const WorkerInfo& info) noexcept;
}  // namespace detail

}  // namespace nodal::data

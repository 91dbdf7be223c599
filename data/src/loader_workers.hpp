// The DataLoader's worker processes: the worker's loop (a batch at a time, each sample written
// into its row of the batch in the arena) and the trainer's side (start, feed, receive, stop).
// Internal to nodal::data.
#pragma once

#include <nodal/data/dataloader.hpp>
#include <nodal/process.hpp>
#include <nodal/tensor_queue.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace nodal::data::detail {

/// Where a forkserver worker finds its dataset: the fork server is a copy of this process, so a
/// pointer registered before it started is valid there. Returns the dataset's id.
int register_dataset(Dataset* dataset);

/// What every worker of a set shares.
struct WorkerSettings {
  Dataset* dataset = nullptr;
  int dataset_id = -1;  ///< in the registry (forkserver)
  int workers = 1;
  std::uint64_t seed = 0;
  int prefetch = 2;
  Batch (*collate)(std::vector<Sample>&&) = nullptr;
  void (*init)(int worker_id, std::uint64_t seed) = nullptr;
  StartMethod start_method = StartMethod::forkserver;
};

/// The workers of one DataLoader, each with a queue of batches to make (a ticket and the sample
/// indices) and a queue of batches made, both `prefetch` deep. Tickets grow over the set's life,
/// so a batch left over from an epoch that was abandoned is recognised and dropped.
class WorkerSet {
 public:
  /// Starts the workers. Throws what Process::start throws, UsageError for a dataset the fork
  /// server cannot see.
  explicit WorkerSet(const WorkerSettings& settings);
  /// Stops the workers (stop()).
  ~WorkerSet();
  WorkerSet(const WorkerSet&) = delete;
  WorkerSet& operator=(const WorkerSet&) = delete;

  int size() const noexcept { return static_cast<int>(workers_.size()); }
  /// Asks `worker` for the batch of these sample indices, called `ticket`; `number` is its place in
  /// the epoch (for errors). Never blocks: a worker is given at most `prefetch` batches ahead.
  void send(int worker, std::int64_t ticket, std::int64_t number, std::span<const std::int64_t> indices);
  /// The batch `ticket` from `worker`, waiting until `deadline` (none: no limit). Throws
  /// ProcessRaisedError when loading it threw (the worker id, the sample index, the worker's
  /// stack), ProcessExitedError when the worker died, TimeoutError.
  Batch receive(int worker, std::int64_t ticket, std::optional<std::chrono::steady_clock::time_point> deadline);
  /// Ends every worker: closed queues, then SIGTERM, then SIGKILL after a grace. Idempotent.
  void stop() noexcept;
  std::vector<pid_t> pids() const;

 private:
  struct Worker;
  std::string name_;
  WorkerSettings settings_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace nodal::data::detail

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

/// Where a forkserver worker finds its dataset (one of the two set): the fork server is a copy of
/// this process, so a pointer registered before it started is valid there. Returns its id.
int register_dataset(Dataset* map, IterableDataset* stream);

/// What every worker of a set shares.
struct WorkerSettings {
  Dataset* dataset = nullptr;          ///< a map-style dataset, or
  IterableDataset* stream = nullptr;   ///< an iterable one (each worker streams its own batches)
  int dataset_id = -1;  ///< in the registry (forkserver)
  int workers = 1;
  std::uint64_t seed = 0;
  int prefetch = 2;
  Batch (*collate)(std::vector<Sample>&&) = nullptr;
  void (*init)(int worker_id, std::uint64_t seed) = nullptr;
  StartMethod start_method = StartMethod::forkserver;
  std::int64_t batch_size = 1;  ///< an iterable dataset's workers batch their streams
  bool drop_last = false;
  std::int64_t epoch = 0;  ///< the epoch the workers start for (worker_info() in worker_init_fn)
};

/// The workers of one DataLoader, each with a queue of requests (a ticket and the sample indices
/// of one batch, or an epoch of an iterable dataset's stream) and a queue of batches made, both
/// `prefetch` deep. Tickets grow over the set's life,
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
  /// Asks `worker` for the batch of these sample indices (map-style) of `epoch`, called `ticket`.
  /// Never blocks: a worker is given at most `prefetch` batches ahead.
  void send(int worker, std::int64_t ticket, std::int64_t epoch, std::span<const std::int64_t> indices);
  /// Asks `worker` for its stream's batches of `epoch` (iterable), all called `ticket`.
  void send_stream(int worker, std::int64_t ticket, std::int64_t epoch);
  /// The next batch `ticket` from `worker`, waiting until `deadline` (none: no limit); nullopt
  /// when the worker's stream for that ticket ended. `number` (its place in the epoch) names it
  /// in errors. Throws ProcessRaisedError when loading it threw (the worker id, the sample index,
  /// the worker's stack), ProcessExitedError when the worker died, TimeoutError.
  std::optional<Batch> receive(int worker, std::int64_t ticket, std::int64_t number,
                               std::optional<std::chrono::steady_clock::time_point> deadline);
  /// Ends every worker: closed queues, then SIGTERM, then SIGKILL after a grace. Idempotent.
  void stop() noexcept;
  std::vector<pid_t> pids() const;

 private:
  struct Worker;
  /// Worker `worker`'s "requests" or "batches" queue.
  std::string queue_name(int worker, const char* which) const;
  std::string name_;
  WorkerSettings settings_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace nodal::data::detail

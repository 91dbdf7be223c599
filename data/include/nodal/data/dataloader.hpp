// nodal::data::DataLoader: torch.utils.data.DataLoader's model over nodal's shared arena. Worker
// processes make whole batches straight into the arena (each sample written into its row of the
// batch: no stack-then-copy, no shared-memory segment or file descriptor per batch); the trainer
// reads them in place, in sampler order.
//
//   auto dataset = std::make_shared<MyDataset>(...);
//   nodal::data::DataLoader loader(dataset, {.batch_size = 32, .shuffle = true, .num_workers = 2});
//   for (int epoch = 0; epoch < 10; ++epoch) {
//     for (const nodal::data::Batch& batch : loader) train(batch["image"], batch["label"]);
//   }
#pragma once

#include <nodal/data/dataset.hpp>
#include <nodal/data/sample.hpp>
#include <nodal/data/sampler.hpp>
#include <nodal/data/worker_info.hpp>
#include <nodal/spawn.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace nodal::data {

struct DataLoaderOptions {
  std::int64_t batch_size = 1;
  /// Without a sampler: RandomSampler(size, seed) when true, else SequentialSampler.
  bool shuffle = false;
  std::uint64_t seed = 0;
  /// Drop the last batch when it would be short.
  bool drop_last = false;
  /// Worker processes; 0 loads in the calling process (torch's num_workers=0).
  int num_workers = 0;
  /// Batches each worker has in flight (made or being made) ahead of the trainer.
  int prefetch_factor = 2;
  /// Keep the workers from one epoch to the next (else they start at each epoch's first batch
  /// and end with its last, as torch's default).
  bool persistent_workers = false;
  /// Runs in each worker before its first sample: (worker id, the worker's seed). The seed is
  /// `seed` + e * num_workers + id for workers started at epoch e (persistent workers: the first
  /// epoch's), so that per-epoch workers do not repeat their random streams. An exception from
  /// it ends the epoch with ProcessRaisedError naming the worker's worker_init_fn.
  void (*worker_init_fn)(int worker_id, std::uint64_t seed) = nullptr;
  /// How workers are made. forkserver (the default) forks them from a single-threaded server, so
  /// the trainer may run threads (CUDA, NCCL, a progress thread); the server is a fork of this
  /// process made after the dataset exists (see DataLoader::DataLoader). fork forks this process
  /// (refused when it runs threads). spawn is refused: a dataset object cannot be re-created in a
  /// fresh program.
  StartMethod start_method = StartMethod::forkserver;
  /// Longest wait for one batch; zero: no limit. A dead worker is an error at once either way.
  std::chrono::milliseconds timeout{0};
  /// A custom collate, run in the worker on the batch's samples (got with Dataset::get). Its
  /// tensors reach the trainer by handle (private ones moved into the arena once). nullptr: the
  /// default, which writes each sample into its row of the batch (Dataset::get_into).
  Batch (*collate)(std::vector<Sample>&& samples) = nullptr;
  /// Page-locks the batches' memory for fast, asynchronous copies to a GPU: the whole arena,
  /// where every batch is made (also without workers, then), registered with CUDA once per process
  /// at the first epoch, after the workers started (so all of --shm-size / NODAL_SHM_SIZE becomes
  /// resident). CUDA is then initialised: later workers need the fork server (the default) or
  /// persistent workers, as fork is refused after CUDA. UsageError at construction in a build
  /// without CUDA; CudaError at the first epoch where no GPU can be used.
  bool pin_memory = false;
  /// The order of the indices; nullptr: as `shuffle` says. A DistributedSampler gives each rank
  /// its share.
  std::shared_ptr<Sampler> sampler{};
};

class DataLoader {
 public:
  /// Throws UsageError for batch_size < 1, num_workers < 0, prefetch_factor < 1, spawn, an empty
  /// dataset pointer, or pin_memory in a build without CUDA. With forkserver and workers, this registers
  /// the dataset for the fork server, which is started (if it is not running yet) when the first
  /// worker starts: make every DataLoader of the program before anything starts the fork server
  /// (and before the program's threads); a DataLoader made after that throws UsageError when its
  /// workers start, saying so.
  DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options = {});
  /// Over an iterable dataset: each worker streams its own batches (IterableDataset::start tells
  /// it which worker it is), taken from the workers in turn. Also throws UsageError for a
  /// sampler or shuffle (torch's rule).
  DataLoader(std::shared_ptr<IterableDataset> stream, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader& operator=(DataLoader&&) noexcept;

  /// Batches per epoch. Throws UsageError for an iterable dataset (not known ahead).
  std::int64_t size() const;
  /// The epoch the next iteration runs (the sampler's seed + epoch). Each iteration advances it by
  /// one; set it explicitly as with torch's DistributedSampler.set_epoch.
  void set_epoch(std::int64_t epoch);
  std::int64_t epoch() const noexcept { return epoch_; }

  /// One epoch's batches, in sampler order, as an input range. Starting a new iteration ends the
  /// previous one (its batches still held stay valid).
  class iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(DataLoader* loader);
    const Batch& operator*() const { return *current_; }
    const Batch* operator->() const { return &*current_; }
    iterator& operator++();
    bool operator==(const iterator& other) const { return loader_ == other.loader_; }

   private:
    DataLoader* loader_ = nullptr;
    std::optional<Batch> current_;
  };
  /// Starts an epoch (ending one still running: its workers stop, and the next start new ones):
  /// the workers (unless persistent and running) and the first batches. The iterator's ++ throws what a batch's loading threw: ProcessRaisedError naming the worker and
  /// the sample index, with the worker's stack; ProcessExitedError naming the worker when it died;
  /// TimeoutError after `timeout`. The epoch is over after such an error (workers stopped).
  iterator begin();
  iterator end() { return iterator(); }

  /// The next batch of the running epoch (starting one when none runs); nullopt at its end.
  std::optional<Batch> next();

  /// The workers' pids now (empty with num_workers 0 or between non-persistent epochs).
  std::vector<pid_t> worker_pids() const;

 private:
  void start_epoch();

  struct Running;  ///< the workers and the epoch in progress
  std::shared_ptr<Dataset> dataset_;          ///< one of the two
  std::shared_ptr<IterableDataset> stream_;
  DataLoaderOptions options_;
  std::shared_ptr<Sampler> sampler_;
  int registry_id_ = -1;
  std::int64_t epoch_ = 0;
  std::unique_ptr<Running> state_;
};

}  // namespace nodal::data

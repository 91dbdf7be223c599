#include <nodal/data/dataloader.hpp>

#include <nodal/arena.hpp>
#include <nodal/cuda.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/storage.hpp>

#include "batch_maker.hpp"
#include "loader_workers.hpp"

#include <mutex>

#include <fmt/format.h>

namespace nodal::data {
namespace detail {

using Clock = std::chrono::steady_clock;

/// One epoch in progress: the next batch, and (with workers) the batches in flight.
class Epoch {
 public:
  virtual ~Epoch() = default;
  /// The next batch; nullopt at the epoch's end.
  virtual std::optional<Batch> next() = 0;
  /// The first ticket the next epoch may use.
  virtual std::int64_t end_ticket() const noexcept = 0;

 protected:
  static std::optional<Clock::time_point> deadline(const DataLoaderOptions& options) {
    if (options.timeout.count() <= 0) return std::nullopt;
    return Clock::now() + options.timeout;
  }
};

/// One pass over a map-style dataset's sampler indices. Batch b is made by worker b % W, which
/// gets batch b + W * prefetch as soon as b is taken: torch's round robin, so batches come in
/// sampler order without reordering.
class IndexEpoch : public Epoch {
 public:
  IndexEpoch(Dataset& dataset, const DataLoaderOptions& options, std::int64_t epoch,
             std::vector<std::int64_t> indices, WorkerSet* workers, std::int64_t first_ticket)
      : options_(options),
        epoch_(epoch),
        maker_(&dataset, options.collate, /*shared=*/options.pin_memory),
        indices_(std::move(indices)),
        workers_(workers),
        base_(first_ticket) {
    const auto n = static_cast<std::int64_t>(indices_.size());
    batches_ = options.drop_last ? n / options.batch_size : (n + options.batch_size - 1) / options.batch_size;
    if (workers_ != nullptr) {
      const std::int64_t ahead = static_cast<std::int64_t>(workers_->size()) * options.prefetch_factor;
      for (; sent_ < std::min(ahead, batches_); ++sent_) send(sent_);
    }
  }

  std::int64_t end_ticket() const noexcept override { return base_ + batches_; }

  std::optional<Batch> next() override {
    if (next_ >= batches_) return std::nullopt;
    const std::int64_t b = next_++;
    if (workers_ == nullptr) {
      std::int64_t current = -1;
      // As a worker makes it, in private memory (in the arena, which is pinned, with pin_memory).
      Batch batch = maker_.make(rows_of(b), current);
      batch.number = b;
      return batch;
    }
    std::optional<Batch> batch = workers_->receive(worker_of(b), base_ + b, b, deadline(options_));
    if (!batch) throw Error("nodal::data::DataLoader: a worker ended a map-style epoch early");
    if (sent_ < batches_) send(sent_++);
    return batch;
  }

 private:
  int worker_of(std::int64_t b) const { return static_cast<int>(b % workers_->size()); }
  std::span<const std::int64_t> rows_of(std::int64_t b) const {
    const auto first = static_cast<std::size_t>(b * options_.batch_size);
    const std::size_t count = std::min(static_cast<std::size_t>(options_.batch_size), indices_.size() - first);
    return {indices_.data() + first, count};
  }
  void send(std::int64_t b) { workers_->send(worker_of(b), base_ + b, epoch_, rows_of(b)); }

  const DataLoaderOptions options_;  ///< a copy: the DataLoader may move while an epoch runs
  std::int64_t epoch_;
  BatchMaker maker_;
  std::vector<std::int64_t> indices_;
  WorkerSet* workers_;
  std::int64_t base_;
  std::int64_t batches_ = 0;
  std::int64_t next_ = 0;
  std::int64_t sent_ = 0;
};

/// One pass over an iterable dataset: each worker streams its own batches (its last one maybe
/// short), taken from the workers in turn, skipping those whose stream ended (torch's order).
class StreamEpoch : public Epoch {
 public:
  StreamEpoch(IterableDataset& stream, const DataLoaderOptions& options, std::int64_t epoch, WorkerSet* workers,
              std::int64_t ticket)
      : stream_(stream), options_(options), maker_(nullptr, options.collate, /*shared=*/options.pin_memory),
        workers_(workers),
        ticket_(ticket) {
    if (workers_ == nullptr) {
      stream_.start(0, 1, epoch);
      return;
    }
    for (int w = 0; w < workers_->size(); ++w) {
      workers_->send_stream(w, ticket_, epoch);
      active_.push_back(w);
    }
  }

  std::int64_t end_ticket() const noexcept override { return ticket_ + 1; }

  std::optional<Batch> next() override {
    if (workers_ == nullptr) return next_here();
    while (!active_.empty()) {
      cursor_ %= active_.size();
      const int w = active_[cursor_];
      std::optional<Batch> batch = workers_->receive(w, ticket_, number_, deadline(options_));
      if (!batch) {
        active_.erase(active_.begin() + static_cast<std::ptrdiff_t>(cursor_));
        continue;
      }
      ++cursor_;
      ++number_;
      return batch;
    }
    return std::nullopt;
  }

 private:
  std::optional<Batch> next_here() {
    std::vector<Sample> samples;
    while (static_cast<std::int64_t>(samples.size()) < options_.batch_size && !ended_) {
      std::optional<Sample> sample = stream_.next();
      if (!sample) {
        ended_ = true;
        break;
      }
      samples.push_back(std::move(*sample));
    }
    const auto rows = static_cast<std::int64_t>(samples.size());
    if (rows == 0 || (rows < options_.batch_size && options_.drop_last)) return std::nullopt;
    Batch batch = maker_.stack(std::move(samples), position_);
    position_ += rows;
    batch.number = number_++;
    return batch;
  }

  IterableDataset& stream_;
  const DataLoaderOptions options_;  ///< a copy: the DataLoader may move while an epoch runs
  BatchMaker maker_;
  WorkerSet* workers_;
  std::int64_t ticket_;
  std::vector<int> active_;
  std::size_t cursor_ = 0;
  std::int64_t number_ = 0;
  std::int64_t position_ = 0;
  bool ended_ = false;
};

}  // namespace detail

namespace {

/// pin_memory: the whole arena, where every batch is, page-locked once per process (not at
/// construction, nor before the workers start: that would initialise CUDA before the workers'
/// fork server or fork). Throws CudaError where no GPU can be used.
void pin_arena() {
  static std::mutex mutex;
  static Arena* pinned = nullptr;
  std::lock_guard lock(mutex);
  Arena& arena = nodal::detail::job_arena();
  if (pinned == &arena) return;
  nodal::detail::gpu::register_host(arena.at(0), arena.size());
  pinned = &arena;
}

}  // namespace

struct DataLoader::Running {
  std::unique_ptr<detail::WorkerSet> workers;
  std::unique_ptr<detail::Epoch> epoch;
  std::int64_t next_ticket = 0;
};

namespace {

/// The checks both constructors make.
void check_options(const DataLoaderOptions& options) {
  if (options.batch_size < 1) throw UsageError(fmt::format("DataLoader: batch_size {} < 1", options.batch_size));
  if (options.num_workers < 0) throw UsageError(fmt::format("DataLoader: num_workers {} < 0", options.num_workers));
  if (options.prefetch_factor < 1) {
    throw UsageError(fmt::format("DataLoader: prefetch_factor {} < 1", options.prefetch_factor));
  }
  if (options.start_method == StartMethod::spawn && options.num_workers > 0) {
    throw UsageError(
        "DataLoader: StartMethod::spawn cannot give a worker the dataset object (a fresh program does not have "
        "it); use forkserver (the default) or fork");
  }
  if (options.pin_memory && !cuda::built_with_cuda()) {
    throw UsageError("DataLoader: pin_memory needs CUDA: " + cuda::unavailable_reason());
  }
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)), state_(std::make_unique<Running>()) {
  if (!dataset_) throw UsageError("nodal::data::DataLoader: no dataset");
  check_options(options_);
  sampler_ = options_.sampler;
  if (!sampler_) {
    if (options_.shuffle) {
      sampler_ = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
    } else {
      sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
    }
  }
  if (options_.num_workers > 0 && options_.start_method == StartMethod::forkserver) {
    registry_id_ = detail::register_dataset(dataset_.get(), nullptr);
  }
}

DataLoader::DataLoader(std::shared_ptr<IterableDataset> stream, DataLoaderOptions options)
    : stream_(std::move(stream)), options_(std::move(options)), state_(std::make_unique<Running>()) {
  if (!stream_) throw UsageError("nodal::data::DataLoader: no dataset");
  check_options(options_);
  if (options_.sampler || options_.shuffle) {
    throw UsageError("DataLoader: an IterableDataset has no indices to sample or shuffle (torch refuses the same)");
  }
  if (options_.num_workers > 0 && options_.start_method == StartMethod::forkserver) {
    registry_id_ = detail::register_dataset(nullptr, stream_.get());
  }
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

std::int64_t DataLoader::size() const {
  if (!sampler_) throw UsageError("DataLoader::size: an IterableDataset's batches are not known ahead");
  const std::int64_t n = sampler_->size();
  return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
}

void DataLoader::set_epoch(std::int64_t epoch) { epoch_ = epoch; }

void DataLoader::start_epoch() {
  Running& s = *state_;
  if (s.epoch) {
    // An epoch left before its end: its workers may still be making its batches; new ones are
    // quicker to get than those are to wait out.
    s.next_ticket = s.epoch->end_ticket();
    s.epoch.reset();
    s.workers.reset();
  }
  if (options_.num_workers > 0 && !s.workers) {
    // Each start of workers gets seeds of its own (torch draws a new base seed per iterator): the
    // base seed + epoch * workers, so worker w of epoch e has seed + e * W + w.
    const std::uint64_t base =
        options_.seed + static_cast<std::uint64_t>(epoch_) * static_cast<std::uint64_t>(options_.num_workers);
    s.workers = std::make_unique<detail::WorkerSet>(detail::WorkerSettings{
        dataset_.get(), stream_.get(), registry_id_, options_.num_workers, base, options_.prefetch_factor,
        options_.collate, options_.worker_init_fn, options_.start_method, options_.batch_size, options_.drop_last,
        epoch_});
  }
  // After the workers started: pinning initialises CUDA, and no fork may follow that.
  if (options_.pin_memory) pin_arena();
  if (stream_) {
    s.epoch = std::make_unique<detail::StreamEpoch>(*stream_, options_, epoch_, s.workers.get(), s.next_ticket);
  } else {
    s.epoch = std::make_unique<detail::IndexEpoch>(*dataset_, options_, epoch_, sampler_->indices(epoch_),
                                                   s.workers.get(), s.next_ticket);
  }
  ++epoch_;
}

std::optional<Batch> DataLoader::next() {
  Running& s = *state_;
  if (!s.epoch) start_epoch();
  std::optional<Batch> batch;
  try {
    batch = s.epoch->next();
  } catch (...) {
    // The epoch is over; the workers go (the next epoch starts new ones).
    s.epoch.reset();
    s.workers.reset();
    throw;
  }
  if (!batch) {
    s.next_ticket = s.epoch->end_ticket();
    s.epoch.reset();
    if (!options_.persistent_workers) s.workers.reset();
  }
  return batch;
}

DataLoader::iterator DataLoader::begin() {
  start_epoch();
  return iterator(this);
}

DataLoader::iterator::iterator(DataLoader* loader) : loader_(loader) { ++*this; }

DataLoader::iterator& DataLoader::iterator::operator++() {
  if (loader_ == nullptr) return *this;
  current_ = loader_->next();
  if (!current_) loader_ = nullptr;
  return *this;
}

std::vector<pid_t> DataLoader::worker_pids() const {
  return state_->workers ? state_->workers->pids() : std::vector<pid_t>{};
}

}  // namespace nodal::data

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

/// One pass over the sampler's indices: which batch comes next, and (with workers) which
/// batches are in flight. Batch b is made by worker b % W, which gets batch b + W * prefetch as
/// soon as b is taken: torch's round robin, so batches come in sampler order without reordering.
class Epoch {
 public:
  Epoch(Dataset& dataset, const DataLoaderOptions& options, std::vector<std::int64_t> indices, WorkerSet* workers,
        std::int64_t first_ticket)
      : dataset_(dataset), options_(options), indices_(std::move(indices)), workers_(workers), base_(first_ticket) {
    const auto n = static_cast<std::int64_t>(indices_.size());
    batches_ = options.drop_last ? n / options.batch_size : (n + options.batch_size - 1) / options.batch_size;
    if (workers_ != nullptr) {
      const std::int64_t ahead = static_cast<std::int64_t>(workers_->size()) * options.prefetch_factor;
      for (std::int64_t b = 0; b < std::min(ahead, batches_); ++b) send(b);
      sent_ = std::min(ahead, batches_);
    }
  }

  std::int64_t batches() const noexcept { return batches_; }
  /// Tickets this epoch used: the next epoch's start after these.
  std::int64_t end_ticket() const noexcept { return base_ + batches_; }

  std::optional<Batch> next() {
    if (next_ >= batches_) return std::nullopt;
    const std::int64_t b = next_++;
    if (workers_ == nullptr) return make_here(b);
    const auto deadline = options_.timeout.count() > 0 ? std::optional(Clock::now() + options_.timeout) : std::nullopt;
    Batch batch = workers_->receive(static_cast<int>(b % workers_->size()), base_ + b, deadline);
    if (sent_ < batches_) send(sent_++);
    return batch;
  }

 private:
  std::span<const std::int64_t> rows_of(std::int64_t b) const {
    const auto first = static_cast<std::size_t>(b * options_.batch_size);
    const std::size_t count = std::min(static_cast<std::size_t>(options_.batch_size), indices_.size() - first);
    return {indices_.data() + first, count};
  }

  void send(std::int64_t b) { workers_->send(static_cast<int>(b % workers_->size()), base_ + b, b, rows_of(b)); }

  /// num_workers 0: the batch made here, as a worker makes it (in private memory).
  Batch make_here(std::int64_t b) {
    std::int64_t current = -1;
    Batch batch = maker_.make(rows_of(b), current);
    batch.number = b;
    return batch;
  }

  Dataset& dataset_;
  const DataLoaderOptions& options_;
  BatchMaker maker_{dataset_, options_.collate, /*shared=*/false};
  std::vector<std::int64_t> indices_;
  WorkerSet* workers_;
  std::int64_t base_;
  std::int64_t batches_ = 0;
  std::int64_t next_ = 0;
  std::int64_t sent_ = 0;
};

}  // namespace detail

namespace {

/// pin_memory: the whole arena, where every batch is, page-locked once per process (not at
/// construction: that would initialise CUDA before the workers' fork server starts). Throws
/// CudaError where no GPU can be used.
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

DataLoader::DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)), state_(std::make_unique<Running>()) {
  if (!dataset_) throw UsageError("nodal::data::DataLoader: no dataset");
  if (options_.batch_size < 1) throw UsageError(fmt::format("DataLoader: batch_size {} < 1", options_.batch_size));
  if (options_.num_workers < 0) throw UsageError(fmt::format("DataLoader: num_workers {} < 0", options_.num_workers));
  if (options_.prefetch_factor < 1) {
    throw UsageError(fmt::format("DataLoader: prefetch_factor {} < 1", options_.prefetch_factor));
  }
  if (options_.start_method == StartMethod::spawn && options_.num_workers > 0) {
    throw UsageError(
        "DataLoader: StartMethod::spawn cannot give a worker the dataset object (a fresh program does not have "
        "it); use forkserver (the default) or fork");
  }
  if (options_.pin_memory && !cuda::built_with_cuda()) {
    throw UsageError("DataLoader: pin_memory needs CUDA: " + cuda::unavailable_reason());
  }
  sampler_ = options_.sampler;
  if (!sampler_) {
    if (options_.shuffle) {
      sampler_ = std::make_shared<RandomSampler>(dataset_->size(), options_.seed);
    } else {
      sampler_ = std::make_shared<SequentialSampler>(dataset_->size());
    }
  }
  if (options_.num_workers > 0 && options_.start_method == StartMethod::forkserver) {
    registry_id_ = detail::register_dataset(dataset_.get());
  }
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;
DataLoader& DataLoader::operator=(DataLoader&&) noexcept = default;

std::int64_t DataLoader::size() const {
  const auto n = static_cast<std::int64_t>(sampler_->indices(epoch_).size());
  return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
}

void DataLoader::set_epoch(std::int64_t epoch) { epoch_ = epoch; }

void DataLoader::start_epoch() {
  Running& s = *state_;
  if (options_.pin_memory) pin_arena();
  if (s.epoch) {
    // An epoch left before its end: its workers may still be making its batches; new ones are
    // quicker to get than those are to wait out.
    s.next_ticket = s.epoch->end_ticket();
    s.epoch.reset();
    s.workers.reset();
  }
  if (options_.num_workers > 0 && !s.workers) {
    s.workers = std::make_unique<detail::WorkerSet>(detail::WorkerSettings{
        dataset_.get(), registry_id_, options_.num_workers, options_.seed, options_.prefetch_factor,
        options_.collate, options_.worker_init_fn, options_.start_method});
  }
  s.epoch = std::make_unique<detail::Epoch>(*dataset_, options_, sampler_->indices(epoch_), s.workers.get(),
                                            s.next_ticket);
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

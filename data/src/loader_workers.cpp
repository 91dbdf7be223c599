#include "loader_workers.hpp"

#include "batch_maker.hpp"

#include <nodal/data/worker_info.hpp>

#include <nodal/errors.hpp>
#include <nodal/detail/child_config.hpp>
#include <nodal/detail/exception_report.hpp>
#include <nodal/detail/forkserver.hpp>

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace nodal::data::detail {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// What a worker puts on its batch queue (the item's label); the item's index is the ticket.
/// kEnd: an IterableDataset's worker reached the end of its stream for that ticket's epoch.
/// kInitError: worker_init_fn threw (the index is the largest ticket: no batch is older).
enum Kind : std::int64_t { kBatch = 1, kError = 2, kEnd = 3, kInitError = 4 };
/// How long the trainer waits on a worker's queue before it looks whether the worker lives.
constexpr auto kLivenessSlice = 50ms;
/// stop(): how long after the queues close a worker may take to leave, and after SIGTERM to die.
constexpr auto kLeaveGrace = 1s;
constexpr auto kTerminateGrace = 2s;

struct Registered {
  Dataset* map;
  IterableDataset* stream;
  /// forkservers_started() when it was registered: the servers numbered above it have it.
  std::uint64_t servers_before;
};
struct Registry {
  std::mutex mutex;
  std::vector<Registered> entries;
};
Registry& registry() {
  static Registry r;
  return r;
}

/// A worker's settings as they travel to a forkserver worker (one plain struct of bytes).
struct Wire {
  int dataset_id;
  int id;
  int workers;
  int prefetch;
  std::uint64_t seed;
  std::uintptr_t collate;
  std::uintptr_t init;
  std::int64_t batch_size;
  bool drop_last;
  std::int64_t epoch;
  char index_queue[80];
  char batch_queue[80];
};

struct WorkerPlan {
  Dataset* dataset;
  IterableDataset* stream;
  int id;
  int workers;
  int prefetch;
  std::uint64_t seed;
  Batch (*collate)(std::vector<Sample>&&);
  void (*init)(int, std::uint64_t);
  std::int64_t batch_size;
  bool drop_last;
  std::int64_t epoch;
  std::string index_queue;
  std::string batch_queue;
};

/// A batch as it travels: its tensors by handle, the fields' names in the text, NUL-separated.
QueueItem batch_item(std::int64_t ticket, const Batch& batch) {
  QueueItem out;
  out.index = ticket;
  out.label = kBatch;
  for (const auto& [name, tensor] : batch.fields()) {
    out.text += name;
    out.text.push_back('\0');
    out.tensors.push_back(tensor);
  }
  return out;
}

/// The report of what was thrown while loading sample `current` (-1: outside the samples).
QueueItem error_item(std::int64_t ticket, std::int64_t current) {
  QueueItem out;
  out.index = ticket;
  out.label = kError;
  out.text = fmt::format("{}\n{}\n{}", current, nodal::detail::describe_exception(std::current_exception()),
                         nodal::detail::current_stack_trace());
  return out;
}

/// An IterableDataset's pass for the epoch in `request`: its batches, then kEnd. A batch queue
/// `prefetch` deep holds the worker back while the trainer is behind.
void stream_epoch(const WorkerPlan& plan, BatchMaker& maker, const QueueItem& request, TensorQueue& batches) {
  std::int64_t position = 0;  // samples of this pass so far
  std::int64_t current = -1;  // the one being loaded (-1: none, e.g. while stacking)
  try {
    std::int64_t epoch = 0;
    std::memcpy(&epoch, request.text.data(), sizeof epoch);
    set_worker_info({plan.id, plan.workers, plan.seed, epoch});
    plan.stream->start(plan.id, plan.workers, epoch);
    for (;;) {
      std::vector<Sample> samples;
      while (static_cast<std::int64_t>(samples.size()) < plan.batch_size) {
        current = position;
        std::optional<Sample> sample = plan.stream->next();
        current = -1;
        if (!sample) break;
        samples.push_back(std::move(*sample));
        ++position;
      }
      const auto rows = static_cast<std::int64_t>(samples.size());
      if (rows == 0 || (rows < plan.batch_size && plan.drop_last)) break;
      batches.put(batch_item(request.index, maker.stack(std::move(samples), position - rows)));
      if (rows < plan.batch_size) break;
    }
  } catch (...) {
    batches.put(error_item(request.index, current));
    return;
  }
  QueueItem end;
  end.index = request.index;
  end.label = kEnd;
  batches.put(std::move(end));
}

/// A worker: makes the batches its index queue asks for, in order, until the queue is closed.
void run_worker(const WorkerPlan& plan) {
  TensorQueue requests = TensorQueue::open(plan.index_queue, static_cast<std::size_t>(plan.prefetch));
  TensorQueue batches = TensorQueue::open(plan.batch_queue, static_cast<std::size_t>(plan.prefetch));
  set_worker_info({plan.id, plan.workers, plan.seed, plan.epoch});
  if (plan.init != nullptr) {
    try {
      plan.init(plan.id, plan.seed);
    } catch (...) {
      QueueItem report = error_item(std::numeric_limits<std::int64_t>::max(), -1);
      report.label = kInitError;
      batches.put(std::move(report));
      return;
    }
  }
  BatchMaker maker(plan.dataset, plan.collate, /*shared=*/true);
  while (std::optional<QueueItem> request = requests.get()) {
    if (plan.stream != nullptr) {
      stream_epoch(plan, maker, *request, batches);
      continue;
    }
    set_worker_info({plan.id, plan.workers, plan.seed, request->label});  // the label: the epoch
    std::vector<std::int64_t> indices(request->text.size() / sizeof(std::int64_t));
    std::memcpy(indices.data(), request->text.data(), indices.size() * sizeof(std::int64_t));
    std::int64_t current = -1;
    QueueItem out;
    try {
      out = batch_item(request->index, maker.make(indices, current));
    } catch (...) {
      out = error_item(request->index, current);
    }
    batches.put(std::move(out));
  }
}

/// A forkserver worker's target.
void forkserver_worker() {
  const QueueItem config = nodal::detail::receive_child_config("a nodal::data::DataLoader forkserver worker");
  Wire wire{};
  if (config.text.size() != sizeof wire) throw Error("DataLoader worker: a malformed configuration");
  std::memcpy(&wire, config.text.data(), sizeof wire);
  Registered dataset{};
  {
    std::lock_guard lock(registry().mutex);
    if (wire.dataset_id < 0 || static_cast<std::size_t>(wire.dataset_id) >= registry().entries.size()) {
      throw Error("DataLoader worker: the fork server does not have this dataset");
    }
    dataset = registry().entries[static_cast<std::size_t>(wire.dataset_id)];
  }
  run_worker(WorkerPlan{dataset.map, dataset.stream, wire.id, wire.workers, wire.prefetch, wire.seed,
                        reinterpret_cast<Batch (*)(std::vector<Sample>&&)>(wire.collate),
                        reinterpret_cast<void (*)(int, std::uint64_t)>(wire.init), wire.batch_size, wire.drop_last,
                        wire.epoch, wire.index_queue, wire.batch_queue});
}

std::atomic<int> g_sets{0};

}  // namespace

int register_dataset(Dataset* map, IterableDataset* stream) {
  std::lock_guard lock(registry().mutex);
  registry().entries.push_back({map, stream, nodal::detail::forkservers_started()});
  return static_cast<int>(registry().entries.size()) - 1;
}

struct WorkerSet::Worker {
  int id = 0;
  std::unique_ptr<Process> process;
  pid_t pid = -1;
  TensorQueue requests;
  TensorQueue batches;
};

WorkerSet::WorkerSet(const WorkerSettings& settings)
    : name_(fmt::format("nodal.data.{}.{}", ::getpid(), ++g_sets)), settings_(settings) {
  if (settings.start_method == StartMethod::forkserver) {
    start_forkserver();  // UsageError when threads run and none runs yet: it says what to do
    std::uint64_t before = 0;
    {
      std::lock_guard lock(registry().mutex);
      before = registry().entries.at(static_cast<std::size_t>(settings.dataset_id)).servers_before;
    }
    if (nodal::detail::running_forkserver() <= before) {
      throw UsageError(
          "nodal::data::DataLoader: the fork server started before this DataLoader was made, so its workers "
          "cannot see the dataset (the server is a copy of the program as it was then). Make every DataLoader "
          "before anything starts the fork server (nodal::start_forkserver(), a forkserver Process or spawn), "
          "or use StartMethod::fork");
    }
  }
  try {
    for (int id = 0; id < settings.workers; ++id) {
      const std::string requests = queue_name(id, "requests");
      const std::string batches = queue_name(id, "batches");
      const auto depth = static_cast<std::size_t>(settings.prefetch);
      auto worker = std::make_unique<Worker>(
          Worker{id, nullptr, -1, TensorQueue::open(requests, depth), TensorQueue::open(batches, depth)});
      const std::uint64_t seed = settings.seed + static_cast<std::uint64_t>(id);
      ProcessOptions options{.start_method = settings.start_method, .name = fmt::format("DataLoader worker {}", id)};
      if (settings.start_method == StartMethod::fork) {
        const WorkerPlan plan{settings.dataset, settings.stream, id, settings.workers, settings.prefetch, seed,
                              settings.collate, settings.init, settings.batch_size, settings.drop_last, settings.epoch,
                              requests, batches};
        worker->process = std::make_unique<Process>([plan] { run_worker(plan); }, options);
        worker->process->start();
      } else {
        worker->process = std::make_unique<Process>(&forkserver_worker, options);
        worker->process->start();
        Wire wire{settings.dataset_id, id, settings.workers, settings.prefetch, seed,
                  reinterpret_cast<std::uintptr_t>(settings.collate), reinterpret_cast<std::uintptr_t>(settings.init),
                  settings.batch_size, settings.drop_last, settings.epoch, {}, {}};
        requests.copy(wire.index_queue, sizeof wire.index_queue - 1);
        batches.copy(wire.batch_queue, sizeof wire.batch_queue - 1);
        QueueItem config;
        config.text.assign(reinterpret_cast<const char*>(&wire), sizeof wire);
        nodal::detail::send_child_config(*worker->process->pid(), std::move(config));
      }
      worker->pid = *worker->process->pid();
      workers_.push_back(std::move(worker));
    }
  } catch (...) {
    stop();
    throw;
  }
}

WorkerSet::~WorkerSet() { stop(); }

std::string WorkerSet::queue_name(int worker, const char* which) const {
  return fmt::format("{}.w{}.{}", name_, worker, which);
}

void WorkerSet::send(int worker, std::int64_t ticket, std::int64_t epoch, std::span<const std::int64_t> indices) {
  QueueItem request;
  request.index = ticket;
  request.label = epoch;
  request.text.assign(reinterpret_cast<const char*>(indices.data()), indices.size_bytes());
  workers_.at(static_cast<std::size_t>(worker))->requests.put(std::move(request));
}

void WorkerSet::send_stream(int worker, std::int64_t ticket, std::int64_t epoch) {
  QueueItem request;
  request.index = ticket;
  request.text.assign(reinterpret_cast<const char*>(&epoch), sizeof epoch);
  workers_.at(static_cast<std::size_t>(worker))->requests.put(std::move(request));
}

std::optional<Batch> WorkerSet::receive(int worker, std::int64_t ticket, std::int64_t number,
                                        std::optional<Clock::time_point> deadline) {
  Worker& w = *workers_.at(static_cast<std::size_t>(worker));
  const std::string name = fmt::format("DataLoader worker {}", w.id);
  for (;;) {
    auto slice = std::chrono::duration_cast<std::chrono::nanoseconds>(kLivenessSlice);
    if (deadline) {
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - Clock::now());
      if (left <= std::chrono::nanoseconds(0)) {
        throw TimeoutError(fmt::format("nodal::data::DataLoader: {} (pid {}) did not deliver batch {} within the timeout",
                                       name, w.pid, number));
      }
      slice = std::min(slice, left);
    }
    std::optional<QueueItem> item;
    if (w.batches.wait_readable(slice)) item = w.batches.try_get();
    if (!item) {
      if (w.process->is_alive()) continue;
      item = w.batches.try_get();  // what it put just before it died
      if (!item) {
        const int code = w.process->exitcode().value_or(0);
        throw ProcessExitedError(w.id, static_cast<int>(w.pid), code > 0 ? code : 0, code < 0 ? -code : 0,
                                 fmt::format("{}, making batch {}", name, number));
      }
    }
    if (item->index < ticket) continue;  // a batch of an epoch that was abandoned
    if (item->label == kEnd) return std::nullopt;
    if (item->label == kError || item->label == kInitError) {
      const std::size_t newline = item->text.find('\n');
      const std::string sample = item->text.substr(0, newline);
      std::string where;
      if (item->label == kInitError) {
        where = fmt::format("{}'s worker_init_fn", name);
      } else if (sample == "-1") {
        where = fmt::format("{}, making batch {} (not in a sample: allocating, stacking or collating)", name, number);
      } else if (settings_.stream != nullptr) {
        where = fmt::format("{}, loading sample {} of its stream (for batch {})", name, sample, number);
      } else {
        where = fmt::format("{}, loading sample {} of batch {}", name, sample, number);
      }
      throw ProcessRaisedError(w.id, static_cast<int>(w.pid), item->text.substr(newline + 1), where);
    }
    Batch batch;
    batch.number = number;
    std::size_t begin = 0;
    for (Tensor& tensor : item->tensors) {
      const std::size_t end = item->text.find('\0', begin);
      batch.add(item->text.substr(begin, end - begin), std::move(tensor));
      begin = end + 1;
    }
    return batch;
  }
}

void WorkerSet::stop() noexcept {
  for (auto& worker : workers_) worker->requests.close();
  const auto leave_by = Clock::now() + kLeaveGrace;
  for (auto& worker : workers_) {
    try {
      // Drains what the worker still delivers, so that it is not blocked putting it.
      while (worker->process->is_alive() && Clock::now() < leave_by) {
        while (worker->batches.try_get()) {
        }
        std::this_thread::sleep_for(1ms);
      }
      if (worker->process->is_alive()) worker->process->terminate();
    } catch (...) {
      // A failed worker's error was reported through the batch it owed, or nobody waits for it.
    }
    worker->process->join_or_kill(Clock::now() + kTerminateGrace);
    if (settings_.start_method == StartMethod::forkserver) nodal::detail::discard_child_config(worker->pid);
  }
  // The workers have ended: their queues go back to the arena (with what is still in them).
  for (int id = 0; id < static_cast<int>(workers_.size()); ++id) {
    try {
      TensorQueue::unlink(queue_name(id, "requests"));
      TensorQueue::unlink(queue_name(id, "batches"));
    } catch (...) {
      // The arena's index is unusable (a process died holding it): the job is failing anyway.
    }
  }
  workers_.clear();
}

std::vector<pid_t> WorkerSet::pids() const {
  std::vector<pid_t> pids;
  for (const auto& worker : workers_) pids.push_back(worker->pid);
  return pids;
}

}  // namespace nodal::data::detail

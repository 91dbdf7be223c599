#include <nodal/pool.hpp>

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/process.hpp>
#include <nodal/detail/child_config.hpp>
#include <nodal/detail/exception_report.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/wait.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

namespace nodal {
namespace detail::pool {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// Tasks queued to one worker at a time, beyond the one it runs: enough that a worker never
/// waits for the parent between two short tasks, few enough that a worker stuck in a long task
/// holds back little work that another worker could do (tasks are not stolen back).
constexpr std::size_t kDepth = 4;
/// A worker's result queue: one result per task it was given, plus an initializer's error.
constexpr std::size_t kResultCapacity = kDepth + 1;
/// How long the collecting thread waits on the result bell before it looks at the workers, and
/// how often it looks at them while results keep coming.
constexpr auto kPoll = 5ms;
/// Pool::terminate: how long after SIGTERM a worker still running gets SIGKILL.
constexpr auto kTerminateGrace = 2s;

/// What a worker puts on the result queue; every message's text starts with the worker's pid.
enum Kind : std::int64_t { kResult = 2, kError = 3, kInitError = 4 };

/// Rung by a worker after each put on its own result queue; the parent sleeps on it while every
/// result queue is empty. One word for all workers: a futex waits on one address only. A worker
/// killed between its put and the ring costs the parent at most kPoll, never the result.
struct ResultBell {
  detail::WaitWord word;
};

ResultBell& open_bell(const std::string& name) {
  return detail::job_arena().find_or_construct<ResultBell>(name.c_str());
}

struct WorkerConfig {
  std::string tasks;
  std::string results;
  std::string bell;
  void (*initializer)() = nullptr;
  std::uint64_t maxtasks = 0;
};

QueueItem message(Kind kind, std::int64_t task, std::int64_t pid) {
  QueueItem item;
  item.index = task;
  item.label = kind;
  Writer(item).put(pid);
  return item;
}

/// A worker: runs the tasks of its own queue in order, one result (or error) per task.
void worker_main(const WorkerConfig& config) {
  TensorQueue tasks = TensorQueue::open(config.tasks, kDepth);
  TensorQueue results = TensorQueue::open(config.results, kResultCapacity);
  ResultBell& bell = open_bell(config.bell);
  const std::int64_t pid = ::getpid();
  if (config.initializer != nullptr) {
    try {
      config.initializer();
    } catch (...) {
      QueueItem report = message(kInitError, -1, pid);
      report.text += describe_exception(std::current_exception()) + "\n" + current_stack_trace();
      results.put(std::move(report));
      detail::notify(bell.word);
      return;
    }
  }
  for (std::uint64_t done = 0; config.maxtasks == 0 || done < config.maxtasks; ++done) {
    std::optional<QueueItem> task = tasks.get();
    if (!task) return;  // closed and drained
    QueueItem out = message(kResult, task->index, pid);
    try {
      Reader in(*task, 0);
      TaskHeader header{};
      in.bytes(&header, sizeof header);
      Writer writer(out);
      reinterpret_cast<Runner>(static_cast<std::uintptr_t>(header.runner))(header.fn, in, header.count, writer);
    } catch (...) {
      out = message(kError, task->index, pid);
      out.text += describe_exception(std::current_exception()) + "\n" + current_stack_trace();
    }
    task.reset();  // drop the arguments' tensors before the result goes
    results.put(std::move(out));
    detail::notify(bell.word);
  }
}

/// A forkserver worker's target: its configuration comes through child_config.hpp.
void forkserver_worker() {
  QueueItem item = receive_child_config("a nodal::Pool forkserver worker");
  WorkerConfig config;
  Reader reader(item, 0);
  config.initializer = reinterpret_cast<void (*)()>(static_cast<std::uintptr_t>(reader.get<std::uint64_t>()));
  config.maxtasks = reader.get<std::uint64_t>();
  config.tasks = reader.get<std::string>();
  config.results = reader.get<std::string>();
  config.bell = reader.get<std::string>();
  item = QueueItem{};
  worker_main(config);
}

std::atomic<int> g_pool_count{0};

}  // namespace

void Reader::bytes(void* data, std::size_t size) {
  if (offset_ + size > item_.text.size()) throw Error("nodal::Pool: a task or result item is shorter than its values");
  std::memcpy(data, item_.text.data() + offset_, size);
  offset_ += size;
}

Tensor Reader::tensor() {
  if (next_tensor_ >= item_.tensors.size()) throw Error("nodal::Pool: a task or result item lacks a tensor");
  return item_.tensors[next_tensor_++];
}

struct Task {
  std::string what;
  std::uint64_t count = 0;
  bool finished = false;
  bool abandoned = false;
  QueueItem result;
  std::exception_ptr error;
};

/// One worker as the parent sees it: its process, its task queue, and the tasks it was given
/// that have not come back, in the order it runs them.
struct Worker {
  std::unique_ptr<Process> process;
  pid_t pid = -1;
  int slot = 0;
  std::string queue_name;
  std::optional<TensorQueue> queue;
  /// Its own result queue: a worker SIGKILLed inside a put leaves a cell claimed and never
  /// published, which blocks every later item of that queue (Vyukov's queue has no way past
  /// it). Shared by all workers, it would stall the others' results too; its own, it goes with
  /// the worker.
  std::string results_name;
  std::optional<TensorQueue> results;
  std::deque<std::int64_t> given;
  std::uint64_t given_total = 0;  ///< for maxtasksperchild
};

/// The parent's side of a pool. Each worker has its own task queue, fed by the parent a few
/// tasks ahead (kDepth). So the parent always knows which tasks a worker holds: when it dies, the
/// tasks still in its queue go to other workers, and the one it had taken fails with
/// ProcessExitedError; no task is lost, whatever instant it died at. (Python's Pool, with one
/// shared queue, cannot tell which task a dead worker held, and waits forever.)
class Core {
 public:
  Core(std::size_t processes, PoolOptions options)
      : options_(options),
        id_(fmt::format("nodal.pool.{}.{}", ::getpid(), ++g_pool_count)) {
    if (options.start_method == StartMethod::spawn) {
      throw UsageError(
          "nodal::Pool: StartMethod::spawn is not supported (task functions travel as addresses, valid only in a "
          "fork of this program); use StartMethod::fork or StartMethod::forkserver");
    }
    bell_ = &open_bell(bell_name());  // after the check: a constructor that throws runs no ~Core
    if (processes == 0) processes = std::max(1U, std::thread::hardware_concurrency());
    processes_ = processes;
    try {
      for (std::size_t k = 0; k < processes; ++k) start_worker();
    } catch (...) {
      terminate();
      throw;
    }
  }
  ~Core() { terminate(); }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  std::int64_t submit(QueueItem item, std::string what) {
    if (terminated_) throw UsageError("nodal::Pool: the pool was terminated");
    if (closed_) throw UsageError("nodal::Pool: the pool was closed");
    if (broken_) std::rethrow_exception(broken_);
    TaskHeader header{};
    Reader(item, 0).bytes(&header, sizeof header);
    const std::int64_t id = next_task_++;
    item.index = id;
    Task& task = tasks_by_id_[id];
    task.what = std::move(what);
    task.count = header.count;
    backlog_.push_back(std::move(item));
    feed();
    return id;
  }

  QueueItem take(std::int64_t id, std::optional<Clock::time_point> deadline) {
    bool looked = false;
    for (;;) {
      auto it = tasks_by_id_.find(id);
      if (it == tasks_by_id_.end()) throw UsageError(fmt::format("nodal::Pool: task {} was taken already", id));
      if (it->second.finished) {
        Task task = std::move(it->second);
        tasks_by_id_.erase(it);
        if (task.error) std::rethrow_exception(task.error);
        task.result.index = static_cast<std::int64_t>(task.count);
        return std::move(task.result);
      }
      // Whatever the deadline, one look at what came (a zero timeout polls).
      if (looked && deadline && Clock::now() >= *deadline) {
        throw TimeoutError(fmt::format("nodal::Pool: timed out waiting for task {} ({})", id, it->second.what));
      }
      collect(deadline);
      looked = true;
    }
  }

  bool done(std::int64_t id) {
    collect(Clock::now());
    auto it = tasks_by_id_.find(id);
    return it == tasks_by_id_.end() || it->second.finished;
  }

  std::optional<std::int64_t> wait_any(const std::vector<std::int64_t>& ids, std::optional<Clock::time_point> deadline) {
    bool looked = false;
    for (;;) {
      for (std::int64_t id : ids) {
        auto it = tasks_by_id_.find(id);
        if (it == tasks_by_id_.end() || it->second.finished) return id;
      }
      if (looked && deadline && Clock::now() >= *deadline) return std::nullopt;
      collect(deadline);
      looked = true;
    }
  }

  void abandon(const std::vector<std::int64_t>& ids) noexcept {
    for (std::int64_t id : ids) {
      auto it = tasks_by_id_.find(id);
      if (it == tasks_by_id_.end()) continue;
      if (it->second.finished) {
        tasks_by_id_.erase(it);
      } else {
        it->second.abandoned = true;
      }
    }
  }

  void close() {
    closed_ = true;
    feed();
  }

  void terminate() noexcept {
    if (terminated_) return;
    terminated_ = true;
    closed_ = true;
    // Workers hold SIGTERM back while they change the arena or a queue (termination_shield.hpp),
    // so ending them in the middle of a task leaves the job's shared structures whole.
    for (Worker& worker : workers_) {
      if (worker.queue) worker.queue->close();
      try {
        worker.process->terminate();
      } catch (...) {
      }
    }
    const auto kill_at = Clock::now() + kTerminateGrace;
    for (Worker& worker : workers_) worker.process->join_or_kill(kill_at);
    // Every process that used the pool's queues has ended: they go back to the arena, with the
    // tensors of the items still in them (results nobody collected, tasks never taken).
    for (Worker& worker : workers_) {
      if (options_.start_method == StartMethod::forkserver) discard_child_config(worker.pid);
      unlink(worker.queue_name);
      unlink(worker.results_name);
    }
    workers_.clear();
    for (const std::string& name : spare_queues_) unlink(name);
    spare_queues_.clear();
    try {
      detail::job_arena().destroy(bell_name().c_str());
    } catch (...) {
      // As unlink(): the job is failing anyway.
    }
    backlog_.clear();
    std::vector<std::int64_t> unfinished;  // finish() may erase from the map: not while iterating it
    for (const auto& [id, task] : tasks_by_id_) {
      if (!task.finished) unfinished.push_back(id);
    }
    for (std::int64_t id : unfinished) {
      Task& task = tasks_by_id_.at(id);
      finish(id, task, std::make_exception_ptr(Error(fmt::format(
                           "nodal::Pool: the pool was terminated before task {} ({}) finished", id, task.what))));
    }
  }

  void join() {
    if (!closed_) throw UsageError("nodal::Pool::join: call close() or terminate() first");
    while (!workers_.empty()) collect(std::nullopt);
  }

  std::vector<pid_t> pids() const {
    std::vector<pid_t> pids;
    for (const Worker& worker : workers_) pids.push_back(worker.pid);
    return pids;
  }

 private:
  /// One round of the collecting loop: feeds the workers, takes what came back (waiting up to
  /// kPoll or the deadline for it), and looks after workers that exited.
  void collect(std::optional<Clock::time_point> deadline) {
    if (terminated_) return;
    feed();
    auto wait = std::chrono::duration_cast<std::chrono::nanoseconds>(kPoll);
    if (deadline) wait = std::clamp(std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline - Clock::now()),
                                    std::chrono::nanoseconds(0), wait);
    bool came = false;
    try {
      detail::wait_until(
          bell_->word, [&] { return (came = drain()); }, detail::Deadline{Clock::now() + wait},
          "nodal::Pool waiting for a result");
    } catch (const TimeoutError&) {
    }
    // Looking at the workers costs a waitpid each: after a quiet kPoll, or once per kPoll.
    const auto now = Clock::now();
    if (!came || now >= next_check_) {
      next_check_ = now + kPoll;
      check_workers();
    }
    feed();
  }

  /// Gives backlog tasks to the least busy workers, up to kDepth each (and no more than a
  /// worker's maxtasksperchild allows), in submission order. Only this process puts on a
  /// worker's queue, and it never holds more than kDepth, so put never waits.
  void feed() {
    if (terminated_) return;
    while (!backlog_.empty()) {
      Worker* best = nullptr;
      for (Worker& worker : workers_) {
        if (worker.queue->closed() || worker.given.size() >= kDepth) continue;
        if (options_.maxtasksperchild != 0 && worker.given_total >= options_.maxtasksperchild) continue;
        if (best == nullptr || worker.given.size() < best->given.size()) best = &worker;
      }
      if (best == nullptr) break;
      const std::int64_t id = backlog_.front().index;
      best->queue->put(std::move(backlog_.front()));
      backlog_.pop_front();
      best->given.push_back(id);
      ++best->given_total;
    }
    if (closed_ && backlog_.empty()) {
      for (Worker& worker : workers_) worker.queue->close();  // each leaves once its queue is drained
    }
  }

  /// Takes every result queued now; true when there was one.
  bool drain() {
    bool any = false;
    // handle() never adds or removes workers, so the loop's references stay valid.
    for (Worker& worker : workers_) {
      while (std::optional<QueueItem> item = worker.results->try_get()) {
        handle(std::move(*item));
        any = true;
      }
    }
    return any;
  }

  Worker* worker_of(std::int64_t pid) {
    for (Worker& worker : workers_) {
      if (worker.pid == pid) return &worker;
    }
    return nullptr;
  }

  void handle(QueueItem item) {
    Reader reader(item, 0);
    const std::int64_t pid = reader.get<std::int64_t>();
    Worker* worker = worker_of(pid);
    const std::int64_t id = item.index;
    if (item.label == kInitError) {
      broken_ = std::make_exception_ptr(ProcessRaisedError(worker ? worker->slot : 0, static_cast<int>(pid),
                                                           item.text.substr(sizeof pid),
                                                           "a nodal::Pool worker's initializer"));
      fail_all(broken_);
      return;
    }
    if (worker != nullptr) std::erase(worker->given, id);
    auto it = tasks_by_id_.find(id);
    if (it == tasks_by_id_.end() || it->second.finished) return;
    if (item.label == kError) {
      finish(id, it->second,
             std::make_exception_ptr(ProcessRaisedError(worker ? worker->slot : 0, static_cast<int>(pid),
                                                        item.text.substr(sizeof pid), name(worker, id))));
    } else {
      item.text.erase(0, sizeof pid);
      it->second.result = std::move(item);
      finish(id, it->second, nullptr);
    }
  }

  std::string name(const Worker* worker, std::int64_t id) const {
    auto it = tasks_by_id_.find(id);
    return fmt::format("nodal::Pool worker {} running task {} ({})", worker ? worker->slot : -1, id,
                       it == tasks_by_id_.end() ? std::string("?") : it->second.what);
  }

  void finish(std::int64_t id, Task& task, std::exception_ptr error) {
    task.finished = true;
    task.error = std::move(error);
    if (task.abandoned) tasks_by_id_.erase(id);
  }

  void fail_all(const std::exception_ptr& error) {
    backlog_.clear();
    std::vector<std::int64_t> ids;
    for (auto& [id, task] : tasks_by_id_) {
      if (!task.finished) ids.push_back(id);
    }
    for (std::int64_t id : ids) finish(id, tasks_by_id_.at(id), error);
  }

  void check_workers() {
    bool changed = false;
    for (std::size_t k = 0; k < workers_.size();) {
      Worker& worker = workers_[k];
      if (worker.process->is_alive()) {
        ++k;
        continue;
      }
      changed = true;
      retire(worker);
      workers_.erase(workers_.begin() + static_cast<std::ptrdiff_t>(k));
    }
    if (!changed) return;
    // Replace the workers that left while the pool is open, or after close() while tasks wait
    // for a worker (those a dead worker never took).
    while (!terminated_ && !broken_ && (!closed_ || !backlog_.empty()) && workers_.size() < processes_) {
      try {
        start_worker();
      } catch (...) {
        // No replacement (fork refused once the program runs threads, no memory, ...): the pool
        // cannot go on, and every pending task says why rather than waiting forever.
        try {
          throw Error(fmt::format("nodal::Pool: a worker died and could not be replaced: {}",
                                  describe_exception(std::current_exception())));
        } catch (...) {
          broken_ = std::current_exception();
        }
        fail_all(broken_);
        return;
      }
    }
  }

  /// A worker exited: takes its last results, gives the tasks it had not taken to the others
  /// (first in line, in order), and fails the one it had taken.
  void retire(Worker& worker) {
    drain();  // what it put before it exited
    std::vector<QueueItem> untaken;
    while (std::optional<QueueItem> item = worker.queue->try_get()) untaken.push_back(std::move(*item));
    for (auto it = untaken.rbegin(); it != untaken.rend(); ++it) {
      std::erase(worker.given, it->index);
      auto task = tasks_by_id_.find(it->index);
      if (task != tasks_by_id_.end() && !task->second.finished) backlog_.push_front(std::move(*it));
    }
    const int code = worker.process->exitcode().value_or(0);
    for (std::int64_t id : worker.given) {
      auto it = tasks_by_id_.find(id);
      if (it == tasks_by_id_.end() || it->second.finished) continue;
      const std::string who = name(&worker, id);
      finish(id, it->second,
             code == 0 ? std::make_exception_ptr(Error(who + ": the worker exited (code 0) before the task returned"))
                       : std::make_exception_ptr(ProcessExitedError(worker.slot, static_cast<int>(worker.pid),
                                                                    code > 0 ? code : 0, code < 0 ? -code : 0, who)));
    }
    try {
      worker.process->join();
    } catch (...) {
      // A worker's failure is reported through the task it held.
    }
    if (options_.start_method == StartMethod::forkserver) {
      discard_child_config(worker.pid);
    }
    // A queue whose worker exited by itself is whole and reusable; one killed may have died
    // between claiming a cell and releasing it (SIGKILL is not held back): it goes. Its result
    // queue goes in any case (drained above, as far as it can be).
    if (code == 0 && !worker.queue->closed()) {
      spare_queues_.push_back(worker.queue_name);
    } else {
      unlink(worker.queue_name);
    }
    unlink(worker.results_name);
  }

  static void unlink(const std::string& queue) noexcept {
    try {
      TensorQueue::unlink(queue);
    } catch (...) {
      // The arena's index is unusable (a process died holding it): the job is failing anyway.
    }
  }

  void start_worker() {
    const int slot = next_slot_++;
    const bool spare = !spare_queues_.empty();
    std::string queue_name = spare ? spare_queues_.back() : fmt::format("{}.tasks.{}", id_, slot);
    if (spare) spare_queues_.pop_back();
    // Slots are never reused, so a result queue is always new (no dead worker's cell in it).
    const std::string results = fmt::format("{}.results.{}", id_, slot);
    try {
      launch(slot, queue_name, results);
    } catch (...) {
      // A worker that did not start leaves no queue behind (a spare one goes back to the spares).
      unlink(results);
      if (spare) {
        spare_queues_.push_back(queue_name);
      } else {
        unlink(queue_name);
      }
      throw;
    }
  }

  /// Opens the worker's queues, starts it and adds it to workers_.
  void launch(int slot, const std::string& queue_name, const std::string& results) {
    TensorQueue queue = TensorQueue::open(queue_name, kDepth);
    TensorQueue result_queue = TensorQueue::open(results, kResultCapacity);
    ProcessOptions options{.start_method = options_.start_method, .name = fmt::format("PoolWorker-{}", slot)};
    std::unique_ptr<Process> process;
    if (options_.start_method == StartMethod::fork) {
      WorkerConfig config{queue_name, results, bell_name(), options_.initializer, options_.maxtasksperchild};
      process = std::make_unique<Process>([config] { worker_main(config); }, options);
      process->start();
    } else {
      process = std::make_unique<Process>(&forkserver_worker, options);
      process->start();
      QueueItem handoff;
      Writer writer(handoff);
      writer.put(static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(options_.initializer)));
      writer.put(static_cast<std::uint64_t>(options_.maxtasksperchild));
      writer.put(queue_name);
      writer.put(results);
      writer.put(bell_name());
      send_child_config(*process->pid(), std::move(handoff));
    }
    const pid_t pid = *process->pid();
    workers_.push_back(Worker{std::move(process), pid, slot, queue_name, queue, results, result_queue, {}, 0});
  }


  std::string bell_name() const { return id_ + ".bell"; }

  PoolOptions options_;
  std::string id_;
  ResultBell* bell_ = nullptr;
  std::size_t processes_ = 0;
  std::vector<Worker> workers_;
  std::vector<std::string> spare_queues_;
  std::deque<QueueItem> backlog_;
  std::unordered_map<std::int64_t, Task> tasks_by_id_;
  std::int64_t next_task_ = 0;
  int next_slot_ = 0;
  Clock::time_point next_check_{};
  bool closed_ = false;
  bool terminated_ = false;
  std::exception_ptr broken_;
};

QueueItem take(Core& core, std::int64_t task, std::optional<std::chrono::steady_clock::time_point> deadline) {
  return core.take(task, deadline);
}
bool done(Core& core, std::int64_t task) { return core.done(task); }
std::optional<std::int64_t> wait_any(Core& core, const std::vector<std::int64_t>& tasks,
                                     std::optional<std::chrono::steady_clock::time_point> deadline) {
  return core.wait_any(tasks, deadline);
}
void abandon(Core& core, const std::vector<std::int64_t>& tasks) noexcept { core.abandon(tasks); }
std::int64_t submit(Core& core, QueueItem task, std::string what) { return core.submit(std::move(task), std::move(what)); }

}  // namespace detail::pool

Pool::Pool(std::size_t processes, PoolOptions options)
    : core_(std::make_shared<detail::pool::Core>(processes, options)) {}

Pool& Pool::operator=(Pool&& other) noexcept {
  if (this != &other) {
    if (core_) core_->terminate();
    core_ = std::move(other.core_);
  }
  return *this;
}

Pool::~Pool() {
  if (core_) core_->terminate();
}

detail::pool::Core& Pool::core() {
  if (!core_) throw UsageError("nodal::Pool: moved-from pool");
  return *core_;
}

void Pool::close() { core().close(); }
void Pool::terminate() { core().terminate(); }
void Pool::join() { core().join(); }
std::vector<pid_t> Pool::pids() const { return core_ ? core_->pids() : std::vector<pid_t>{}; }

}  // namespace nodal

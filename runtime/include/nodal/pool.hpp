// nodal::Pool: a pool of worker processes running tasks, like Python's multiprocessing.Pool
// (torch.multiprocessing.Pool is the same class). Arguments and results travel through each
// worker's own two TensorQueues (tasks in, results out); tensors go by handle, never copied.
#pragma once

#include <nodal/errors.hpp>
#include <nodal/spawn.hpp>
#include <nodal/tensor.hpp>
#include <nodal/tensor_queue.hpp>

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace nodal {

struct PoolOptions {
  /// How workers are made: fork or forkserver. StartMethod::spawn is refused (UsageError): a
  /// re-executed worker would replay the program up to the pool, and task functions are passed
  /// as addresses, valid only in a fork of this program.
  StartMethod start_method = StartMethod::fork;
  /// Run once in each worker before its first task (Python's initializer). An exception from it
  /// breaks the pool: pending and later tasks fail with its ProcessRaisedError.
  void (*initializer)() = nullptr;
  /// A worker exits after this many tasks (a chunk of map counts as one) and is replaced; 0: never.
  std::size_t maxtasksperchild = 0;
};

namespace detail::pool {

template <class T>
struct is_tuple_like : std::false_type {};
template <class... Ts>
struct is_tuple_like<std::tuple<Ts...>> : std::true_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};

/// Appends values to a task or result item: trivially copyable values as bytes of `text`,
/// strings as a length and bytes, tensors as entries of `tensors` (by handle), pairs and tuples
/// element by element.
class Writer {
 public:
  explicit Writer(QueueItem& item) : item_(item) {}
  void bytes(const void* data, std::size_t size) { item_.text.append(static_cast<const char*>(data), size); }
  template <class T>
  void put(const T& value) {
    if constexpr (std::is_same_v<T, Tensor>) {
      item_.tensors.push_back(value);
    } else if constexpr (is_tuple_like<T>::value) {
      std::apply([this](const auto&... element) { (put(element), ...); }, value);
    } else if constexpr (std::is_same_v<T, std::string>) {
      const std::uint64_t size = value.size();
      bytes(&size, sizeof size);
      bytes(value.data(), value.size());
    } else {
      static_assert(std::is_trivially_copyable_v<T>,
                    "nodal::Pool: arguments and results are trivially copyable, std::string, nodal::Tensor, or "
                    "std::pair / std::tuple of those");
      bytes(&value, sizeof value);
    }
  }

 private:
  QueueItem& item_;
};

/// Reads back what a Writer wrote, in the same order. Throws nodal::Error on a short item.
class Reader {
 public:
  Reader(const QueueItem& item, std::size_t offset) : item_(item), offset_(offset) {}
  void bytes(void* data, std::size_t size);
  Tensor tensor();
  template <class T>
  T get() {
    if constexpr (std::is_same_v<T, Tensor>) {
      return tensor();
    } else if constexpr (is_tuple_like<T>::value) {
      return get_elements(static_cast<T*>(nullptr));
    } else if constexpr (std::is_same_v<T, std::string>) {
      std::uint64_t size = 0;
      bytes(&size, sizeof size);
      std::string value(size, '\0');
      bytes(value.data(), size);
      return value;
    } else {
      T value;
      bytes(&value, sizeof value);
      return value;
    }
  }

 private:
  // Braced initialisation reads the elements in order.
  template <class... Ts>
  std::tuple<Ts...> get_elements(std::tuple<Ts...>*) {
    return std::tuple<Ts...>{get<Ts>()...};
  }
  template <class A, class B>
  std::pair<A, B> get_elements(std::pair<A, B>*) {
    return std::pair<A, B>{get<A>(), get<B>()};
  }

  const QueueItem& item_;
  std::size_t offset_;
  std::size_t next_tensor_ = 0;
};

/// A task's header at the start of its item's text: which instantiation of run_chunk decodes
/// it, the user's function, and how many arguments follow.
struct TaskHeader {
  std::uint64_t runner;  ///< void (*)(std::uint64_t fn, Reader&, std::uint64_t count, Writer&)
  std::uint64_t fn;
  std::uint64_t count;
};

using Runner = void (*)(std::uint64_t fn, Reader& in, std::uint64_t count, Writer& out);

/// Runs fn on each of `count` arguments, writing the results. Instantiated in the parent, so its
/// address is the same in every worker (all are forks of this program).
template <class R, class A>
void run_chunk(std::uint64_t fn, Reader& in, std::uint64_t count, Writer& out) {
  auto* f = reinterpret_cast<R (*)(A)>(static_cast<std::uintptr_t>(fn));
  for (std::uint64_t k = 0; k < count; ++k) out.put<R>(f(in.get<std::decay_t<A>>()));
}

/// Python's starmap: fn(*arguments) for each tuple of arguments.
template <class R, class... Args>
void run_star_chunk(std::uint64_t fn, Reader& in, std::uint64_t count, Writer& out) {
  auto* f = reinterpret_cast<R (*)(Args...)>(static_cast<std::uintptr_t>(fn));
  for (std::uint64_t k = 0; k < count; ++k) out.put<R>(std::apply(f, in.get<std::tuple<std::decay_t<Args>...>>()));
}

template <class F>
std::uint64_t address(F* f) {
  return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(f));
}

/// A task item: the header, then `count` arguments.
template <class Arg>
QueueItem make_task(Runner runner, std::uint64_t fn, const Arg* args, std::size_t count) {
  QueueItem item;
  const TaskHeader header{address(runner), fn, count};
  Writer writer(item);
  writer.bytes(&header, sizeof header);
  for (std::size_t k = 0; k < count; ++k) writer.put(args[k]);
  return item;
}

/// The parent's side of a pool: workers, the task backlog, results not yet taken. Shared by the
/// Pool and the results it handed out. Internal; one thread at a time.
class Core;

/// A result item's values, from offset 0. Throws what the task threw, as ProcessRaisedError, or
/// ProcessExitedError when its worker died; TimeoutError when `deadline` passed first (the task
/// stays pending).
QueueItem take(Core& core, std::int64_t task, std::optional<std::chrono::steady_clock::time_point> deadline);
/// Whether the task's result (or failure) arrived; collects what is waiting first.
bool done(Core& core, std::int64_t task);
/// Waits for any of `tasks` to finish; returns it, or nullopt when `deadline` passed first.
std::optional<std::int64_t> wait_any(Core& core, const std::vector<std::int64_t>& tasks,
                                     std::optional<std::chrono::steady_clock::time_point> deadline);
/// The caller no longer wants these tasks' results: they are dropped when they come.
void abandon(Core& core, const std::vector<std::int64_t>& tasks) noexcept;
/// Queues a task; `what` names it in errors ("map inputs [0, 7)"). Returns its id. Throws
/// UsageError after close() or terminate(), the initializer's error once the pool is broken.
std::int64_t submit(Core& core, QueueItem task, std::string what);

inline std::optional<std::chrono::steady_clock::time_point> deadline_after(
    std::optional<std::chrono::nanoseconds> timeout) {
  if (!timeout) return std::nullopt;
  return std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(*timeout);
}

}  // namespace detail::pool

/// What Pool::apply_async returns (Python's AsyncResult): the result of one call, once it came.
template <class R>
class AsyncResult {
 public:
  AsyncResult(std::shared_ptr<detail::pool::Core> core, std::int64_t task) : core_(std::move(core)), task_(task) {}
  AsyncResult(AsyncResult&&) noexcept = default;
  AsyncResult& operator=(AsyncResult&& other) noexcept {
    if (this != &other) {
      release();
      core_ = std::move(other.core_);
      task_ = other.task_;
      value_ = std::move(other.value_);
      error_ = std::move(other.error_);
    }
    return *this;
  }
  ~AsyncResult() { release(); }

  /// The result, waiting at most `timeout` (none: as long as it takes). Throws TimeoutError when
  /// the timeout passed (get may be called again), ProcessRaisedError when the task threw (the
  /// worker's exception type, message and stack), ProcessExitedError when its worker died by a
  /// signal or exited; nodal::Error when the pool was terminated first. Every later call gives the
  /// same value or throws the same error.
  R get(std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
    collect(timeout);
    if (error_) std::rethrow_exception(error_);
    return *value_;
  }
  /// Waits at most `timeout` for the result; true once it is there (value or error).
  bool wait(std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
    try {
      collect(timeout);
    } catch (const TimeoutError&) {
      return false;
    }
    return true;
  }
  /// Whether the result is there, without waiting.
  bool ready() { return value_ || error_ || detail::pool::done(*core_, task_); }
  /// Whether the task returned a value. Throws UsageError before ready().
  bool successful() {
    if (!wait(std::chrono::nanoseconds(0))) throw UsageError("AsyncResult::successful: not ready");
    return value_.has_value();
  }

 private:
  /// The result is no longer wanted: dropped when it comes.
  void release() noexcept {
    if (core_ && !value_ && !error_) detail::pool::abandon(*core_, {task_});
  }

  void collect(std::optional<std::chrono::nanoseconds> timeout) {
    if (value_ || error_) return;
    QueueItem item;
    try {
      item = detail::pool::take(*core_, task_, detail::pool::deadline_after(timeout));
    } catch (const TimeoutError&) {
      throw;
    } catch (...) {
      error_ = std::current_exception();
      return;
    }
    detail::pool::Reader reader(item, 0);
    value_ = reader.get<R>();
  }

  std::shared_ptr<detail::pool::Core> core_;
  std::int64_t task_;
  std::optional<R> value_;
  std::exception_ptr error_;
};

/// What Pool::imap and Pool::imap_unordered return: the results, each as soon as it came (in
/// input order for imap, in completion order for imap_unordered). `next()` gives nullopt at the
/// end; a range-for works too. A task's failure is thrown by the next() that reaches it.
template <class R>
class ResultStream {
 public:
  ResultStream(std::shared_ptr<detail::pool::Core> core, std::vector<std::int64_t> tasks, bool ordered)
      : core_(std::move(core)), tasks_(tasks.begin(), tasks.end()), ordered_(ordered) {}
  ResultStream(ResultStream&&) noexcept = default;
  ResultStream& operator=(ResultStream&& other) noexcept {
    if (this != &other) {
      release();
      core_ = std::move(other.core_);
      tasks_ = std::move(other.tasks_);
      ordered_ = other.ordered_;
      buffer_ = std::move(other.buffer_);
    }
    return *this;
  }
  ~ResultStream() { release(); }

  /// The next result; nullopt once all came. Throws TimeoutError when `timeout` passed first
  /// (next may be called again), and what AsyncResult::get throws for a failed task.
  std::optional<R> next(std::optional<std::chrono::nanoseconds> timeout = std::nullopt) {
    if (buffer_.empty() && !tasks_.empty()) {
      const auto deadline = detail::pool::deadline_after(timeout);
      std::int64_t task = tasks_.front();
      if (!ordered_) {
        const auto any = detail::pool::wait_any(*core_, {tasks_.begin(), tasks_.end()}, deadline);
        if (!any) throw TimeoutError("Pool: timed out waiting for a result");
        task = *any;
      }
      QueueItem item;
      try {
        item = detail::pool::take(*core_, task, deadline);
      } catch (const TimeoutError&) {
        throw;
      } catch (...) {
        forget(task);  // a failed task is thrown once; next() goes on with the others
        throw;
      }
      forget(task);
      const std::uint64_t count = static_cast<std::uint64_t>(item.index);
      detail::pool::Reader reader(item, 0);
      for (std::uint64_t k = 0; k < count; ++k) buffer_.push_back(reader.get<R>());
    }
    if (buffer_.empty()) return std::nullopt;
    R value = std::move(buffer_.front());
    buffer_.pop_front();
    return value;
  }

  /// All the remaining results (`expected` of them, for the reservation), waiting as next() does.
  std::vector<R> collect(std::size_t expected) {
    std::vector<R> results;
    results.reserve(expected);
    while (std::optional<R> value = next()) results.push_back(std::move(*value));
    return results;
  }

  /// An input iterator over the remaining results (blocking as next() does).
  class iterator {
   public:
    using value_type = R;
    using difference_type = std::ptrdiff_t;
    explicit iterator(ResultStream* stream = nullptr) : stream_(stream) { advance(); }
    const R& operator*() const { return *current_; }
    iterator& operator++() {
      advance();
      return *this;
    }
    void operator++(int) { advance(); }
    bool operator==(const iterator& other) const { return stream_ == other.stream_; }

   private:
    void advance() {
      if (stream_ == nullptr) return;
      current_ = stream_->next();
      if (!current_) stream_ = nullptr;
    }
    ResultStream* stream_;
    std::optional<R> current_;
  };
  iterator begin() { return iterator(this); }
  iterator end() { return iterator(); }

 private:
  /// The remaining results are no longer wanted: dropped when they come.
  void release() noexcept {
    if (core_) detail::pool::abandon(*core_, {tasks_.begin(), tasks_.end()});
  }

  void forget(std::int64_t task) {
    if (tasks_.front() == task) {
      tasks_.pop_front();
    } else {
      tasks_.erase(std::find(tasks_.begin(), tasks_.end(), task));
    }
  }

  std::shared_ptr<detail::pool::Core> core_;
  std::deque<std::int64_t> tasks_;
  bool ordered_;
  std::deque<R> buffer_;
};

/// A pool of `processes` worker processes, like Python's multiprocessing.Pool:
///
///   std::int64_t square(std::int64_t x) { return x * x; }
///   nodal::Pool pool(4, {.start_method = nodal::StartMethod::forkserver});
///   std::vector<std::int64_t> squares = pool.map(&square, inputs);   // in input order
///   auto later = pool.apply_async(&square, std::int64_t{7});
///   later.get(std::chrono::seconds(5));                               // 49
///
/// Task functions are plain function pointers R (*)(A) (R (*)(A1, A2, ...) for starmap), each
/// argument and result trivially copyable, std::string, nodal::Tensor, or a std::pair/std::tuple
/// of those. A tensor travels by handle: a shared tensor (or a slice of one) arrives as the same
/// storage, so a task can write its output into a slice of one big tensor the caller holds; a
/// private tensor is moved into the arena once. Each worker is given a few tasks ahead (4); a
/// worker held up by a long task keeps those waiting (tasks are not taken back while it lives).
/// A task's exception comes back from get/map/next as
/// ProcessRaisedError naming the task, with the worker's type, message and stack (taken where the
/// worker caught it). A worker killed by a signal (or exiting) inside a task fails that task with
/// ProcessExitedError naming the task; the worker is replaced and the pool stays usable (Python's
/// Pool hangs there). terminate()'s SIGTERM is held back while a worker changes the arena; a
/// SIGKILL cannot be: one that lands while a worker starts (opening its queues by name, under the
/// arena's index lock) leaves the index unusable for the job (PeerFailure from then on). Results are collected by the thread waiting in map/get/next; a Pool and the
/// results it gave are for one thread at a time. The destructor terminates the pool, as Python's
/// `with Pool() as p:` does: call close() and join() first to let queued tasks finish.
class Pool {
 public:
  /// `processes` 0: the number of CPUs. Throws UsageError for StartMethod::spawn; what
  /// Process::start throws when a worker cannot start.
  explicit Pool(std::size_t processes = 0, PoolOptions options = {});
  Pool(Pool&&) noexcept = default;
  Pool& operator=(Pool&&) noexcept;
  ~Pool();

  /// fn applied to every input, results in input order; `chunksize` inputs go to a worker as one
  /// task. Throws the first failed chunk's error (in input order); UsageError after close().
  template <class R, class A>
  std::vector<R> map(R (*fn)(A), const std::vector<std::decay_t<A>>& inputs, std::size_t chunksize = 1) {
    return imap(fn, inputs, chunksize).collect(inputs.size());
  }

  /// Python's starmap: fn(a, b, ...) for each tuple (a, b, ...) of `inputs`, results in input order.
  template <class R, class... Args>
  std::vector<R> starmap(R (*fn)(Args...), const std::vector<std::tuple<std::decay_t<Args>...>>& inputs,
                         std::size_t chunksize = 1) {
    ResultStream<R> stream(core_,
                           submit_chunks(&detail::pool::run_star_chunk<R, Args...>, detail::pool::address(fn), inputs,
                                         chunksize),
                           /*ordered=*/true);
    return stream.collect(inputs.size());
  }

  /// Lazy map: the tasks are queued now, the results come one by one as they are ready.
  template <class R, class A>
  ResultStream<R> imap(R (*fn)(A), const std::vector<std::decay_t<A>>& inputs, std::size_t chunksize = 1) {
    return ResultStream<R>(
        core_, submit_chunks(&detail::pool::run_chunk<R, A>, detail::pool::address(fn), inputs, chunksize),
        /*ordered=*/true);
  }
  /// Like imap, results in the order they finish.
  template <class R, class A>
  ResultStream<R> imap_unordered(R (*fn)(A), const std::vector<std::decay_t<A>>& inputs, std::size_t chunksize = 1) {
    return ResultStream<R>(
        core_, submit_chunks(&detail::pool::run_chunk<R, A>, detail::pool::address(fn), inputs, chunksize),
        /*ordered=*/false);
  }

  /// fn(arg) in a worker; the result comes through the AsyncResult.
  template <class R, class A>
  AsyncResult<R> apply_async(R (*fn)(A), std::decay_t<A> arg) {
    return AsyncResult<R>(
        core_, detail::pool::submit(core(),
                                    detail::pool::make_task(&detail::pool::run_chunk<R, A>, detail::pool::address(fn),
                                                            &arg, 1),
                                    "apply_async"));
  }

  /// No more tasks (later submissions throw UsageError); the workers exit once the queued tasks
  /// are done. Idempotent.
  void close();
  /// Stops the workers now (SIGTERM) and reaps them; tasks not finished fail with nodal::Error.
  /// Idempotent.
  void terminate();
  /// After close() or terminate(): waits until every worker exited, collecting the results still
  /// coming. Throws UsageError while the pool is open.
  void join();
  /// The pids of the workers running now.
  std::vector<pid_t> pids() const;

 private:
  detail::pool::Core& core();

  template <class Arg>
  std::vector<std::int64_t> submit_chunks(detail::pool::Runner runner, std::uint64_t fn,
                                          const std::vector<Arg>& inputs, std::size_t chunksize) {
    if (chunksize == 0) chunksize = 1;
    std::vector<std::int64_t> tasks;
    try {
      for (std::size_t first = 0; first < inputs.size(); first += chunksize) {
        const std::size_t count = std::min(chunksize, inputs.size() - first);
        tasks.push_back(detail::pool::submit(core(), detail::pool::make_task(runner, fn, inputs.data() + first, count),
                                             "map inputs [" + std::to_string(first) + ", " +
                                                 std::to_string(first + count) + ")"));
      }
    } catch (...) {
      detail::pool::abandon(core(), tasks);
      throw;
    }
    return tasks;
  }

  std::shared_ptr<detail::pool::Core> core_;
};

}  // namespace nodal

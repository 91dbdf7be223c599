#include "progress.hpp"

#include <nodal/work.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>

namespace nodal::detail {

struct ProgressThread::Queue {
  struct Task {
    std::function<void()> call;
    std::shared_ptr<WorkState> work;
    cuda::Stream stream;
  };
  std::mutex mutex;
  std::condition_variable wake;  ///< the idle thread's sleep: not a nodal call, so no abort checks
  std::deque<Task> tasks;
  bool stop = false;      ///< the owner has gone: end once the queue is empty
  bool finished = false;  ///< the thread has run its last call
  std::atomic<std::uint64_t> pending{0};  ///< submitted and not yet finished
};

ProgressThread::ProgressThread() : queue_(std::make_shared<Queue>()) {
  std::thread thread([queue = queue_] { run_queue(queue); });
  id_ = thread.get_id();
  thread.detach();  // joined through the queue: see the destructor
}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard lock(queue_->mutex);
    queue_->stop = true;
  }
  queue_->wake.notify_all();
  // The thread ends once the queue is empty: wait for that unless this is the thread itself. It
  // holds its own reference to the queue, so it may outlive this object safely.
  if (on_this_thread()) return;
  std::unique_lock lock(queue_->mutex);
  queue_->wake.wait(lock, [&] { return queue_->finished; });
}

std::shared_ptr<WorkState> ProgressThread::submit(std::function<void()> call, std::string what) {
  auto work = std::make_shared<WorkState>();
  work->what = std::move(what);
  {
    std::lock_guard lock(queue_->mutex);
    queue_->tasks.push_back({std::move(call), work, cuda::current_stream()});
    queue_->pending.fetch_add(1, std::memory_order_relaxed);
  }
  queue_->wake.notify_all();
  return work;
}

void ProgressThread::run_queue(std::shared_ptr<Queue> queue) {
  for (;;) {
    Queue::Task task;
    {
      std::unique_lock lock(queue->mutex);
      queue->wake.wait(lock, [&] { return !queue->tasks.empty() || queue->stop; });
      if (queue->tasks.empty()) break;  // stopped, and nothing left
      task = std::move(queue->tasks.front());
      queue->tasks.pop_front();
    }
    cuda::set_current_stream(task.stream);
    try {
      task.call();
    } catch (...) {
      task.work->error = std::current_exception();
    }
    // The call's closure goes first: it may hold the last reference to the communicator, whose
    // destruction then runs ~ProgressThread here (which returns at once on this thread).
    task.call = nullptr;
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard lock(task.work->mutex);
      task.work->done.store(true, std::memory_order_release);
      callbacks.swap(task.work->callbacks);
    }
    notify(task.work->word);
    for (auto& callback : callbacks) {
      try {
        callback();
      } catch (...) {  // documented: dropped
      }
    }
    callbacks.clear();
    queue->pending.fetch_sub(1, std::memory_order_release);
  }
  // Tell a destructor waiting on another thread that the thread is done with everything but its
  // own reference to the queue (released when this function returns, after the notify).
  {
    std::lock_guard lock(queue->mutex);
    queue->finished = true;
  }
  queue->wake.notify_all();
}

bool ProgressThread::idle() const noexcept { return queue_->pending.load(std::memory_order_acquire) == 0; }

void wait_work(WorkState& work, std::optional<std::chrono::nanoseconds> timeout) {
  wait_until(work.word, [&] { return work.done.load(std::memory_order_acquire); }, Deadline::after(timeout),
             work.what);
  if (work.error) std::rethrow_exception(work.error);
}

}  // namespace nodal::detail

namespace nodal {

bool Work::is_completed() const noexcept { return !state_ || state_->done.load(std::memory_order_acquire); }

bool Work::test() {
  if (!is_completed()) return false;
  if (state_ && state_->error) std::rethrow_exception(state_->error);
  return true;
}

void Work::on_completion(std::function<void()> callback) {
  if (state_) {
    std::unique_lock lock(state_->mutex);
    if (!state_->done.load(std::memory_order_acquire)) {
      state_->callbacks.push_back(std::move(callback));
      return;
    }
  }
  callback();
}

void Work::wait(std::optional<std::chrono::milliseconds> timeout) {
  if (!state_) return;
  detail::wait_work(*state_, timeout ? std::optional<std::chrono::nanoseconds>(*timeout) : std::nullopt);
}

}  // namespace nodal

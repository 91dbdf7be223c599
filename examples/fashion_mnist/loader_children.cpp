#include "loader_children.hpp"

#include <nodal/context.hpp>
#include <nodal/spawn.hpp>

namespace fashion_mnist {
namespace {

/// The children's task. A forkserver child is a fork of the server, which is a fork of this
/// process made after the task was stored: a global is how it gets there (Python's forkserver
/// pickles the arguments instead).
LoaderTask g_task;

void loader_child(int slot) {
  LoaderTask task = g_task;
  task.slot = slot;
  if (slot != 0) task.fail_at = -1;
  run_loader(task);
}

}  // namespace

LoaderChildren::LoaderChildren(const LoaderTask& task)
    : trainer_(task.trainer), loaders_(task.loaders), prefetch_(task.prefetch) {
  g_task = task;
  // The children must map the job's arena, where the queues are: a singleton (no nodalrun) makes
  // its arena on first use, so make it now, or the server's children would each make their own.
  nodal::init().arena();
  nodal::start_forkserver();
  thread_ = std::thread([this] {
    try {
      nodal::spawn(&loader_child, loaders_, {.start_method = nodal::StartMethod::forkserver});
    } catch (...) {
      {
        std::lock_guard lock(mutex_);
        failure_ = std::current_exception();
      }
      close_queues();
    }
  });
}

LoaderChildren::~LoaderChildren() {
  if (!thread_.joinable()) return;
  close_queues();
  thread_.join();
}

void LoaderChildren::rethrow_failure() {
  std::lock_guard lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
}

void LoaderChildren::join() {
  thread_.join();
  rethrow_failure();
}

void LoaderChildren::close_queues() const {
  for (int slot = 0; slot < loaders_; ++slot) {
    nodal::TensorQueue::open(queue_name(trainer_, slot), queue_capacity(prefetch_)).close();
  }
}

}  // namespace fashion_mnist

#include "p2p_lanes.hpp"

namespace nodal::torch_backend {

P2PLanes::~P2PLanes() {
  for (auto& [key, lane] : lanes_) {
    {
      std::lock_guard lock(lane->mutex);
      lane->stopping = true;
    }
    lane->posted.notify_one();
  }
  for (auto& [key, lane] : lanes_) {
    if (lane->thread.joinable()) lane->thread.join();
    lane->finished.clear();
  }
}

c10::intrusive_ptr<c10d::Work> P2PLanes::post(Direction direction, int peer, c10d::OpType op, const char* call,
                                              std::function<void()> body, std::vector<at::Tensor> outputs) {
  auto work = c10::make_intrusive<TensorListWork>(rank_, op, std::move(outputs));
  std::vector<Task> finished;  // every lane's, released here on the caller's thread, after the locks
  std::lock_guard lanes_lock(lanes_mutex_);
  std::unique_ptr<Lane>& slot = lanes_[{direction, peer}];
  if (!slot) slot = std::make_unique<Lane>();
  Lane& lane = *slot;
  for (auto& [key, other] : lanes_) {
    std::lock_guard lock(other->mutex);
    for (Task& task : other->finished) finished.push_back(std::move(task));
    other->finished.clear();
  }
  {
    std::lock_guard lock(lane.mutex);
    if (!lane.thread.joinable()) lane.thread = std::thread([&lane] { serve(lane); });
    lane.tasks.push_back(Task{std::move(body), work, call});
  }
  lane.posted.notify_one();
  return work;
}

void P2PLanes::serve(Lane& lane) {
  for (;;) {
    Task task;
    {
      std::unique_lock lock(lane.mutex);
      lane.posted.wait(lock, [&] { return lane.stopping || !lane.tasks.empty(); });
      if (lane.tasks.empty()) return;  // stopping, and everything posted has run
      task = std::move(lane.tasks.front());
      lane.tasks.pop_front();
    }
    std::exception_ptr error;
    try {
      task.body();
    } catch (...) {
      error = torch_error(std::current_exception(), task.call);
    }
    task.work->complete(error);
    std::lock_guard lock(lane.mutex);
    lane.finished.push_back(std::move(task));  // its tensors and Work: see p2p_lanes.hpp
  }
}

}  // namespace nodal::torch_backend

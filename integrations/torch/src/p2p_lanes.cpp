#include "p2p_lanes.hpp"

namespace nodal::torch_backend {

P2PLanes::~P2PLanes() {
  for (Lane& lane : lanes_) {
    {
      std::lock_guard lock(lane.mutex);
      lane.stopping = true;
    }
    lane.posted.notify_one();
    if (lane.thread.joinable()) lane.thread.join();
    lane.finished.clear();
  }
}

c10::intrusive_ptr<c10d::Work> P2PLanes::post(Direction direction, c10d::OpType op, const char* call,
                                              std::function<void()> body, std::vector<at::Tensor> outputs) {
  Lane& lane = lanes_[direction == Direction::send ? 0 : 1];
  auto work = c10::make_intrusive<TensorListWork>(rank_, op, std::move(outputs));
  std::vector<Task> finished;  // released here, on the caller's thread, after the lock
  {
    std::lock_guard lock(lane.mutex);
    if (!lane.thread.joinable()) lane.thread = std::thread([&lane] { serve(lane); });
    lane.tasks.push_back(Task{std::move(body), work, call});
    finished.swap(lane.finished);
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

// torch's isend and irecv return at once and complete later; gloo's do. nodal's send is a
// rendezvous (Communicator::send), so run on the caller's thread, two ranks that isend to each
// other before they recv (batch_isend_irecv around a ring, say) would wait forever. So the
// process group runs each send and receive on a lane: a thread of its own per direction and
// peer (started by the first call that needs it), which takes that direction's calls with that
// peer in the order they were posted; the call's Work completes when the message has gone or
// come. A lane per direction and peer, as gloo's transfers are independent: a receive posted
// before a send must not hold the send back, nor a send that rank 1 has not received yet a send
// to rank 2 (which rank 1 may be waiting on). Communicator::send allows exactly this: one thread
// per peer and direction at a time.
// A lane thread never drops the last reference to a tensor or a Work: one that Python let go
// of would then take the GIL to free its PyObject, and the caller's thread may hold the GIL
// while it waits for the lane (destroying the group joins the lanes). Finished tasks go to
// `finished`, emptied on the caller's thread (the next post, or the destructor). Internal.
#pragma once

#include "work.hpp"

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace nodal::torch_backend {

class P2PLanes {
 public:
  explicit P2PLanes(int rank) : rank_(rank) {}
  /// Waits for what was posted to run (a send nobody receives keeps it waiting, as it keeps the
  /// job waiting: nodalrun's --stall-timeout names it), then ends the lanes.
  ~P2PLanes();
  P2PLanes(const P2PLanes&) = delete;
  P2PLanes& operator=(const P2PLanes&) = delete;

  enum class Direction { send, recv };
  /// Queues `body` on the lane of `direction` with `peer` and returns its Work at once: it
  /// completes with `outputs` once body has run, or with body's error as torch_error words it for
  /// `call`.
  c10::intrusive_ptr<c10d::Work> post(Direction direction, int peer, c10d::OpType op, const char* call,
                                      std::function<void()> body, std::vector<at::Tensor> outputs);

 private:
  struct Task {
    std::function<void()> body;
    c10::intrusive_ptr<TensorListWork> work;
    const char* call;
  };
  struct Lane {
    std::mutex mutex;
    std::condition_variable posted;
    std::deque<Task> tasks;
    std::vector<Task> finished;  ///< run and completed; released by the caller's thread
    bool stopping = false;
    std::thread thread;
  };
  static void serve(Lane& lane);

  int rank_;
  std::mutex lanes_mutex_;  ///< guards the map, not the lanes (each has its own mutex)
  std::map<std::pair<Direction, int>, std::unique_ptr<Lane>> lanes_;
};

}  // namespace nodal::torch_backend

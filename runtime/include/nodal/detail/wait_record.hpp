// A rank's side of the wait table (wait_table.hpp): every public blocking call opens a
// BlockingCall; when one of its waits lasts long enough to sleep (Waiter, wait.hpp), the call is
// described into the thread's entry of the rank's row, kept up to date while it sleeps, and
// cleared when the call returns. Internal.
//
// Cost on the fast path, where a call never sleeps: two thread-local stores and one store to the
// rank's own line of the table (its heartbeat). The description (a few hundred nanoseconds of
// formatting) is made only after the waiter has spun for ~50 us, when it goes to sleep.
#pragma once

#include <nodal/detail/wait_table.hpp>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace nodal::detail {

/// Writes what the blocking call is (`what`: "allreduce #12 on communicator 'world' (256 f32,
/// sum)") and what it waits for right now (`waiting_for`: "ranks 1, 3 to make this call").
/// Called by the waiting thread itself, on the slow path only.
using DescribeCall = void (*)(const void* context, std::string& what, std::string& waiting_for);

class BlockingCall;
/// The innermost BlockingCall open on this thread (initial-exec: one instruction to reach).
extern constinit thread_local BlockingCall* t_blocking_call __attribute__((tls_model("initial-exec")));
/// This process's heartbeat in the wait table (nullptr when the job has no table).
extern std::atomic<std::uint64_t>* g_wait_heartbeat;

/// Marks a public blocking call for the wait table, from its start to its return. `context` must
/// outlive the call (it is what `describe` reads).
class BlockingCall {
 public:
  BlockingCall(DescribeCall describe, const void* context) noexcept
      : describe_(describe), context_(context), outer_(t_blocking_call) {
    t_blocking_call = this;
  }
  ~BlockingCall() {
    t_blocking_call = outer_;
    if (entry_) release();
    if (std::atomic<std::uint64_t>* beat = g_wait_heartbeat) {
      beat->store(beat->load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
  }
  BlockingCall(const BlockingCall&) = delete;
  BlockingCall& operator=(const BlockingCall&) = delete;

 private:
  friend WaitEntry* begin_waiting(std::string_view) noexcept;
  friend void refresh_waiting(WaitEntry*, std::string_view) noexcept;
  friend void end_waiting(WaitEntry*) noexcept;
  void release() noexcept;

  DescribeCall describe_;
  const void* context_;
  BlockingCall* outer_;
  WaitEntry* entry_ = nullptr;  ///< this thread's entry, once the call first slept
};

/// The name of a shared object (queue, lock, event, barrier) kept in its shared state, so the
/// wait table can name it in any process; cut to 63 bytes.
struct ObjectName {
  explicit ObjectName(std::string_view name) noexcept;
  char text[64];
};

/// Binds this process to row `rank` of its job arena's wait table (nodal::init); no-op without
/// a table. unbind: a child of nodal::spawn is not its parent's rank, and writes no row.
void bind_wait_record(int rank) noexcept;
void unbind_wait_record() noexcept;

// The Waiter's side (wait.cpp). `what` names the wait when no BlockingCall is open.
/// The calling thread goes to sleep in a wait: its entry (claimed now, or its call's) shows the
/// call as waiting. nullptr when the job has no table or the rank's entries are all taken.
WaitEntry* begin_waiting(std::string_view what) noexcept;
/// Still waiting: what it waits for is described again, and a stack request from nodalrun
/// (ArenaControl::stack_request) is answered with this thread's stack on the control channel.
void refresh_waiting(WaitEntry* entry, std::string_view what) noexcept;
/// The wait is over: the entry shows its call as working (in_call), or is freed when no call
/// owns it.
void end_waiting(WaitEntry* entry) noexcept;

}  // namespace nodal::detail

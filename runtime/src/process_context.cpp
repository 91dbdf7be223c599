// nodal::ProcessContext: torch's first-failure join over the children of one spawn call.
#include <nodal/process_context.hpp>

#include "child_group.hpp"

#include <signal.h>

#include <algorithm>
#include <exception>
#include <utility>

namespace nodal {

using Clock = std::chrono::steady_clock;

struct ProcessContext::State {
  std::unique_ptr<detail::ChildGroup> children;
  std::chrono::milliseconds grace;
  std::exception_ptr failure;                ///< the first child's failure: what join throws
  std::optional<Clock::time_point> kill_at;  ///< after a failure: when SIGTERM turns to SIGKILL
};

ProcessContext detail::make_process_context(std::unique_ptr<ChildGroup> children, std::chrono::milliseconds grace) {
  return ProcessContext(std::make_unique<ProcessContext::State>(
      ProcessContext::State{std::move(children), std::max(grace, std::chrono::milliseconds(0)), nullptr, {}}));
}

ProcessContext::ProcessContext() noexcept = default;
ProcessContext::ProcessContext(std::unique_ptr<State> state) noexcept : state_(std::move(state)) {}
ProcessContext::ProcessContext(ProcessContext&& other) noexcept = default;
ProcessContext& ProcessContext::operator=(ProcessContext&& other) noexcept = default;
ProcessContext::~ProcessContext() = default;  // ChildGroup's destructor kills and reaps

bool ProcessContext::join(std::optional<std::chrono::milliseconds> timeout) {
  if (!state_ || !state_->children) return true;
  State& state = *state_;
  detail::ChildGroup& children = *state.children;
  std::optional<Clock::time_point> deadline;
  if (timeout) deadline = Clock::now() + std::max(*timeout, std::chrono::milliseconds(0));

  std::vector<detail::ChildEvent> events;
  while (children.running() > 0) {
    // Once a child failed, the others are being stopped: wait for them whatever the timeout.
    events.clear();
    children.wait(state.failure ? state.kill_at : deadline, events);
    const auto now = Clock::now();
    if (state.kill_at && now >= *state.kill_at) {
      children.signal_all(SIGKILL);
      state.kill_at.reset();
    }
    for (const detail::ChildEvent& event : events) {
      if (state.failure) break;
      if (std::exception_ptr failure = detail::failure_of(event)) {
        state.failure = failure;
        children.signal_all(SIGTERM);
        state.kill_at = now + state.grace;
      }
    }
    if (!state.failure && deadline && now >= *deadline && children.running() > 0) return false;
  }
  if (state.failure) std::rethrow_exception(state.failure);
  return true;
}

std::vector<pid_t> ProcessContext::pids() const {
  if (!state_ || !state_->children) return {};
  return state_->children->pids();
}

}  // namespace nodal

#include <nodal/detail/child_config.hpp>

#include <nodal/errors.hpp>

#include <unistd.h>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

std::string config_queue_name(pid_t child) { return fmt::format("nodal.child-config.{}", child); }
TensorQueue config_queue(pid_t child) { return TensorQueue::open(config_queue_name(child), 1); }

}  // namespace

void send_child_config(pid_t child, QueueItem config) { config_queue(child).put(std::move(config)); }

QueueItem receive_child_config(const char* who, std::chrono::milliseconds timeout) {
  std::optional<QueueItem> item = config_queue(::getpid()).get(timeout);
  if (!item) {
    throw Error(fmt::format("{}: no configuration from the parent within {} ms", who, timeout.count()));
  }
  return std::move(*item);
}

void discard_child_config(pid_t child) noexcept {
  try {
    TensorQueue::unlink(config_queue_name(child));
  } catch (...) {
  }
}

}  // namespace nodal::detail

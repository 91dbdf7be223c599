#include <nodal/detail/child_config.hpp>

#include <nodal/errors.hpp>

#include <unistd.h>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

TensorQueue config_queue(pid_t child) { return TensorQueue::open(fmt::format("nodal.child-config.{}", child), 1); }

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
    config_queue(child).try_get();
  } catch (...) {
  }
}

}  // namespace nodal::detail

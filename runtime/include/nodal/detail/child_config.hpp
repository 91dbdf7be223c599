// How a child started by the fork server gets its configuration. Its target is a plain function
// pointer, which carries none (the server forked before the configuration existed), so the
// parent puts one item on a queue named for the child's pid, and the child takes it first
// thing. Used by nodal::Pool's and nodal::data::DataLoader's forkserver workers. Internal.
#pragma once

#include <nodal/tensor_queue.hpp>

#include <sys/types.h>

#include <chrono>

namespace nodal::detail {

/// In the parent, once the child started: its configuration. Throws what TensorQueue::put throws.
void send_child_config(pid_t child, QueueItem config);

/// In the child: the item its parent sent. Throws nodal::Error naming `who` when none came
/// within `timeout`.
QueueItem receive_child_config(const char* who, std::chrono::milliseconds timeout = std::chrono::seconds(60));

/// In the parent, after the child exited: removes its queue (and a configuration it never took,
/// which a later process with the same pid must not read). Throws nothing.
void discard_child_config(pid_t child) noexcept;

}  // namespace nodal::detail

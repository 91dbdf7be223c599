// The job's file-descriptor broker, internal: lets a rank hand a descriptor (a GPU pool chunk's
// VMM POSIX fd) to any other rank of the job, even after it has exited. nodalrun keeps a duplicate
// of every published descriptor until the job ends; requests and replies carry descriptors with
// SCM_RIGHTS over the control socket (the request brings a one-shot reply socket, because the
// ranks share one end of the control socket).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace nodal::detail {

/// Publishes `fd` (not consumed: the caller keeps its own) under (this rank, key). Under nodalrun
/// the supervisor keeps a duplicate; in a singleton the process keeps one itself. Publishing a key
/// twice replaces nothing: the first descriptor stays. Throws std::system_error.
void publish_fd(std::uint64_t key, int fd);

/// A new descriptor (owned by the caller) for what rank `owner` published under `key`. Waits
/// until it is published (the owner may not have got there yet), through the runtime's waiting
/// rules. Throws PeerFailure when the job fails first, TimeoutError after `timeout`, UsageError
/// when there is no broker to ask (a process started by nodal::spawn outside nodalrun asking
/// for another rank's descriptor).
int fetch_fd(int owner, std::uint64_t key, std::optional<std::chrono::nanoseconds> timeout = std::nullopt);

}  // namespace nodal::detail

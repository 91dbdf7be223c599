// nodalrun's half of the job's fd broker (runtime/include/nodal/detail/fd_broker.hpp): holds a
// duplicate of every descriptor a rank publishes until the job ends, so that any rank can fetch
// it, even after its publisher exited, and answers fetches on the reply socket each brings.
#pragma once

#include <nodal/detail/control.hpp>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace nodal::launcher {

/// Never blocks the event loop: reply sockets are non-blocking, and a reply that does not fit is
/// dropped with its socket closed (the requester reads end-of-file). Whatever is left when the
/// registry goes (parked requests, published descriptors) is closed with it.
class FdRegistry {
 public:
  explicit FdRegistry(int world_size) : world_size_(world_size) {}

  /// Keeps `fd` as what `rank` published under `key`, and answers the requests parked on it.
  /// A key published twice keeps its first descriptor.
  void publish(int rank, std::uint64_t key, detail::OwnedFd fd);
  /// Answers on `reply`: the descriptor `owner` published under `key`, or why there is none (an
  /// owner outside the job, or one that exited without publishing it); a request for what is
  /// not published yet waits here until it is.
  void fetch(int owner, std::uint64_t key, detail::OwnedFd reply);
  /// `rank` has exited: what it has not published by now never will be, and the requests
  /// parked on it get that answer.
  void rank_exited(int rank);

  /// Requests waiting for a publication (for tests).
  std::size_t parked() const noexcept { return parked_.size(); }

 private:
  using Key = std::pair<int, std::uint64_t>;
  int world_size_;
  std::map<Key, detail::OwnedFd> published_;
  std::multimap<Key, detail::OwnedFd> parked_;
  std::set<int> exited_;
};

}  // namespace nodal::launcher

#include "fd_registry.hpp"

#include <fcntl.h>

#include <fmt/format.h>

namespace nodal::launcher {
namespace {

using detail::ControlKind;
using detail::OwnedFd;

/// Sends the answer and closes the reply socket. `fd` (-1: none, then `error` says why) is not
/// consumed. Non-blocking: a requester that cannot take the answer gets end-of-file instead.
void answer(OwnedFd reply, int fd, const std::string& error) {
  int flags = ::fcntl(reply.get(), F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) == 0) ::fcntl(reply.get(), F_SETFL, flags | O_NONBLOCK);
  detail::send_control(reply.get(), {ControlKind::fd_reply, -1, -1, error, 0, {}}, fd);
}

std::string never_published(int rank, std::uint64_t key) {
  return fmt::format("rank {} exited without publishing key {}", rank, key);
}

}  // namespace

void FdRegistry::publish(int rank, std::uint64_t key, OwnedFd fd) {
  if (rank < 0 || rank >= world_size_) return;  // not one of our ranks: dropped (and closed)
  auto [slot, added] = published_.try_emplace({rank, key}, std::move(fd));
  if (!added) return;
  auto [first, last] = parked_.equal_range({rank, key});
  for (auto it = first; it != last; ++it) answer(std::move(it->second), slot->second.get(), {});
  parked_.erase(first, last);
}

void FdRegistry::fetch(int owner, std::uint64_t key, OwnedFd reply) {
  if (owner < 0 || owner >= world_size_) {
    return answer(std::move(reply), -1, fmt::format("there is no rank {} in a job of {} ranks", owner, world_size_));
  }
  if (auto it = published_.find({owner, key}); it != published_.end()) {
    return answer(std::move(reply), it->second.get(), {});
  }
  if (exited_.count(owner)) {
    return answer(std::move(reply), -1, never_published(owner, key));
  }
  parked_.emplace(Key{owner, key}, std::move(reply));
}

void FdRegistry::rank_exited(int rank) {
  exited_.insert(rank);
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->first.first != rank) {
      ++it;
      continue;
    }
    answer(std::move(it->second), -1, never_published(rank, it->first.second));
    it = parked_.erase(it);
  }
}

}  // namespace nodal::launcher

#include "free_port.hpp"

#include <nodal/detail/posix.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace nodal::launcher {

int free_port(PortScope scope) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) detail::throw_errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(scope == PortScope::loopback ? INADDR_LOOPBACK : INADDR_ANY);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    ::close(fd);
    detail::throw_errno(scope == PortScope::loopback ? "bind(127.0.0.1:0)" : "bind(0.0.0.0:0)");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace nodal::launcher

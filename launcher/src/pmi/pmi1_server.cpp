#include "pmi1_server.hpp"

#include <nodal/detail/posix.hpp>

#include <sys/socket.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

namespace nodal::launcher {
namespace {

/// What the server announces (Hydra's values; MPICH's client splits longer values itself).
constexpr int kKvsnameMax = 256;
constexpr int kKeylenMax = 64;
constexpr int kVallenMax = 1024;
/// A line longer than this is not PMI-1 (values are at most kVallenMax).
constexpr std::size_t kLineMax = 64 * 1024;

/// A command line's attributes: "cmd=put kvsname=k key=a value=b" -> {cmd: put, kvsname: k, ...}.
/// An abort's message (MPICH: message=, Flux's client: error_msg=) is the rest of the line.
std::map<std::string, std::string> parse(const std::string& line) {
  std::map<std::string, std::string> attributes;
  std::size_t at = 0;
  while (at < line.size()) {
    while (at < line.size() && line[at] == ' ') ++at;
    if (at >= line.size()) break;
    const std::size_t equals = line.find('=', at);
    std::size_t end = line.find(' ', at);
    if (end == std::string::npos) end = line.size();
    if (equals == std::string::npos || equals > end) {
      attributes.emplace(line.substr(at, end - at), "");
      at = end;
      continue;
    }
    const std::string key = line.substr(at, equals - at);
    if (key == "message" || key == "error_msg") end = line.size();
    attributes.emplace(key, line.substr(equals + 1, end - equals - 1));
    at = end;
  }
  return attributes;
}

std::string value_of(const std::map<std::string, std::string>& attributes, const std::string& key) {
  auto it = attributes.find(key);
  return it == attributes.end() ? std::string() : it->second;
}

}  // namespace

Pmi1Server::Pmi1Server(std::string kvsname, int size)
    : kvsname_(std::move(kvsname)), size_(size), pending_(size), in_barrier_(size, false) {
  for (int rank = 0; rank < size; ++rank) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0) {
      for (int fd : server_fds_) ::close(fd);
      for (int fd : client_fds_) ::close(fd);
      detail::throw_errno("socketpair (PMI-1)");
    }
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    server_fds_.push_back(fds[0]);
    client_fds_.push_back(fds[1]);
  }
  // Every rank's place: one node holding all of them (MPICH's "vector" mapping: starting at node
  // 0, 1 node, size ranks on it), so MPICH's shared-memory paths see them as neighbours.
  kvs_["PMI_process_mapping"] = fmt::format("(vector,(0,1,{}))", size);
}

Pmi1Server::~Pmi1Server() {
  for (int fd : server_fds_) {
    if (fd >= 0) ::close(fd);
  }
  close_client_ends();
}

std::vector<std::string> Pmi1Server::environment(int rank) const {
  return {fmt::format("PMI_FD={}", client_fds_[rank]), fmt::format("PMI_RANK={}", rank),
          fmt::format("PMI_SIZE={}", size_)};
}

void Pmi1Server::close_client_ends() {
  for (int& fd : client_fds_) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

std::vector<MpiEvent> Pmi1Server::on_readable(int rank) {
  std::vector<MpiEvent> events;
  int& fd = server_fds_[rank];
  if (fd < 0) return events;
  char buffer[16 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {  // end of file, or the connection broke: the rank is gone or done with PMI
      ::close(fd);
      fd = -1;
      break;
    }
    std::string& pending = pending_[rank];
    pending.append(buffer, static_cast<std::size_t>(n));
    std::size_t newline;
    while (fd >= 0 && (newline = pending.find('\n')) != std::string::npos) {
      const std::string line = pending.substr(0, newline);
      pending.erase(0, newline + 1);
      handle(rank, line, events);
    }
    if (pending.size() > kLineMax) {
      events.push_back({MpiEvent::Kind::protocol, rank, 0,
                        fmt::format("sent a PMI-1 line longer than {} bytes", kLineMax)});
      pending.clear();
    }
  }
  return events;
}

void Pmi1Server::reply(int rank, const std::string& line) {
  const int fd = server_fds_[rank];
  if (fd < 0) return;
  // Answers are short and the rank waits for each one: a full socket buffer means a rank that
  // stopped reading, whose exit the supervisor will see; a failed write only loses its answer.
  detail::write_all(fd, line + "\n");
}

void Pmi1Server::handle(int rank, const std::string& line, std::vector<MpiEvent>& events) {
  const std::map<std::string, std::string> attributes = parse(line);
  const std::string cmd = value_of(attributes, "cmd");
  if (cmd.empty()) {
    // PMI-1's spawn is "mcmd=spawn" and several lines; PMI-2 frames its commands with a length.
    events.push_back({MpiEvent::Kind::protocol, rank, 0,
                      fmt::format("sent \"{}\", which nodalrun's PMI-1 server does not serve (no spawn, no PMI-2)",
                                  line.substr(0, 80))});
    return;
  }
  if (cmd == "init") {
    if (value_of(attributes, "pmi_version") != "1") {
      events.push_back({MpiEvent::Kind::protocol, rank, 0,
                        fmt::format("asked for PMI version {}; nodalrun serves PMI-1 (--mpi pmi1) and PMIx (--mpi pmix)",
                                    value_of(attributes, "pmi_version"))});
      reply(rank, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1");
      return;
    }
    events.push_back({MpiEvent::Kind::init, rank, 0, {}});
    reply(rank, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0");
  } else if (cmd == "get_maxes") {
    reply(rank, fmt::format("cmd=maxes kvsname_max={} keylen_max={} vallen_max={}", kKvsnameMax, kKeylenMax,
                            kVallenMax));
  } else if (cmd == "get_appnum") {
    reply(rank, "cmd=appnum appnum=0");
  } else if (cmd == "get_universe_size") {
    reply(rank, fmt::format("cmd=universe_size size={} rc=0", size_));
  } else if (cmd == "get_my_kvsname") {
    reply(rank, fmt::format("cmd=my_kvsname kvsname={}", kvsname_));
  } else if (cmd == "put") {
    kvs_[value_of(attributes, "key")] = value_of(attributes, "value");
    reply(rank, "cmd=put_result rc=0 msg=success");
  } else if (cmd == "get") {
    const std::string key = value_of(attributes, "key");
    const std::string kvsname = value_of(attributes, "kvsname");
    auto it = kvs_.find(key);
    if (!kvsname.empty() && kvsname != kvsname_) {
      reply(rank, fmt::format("cmd=get_result rc=-1 msg=kvs_{}_not_found value=unknown", kvsname));
    } else if (it == kvs_.end()) {
      reply(rank, fmt::format("cmd=get_result rc=-1 msg=key_{}_not_found value=unknown", key));
    } else {
      reply(rank, fmt::format("cmd=get_result rc=0 msg=success value={}", it->second));
    }
  } else if (cmd == "barrier_in") {
    if (!in_barrier_[rank]) {
      in_barrier_[rank] = true;
      ++barrier_count_;
    }
    if (barrier_count_ == size_) {  // the fence: every put before it is visible to every get after
      barrier_count_ = 0;
      for (int r = 0; r < size_; ++r) {
        in_barrier_[r] = false;
        reply(r, "cmd=barrier_out");
      }
    }
  } else if (cmd == "finalize") {
    events.push_back({MpiEvent::Kind::finalize, rank, 0, {}});
    reply(rank, "cmd=finalize_ack");
  } else if (cmd == "abort") {
    const std::string code = value_of(attributes, "exitcode");
    std::string message = value_of(attributes, "message");
    if (message.empty()) message = value_of(attributes, "error_msg");
    int exit_code = 1;
    try {
      exit_code = code.empty() ? 1 : std::stoi(code);
    } catch (const std::exception&) {
    }
    events.push_back({MpiEvent::Kind::abort, rank, exit_code, message});
  } else if (cmd == "publish_name") {
    const std::string service = value_of(attributes, "service");
    const bool fresh = published_.emplace(service, value_of(attributes, "port")).second;
    reply(rank, fresh ? "cmd=publish_result rc=0 msg=success"
                      : fmt::format("cmd=publish_result rc=-1 msg=service_{}_already_published", service));
  } else if (cmd == "unpublish_name") {
    const std::string service = value_of(attributes, "service");
    reply(rank, published_.erase(service) > 0
                    ? "cmd=unpublish_result rc=0 msg=success"
                    : fmt::format("cmd=unpublish_result rc=-1 msg=service_{}_not_found", service));
  } else if (cmd == "lookup_name") {
    const std::string service = value_of(attributes, "service");
    auto it = published_.find(service);
    reply(rank, it != published_.end() ? fmt::format("cmd=lookup_result rc=0 msg=success port={}", it->second)
                                       : fmt::format("cmd=lookup_result rc=-1 msg=service_{}_not_found", service));
  } else {
    events.push_back({MpiEvent::Kind::protocol, rank, 0,
                      fmt::format("sent the PMI-1 command \"{}\", which nodalrun does not serve", cmd)});
    reply(rank, fmt::format("cmd={}_result rc=-1 msg=nodalrun_does_not_serve_{}", cmd, cmd));
  }
}

}  // namespace nodal::launcher

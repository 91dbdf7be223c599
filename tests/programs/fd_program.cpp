// The rank program of the fd broker tests: `fd_program MODE [DIR]`. Every rank publishes a memfd
// holding "rank <r>" under key 7 (except where a mode says otherwise) and prints what it fetched.
#include <nodal/nodal.hpp>
#include <nodal/detail/fd_broker.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kKey = 7;

int open_fds() {
  int count = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

int publish_own(int rank) {
  int fd = ::memfd_create("fd_program", MFD_CLOEXEC);
  std::string text = "rank " + std::to_string(rank);
  if (fd < 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) std::exit(70);
  nodal::detail::publish_fd(kKey, fd);
  return fd;
}

/// What `owner` published under `key`, read through a fresh descriptor (closed again).
std::string fetch_text(int owner, std::uint64_t key = kKey) {
  int fd = nodal::detail::fetch_fd(owner, key, std::chrono::seconds(30));
  char buf[64] = {};
  ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "<nothing>";
}

long ms_since(Clock::time_point start) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count());
}

/// Waits until process `pid` is gone (reaped by nodalrun).
void wait_gone(pid_t pid) {
  while (::kill(pid, 0) == 0 || errno != ESRCH) std::this_thread::sleep_for(1ms);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "exchange";
  const std::string dir = argc > 2 ? argv[2] : ".";
  nodal::Context ctx = nodal::init();
  const int rank = ctx.rank();
  // Long before the failure it waits for: rank 0 must outlive nodalrun's SIGTERM to tell what it saw.
  if (mode == "peer_failure" && rank == 0) ::signal(SIGTERM, SIG_IGN);
  const int last = ctx.world_size() - 1;

  if (mode == "exchange") {
    // The last rank publishes late: the others' fetches wait for it.
    if (rank == last) std::this_thread::sleep_for(200ms);
    const int before = open_fds();
    int own = publish_own(rank);
    for (int owner = 0; owner <= last; ++owner) std::printf("from %d: %s\n", owner, fetch_text(owner).c_str());
    ::close(own);
    std::printf("fds before %d after %d\n", before, open_fds());
    return 0;
  }
  if (mode == "after_exit") {
    // Rank 1 publishes and exits at once; rank 0 fetches once it is gone.
    if (rank == 1) {
      ::close(publish_own(rank));
      std::ofstream(dir + "/rank1.pid") << ::getpid() << "\n";
      return 0;
    }
    if (rank != 0) return 0;
    pid_t pid = 0;
    while (!(std::ifstream(dir + "/rank1.pid") >> pid)) std::this_thread::sleep_for(1ms);
    wait_gone(pid);
    std::printf("from 1 after its exit: %s\n", fetch_text(1).c_str());
    try {
      fetch_text(1, 8);
    } catch (const nodal::UsageError& e) {
      std::printf("usage error: %s\n", e.what());
    }
    return 0;
  }
  if (mode == "peer_failure") {
    // Rank 0 waits for a key rank 1 never publishes; rank 2 fails meanwhile.
    if (rank == 2) {
      std::this_thread::sleep_for(200ms);
      return 5;
    }
    if (rank != 0) {
      for (;;) ::pause();
    }
    const Clock::time_point start = Clock::now();
    try {
      nodal::detail::fetch_fd(1, 99);
    } catch (const nodal::PeerFailure& e) {
      std::printf("peer failure after %ld ms: %s\n", ms_since(start), e.what());
    }
    return 0;
  }
  if (mode == "timeout") {
    if (rank != 0) {
      std::this_thread::sleep_for(1s);  // alive, never publishing
      return 0;
    }
    const Clock::time_point start = Clock::now();
    try {
      nodal::detail::fetch_fd(1, 42, std::chrono::milliseconds(150));
    } catch (const nodal::TimeoutError& e) {
      std::printf("timeout after %ld ms: %s\n", ms_since(start), e.what());
    }
    return 0;
  }
  std::fprintf(stderr, "fd_program: unknown mode %s\n", mode.c_str());
  return 64;
}

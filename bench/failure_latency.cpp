// Failure detection latency, seen from the ranks: how long after rank 0 dies do its siblings
// get nodalrun's SIGTERM?
//
//   nodalrun -n N --grace 1 failure_latency DIR
//
// Rank 0 sleeps 200 ms (time for the others to reach sigwaitinfo), writes CLOCK_MONOTONIC in ns
// to DIR/fail.ns and _exit(3)s. Every other rank blocks SIGTERM before anything else, waits for
// it with sigwaitinfo, writes the clock to DIR/term.<rank>.ns and exits 0. CLOCK_MONOTONIC is one
// clock for the whole machine, so the latency is max over r of term.r - fail (bench/startup.sh).
// A rank that never gets SIGTERM (or gets it before it blocked it) leaves no term file.
#include <nodal/nodal.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace {

/// Opens DIR/NAME for writing ahead of the moment to stamp, so the stamp is one clock read and
/// one write.
int open_stamp_file(const std::string& dir, const std::string& name) {
  std::string path = fmt::format("{}/{}", dir, name);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) std::perror(path.c_str());
  return fd;
}

/// Writes CLOCK_MONOTONIC in ns, as decimal text, to fd and closes it.
void stamp(int fd) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  char text[32];
  auto end = fmt::format_to_n(text, sizeof text, "{}\n", now.tv_sec * 1'000'000'000LL + now.tv_nsec);
  ssize_t ignored = ::write(fd, text, end.size);
  (void)ignored;  // nothing to do about it: a missing stamp shows up in the script
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: nodalrun -n N --grace 1 %s DIR\n", argv[0]);
    return 2;
  }
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &term, nullptr);  // before init: SIGTERM may come at any moment now

  const nodal::Context ctx = nodal::init();
  const std::string dir = argv[1];
  if (ctx.rank() == 0) {
    int fd = open_stamp_file(dir, "fail.ns");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stamp(fd);
    ::_exit(3);
  }
  int fd = open_stamp_file(dir, fmt::format("term.{}.ns", ctx.rank()));
  while (::sigwaitinfo(&term, nullptr) < 0) {
  }
  stamp(fd);
  return 0;
}

// Times one command from spawn to exit with CLOCK_MONOTONIC, for bench/startup.sh.
//
//   startup_timer [--timeout SECONDS] -- PROGRAM [ARGS...]
//
// Prints one line on stdout: "<elapsed_ns> <exit_code> <leftovers>". The command's own stdout
// goes to stderr, so that the line is all a caller captures. exit_code is the shell's (128 +
// signal for a signal) and 124 when the command ran past --timeout (default 60 s) and was killed.
// leftovers counts processes the command left running after it exited: the timer is a child
// subreaper, so orphaned descendants (ranks, daemons) become its children; it kills and reaps
// them, and names them on stderr. The timer exits 0 unless it could not run the command.
//
// Why not `date +%s%N` around the command in bash: that adds the shell's own fork and exec, a
// few ms on this VM, to a figure that is itself a few ms. Spawning with posix_spawn (vfork-like)
// keeps the timer's share to what exec'ing /bin/true alone costs; startup.sh reports that floor.
#include <nodal/detail/posix.hpp>

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace {

using nodal::detail::throw_errno;

long long monotonic_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec * 1'000'000'000LL + now.tv_nsec;
}

/// Our living children, with their command names (from /proc/<pid>/stat: "pid (comm) state ppid").
std::vector<std::pair<pid_t, std::string>> living_children() {
  std::vector<std::pair<pid_t, std::string>> children;
  const pid_t self = ::getpid();
  DIR* proc = ::opendir("/proc");
  if (!proc) throw_errno("opendir(/proc)");
  while (dirent* entry = ::readdir(proc)) {
    const int pid = nodal::detail::parse_int(entry->d_name);
    if (pid <= 0) continue;
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string line;
    if (!std::getline(stat, line)) continue;  // gone meanwhile
    const std::size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) != 2) continue;
    if (ppid == self && state != 'Z') children.emplace_back(pid, line.substr(open + 1, close - open - 1));
  }
  ::closedir(proc);
  return children;
}

/// Reaps exited children; then kills, reaps and counts the living ones, until none is left
/// (killing one hands its own children to us).
int sweep_leftovers() {
  int leftovers = 0;
  for (int round = 0; round < 100; ++round) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    auto children = living_children();
    if (children.empty()) break;
    for (const auto& [pid, comm] : children) {
      std::fprintf(stderr, "startup_timer: leftover process %d (%s) still running, killing it\n", pid, comm.c_str());
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      ++leftovers;
    }
  }
  return leftovers;
}

int run(double timeout_s, char** command) {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) throw_errno("prctl(PR_SET_CHILD_SUBREAPER)");
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);

  const long long start = monotonic_ns();
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, command[0], &actions, nullptr, command, environ);
  ::posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    errno = rc;
    throw_errno(fmt::format("posix_spawnp({})", command[0]));
  }
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) throw_errno("pidfd_open");
  pollfd exited{pidfd, POLLIN, 0};
  int ready = 0;
  do {
    ready = ::poll(&exited, 1, static_cast<int>(timeout_s * 1000));
  } while (ready < 0 && errno == EINTR);
  const long long elapsed = monotonic_ns() - start;
  ::close(pidfd);

  int exit_code = 124;
  if (ready == 0) {
    std::fprintf(stderr, "startup_timer: %s ran past %g s, killing it\n", command[0], timeout_s);
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  } else {
    int status = 0;
    if (::waitpid(pid, &status, 0) < 0) throw_errno("waitpid");
    exit_code = nodal::detail::exit_code_of(status);
  }
  std::printf("%lld %d %d\n", elapsed, exit_code, sweep_leftovers());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double timeout_s = 60;
  int first = 1;
  if (first + 1 < argc && std::string(argv[first]) == "--timeout") {
    timeout_s = std::atof(argv[first + 1]);
    first += 2;
  }
  if (first < argc && std::string(argv[first]) == "--") ++first;
  if (first >= argc || timeout_s <= 0) {
    std::fprintf(stderr, "usage: %s [--timeout SECONDS] -- PROGRAM [ARGS...]\n", argv[0]);
    return 2;
  }
  try {
    return run(timeout_s, argv + first);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "startup_timer: %s\n", e.what());
    return 1;
  }
}

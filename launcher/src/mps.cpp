#include "mps.hpp"

#include "options.hpp"
#include "program_error.hpp"

#include <nodal/detail/posix.hpp>
#include <nodal/errors.hpp>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

extern char** environ;

namespace nodal::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kControl = "nvidia-cuda-mps-control";
constexpr const char* kPipeVar = "CUDA_MPS_PIPE_DIRECTORY";
constexpr const char* kLogVar = "CUDA_MPS_LOG_DIRECTORY";
constexpr auto kStartLimit = std::chrono::seconds(10);  ///< `-d`, then until the daemon answers
constexpr auto kStopLimit = std::chrono::seconds(15);   ///< the guard's `quit` and clean-up

/// Stops the guard: its `quit`, then removing the directory. Arguments: $0 the control program,
/// $1 the directory. It waits for end of file on its standard input (nodalrun's pipe).
/// `quit` does not wait for the daemon to exit, so the guard then waits (up to 10 s) for the pid
/// in the daemon's nvidia-cuda-mps-control.pid (MPS guide: the control daemon writes it in
/// CUDA_MPS_PIPE_DIRECTORY), read before `quit` since the file goes with the daemon. A zombie
/// counts as gone: on a restarted attempt the daemon is nodalrun's (a subreaper's) child.
constexpr const char* kGuardScript =
    "trap '' INT TERM HUP USR1 USR2\n"
    "while read -r line; do :; done\n"
    "pid=$(cat \"$1/pipe/nvidia-cuda-mps-control.pid\" 2>/dev/null)\n"
    "echo quit | \"$0\" >>\"$1/control.out\" 2>&1\n"
    "i=0\n"
    "while [ -n \"$pid\" ] && kill -0 \"$pid\" 2>/dev/null && ! grep -qs '^State:[[:space:]]*Z' \"/proc/$pid/status\" &&\n"
    "  [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done\n"
    "rm -rf \"$1\"\n";

/// Waits for `pid` until `limit`; its exit code, or nullopt when it still runs then. A child
/// already reaped elsewhere (nodalrun's wait4(-1) as a subreaper) counts as exited, code 0.
std::optional<int> wait_for(pid_t pid, Clock::duration limit) {
  const auto until = Clock::now() + limit;
  for (;;) {
    int status = 0;
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (done < 0 && errno != EINTR) return 0;
    if (Clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

/// Spawns `argv` with `env`, stdin from `stdin_fd` (-1: /dev/null), stdout and stderr appended to
/// `out_path`, no other descriptor of nodalrun's, in its own process group when `own_group`.
pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, int stdin_fd,
            const std::string& out_path, bool own_group) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawnattr_init(&attributes);
  if (stdin_fd >= 0) {
    ::posix_spawn_file_actions_adddup2(&actions, stdin_fd, STDIN_FILENO);
  } else {
    ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  }
  ::posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  ::posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  // The daemon lives for the whole job: it must not hold nodalrun's sockets, pipes or arena.
  ::posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  ::posix_spawnattr_setsigmask(&attributes, &none);  // nodalrun blocks signals for its signalfd
  ::posix_spawnattr_setsigdefault(&attributes, &all);
  if (own_group) {
    flags |= POSIX_SPAWN_SETPGROUP;  // a Ctrl-C to the terminal's group must not end it early
    ::posix_spawnattr_setpgroup(&attributes, 0);
  }
  ::posix_spawnattr_setflags(&attributes, flags);
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int error = ::posix_spawn(&pid, argv[0].c_str(), &actions, &attributes, args.data(), envp.data());
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attributes);
  if (error != 0) {
    errno = error;
    detail::throw_errno(fmt::format("posix_spawn({})", argv[0]));
  }
  return pid;
}

/// Runs the control program with `command` on its standard input, its output going to
/// `out_path`; its exit code, or nullopt when it did not exit within `limit` (then it is killed).
std::optional<int> control_command(const std::string& control, const std::string& command,
                                   const std::vector<std::string>& env, const std::string& out_path,
                                   Clock::duration limit) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) < 0) detail::throw_errno("pipe2");
  pid_t pid = -1;
  try {
    pid = spawn({control}, env, fds[0], out_path, false);
  } catch (...) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw;
  }
  ::close(fds[0]);
  const std::string line = command + "\n";
  (void)detail::write_all(fds[1], line);  // EPIPE (SIGPIPE is ignored): it exited without reading
  ::close(fds[1]);
  std::optional<int> code = wait_for(pid, limit);
  if (!code) {
    ::kill(pid, SIGKILL);
    wait_for(pid, std::chrono::seconds(1));
  }
  return code;
}

/// Whether the daemon answered `get_server_list`: exit code 0 and not the client's "Cannot find
/// MPS control daemon process" (whatever exit code the client gives with it).
bool daemon_answers(const std::string& control, const std::vector<std::string>& env, const std::string& dir) {
  const std::string answer = dir + "/answer.out";
  std::filesystem::remove(answer);
  const std::optional<int> code = control_command(control, "get_server_list", env, answer, std::chrono::seconds(2));
  std::ifstream in(answer);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return code && *code == 0 && text.find("Cannot find") == std::string::npos;
}

/// The last lines of the daemon's output and log, for an error message.
std::string tail_of_output(const std::string& dir) {
  std::string text;
  for (const char* name : {"control.out", "log/control.log"}) {
    std::ifstream in(dir + "/" + name);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) lines.push_back(line);
    }
    const std::size_t from = lines.size() > 4 ? lines.size() - 4 : 0;
    for (std::size_t i = from; i < lines.size(); ++i) text += fmt::format("\n  {}: {}", name, lines[i]);
  }
  return text.empty() ? std::string(" (it printed nothing)") : text;
}

}  // namespace

MpsDaemon::MpsDaemon(const std::string& visible_devices) {
  // A control client that exits before reading its command must not end nodalrun (which ignores
  // SIGPIPE from its set-up on anyway).
  ::signal(SIGPIPE, SIG_IGN);
  gpus_ = 1 + static_cast<int>(std::count(visible_devices.begin(), visible_devices.end(), ','));
  try {
    control_ = resolve_program(kControl);
  } catch (const ProgramError& e) {
    throw UsageError(fmt::format("--mps: {} (it comes with the NVIDIA driver)", e.what()));
  }
  // The daemon's sockets (pipe/control_privileged, the longest) must fit a Unix socket path (108
  // bytes with its NUL): a longer one makes the daemon exit at once, saying only "Cannot find MPS
  // control daemon process". A TMPDIR too long for that gives way to /tmp.
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp && *tmp ? tmp : "/tmp";
  if (base.size() + std::string_view("/nodal-mps-XXXXXX/pipe/control_privileged").size() >= 108) base = "/tmp";
  std::string pattern = base + "/nodal-mps-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) detail::throw_errno(fmt::format("--mps: mkdtemp({})", pattern));
  dir_ = pattern;
  try {
    std::filesystem::create_directory(dir_ + "/pipe");
    std::filesystem::create_directory(dir_ + "/log");
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string_view entry(*e);
      const std::string_view name = entry.substr(0, entry.find('='));
      if (name != kPipeVar && name != kLogVar && name != "CUDA_VISIBLE_DEVICES" && name != "CUDA_DEVICE_ORDER") {
        env.emplace_back(entry);
      }
    }
    for (std::string& e : environment()) env.push_back(std::move(e));
    env.push_back("CUDA_VISIBLE_DEVICES=" + visible_devices);
    env.push_back("CUDA_DEVICE_ORDER=PCI_BUS_ID");  // nodalrun's numbering (/proc/driver/nvidia/gpus)
    const std::string out = dir_ + "/control.out";

    // The guard first: from here on, whatever happens, the daemon is stopped and dir_ removed.
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) < 0) detail::throw_errno("pipe2");
    try {
      guard_ = spawn({"/bin/sh", "-c", kGuardScript, control_, dir_}, env, fds[0], "/dev/null", true);
    } catch (...) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw;
    }
    ::close(fds[0]);
    guard_pipe_ = fds[1];

    const auto until = Clock::now() + kStartLimit;
    // In its own process group: a Ctrl-C to the terminal must not end it while the ranks stop.
    const pid_t starter = spawn({control_, "-d"}, env, -1, out, true);
    const std::optional<int> started = wait_for(starter, kStartLimit);
    if (!started || *started != 0) {
      if (!started) {
        ::kill(starter, SIGKILL);
        wait_for(starter, std::chrono::seconds(1));
      }
      throw Error(fmt::format("--mps: `{} -d` {}:{}", control_,
                              started ? fmt::format("exited with code {}", *started) : std::string("did not return in 10 s"),
                              tail_of_output(dir_)));
    }
    for (;;) {  // the daemon answers: a rank's first CUDA call will find it
      if (daemon_answers(control_, env, dir_)) break;
      if (Clock::now() >= until) {
        throw Error(fmt::format("--mps: the MPS control daemon did not answer within 10 s:{}", tail_of_output(dir_)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (...) {
    stop();
    throw;
  }
}

MpsDaemon::~MpsDaemon() { stop(); }

void MpsDaemon::stop() {
  if (guard_pipe_ >= 0) {
    ::close(guard_pipe_);
    guard_pipe_ = -1;
  }
  if (guard_ > 0) {
    if (!wait_for(guard_, kStopLimit)) {
      detail::write_all(STDERR_FILENO, fmt::format("nodalrun: --mps: the MPS control daemon did not stop within 15 s; "
                                                   "its guard (pid {}) goes on stopping it\n",
                                                   guard_));
    }
    guard_ = -1;
  } else if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);  // no guard started: nothing else removes it
  }
}

std::string MpsDaemon::client_visible_devices() const {
  std::string list = "0";
  for (int i = 1; i < gpus_; ++i) list += fmt::format(",{}", i);
  return list;
}

std::vector<std::string> MpsDaemon::environment() const {
  return {fmt::format("{}={}/pipe", kPipeVar, dir_), fmt::format("{}={}/log", kLogVar, dir_)};
}

}  // namespace nodal::launcher

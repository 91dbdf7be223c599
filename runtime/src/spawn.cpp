// nodal::spawn: start the children (fork, re-executed program, or fork server), then one join
// loop for all three start methods, fed by the children's exits and their exception reports.
#include <nodal/spawn.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/control.hpp>
#include <nodal/detail/exception_report.hpp>
#include <nodal/detail/forkserver.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/wait_record.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

extern char** environ;

namespace nodal {
namespace {

using namespace detail;
using Clock = std::chrono::steady_clock;

// What a parent tells the children it re-executes (StartMethod::spawn).
constexpr const char* kEnvSpawnCall = "NODAL_SPAWN_CALL";  ///< the parent's call, 1 = its first
constexpr const char* kEnvSpawnRank = "NODAL_SPAWN_RANK";
constexpr const char* kEnvSpawnNprocs = "NODAL_SPAWN_NPROCS";  ///< checked against the child's call
constexpr const char* kEnvSpawnControlFd = "NODAL_SPAWN_CONTROL_FD";

/// A file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// ---- The child's side ----------------------------------------------------------------------

/// Set in a child before it runs fn: spawn calls inside fn are the child's own.
bool g_in_child = false;

/// The spawn calls this process made with valid arguments, in program order.
std::atomic<int> g_spawn_calls{0};

/// A child's last words: the report the parent throws as ProcessRaisedError, then exit code 1.
[[noreturn]] void report_and_exit(int control_fd, int rank, const std::string& report) noexcept {
  send_control(control_fd, {ControlKind::exception, rank, static_cast<int>(::getpid()), report});
  flush_stdio();
  ::_exit(1);
}

/// Runs fn(rank) in a child, then exits: 0 when fn returns, 1 after reporting when it throws.
/// Never returns: the frames above belong to the parent's copy of the program, and _exit skips
/// the atexit handlers and static destructors that are the parent's to run.
[[noreturn]] void run_rank(const std::function<void(int)>& fn, int rank, int control_fd) noexcept {
  g_in_child = true;
  unbind_wait_record();  // the parent's row in the wait table is the parent's
  try {
    fn(rank);
  } catch (...) {
    std::string report;
    try {
      // The stack is the catch's, not the throw's: C++ unwinds before it runs a handler.
      report = fmt::format("{}\n{}", describe_exception(std::current_exception()), current_stack_trace());
    } catch (...) {
      report = "an exception (describing it failed)";
    }
    report_and_exit(control_fd, rank, report);
  }
  flush_stdio();
  ::_exit(0);
}

/// ForkServerEntry: what a child of the fork server runs.
[[noreturn]] void run_forkserver_rank(void (*fn)(int), int rank, int control_fd) { run_rank(fn, rank, control_fd); }

/// What a child re-executed by StartMethod::spawn must do (call == 0 in any other process).
struct SpawnedChild {
  int call = 0;
  int rank = -1;
  int nprocs = -1;
  int control_fd = -1;
};

SpawnedChild read_spawned_child();

/// Read before main(), so that the NODAL_SPAWN_* variables are gone before the program can start
/// another program (which would take them as its own), and so that the exit check is in place.
const SpawnedChild g_spawned_child = read_spawned_child();

/// atexit in a re-executed child: main() ended without reaching the call that started the child,
/// which would otherwise pass for a rank whose fn returned.
void report_call_not_reached() {
  report_and_exit(g_spawned_child.control_fd, g_spawned_child.rank,
                  fmt::format("nodal::UsageError: this child of nodal::spawn(StartMethod::spawn) ended without "
                              "reaching the call that started it (call #{} in program order; it made {}). A "
                              "spawned child re-runs main() up to that call: the code before the call must reach "
                              "it the same way in the child",
                              g_spawned_child.call, g_spawn_calls.load()));
}

SpawnedChild read_spawned_child() {
  const std::string call = getenv_or_empty(kEnvSpawnCall);
  if (call.empty()) return {};
  const SpawnedChild child{parse_int(call), parse_int(getenv_or_empty(kEnvSpawnRank)),
                           parse_int(getenv_or_empty(kEnvSpawnNprocs)), parse_int(getenv_or_empty(kEnvSpawnControlFd))};
  for (const char* name : {kEnvSpawnCall, kEnvSpawnRank, kEnvSpawnNprocs, kEnvSpawnControlFd}) ::unsetenv(name);
  if (child.call < 1 || child.rank < 0 || child.nprocs < 1 || child.control_fd < 0) {
    write_all(STDERR_FILENO, "nodal::spawn: malformed NODAL_SPAWN_* variables in the environment\n");
    ::_exit(2);
  }
  set_cloexec(child.control_fd, true);  // fn's own children must not inherit the parent's socket
  std::atexit(&report_call_not_reached);
  return child;
}

// ---- The parent's side: children and their events ------------------------------------------

/// One thing the join loop learns about a child.
struct ChildEvent {
  int rank = -1;
  pid_t pid = -1;
  std::optional<std::string> raised;  ///< fn threw: the child's report. Otherwise it exited:
  int wait_status = 0;
};

Fd open_pidfd(pid_t pid) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) throw_errno("pidfd_open");
  return Fd(fd);
}

/// The children of one spawn call, by rank. Signals go through pidfds: a pidfd names one process
/// for good, so a signal never reaches an unrelated process that reused a child's pid.
class Children {
 public:
  /// `own`: children of this process (fork, spawn), which we reap; else the fork server's.
  Children(int nprocs, bool own) : slots_(static_cast<std::size_t>(nprocs)), running_(nprocs), own_(own) {}
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;

  /// Only on error paths (a join ends with no child left): SIGKILL the children still running
  /// and reap those that are ours, so that an error leaves neither orphans nor zombies.
  ~Children() {
    if (running_ == 0) return;
    signal_all(SIGKILL);
    if (!own_) return;  // the fork server reaps its own, or is retired and they die with it
    for (const Slot& slot : slots_) {
      if (slot.pid <= 0 || slot.exited) continue;
      while (::waitpid(slot.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }

  /// Records rank's process; opens its pidfd when none is given (own children: as our unreaped
  /// child, the pid cannot be reused before). A child added after signal_all gets the signal too.
  void add(int rank, pid_t pid, Fd pidfd = {}) {
    Slot& slot = slots_.at(static_cast<std::size_t>(rank));
    slot.pid = pid;  // first, so that the destructor finds the child even if open_pidfd throws
    slot.pidfd = pidfd.get() >= 0 ? std::move(pidfd) : open_pidfd(pid);
    if (signal_ != 0) send(slot, signal_);
  }

  void exited(int rank) {
    Slot& slot = slots_.at(static_cast<std::size_t>(rank));
    if (slot.exited) return;
    slot.exited = true;
    slot.pidfd.reset();
    --running_;
  }

  int size() const noexcept { return static_cast<int>(slots_.size()); }

  /// Children not known to have exited, counting those the fork server has yet to report.
  int running() const noexcept { return running_; }

  /// Sends sig to every running child, and to those added later.
  void signal_all(int sig) noexcept {
    signal_ = sig;
    for (const Slot& slot : slots_) {
      if (slot.pid > 0 && !slot.exited) send(slot, sig);
    }
  }

  /// Calls f(rank, pid, pidfd) for every started child that has not exited.
  template <class F>
  void for_each_running(F&& f) const {
    for (std::size_t rank = 0; rank < slots_.size(); ++rank) {
      const Slot& slot = slots_[rank];
      if (slot.pid > 0 && !slot.exited) f(static_cast<int>(rank), slot.pid, slot.pidfd.get());
    }
  }

 private:
  struct Slot {
    pid_t pid = -1;
    Fd pidfd;
    bool exited = false;
  };

  void send(const Slot& slot, int sig) const noexcept {
    if (slot.pidfd.get() >= 0) {
      ::syscall(SYS_pidfd_send_signal, slot.pidfd.get(), sig, nullptr, 0);
    } else if (own_) {
      ::kill(slot.pid, sig);  // our unreaped child: its pid cannot have been reused
    }
  }

  std::vector<Slot> slots_;
  int running_;
  int signal_ = 0;
  bool own_;
};

/// Where the join loop learns that children exited.
class ExitFeed {
 public:
  virtual ~ExitFeed() = default;
  /// Adds the descriptors that turn readable when there is news.
  virtual void add_poll_fds(std::vector<pollfd>& fds) const = 0;
  /// Appends the exits known now, without blocking.
  virtual void collect(std::vector<ChildEvent>& exits) = 0;
};

/// Exits of this process's own children (fork, spawn). A pidfd turns readable when its process
/// ends (no SIGCHLD handler, which a library cannot own when the caller runs threads), and
/// waitpid(pid) reaps exactly that child, never one the caller started itself.
class OwnExits final : public ExitFeed {
 public:
  explicit OwnExits(Children& children) : children_(children) {}

  void add_poll_fds(std::vector<pollfd>& fds) const override {
    children_.for_each_running([&](int, pid_t, int pidfd) { fds.push_back({pidfd, POLLIN, 0}); });
  }

  void collect(std::vector<ChildEvent>& exits) override {
    children_.for_each_running([&](int rank, pid_t pid, int) {
      int status = 0;
      pid_t reaped = -1;
      do {
        reaped = ::waitpid(pid, &status, WNOHANG);
      } while (reaped < 0 && errno == EINTR);
      if (reaped == pid) exits.push_back({rank, pid, std::nullopt, status});
      if (reaped < 0) {
        throw Error(
            fmt::format("nodal::spawn: rank {} (pid {}) was reaped by someone else, so its exit status is "
                        "lost (is SIGCHLD ignored, or does a thread call waitpid(-1)?)",
                        rank, pid));
      }
    });
  }

 private:
  Children& children_;
};

/// Exits of the fork server's children, which only the server can reap: it reports them, after
/// reporting each child's pid and pidfd, which are recorded here as they come.
class ForkServerExits final : public ExitFeed {
 public:
  ForkServerExits(ForkServerJob& job, Children& children) : job_(job), children_(children) {}

  void add_poll_fds(std::vector<pollfd>& fds) const override { fds.push_back({job_.fd(), POLLIN, 0}); }

  void collect(std::vector<ChildEvent>& exits) override {
    while (std::optional<ForkServerEvent> event = job_.receive()) {
      if (event->wait_status) {
        exits.push_back({event->rank, event->pid, std::nullopt, *event->wait_status});
      } else {
        children_.add(event->rank, event->pid, Fd(event->pidfd));
      }
    }
  }

 private:
  ForkServerJob& job_;
  Children& children_;
};

/// Waits until every child has exited. The first failure decides the error, as in
/// torch.multiprocessing: an exception report (ProcessRaisedError) or an exit with a non-zero
/// code or by a signal (ProcessExitedError). The other children then get SIGTERM, and SIGKILL
/// once `grace` has passed.
void join(ExitFeed& feed, Children& children, int control_fd, std::chrono::milliseconds grace) {
  std::exception_ptr failure;
  std::optional<Clock::time_point> kill_at;
  auto handle = [&](const ChildEvent& event) {
    if (!event.raised) children.exited(event.rank);
    if (failure) return;
    if (event.raised) {
      failure = std::make_exception_ptr(ProcessRaisedError(event.rank, event.pid, *event.raised));
    } else if (const int status = event.wait_status; WIFSIGNALED(status)) {
      failure = std::make_exception_ptr(ProcessExitedError(event.rank, event.pid, 0, WTERMSIG(status)));
    } else if (WEXITSTATUS(status) != 0) {
      failure = std::make_exception_ptr(ProcessExitedError(event.rank, event.pid, WEXITSTATUS(status), 0));
    } else {
      return;
    }
    children.signal_all(SIGTERM);
    kill_at = Clock::now() + grace;
  };

  std::vector<pollfd> fds;
  std::vector<ChildEvent> exits;
  while (children.running() > 0) {
    fds.assign(1, pollfd{control_fd, POLLIN, 0});
    feed.add_poll_fds(fds);
    int timeout_ms = -1;
    if (kill_at) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*kill_at - Clock::now()).count();
      timeout_ms = static_cast<int>(std::clamp<decltype(left)>(left, 0, INT_MAX));
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) throw_errno("poll");
    if (kill_at && Clock::now() >= *kill_at) {
      children.signal_all(SIGKILL);
      kill_at.reset();
    }

    // Exits first, then reports: a child sends its report before it exits, so the report of
    // every exit collected here is already queued, and is handled first. Otherwise a child that
    // raised would pass for one that merely exited with code 1.
    exits.clear();
    feed.collect(exits);
    while (std::optional<ControlMessage> message = receive_control(control_fd)) {
      if (message->kind == ControlKind::exception && message->rank >= 0 && message->rank < children.size()) {
        handle({message->rank, message->pid, std::move(message->text), 0});
      }
    }
    for (const ChildEvent& event : exits) handle(event);
  }
  if (failure) std::rethrow_exception(failure);
}

// ---- Starting the children -----------------------------------------------------------------

void spawn_by_fork(const std::function<void(int)>& fn, int nprocs, Fd ranks_end, int control_fd,
                   std::chrono::milliseconds grace) {
  // Checked before the threads: CUDA's runtime may have started threads of its own, and the
  // reason to give then is CUDA.
  if (gpu::cuda_initialized()) {
    throw UsageError(
        "nodal::spawn(StartMethod::fork): CUDA was initialised in this process before fork (by "
        "nodal::cuda::available(), a cuda tensor, a GPU copy, ...): CUDA does not survive fork, the children "
        "would get a broken CUDA. Use CUDA only in the spawned function (not before nodal::spawn), or use "
        "StartMethod::spawn");
  }
  if (const int threads = thread_count(); threads > 1) {
    throw UsageError(fmt::format(
        "nodal::spawn(StartMethod::fork): the program runs {} threads, and fork() copies only the calling one "
        "(a lock another thread holds stays locked in the child for good). nodal's own count too: a communicator's "
        "first non-blocking call (iallreduce, ...) starts its progress thread. Use StartMethod::forkserver (call "
        "nodal::start_forkserver() at the top of main()) or StartMethod::spawn, or spawn before starting threads",
        threads));
  }
  Children children(nprocs, /*own=*/true);
  const pid_t parent = ::getpid();
  flush_stdio();
  for (int rank = 0; rank < nprocs; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) throw_errno("fork");
    if (pid == 0) {
      die_with_parent(parent);
      run_rank(fn, rank, ranks_end.get());
    }
    children.add(rank, pid);
  }
  ranks_end.reset();
  OwnExits feed(children);
  join(feed, children, control_fd, grace);
}

/// This process's argv, as the kernel keeps it.
std::vector<std::string> own_arguments() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  if (!file) throw_errno("open(/proc/self/cmdline)");
  const std::string all{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  std::vector<std::string> arguments;
  for (std::size_t begin = 0; begin < all.size();) {
    const std::size_t end = std::min(all.find('\0', begin), all.size());
    arguments.push_back(all.substr(begin, end - begin));
    begin = end + 1;
  }
  return arguments;
}

/// execve's view of strings: pointers into them, then a null pointer.
std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

void spawn_by_exec(int call, int nprocs, Fd ranks_end, int control_fd, std::chrono::milliseconds grace) {
  // Everything is prepared before the first fork: the caller may run threads, so a child may
  // only make async-signal-safe calls until execve.
  std::vector<std::string> arguments = own_arguments();
  std::vector<char*> argv = c_strings(arguments);
  std::vector<std::vector<std::string>> environments(static_cast<std::size_t>(nprocs));
  std::vector<std::vector<char*>> envps;
  for (int rank = 0; rank < nprocs; ++rank) {
    std::vector<std::string>& environment = environments[static_cast<std::size_t>(rank)];
    for (char** variable = environ; *variable != nullptr; ++variable) environment.emplace_back(*variable);
    environment.push_back(fmt::format("{}={}", kEnvSpawnCall, call));
    environment.push_back(fmt::format("{}={}", kEnvSpawnRank, rank));
    environment.push_back(fmt::format("{}={}", kEnvSpawnNprocs, nprocs));
    environment.push_back(fmt::format("{}={}", kEnvSpawnControlFd, ranks_end.get()));
    envps.push_back(c_strings(environment));
  }

  Children children(nprocs, /*own=*/true);
  const pid_t parent = ::getpid();
  for (int rank = 0; rank < nprocs; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) throw_errno("fork");
    if (pid == 0) {
      die_with_parent(parent);  // PR_SET_PDEATHSIG survives execve
      // The child gets stdin, stdout, stderr and the control socket, like Python's spawn: other
      // descriptors would stay open, unused, in every child (and count against its limit).
      ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
      ::fcntl(ranks_end.get(), F_SETFD, 0);
      ::execve("/proc/self/exe", argv.data(), envps[static_cast<std::size_t>(rank)].data());
      write_all(STDERR_FILENO, "nodal::spawn: execve(/proc/self/exe) failed\n");
      ::_exit(127);
    }
    children.add(rank, pid);
  }
  ranks_end.reset();
  OwnExits feed(children);
  join(feed, children, control_fd, grace);
}

void spawn_by_forkserver(void (*fn)(int), int nprocs, Fd ranks_end, int control_fd, std::chrono::milliseconds grace) {
  ForkServerJob job(&run_forkserver_rank, fn, nprocs, ranks_end.get());
  ranks_end.reset();
  Children children(nprocs, /*own=*/false);  // destroyed before the job: kill, then retire
  ForkServerExits feed(job, children);
  join(feed, children, control_fd, grace);
}

}  // namespace

void spawn(const std::function<void(int rank)>& fn, int nprocs, const SpawnOptions& options) {
  // Argument checks come before the call is counted: a re-executed child replaying the program
  // then throws the same UsageError at the same place.
  if (nprocs < 1) throw UsageError(fmt::format("nodal::spawn: nprocs is {}; it must be at least 1", nprocs));
  if (!fn) throw UsageError("nodal::spawn: fn is empty");
  void (*const* function)(int) = fn.target<void (*)(int)>();
  if (options.start_method == StartMethod::forkserver && function == nullptr) {
    throw UsageError(
        "nodal::spawn(StartMethod::forkserver): fn must hold a plain function pointer (a function, or a "
        "captureless lambda converted with unary +). The fork server is a copy of the program made before this "
        "closure existed, so it cannot run it (Python's forkserver needs a picklable function for the same "
        "reason); use StartMethod::spawn or StartMethod::fork for closures");
  }
  if (options.start_method == StartMethod::spawn && g_in_child) {
    throw UsageError(
        "nodal::spawn(StartMethod::spawn) inside a child's fn: a re-executed child replays main(), which never "
        "reaches a call made inside another call's fn. Use StartMethod::fork or StartMethod::forkserver there");
  }

  const int call = ++g_spawn_calls;
  if (g_spawned_child.call > 0 && !g_in_child) {
    // This process is a child re-executed by StartMethod::spawn, replaying its parent's program.
    if (call < g_spawned_child.call) return;  // the parent made this call before starting us
    if (nprocs != g_spawned_child.nprocs) {
      report_and_exit(g_spawned_child.control_fd, g_spawned_child.rank,
                      fmt::format("nodal::UsageError: this child of nodal::spawn(StartMethod::spawn) reached call "
                                  "#{} with nprocs {}, but the parent's call #{} had nprocs {}: the code before "
                                  "the call took another path in the child",
                                  call, nprocs, call, g_spawned_child.nprocs));
    }
    run_rank(fn, g_spawned_child.rank, g_spawned_child.control_fd);
  }

  auto [control_end, ranks_end] = make_control_pair();
  Fd control(control_end);
  Fd ranks(ranks_end);
  // make_control_pair leaves the ranks' end inheritable; until a child needs it, keep it out of
  // the programs that other threads may start meanwhile.
  set_cloexec(ranks.get(), true);
  const auto grace = std::max(options.grace, std::chrono::milliseconds(0));
  switch (options.start_method) {
    case StartMethod::fork:
      return spawn_by_fork(fn, nprocs, std::move(ranks), control.get(), grace);
    case StartMethod::spawn:
      return spawn_by_exec(call, nprocs, std::move(ranks), control.get(), grace);
    case StartMethod::forkserver:
      return spawn_by_forkserver(*function, nprocs, std::move(ranks), control.get(), grace);
  }
  throw UsageError(fmt::format("nodal::spawn: unknown start method {}", static_cast<int>(options.start_method)));
}

}  // namespace nodal

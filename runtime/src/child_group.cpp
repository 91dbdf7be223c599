// Starting the children of one start (fork, re-executed program, or fork server) and watching
// them: what nodal::spawn, nodal::ProcessContext and nodal::Process share.
#include "child_group.hpp"

#include <nodal/errors.hpp>
#include <nodal/detail/exception_report.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/termination_shield.hpp>
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
#include <climits>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

extern char** environ;

namespace nodal::detail {
namespace {

using Clock = std::chrono::steady_clock;

// What a parent tells the children it re-executes (StartMethod::spawn).
constexpr const char* kEnvSpawnCall = "NODAL_SPAWN_CALL";  ///< the parent's start, 1 = its first
constexpr const char* kEnvSpawnRank = "NODAL_SPAWN_RANK";
constexpr const char* kEnvSpawnNprocs = "NODAL_SPAWN_NPROCS";  ///< checked against the child's start
constexpr const char* kEnvSpawnControlFd = "NODAL_SPAWN_CONTROL_FD";

// ---- The child's side ----------------------------------------------------------------------

/// Set in a child before it runs fn: starts inside fn are the child's own.
bool g_in_child = false;

/// The starts this process made with valid arguments, in program order.
std::atomic<int> g_spawn_calls{0};

/// A child's last words: the report the parent throws as ProcessRaisedError, then exit code 1.
[[noreturn]] void report_and_exit(int control_fd, int rank, const std::string& report) noexcept {
  send_control(control_fd, {ControlKind::exception, rank, static_cast<int>(::getpid()), report});
  flush_stdio();
  ::_exit(1);
}

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

/// atexit in a re-executed child: main() ended without reaching the start that made the child,
/// which would otherwise pass for a child whose function returned.
void report_call_not_reached() {
  report_and_exit(g_spawned_child.control_fd, g_spawned_child.rank,
                  fmt::format("nodal::UsageError: this child of a StartMethod::spawn start (nodal::spawn, "
                              "nodal::Process::start) ended without reaching the call that started it (call #{} in "
                              "program order; it made {}). A spawned child re-runs main() up to that call: the code "
                              "before the call must reach it the same way in the child",
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

// ---- Starting children ---------------------------------------------------------------------

OwnedFd open_pidfd(pid_t pid) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) throw_errno("pidfd_open");
  return OwnedFd(fd);
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

}  // namespace

[[noreturn]] void run_child(const std::function<void(int)>& fn, int rank, int control_fd) noexcept {
  g_in_child = true;
  unbind_wait_record();  // the parent's row in the wait table is the parent's
  defer_termination_in_shielded_sections();  // terminate() never leaves the arena half-changed
  std::string report;
  try {
    fn(rank);
  } catch (...) {
    try {
      // The stack is the catch's, not the throw's: C++ unwinds before it runs a handler.
      report = fmt::format("{}\n{}", describe_exception(std::current_exception()), current_stack_trace());
    } catch (...) {
      report = "an exception (describing it failed)";
    }
  }
  join_children_at_exit();
  if (!report.empty()) report_and_exit(control_fd, rank, report);
  flush_stdio();
  ::_exit(0);
}

bool in_child() noexcept { return g_in_child; }

int count_start(const std::function<void(int)>& fn, int nprocs) {
  const int call = ++g_spawn_calls;
  if (g_spawned_child.call > 0 && !g_in_child) {
    // This process is a child re-executed by StartMethod::spawn, replaying its parent's program.
    if (call < g_spawned_child.call) return 0;  // the parent made this start before starting us
    if (nprocs != g_spawned_child.nprocs) {
      report_and_exit(g_spawned_child.control_fd, g_spawned_child.rank,
                      fmt::format("nodal::UsageError: this child of a StartMethod::spawn start reached call #{} "
                                  "with {} process(es), but the parent's call #{} started {}: the code before the "
                                  "call took another path in the child",
                                  call, nprocs, call, g_spawned_child.nprocs));
    }
    run_child(fn, g_spawned_child.rank, g_spawned_child.control_fd);
  }
  return call;
}

std::exception_ptr failure_of(const ChildEvent& event, const std::string& name) {
  if (event.raised) return std::make_exception_ptr(ProcessRaisedError(event.rank, event.pid, *event.raised, name));
  const int status = event.wait_status;
  if (WIFSIGNALED(status)) {
    return std::make_exception_ptr(ProcessExitedError(event.rank, event.pid, 0, WTERMSIG(status), name));
  }
  if (WEXITSTATUS(status) != 0) {
    return std::make_exception_ptr(ProcessExitedError(event.rank, event.pid, WEXITSTATUS(status), 0, name));
  }
  return nullptr;
}

// ---- The parent's side ---------------------------------------------------------------------

/// The children by rank: their pids and pidfds, and which have exited.
class ChildGroup::Children {
 public:
  /// `own`: children of this process (fork, spawn), which we reap; else the fork server's.
  Children(int nprocs, bool own) : slots_(static_cast<std::size_t>(nprocs)), own_(own) {}
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;

  ~Children() {
    if (running_ == 0 || ::getpid() != owner_) return;
    signal_all(SIGKILL);
    if (!own_) return;  // the fork server reaps its own (and kills them too once the job closes)
    for (const Slot& slot : slots_) {
      if (slot.pid <= 0 || slot.exited) continue;
      while (::waitpid(slot.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
  }

  /// Records rank's process; opens its pidfd when none is given (own children: as our unreaped
  /// child, the pid cannot be reused before).
  void add(int rank, pid_t pid, OwnedFd pidfd = {}) {
    Slot& slot = slots_.at(static_cast<std::size_t>(rank));
    slot.pid = pid;  // first, so that the destructor finds the child even if open_pidfd throws
    ++running_;
    slot.pidfd = pidfd.get() >= 0 ? std::move(pidfd) : open_pidfd(pid);
  }

  void exited(int rank) {
    Slot& slot = slots_.at(static_cast<std::size_t>(rank));
    if (slot.exited) return;
    slot.exited = true;
    slot.pidfd.reset();
    --running_;
  }

  int size() const noexcept { return static_cast<int>(slots_.size()); }
  int running() const noexcept { return running_; }
  bool own() const noexcept { return own_; }

  std::vector<pid_t> pids() const {
    std::vector<pid_t> pids;
    for (const Slot& slot : slots_) pids.push_back(slot.pid);
    return pids;
  }

  void signal_all(int sig) const noexcept {
    for (const Slot& slot : slots_) {
      if (slot.pid <= 0 || slot.exited) continue;
      if (slot.pidfd.get() >= 0) {
        ::syscall(SYS_pidfd_send_signal, slot.pidfd.get(), sig, nullptr, 0);
      } else if (own_) {
        ::kill(slot.pid, sig);  // our unreaped child: its pid cannot have been reused
      }
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
    OwnedFd pidfd;
    bool exited = false;
  };

  std::vector<Slot> slots_;
  int running_ = 0;  ///< started and not seen exited
  bool own_;
  pid_t owner_ = ::getpid();  ///< a forked copy of this object is not the children's parent
};

ChildGroup::ChildGroup(StartMethod method, const ChildTarget& target, int nprocs, int call, std::string_view caller)
    : children_(std::make_unique<Children>(nprocs, method != StartMethod::forkserver)) {
  auto [control_end, ranks_end] = make_control_pair();
  control_ = OwnedFd(control_end);
  OwnedFd ranks(ranks_end);
  // make_control_pair leaves the ranks' end inheritable; until a child needs it, keep it out of
  // the programs that other threads may start meanwhile.
  set_cloexec(ranks.get(), true);
  switch (method) {
    case StartMethod::fork:
      start_by_fork(target.fn, std::move(ranks), caller);
      return;
    case StartMethod::spawn:
      start_by_exec(call, std::move(ranks));
      return;
    case StartMethod::forkserver:
      start_by_forkserver(target, std::move(ranks), caller);
      return;
  }
  throw UsageError(fmt::format("{}: unknown start method {}", caller, static_cast<int>(method)));
}

ChildGroup::~ChildGroup() = default;

int ChildGroup::size() const noexcept { return children_->size(); }

int ChildGroup::running() const noexcept { return children_->running(); }

std::vector<pid_t> ChildGroup::pids() const { return children_->pids(); }

void ChildGroup::signal_all(int sig) noexcept { children_->signal_all(sig); }

void ChildGroup::start_by_fork(const std::function<void(int)>& fn, OwnedFd ranks_end, std::string_view caller) {
  // Checked before the threads: CUDA's runtime may have started threads of its own, and the
  // reason to give then is CUDA.
  if (gpu::cuda_initialized()) {
    throw UsageError(fmt::format(
        "{}(StartMethod::fork): CUDA was initialised in this process before fork (by "
        "nodal::cuda::available(), a cuda tensor, a GPU copy, ...): CUDA does not survive fork, the children "
        "would get a broken CUDA. Use CUDA only in the child's function (not before starting it), or use "
        "StartMethod::spawn",
        caller));
  }
  if (const int threads = thread_count(); threads > 1) {
    throw UsageError(fmt::format(
        "{}(StartMethod::fork): the program runs {} threads, and fork() copies only the calling one "
        "(a lock another thread holds stays locked in the child for good). nodal's own count too: a communicator's "
        "first non-blocking call (iallreduce, ...) starts its progress thread. Use StartMethod::forkserver (call "
        "nodal::start_forkserver() at the top of main()) or StartMethod::spawn, or start children before threads",
        caller, threads));
  }
  const pid_t parent = ::getpid();
  flush_stdio();
  for (int rank = 0; rank < children_->size(); ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) throw_errno("fork");
    if (pid == 0) {
      die_with_parent(parent);
      run_child(fn, rank, ranks_end.get());
    }
    children_->add(rank, pid);
  }
}

void ChildGroup::start_by_exec(int call, OwnedFd ranks_end) {
  // Everything is prepared before the first fork: the caller may run threads, so a child may
  // only make async-signal-safe calls until execve.
  const int nprocs = children_->size();
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
      write_all(STDERR_FILENO, "nodal: execve(/proc/self/exe) failed\n");
      ::_exit(127);
    }
    children_->add(rank, pid);
  }
}

void ChildGroup::start_by_forkserver(const ChildTarget& target, OwnedFd ranks_end, std::string_view caller) {
  job_.emplace(fmt::format("{}(StartMethod::forkserver)", caller), target.entry, target.plain, children_->size(),
               ranks_end.get());
  ranks_end.reset();  // the server has its copy
  // The server reports every child's pid and pidfd as it forks it; a child may even have exited
  // before the last one is forked.
  for (int forked = 0; forked < children_->size();) {
    pollfd news{job_->fd(), POLLIN, 0};
    if (::poll(&news, 1, -1) < 0 && errno != EINTR) throw_errno("poll");
    while (std::optional<ForkServerEvent> event = job_->receive()) {
      if (event->wait_status) {
        early_exits_.push_back({event->rank, event->pid, std::nullopt, *event->wait_status});
      } else {
        children_->add(event->rank, event->pid, OwnedFd(event->pidfd));
        ++forked;
      }
    }
  }
}

void ChildGroup::collect_exits(std::vector<ChildEvent>& exits) {
  if (job_) {
    // The fork server reaped them: only it can, being their parent.
    exits.insert(exits.end(), early_exits_.begin(), early_exits_.end());
    early_exits_.clear();
    while (std::optional<ForkServerEvent> event = job_->receive()) {
      if (event->wait_status) exits.push_back({event->rank, event->pid, std::nullopt, *event->wait_status});
    }
    return;
  }
  // waitpid(pid) reaps exactly that child, never one the caller started itself.
  children_->for_each_running([&](int rank, pid_t pid, int) {
    int status = 0;
    pid_t reaped = -1;
    do {
      reaped = ::waitpid(pid, &status, WNOHANG);
    } while (reaped < 0 && errno == EINTR);
    if (reaped == pid) exits.push_back({rank, pid, std::nullopt, status});
    if (reaped < 0) {
      throw Error(
          fmt::format("nodal: child {} (pid {}) was reaped by someone else, so its exit status is lost (is "
                      "SIGCHLD ignored, or does a thread call waitpid(-1)?)",
                      rank, pid));
    }
  });
}

namespace {

/// A join as nodalrun's wait table shows it (wait_record.hpp).
void describe_join(const void* self, std::string& what, std::string& waiting_for) {
  const ChildGroup& group = *static_cast<const ChildGroup*>(self);
  what = fmt::format("join of {} child process(es) (nodal::spawn, ProcessContext or Process)", group.size());
  std::vector<pid_t> pids = group.pids();
  waiting_for = fmt::format("{} of them to exit (pids {})", group.running(), fmt::join(pids, ", "));
}

/// How often a recorded join wakes to refresh its line and answer nodalrun's stack requests.
constexpr int kRecordedSliceMs = 100;

}  // namespace

void ChildGroup::poll_recorded(std::vector<pollfd>& fds, int timeout_ms) {
  if (timeout_ms == 0) {
    if (::poll(fds.data(), fds.size(), 0) < 0 && errno != EINTR) throw_errno("poll");
    return;
  }
  // Blocking: the join is a wait like any other nodal call (a rank of a job that waits for its
  // children shows so in nodalrun's table). Without a table, one plain poll.
  BlockingCall blocking(&describe_join, this);
  WaitEntry* entry = begin_waiting("join of child processes");
  if (entry == nullptr) {
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) throw_errno("poll");
    return;
  }
  struct End {
    WaitEntry* entry;
    ~End() { end_waiting(entry); }
  } end{entry};
  const auto deadline = timeout_ms < 0 ? std::optional<Clock::time_point>()
                                       : Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int slice = kRecordedSliceMs;
    if (deadline) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
      slice = static_cast<int>(std::clamp<decltype(left)>(left, 0, kRecordedSliceMs));
    }
    const int ready = ::poll(fds.data(), fds.size(), slice);
    if (ready < 0 && errno != EINTR) throw_errno("poll");
    if (ready != 0 || (deadline && Clock::now() >= *deadline)) return;
    refresh_waiting(entry, "join of child processes");
  }
}

void ChildGroup::wait(std::optional<Clock::time_point> deadline, std::vector<ChildEvent>& events) {
  if (children_->running() == 0) return;  // every report came before its exit
  // A pidfd turns readable when its process ends (no SIGCHLD handler, which a library cannot own
  // when the caller runs threads); the fork server's news comes on the job's socket.
  std::vector<pollfd> fds{{control_.get(), POLLIN, 0}};
  if (job_) {
    fds.push_back({job_->fd(), POLLIN, 0});
  } else {
    children_->for_each_running([&](int, pid_t, int pidfd) { fds.push_back({pidfd, POLLIN, 0}); });
  }
  int timeout_ms = early_exits_.empty() ? -1 : 0;
  if (deadline && timeout_ms != 0) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now()).count();
    timeout_ms = static_cast<int>(std::clamp<decltype(left)>(left, 0, INT_MAX));
  }
  poll_recorded(fds, timeout_ms);

  // Exits first, then reports: a child sends its report before it exits, so the report of every
  // exit collected here is already queued, and is handed on first. Otherwise a child that raised
  // would pass for one that merely exited with code 1.
  std::vector<ChildEvent> exits;
  collect_exits(exits);
  while (std::optional<ControlMessage> message = receive_control(control_.get())) {
    if (message->kind == ControlKind::exception && message->rank >= 0 && message->rank < children_->size()) {
      events.push_back({message->rank, message->pid, std::move(message->text), 0});
    }
  }
  for (ChildEvent& exit : exits) {
    children_->exited(exit.rank);
    events.push_back(std::move(exit));
  }
}

}  // namespace nodal::detail

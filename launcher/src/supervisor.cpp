#include "supervisor.hpp"

#include <nodal/detail/control.hpp>
#include <nodal/detail/environment.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/units.hpp>
#include <nodal/detail/verbose.hpp>
#include <nodal/detail/wait_table.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <random>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cgroup.hpp"
#include "free_port.hpp"
#include "launch.hpp"
#include "report.hpp"

extern char** environ;

namespace nodal::launcher {

using namespace nodal::detail;

namespace {

constexpr std::uint64_t kTagSignal = 1;
constexpr std::uint64_t kTagControl = 2;
constexpr std::uint64_t kTagTimeout = 3;
constexpr std::uint64_t kTagGrace = 4;
constexpr std::uint64_t kTagWatch = 5;
constexpr std::uint64_t kTagNode = 6;  ///< the node agent's event (a remote failure)
constexpr std::uint64_t kTagStreamBase = 16;  ///< + index into streams_
constexpr std::uint64_t kTagMpiBase = std::uint64_t{1} << 40;  ///< + index into mpi_->fds()
constexpr std::size_t kLastStderrLines = 10;
/// After the last rank is reaped, how long a pipe still held open by a rank's own child may
/// keep nodalrun waiting for the rest of the output.
constexpr int kDrainMs = 500;

const int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2};
/// Not forwarded: asks nodalrun for the status table (what every rank waits for) and stacks.
constexpr int kStatusSignal = SIGQUIT;
/// How often the stall watch reads the wait table while a diagnosis collects stacks.
constexpr double kDiagnosisTick = 0.02;

/// Sets NAME=VALUE in `env`, replacing an entry of the same name.
void set_environment(std::vector<std::string>& env, std::string entry) {
  const std::string_view name = std::string_view(entry).substr(0, entry.find('=') + 1);  // with the '='
  std::erase_if(env, [&](const std::string& e) { return e.starts_with(name); });
  env.push_back(std::move(entry));
}

int make_timer() {
  int fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (fd < 0) throw_errno("timerfd_create");
  return fd;
}

timespec to_timespec(double seconds) {
  return {static_cast<time_t>(seconds), static_cast<long>((seconds - std::floor(seconds)) * 1e9)};
}

void arm_timer(int fd, double seconds) {
  itimerspec spec{};
  spec.it_value = to_timespec(std::max(seconds, 1e-6));
  if (::timerfd_settime(fd, 0, &spec, nullptr) < 0) throw_errno("timerfd_settime");
}

/// Every `seconds`, from `seconds` on.
void arm_periodic(int fd, double seconds) {
  itimerspec spec{};
  spec.it_value = spec.it_interval = to_timespec(std::max(seconds, 1e-3));
  if (::timerfd_settime(fd, 0, &spec, nullptr) < 0) throw_errno("timerfd_settime");
}

/// The stall watch's tick: a tenth of the stall timeout, between 20 ms and 250 ms (a stall is
/// seen at most that long after the timeout; reading the table costs a few microseconds).
double watch_interval(double stall_timeout) { return std::clamp(stall_timeout / 10, 0.02, 0.25); }

}  // namespace

/// One rank's stdout or stderr pipe as the event loop sees it.
struct Supervisor::Stream {
  int fd = -1;
  int rank = 0;
  bool is_stderr = false;
};

Supervisor::Supervisor(Options options, std::string program_path, Attempt attempt, NodeAgent* agent)
    : options_(std::move(options)),
      agent_(agent),
      program_(std::move(program_path)),
      attempt_(std::move(attempt)),
      fd_registry_(options_.nprocs) {}

Supervisor::~Supervisor() {
  for (int fd : {epoll_fd_, signal_fd_, control_fd_, rank_control_fd_, timeout_fd_, grace_fd_, watch_fd_}) {
    if (fd >= 0) ::close(fd);
  }
  for (const Stream& s : streams_) {
    if (s.fd >= 0) ::close(s.fd);
  }
}

void Supervisor::note(std::string_view step, Clock::time_point since) const {
  if (!options_.verbose) return;
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - since).count();
  write_all(STDERR_FILENO, fmt::format("nodalrun: set-up: {} in {:.2f} ms\n", step, ms));
}

void Supervisor::watch(int fd, std::uint64_t tag) {
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = tag;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) < 0) throw_errno("epoll_ctl");
}

void Supervisor::set_up() {
  Clock::time_point step = Clock::now();
  if (options_.gpus) {  // first: an impossible layout is a usage error before anything starts
    const char* visible = std::getenv(kEnvCudaVisibleDevices);
    gpus_ = assign_gpus(*options_.gpus, options_.nprocs, options_.ranks_per_gpu,
                        visible ? std::optional<std::string>(visible) : std::nullopt, count_gpus());
    note(fmt::format("GPUs assigned (CUDA_VISIBLE_DEVICES={})", gpus_->visible_devices), step);
    if (options_.mps) {  // before any descriptor of the job exists: the daemon outlives nothing of it
      step = Clock::now();
      mps_ = std::make_unique<MpsDaemon>(gpus_->visible_devices);
      note(fmt::format("MPS control daemon started ({})", mps_->directory()), step);
    }
  }
  started_ = Clock::now();
  job_id_ = attempt_.job_id;
  oom_kills_at_start_ = read_oom_kill_count();

  // Two pipes per rank stay open here: make room for 1024 ranks under a 1024-fd soft limit.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  // Forkserver ranks are the zygote's children; as a subreaper we adopt and reap them ourselves.
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) throw_errno("prctl(PR_SET_CHILD_SUBREAPER)");
  ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the supervisor of running ranks

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGCHLD);
  for (int sig : kForwardedSignals) sigaddset(&signals, sig);
  sigaddset(&signals, kStatusSignal);
  if (::sigprocmask(SIG_BLOCK, &signals, nullptr) < 0) throw_errno("sigprocmask");
  signal_fd_ = ::signalfd(-1, &signals, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd_ < 0) throw_errno("signalfd");

  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) throw_errno("epoll_create1");
  std::tie(control_fd_, rank_control_fd_) = make_control_pair();
  timeout_fd_ = make_timer();
  grace_fd_ = make_timer();
  watch_fd_ = make_timer();
  watch(signal_fd_, kTagSignal);
  watch(control_fd_, kTagControl);
  watch(timeout_fd_, kTagTimeout);
  watch(grace_fd_, kTagGrace);
  watch(watch_fd_, kTagWatch);

  step = Clock::now();
  std::string arena_path;
  if (options_.shm_strategy == ShmStrategy::file_system) {
    arena_path = arena_file();
    shm_guard_ = std::make_unique<ShmGuard>(arena_path);  // before the file exists: no window to leak it
  }
  arena_ = Arena::create(options_.shm_size, options_.shm_strategy, arena_path, wait_table_bytes(options_.nprocs));
  create_wait_table(*arena_, options_.nprocs);
  stall_watch_ = std::make_unique<StallWatch>(*arena_, options_.stall_timeout_seconds, options_.first_rank);
  if (agent_) {  // before the ranks: they find the bridge at nodal::init()
    agent_->serve(*arena_);
    watch(agent_->event_fd(), kTagNode);
  }
  note(fmt::format("arena of at most {} created ({}), with the wait table of {} ranks", format_bytes(options_.shm_size),
                   arena_path.empty() ? std::string("memfd") : arena_path, options_.nprocs),
       step);

  if (options_.output_dir) {
    if (::mkdir(options_.output_dir->c_str(), 0777) < 0 && errno != EEXIST) {
      throw_errno(fmt::format("mkdir({})", *options_.output_dir));
    }
  }
  // Placement before the first fork: a rank is bound before its program runs a single
  // instruction (binding from outside after exec raced with the rank's own first threads).
  step = Clock::now();
  placement_ = place_ranks(options_.nprocs, options_.bind_to,
                           agent_ ? agent_->host_share() : HostShare{0, options_.nprocs});
  note("placement (hwloc topology, --bind-to)", step);
  if (options_.mpi != MpiSupport::none) {
    step = Clock::now();
    mpi_ = std::make_unique<MpiWireUp>(options_.mpi, job_id_, options_.nprocs);
    for (std::size_t i = 0; i < mpi_->fds().size(); ++i) watch(mpi_->fds()[i], kTagMpiBase + i);
    note("MPI wire-up servers started (--mpi)", step);
  }
  ranks_.resize(options_.nprocs);
  for (int r = 0; r < options_.nprocs; ++r) {
    ranks_[r].rank = r;
    ranks_[r].cpuset = placement_.cpusets[r];
  }
}

std::vector<std::string> Supervisor::base_environment() const {
  static const std::set<std::string> ours = {kEnvRank,       kEnvWorldSize,       kEnvLocalRank,    kEnvLocalWorldSize,
                                             kEnvMasterAddr, kEnvMasterPort,      kEnvJobId,        kEnvControlFd,
                                             kEnvLauncherPid, kEnvStartMethod,    kEnvForkserverFds,
                                             kEnvArenaFd,     kEnvArenaPath,       kEnvForkserverCpus,
                                             kEnvDevice,      kEnvForkserverDevices, kEnvRestartCount,
                                             kEnvTorchelasticRestartCount, kEnvTorchelasticMaxRestarts, kEnvCrowded};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view entry(*e);
    std::string name(entry.substr(0, entry.find('=')));
    const bool gpus_set = name == kEnvCudaVisibleDevices || name == kEnvCudaDeviceOrder;
    const bool mps_set = name == "CUDA_MPS_PIPE_DIRECTORY" || name == "CUDA_MPS_LOG_DIRECTORY";
    // An outer launcher's wire-up (nodalrun started by srun --mpi=pmix or mpirun) is not the
    // ranks': across nodes it is the agent's alone (a rank that found it would take itself for the
    // agent), and under --mpi a rank's is nodalrun's own. Across nodes Open MPI's per-process
    // values go too, and Slurm's per-task values are set per rank.
    const bool wireup = name.starts_with("PMI_") || name.starts_with("PMIX_");
    const bool launchers = (agent_ && (wireup || name.starts_with("OMPI_") || name == "SLURM_PROCID" ||
                                       name == "SLURM_LOCALID" || name == "SLURM_NTASKS" || name == "SLURM_NPROCS")) ||
                           (mpi_ && wireup);
    if (!ours.count(name) && !(gpus_ && gpus_set) && !(mps_ && mps_set) && !launchers) env.emplace_back(entry);
  }
  if (mps_) {
    for (std::string& item : mps_->environment()) env.push_back(std::move(item));
  }
  for (const std::string& item : options_.exports) {
    if (item.find('=') != std::string::npos) {
      env.push_back(item);
    } else if (const char* value = std::getenv(item.c_str())) {
      env.push_back(item + "=" + value);
    }
  }
  auto set = [&env](const char* name, const std::string& value) { env.push_back(fmt::format("{}={}", name, value)); };
  set(kEnvWorldSize, std::to_string(options_.world_size.value_or(options_.nprocs)));
  set(kEnvLocalWorldSize, std::to_string(options_.nprocs));
  const std::string crowded_prefix = std::string(kEnvCrowded) + "=";
  if (std::none_of(env.begin(), env.end(), [&](const std::string& e) { return e.starts_with(crowded_prefix); })) {
    set(kEnvCrowded, placement_.crowded ? "1" : "0");  // unless -x gave it
  }
  set(kEnvMasterAddr, agent_ ? agent_->master_addr() : std::string("127.0.0.1"));
  set(kEnvMasterPort, std::to_string(agent_ ? agent_->master_port() : free_port(PortScope::loopback)));
  if (agent_) {
    set(kEnvNodeRank, std::to_string(agent_->node_rank()));
    set(kEnvNnodes, std::to_string(agent_->nnodes()));
    set(kEnvGroupRank, std::to_string(agent_->node_rank()));
    set(kEnvGroupWorldSize, std::to_string(agent_->nnodes()));
    set(kEnvFirstRank, std::to_string(agent_->first_rank()));
    if (std::getenv("SLURM_PROCID")) {
      set("SLURM_NTASKS", std::to_string(*options_.world_size));
      set("SLURM_NPROCS", std::to_string(*options_.world_size));
    }
  }
  set(kEnvJobId, job_id_);
  set(kEnvControlFd, std::to_string(rank_control_fd_));
  set(kEnvLauncherPid, std::to_string(::getpid()));
  set(kEnvArenaFd, std::to_string(arena_->fd()));
  if (shm_guard_) set(kEnvArenaPath, arena_file());
  set(kEnvRestartCount, std::to_string(attempt_.number));
  set(kEnvTorchelasticRestartCount, std::to_string(attempt_.number));
  set(kEnvTorchelasticMaxRestarts, std::to_string(options_.max_restarts));
  if (options_.verbose) set(kEnvVerbose, "1");
  if (gpus_) {
    // Under MPS the server shows its clients the daemon's GPUs renumbered from 0 (mps.hpp).
    set(kEnvCudaVisibleDevices, mps_ ? mps_->client_visible_devices() : gpus_->visible_devices);
    set(kEnvCudaDeviceOrder, "PCI_BUS_ID");  // the numbering of /proc/driver/nvidia/gpus
  }
  return env;
}

void Supervisor::open_rank_pipes(RankRecord& rank, int& out_write, int& err_write) {
  for (bool is_stderr : {false, true}) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) < 0) throw_errno("pipe2");
    ::fcntl(fds[0], F_SETFL, O_NONBLOCK);
    (is_stderr ? err_write : out_write) = fds[1];
    int file_fd = -1;
    if (options_.output_dir) {
      std::string path = fmt::format("{}/rank.{}.{}", *options_.output_dir, rank.rank, is_stderr ? "stderr" : "stdout");
      file_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
      if (file_fd < 0) throw_errno(fmt::format("open({})", path));
    }
    auto tagger = std::make_unique<LineTagger>(fmt::format("[{}] ", options_.global_rank(rank.rank)), is_stderr ? STDERR_FILENO : STDOUT_FILENO,
                                               file_fd, is_stderr ? kLastStderrLines : 0);
    (is_stderr ? rank.err : rank.out) = std::move(tagger);
    streams_.push_back({fds[0], rank.rank, is_stderr});
    watch(fds[0], kTagStreamBase + streams_.size() - 1);
  }
}

void Supervisor::start_spawn() {
  std::vector<std::string> env = base_environment();
  std::vector<std::pair<int, int>> write_ends;
  for (RankRecord& rank : ranks_) {
    int out = -1, err = -1;
    open_rank_pipes(rank, out, err);
    write_ends.emplace_back(out, err);
  }
  // Everything is prepared before the first fork: a failure above starts no rank at all.
  for (RankRecord& rank : ranks_) {
    LaunchSpec spec;
    spec.program = program_;
    spec.argv = options_.command;
    spec.env = env;
    spec.env.push_back(fmt::format("{}={}", kEnvRank, options_.global_rank(rank.rank)));
    spec.env.push_back(fmt::format("{}={}", kEnvLocalRank, rank.rank));
    if (agent_ && std::getenv("SLURM_PROCID")) {
      spec.env.push_back(fmt::format("SLURM_PROCID={}", options_.global_rank(rank.rank)));
      spec.env.push_back(fmt::format("SLURM_LOCALID={}", rank.rank));
    }
    if (gpus_) spec.env.push_back(fmt::format("{}={}", kEnvDevice, gpus_->device_of_rank[rank.rank]));
    spec.stdout_fd = write_ends[rank.rank].first;
    spec.stderr_fd = write_ends[rank.rank].second;
    spec.inherit_fds = {arena_->fd(), rank_control_fd_};
    if (mpi_) {
      for (std::string& entry : mpi_->environment(rank.rank)) set_environment(spec.env, std::move(entry));
      for (int fd : mpi_->inherited_fds(rank.rank)) spec.inherit_fds.push_back(fd);
    }
    spec.cpuset = rank.cpuset ? &*rank.cpuset : nullptr;
    rank.started = Clock::now();
    rank.pid = launch(spec);
    ::close(write_ends[rank.rank].first);
    ::close(write_ends[rank.rank].second);
  }
  if (mpi_) mpi_->ranks_started();
}

void Supervisor::start_forkserver() {
  std::vector<std::string> env = base_environment();
  std::vector<std::pair<int, int>> write_ends;
  std::string fd_list;
  std::string cpu_list;  // each rank binds itself in the zygote's child, before it runs on
  LaunchSpec spec;
  for (RankRecord& rank : ranks_) {
    int out = -1, err = -1;
    open_rank_pipes(rank, out, err);
    write_ends.emplace_back(out, err);
    fd_list += fmt::format("{}{},{}", fd_list.empty() ? "" : ";", out, err);
    cpu_list += fmt::format("{}{}", rank.rank == 0 ? "" : ";", rank.cpuset ? describe_cpuset(*rank.cpuset) : "");
    spec.inherit_fds.push_back(out);
    spec.inherit_fds.push_back(err);
  }
  spec.inherit_fds.push_back(arena_->fd());
  spec.inherit_fds.push_back(rank_control_fd_);
  env.push_back(fmt::format("{}=forkserver", kEnvStartMethod));
  env.push_back(fmt::format("{}={}", kEnvForkserverFds, fd_list));
  env.push_back(fmt::format("{}={}", kEnvForkserverCpus, cpu_list));
  if (gpus_) env.push_back(fmt::format("{}={}", kEnvForkserverDevices, fmt::join(gpus_->device_of_rank, ";")));
  spec.program = program_;
  spec.argv = options_.command;
  spec.env = std::move(env);
  // What the zygote prints before nodal::init() appears as rank 0's output.
  spec.stdout_fd = write_ends[0].first;
  spec.stderr_fd = write_ends[0].second;
  zygote_pid_ = launch(spec);
  for (auto [out, err] : write_ends) {
    ::close(out);
    ::close(err);
  }
}

int Supervisor::run() {
  set_up();
  const Clock::time_point starting = Clock::now();
  try {
    if (options_.start_method == StartMethod::forkserver) {
      start_forkserver();
      note("forkserver zygote started (its ranks fork once it reaches nodal::init)", starting);
    } else {
      start_spawn();
      note(fmt::format("{} ranks started (fork+exec)", options_.nprocs), starting);
    }
  } catch (...) {
    // A fork or an open failed part-way: leave nothing running behind us. Only our ranks are
    // waited for (the named-arena guard is a child too, and ends only when we do).
    signal_all(SIGKILL);
    if (zygote_pid_ > 0) ::waitpid(zygote_pid_, nullptr, 0);
    for (const RankRecord& r : ranks_) {
      if (r.pid > 0) ::waitpid(r.pid, nullptr, 0);
    }
    throw;
  }
  if (attempt_.deadline) arm_timer(timeout_fd_, std::chrono::duration<double>(*attempt_.deadline - Clock::now()).count());
  if (options_.stall_timeout_seconds > 0) arm_periodic(watch_fd_, watch_interval(options_.stall_timeout_seconds));
  loop();
  // Whatever a rank left in its process group (a daemonised helper, a stuck grandchild) goes too.
  signal_all(SIGKILL);

  ended_ = Clock::now();
  if (failure_ || interrupted_by_) write_all(STDERR_FILENO, format_failure_report(summary()));
  return exit_code();
}

JobSummary Supervisor::summary() const {
  const std::optional<StatusTable>& table = stall_watch_->last();
  return JobSummary{job_id_, options_,         ranks_, failure_, interrupted_by_, exit_code(), started_,
                    ended_,  stop_signalled_, table ? &*table : nullptr};
}

std::string Supervisor::arena_file() const {
  // A restarted job gets a new arena: its file must not collide with the last one's.
  return attempt_.number == 0 ? fmt::format("{}/{}", options_.shm_dir, job_id_)
                              : fmt::format("{}/{}.{}", options_.shm_dir, job_id_, attempt_.number);
}

bool Supervisor::finished() const {
  if (zygote_pid_ > 0 && !zygote_reaped_) return false;
  for (const RankRecord& r : ranks_) {
    if (r.pid > 0 && !r.reaped) return false;
  }
  return true;
}

void Supervisor::loop() {
  std::optional<Clock::time_point> drain_deadline;
  epoll_event events[64];
  for (;;) {
    bool streams_open = false;
    for (const Stream& s : streams_) streams_open |= s.fd >= 0;
    if (finished()) {
      if (!streams_open) return;
      if (!drain_deadline) drain_deadline = Clock::now() + std::chrono::milliseconds(kDrainMs);
      if (Clock::now() >= *drain_deadline) return;  // a rank's own child holds the pipe: stop here
    }
    int wait_ms = -1;
    if (drain_deadline) {
      wait_ms = std::max(0, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  *drain_deadline - Clock::now()).count()) + 1);
    }
    int n = ::epoll_wait(epoll_fd_, events, 64, wait_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("epoll_wait");
    }
    // Output first, so a failing rank's last lines are in the report; the control socket before
    // exits, so an exception report or a fork announcement is known when its process is reaped.
    bool child_exited = false;
    for (int i = 0; i < n; ++i) {
      std::uint64_t tag = events[i].data.u64;
      if (tag >= kTagMpiBase) {
        on_mpi(tag - kTagMpiBase);
      } else if (tag >= kTagStreamBase) {
        on_output(tag - kTagStreamBase);
      }
    }
    for (int i = 0; i < n; ++i) {
      switch (events[i].data.u64) {
        case kTagControl: on_control(); break;
        case kTagSignal: on_signal(); child_exited = true; break;
        case kTagTimeout: {
          std::uint64_t expirations;
          if (::read(timeout_fd_, &expirations, sizeof expirations) > 0 && !finished()) {
            record_failure({FailureKind::timeout, -1, -1, Clock::now(), kTimeoutExitCode, 0, false,
                            fmt::format("the job passed --timeout {:g} s", options_.timeout_seconds)});
          }
          break;
        }
        case kTagNode: on_node_event(); break;
        case kTagWatch: {
          std::uint64_t expirations;
          if (::read(watch_fd_, &expirations, sizeof expirations) > 0) on_watch_tick();
          break;
        }
        case kTagGrace: {
          std::uint64_t expirations;
          if (::read(grace_fd_, &expirations, sizeof expirations) > 0) {
            for (RankRecord& r : ranks_) r.killed_after_grace = r.pid > 0 && !r.reaped;
            signal_all(SIGKILL);
          }
          break;
        }
        default: break;
      }
    }
    if (child_exited) {
      on_control();
      on_child_exits();
    }
  }
}

void Supervisor::on_output(std::size_t index) {
  Stream& stream = streams_[index];
  if (stream.fd < 0) return;
  RankRecord& rank = ranks_[stream.rank];
  LineTagger& tagger = stream.is_stderr ? *rank.err : *rank.out;
  char buf[64 * 1024];
  ssize_t n = ::read(stream.fd, buf, sizeof buf);
  if (n > 0) {
    tagger.feed(std::string_view(buf, static_cast<std::size_t>(n)));
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    tagger.finish();
    ::close(stream.fd);  // closing also removes it from the epoll set
    stream.fd = -1;
  }
}

void Supervisor::on_signal() {
  signalfd_siginfo info;
  while (::read(signal_fd_, &info, sizeof info) == sizeof info) {
    int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGCHLD) continue;  // reaped by the caller
    if (sig == kStatusSignal) {
      if (!finished() && !stall_watch_->diagnosing()) {
        stall_watch_->begin_diagnosis(ranks_, started_, Clock::now(), "status requested (SIGQUIT)");
        arm_periodic(watch_fd_, kDiagnosisTick);
      }
      continue;
    }
    if (sig == SIGINT && ++sigint_count_ >= 2) {
      write_all(STDERR_FILENO, "nodalrun: second SIGINT: killing every rank now\n");
      for (RankRecord& r : ranks_) r.killed_after_grace = r.pid > 0 && !r.reaped;
      signal_all(SIGKILL);
      continue;
    }
    signal_all(sig);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (!interrupted_by_) interrupted_by_ = sig;
      if (!stopping_) {
        stopping_ = true;
        arm_timer(grace_fd_, options_.grace_seconds);
      }
    }
  }
}

void Supervisor::on_control() {
  while (std::optional<ControlMessage> message = receive_control(control_fd_)) {
    switch (message->kind) {
      case ControlKind::exception: {
        if (message->rank < 0 || message->rank >= options_.nprocs) break;
        RankRecord& rank = ranks_[message->rank];
        rank.exception_report = message->text;
        std::string first_line = message->text.substr(0, message->text.find('\n'));
        record_failure({FailureKind::exception, rank.rank, rank.pid, Clock::now(), 1, 0, false,
                        fmt::format("uncaught exception: {}", first_line)});
        break;
      }
      case ControlKind::forked: {
        if (message->rank < 0 || message->rank >= options_.nprocs || message->pid <= 0) break;
        RankRecord& rank = ranks_[message->rank];
        rank.pid = message->pid;
        rank.started = Clock::now();
        // The zygote's preload: from its start to the first fork, the program's own start-up.
        if (rank.rank == 0) note("forkserver zygote loaded the program and reached nodal::init (from the job's start)", started_);
        if (rank.rank == options_.nprocs - 1) note(fmt::format("forkserver: all {} ranks forked (from the job's start)", options_.nprocs), started_);
        if (stopping_) ::kill(-rank.pid, SIGTERM);  // forked while we were already stopping
        break;
      }
      case ControlKind::zygote_error:
        record_failure({FailureKind::zygote, -1, message->pid, Clock::now(), 2, 0, false,
                        fmt::format("--start-method forkserver: {}", message->text)});
        break;
      case ControlKind::fd_publish:
        if (message->fd.get() >= 0) fd_registry_.publish(message->rank, message->key, std::move(message->fd));
        break;
      case ControlKind::fd_fetch:
        if (message->fd.get() >= 0) fd_registry_.fetch(message->rank, message->key, std::move(message->fd));
        break;
      case ControlKind::fd_reply:
        break;  // only ever sent on a reply socket
      case ControlKind::wait_stack:
        stall_watch_->on_stack(message->rank, std::move(message->text));
        break;
    }
  }
}

void Supervisor::on_child_exits() {
  for (;;) {
    int status = 0;
    rusage usage{};
    pid_t pid = ::wait4(-1, &status, WNOHANG, &usage);
    if (pid <= 0) return;  // 0: none left exited; -1 ECHILD: no children at all
    if (pid == zygote_pid_) {
      zygote_reaped_ = true;
      on_zygote_exit(status);
      continue;
    }
    for (RankRecord& rank : ranks_) {
      if (rank.pid != pid) continue;
      rank.reaped = true;
      rank.wait_status = status;
      rank.ended = Clock::now();
      rank.peak_rss_kib = usage.ru_maxrss;
      on_rank_exit(rank, status);
      // After on_rank_exit: a requester told "never published" sees the abort word already set
      // when this exit failed the job, and throws PeerFailure rather than a usage error.
      fd_registry_.rank_exited(rank.rank);
      break;
    }
    // Any other pid is an orphan a rank left behind that we adopted as subreaper: reaped, ignored.
  }
}

void Supervisor::on_mpi(std::size_t index) {
  if (std::optional<MpiFailure> failure = mpi_->on_readable(index)) record_mpi_failure(*failure);
}

void Supervisor::record_mpi_failure(const MpiFailure& failure) {
  const RankRecord& rank = ranks_[failure.rank];
  record_failure({FailureKind::mpi, failure.rank, rank.pid, Clock::now(), failure.exit_code, 0, false, failure.detail});
}

void Supervisor::on_rank_exit(RankRecord& rank, int status) {
  if (mpi_) {
    if (std::optional<MpiFailure> failure = mpi_->on_rank_exit(rank.rank, status == 0)) record_mpi_failure(*failure);
  }
  if (status == 0) return;
  // Our own SIGKILL (after the grace, or a second SIGINT) is how the job ended, not a new failure.
  if (rank.killed_after_grace && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) return;
  if (failure_ && failure_->rank == rank.rank && failure_->kind == FailureKind::exception) {
    // The report came first; the rank then exits 1 by itself (it is spared the SIGTERM), unless
    // the terminate handler itself hung and the grace ran out.
    if (WIFEXITED(status)) failure_->exit_code = WEXITSTATUS(status);
    return;
  }
  Failure failure;
  failure.rank = rank.rank;
  failure.pid = rank.pid;
  failure.at = rank.ended;
  failure.exit_code = exit_code_of(status);
  failure.detail = describe_wait_status(status);
  if (WIFSIGNALED(status)) {
    failure.kind = FailureKind::signal;
    failure.signal = WTERMSIG(status);
    failure.oom_killed = failure.signal == SIGKILL && oom_kill_count_rose();
  } else {
    failure.kind = FailureKind::exit;
  }
  record_failure(std::move(failure));
}

void Supervisor::on_zygote_exit(int status) {
  int forked = 0;
  for (const RankRecord& r : ranks_) forked += r.pid > 0;
  if (status == 0 && forked == options_.nprocs) return;  // the normal end of a zygote
  if (failure_) return;  // it already said why (zygote_error), or we stopped it
  Failure failure{FailureKind::zygote, -1, zygote_pid_, Clock::now(), exit_code_of(status), 0, false, {}};
  if (forked == 0 && status == 0) {
    failure.exit_code = 2;
    failure.detail = fmt::format(
        "--start-method forkserver: {} exited without calling nodal::init(), so no rank was started; "
        "forkserver needs a program that calls nodal::init() (or use --start-method spawn)",
        options_.command.front());
  } else {
    failure.detail = fmt::format("--start-method forkserver: the zygote {} after forking {} of {} ranks",
                                 describe_wait_status(status), forked, options_.nprocs);
    if (WIFSIGNALED(status)) failure.signal = WTERMSIG(status);
  }
  record_failure(std::move(failure));
}

void Supervisor::on_watch_tick() {
  const Clock::time_point now = Clock::now();
  if (!stopping_ && stall_watch_->stalled(ranks_, now)) {
    const double quiet = stall_watch_->quiet_for_s(now);
    stall_watch_->begin_diagnosis(
        ranks_, started_, now,
        fmt::format("stall: no rank has finished a nodal call or exited for {:.1f} s (--stall-timeout {:g}){}", quiet,
                    options_.stall_timeout_seconds,
                    options_.stall_action == StallAction::fail ? "; failing the job" : "; reporting only"));
    fail_after_diagnosis_ = options_.stall_action == StallAction::fail;
    arm_periodic(watch_fd_, kDiagnosisTick);
  }
  if (!stall_watch_->finish_diagnosis(now)) return;
  // Back to the slow tick (or none).
  itimerspec off{};
  ::timerfd_settime(watch_fd_, 0, &off, nullptr);
  if (options_.stall_timeout_seconds > 0) arm_periodic(watch_fd_, watch_interval(options_.stall_timeout_seconds));
  if (std::exchange(fail_after_diagnosis_, false) && !failure_) {
    record_failure({FailureKind::stall, -1, -1, now, kStallExitCode, 0, false,
                    fmt::format("the job stalled: no rank finished a nodal call or exited for {:g} s "
                                "(--stall-timeout); the table above says what each rank waits for",
                                options_.stall_timeout_seconds)});
  }
}

void Supervisor::on_node_event() {
  if (std::optional<RemoteFailure> remote = agent_->remote_failure()) {
    record_failure({FailureKind::node, -1, -1, Clock::now(), remote->exit_code, 0, false, remote->detail});
  }
}

void Supervisor::record_failure(Failure failure) {
  if (!failure_) {
    failure_ = std::move(failure);
    if (agent_ && failure_->kind != FailureKind::node) {
      agent_->announce_failure(options_.global_rank(failure_->rank), failure_->exit_code,
                               failure_->detail);
    }
    // Ranks blocked in nodal calls see this within a futex slice and throw PeerFailure.
    ArenaControl& control = arena_->control();
    control.failed_rank = options_.global_rank(failure_->rank);
    fmt::format_to_n(control.failure, sizeof control.failure - 1, "{}", failure_->detail);
    control.abort.store(1, std::memory_order_release);
  }
  stop_ranks();
}

void Supervisor::stop_ranks() {
  if (stopping_ && stop_signalled_) return;
  stopping_ = true;
  signal_all(SIGTERM);
  stop_signalled_ = Clock::now();
  arm_timer(grace_fd_, options_.grace_seconds);
}

void Supervisor::signal_all(int sig) {
  // Whole process groups: a rank's own children go too. Reaped ranks' groups may still hold such
  // children; kill() on an empty group fails with ESRCH, which is fine.
  if (zygote_pid_ > 0 && !zygote_reaped_) ::kill(-zygote_pid_, sig);
  for (const RankRecord& r : ranks_) {
    // A rank that reported an uncaught exception is already on its way out with code 1; a SIGTERM
    // now would only cut its report short. SIGKILL after the grace still reaches it.
    if (sig == SIGTERM && !r.exception_report.empty() && !r.reaped) continue;
    if (r.pid > 0) ::kill(-r.pid, sig);
  }
}

bool Supervisor::oom_kill_count_rose() const {
  long now = read_oom_kill_count();
  return oom_kills_at_start_ >= 0 && now > oom_kills_at_start_;
}

int Supervisor::exit_code() const {
  if (failure_) return failure_->exit_code;
  if (interrupted_by_) return 128 + interrupted_by_;
  return 0;
}

}  // namespace nodal::launcher

#include <nodal/arena.hpp>
#include <nodal/context.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/control.hpp>
#include <nodal/detail/environment.hpp>
#include <nodal/detail/exception_report.hpp>
#include <nodal/detail/gpu.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/verbose.hpp>
#include <nodal/detail/wait_record.hpp>

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace nodal {
namespace {

using namespace detail;

/// An int from the environment: fallback when unset, UsageError when set but not a number.
int env_int(const char* name, int fallback) {
  std::string text = getenv_or_empty(name);
  if (text.empty()) return fallback;
  int value = parse_int(text);
  if (value < 0) throw UsageError(fmt::format("nodal::init: {}='{}' is not a non-negative integer", name, text));
  return value;
}

struct RankPipes {
  int out;
  int err;
};

std::vector<RankPipes> parse_forkserver_fds(const std::string& text) {
  std::vector<RankPipes> pipes;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view item(text.data() + pos, end - pos);
    std::size_t comma = item.find(',');
    if (comma == std::string_view::npos) break;
    pipes.push_back({parse_int(item.substr(0, comma)), parse_int(item.substr(comma + 1))});
    pos = end + 1;
  }
  return pipes;
}

/// A CPU list as nodalrun writes it ("0-1,4") as a set; empty text: no CPUs (not bound).
cpu_set_t parse_cpu_list(std::string_view text) {
  cpu_set_t set;
  CPU_ZERO(&set);
  while (!text.empty()) {
    std::size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    std::size_t dash = item.find('-');
    int first = parse_int(item.substr(0, dash));
    int last = dash == std::string_view::npos ? first : parse_int(item.substr(dash + 1));
    for (int cpu = first; cpu >= 0 && cpu <= last && cpu < CPU_SETSIZE; ++cpu) CPU_SET(cpu, &set);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
  }
  return set;
}

/// The rank-th ';'-separated field of a per-rank list (NODAL_FORKSERVER_CPUS, ..._DEVICES);
/// empty when the list is shorter.
std::string_view field_of(std::string_view list, int rank) {
  for (int skip = 0; skip < rank && !list.empty(); ++skip) {
    std::size_t semicolon = list.find(';');
    list = semicolon == std::string_view::npos ? std::string_view() : list.substr(semicolon + 1);
  }
  return list.substr(0, list.find(';'));
}

/// The zygote of `nodalrun --start-method forkserver`: forks the ranks and exits. Returns only
/// in the children, each as its rank with RANK and LOCAL_RANK set. Why the zygote exits rather
/// than waits: nodalrun is a child subreaper, so the ranks become its children and it reaps
/// them (exit status, rusage) exactly as with the spawn start method.
void fork_ranks_as_zygote() {
  const int control_fd = env_int(kEnvControlFd, -1);
  // This node's ranks (in multi-node mode the job's WORLD_SIZE counts every node's).
  const int world_size = env_int(kEnvLocalWorldSize, env_int(kEnvWorldSize, 1));
  const int first_rank = env_int(kEnvFirstRank, 0);
  // One node of a job under srun: each rank is a Slurm task of its own (nodalrun set
  // SLURM_NTASKS to the job's world size), as with the spawn start method.
  const bool slurm_tasks = std::getenv(kEnvFirstRank) && std::getenv("SLURM_NTASKS");
  const pid_t launcher = env_int(kEnvLauncherPid, -1);
  std::vector<RankPipes> pipes = parse_forkserver_fds(getenv_or_empty(kEnvForkserverFds));
  const std::string cpus = getenv_or_empty(kEnvForkserverCpus);
  const std::string devices = getenv_or_empty(kEnvForkserverDevices);
  auto refuse = [&](const std::string& why) {
    send_control(control_fd, {ControlKind::zygote_error, -1, static_cast<int>(::getpid()), why});
    std::_Exit(2);
  };
  if (static_cast<int>(pipes.size()) != world_size) {
    refuse(fmt::format("{} lists {} ranks' pipes for WORLD_SIZE {}", kEnvForkserverFds, pipes.size(), world_size));
  }
  if (job_arena_exists()) {
    // Forked children would share that memfd MAP_SHARED, and each would think it alone holds
    // the references counted in it.
    refuse("the program used shared memory (a shared tensor, queue or lock) before nodal::init(); "
           "with forkserver, call nodal::init() first");
  }
  // Checked before the threads: CUDA's runtime may have started threads of its own, and the
  // reason to give then is CUDA.
  if (gpu::cuda_initialized()) {
    refuse("CUDA was initialised in this process before fork (by nodal::cuda::available(), a cuda tensor, a GPU "
           "copy, ... before nodal::init()): CUDA does not survive fork, the ranks would get a broken CUDA. Use "
           "CUDA only after nodal::init(), or use --start-method spawn");
  }
  if (int threads = thread_count(); threads != 1) {
    refuse(fmt::format(
        "the program runs {} threads when it calls nodal::init(); fork would copy only one of them. "
        "Start threads after nodal::init(), or use --start-method spawn",
        threads));
  }
  // Buffered output would otherwise be written once per child.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);

  int release[2];
  if (::pipe2(release, O_CLOEXEC) < 0) refuse("pipe2 failed");
  const pid_t zygote = ::getpid();
  for (int rank = 0; rank < world_size; ++rank) {
    pid_t pid = ::fork();
    if (pid < 0) refuse(fmt::format("fork failed for rank {}: {}", rank, std::strerror(errno)));
    if (pid == 0) {
      ::close(release[1]);
      ::setpgid(0, 0);
      ::dup2(pipes[rank].out, STDOUT_FILENO);
      ::dup2(pipes[rank].err, STDERR_FILENO);
      for (const RankPipes& p : pipes) {
        if (p.out > STDERR_FILENO) ::close(p.out);
        if (p.err > STDERR_FILENO) ::close(p.err);
      }
      ::setenv(kEnvRank, std::to_string(first_rank + rank).c_str(), 1);
      ::unsetenv(kEnvFirstRank);
      ::setenv(kEnvLocalRank, std::to_string(rank).c_str(), 1);
      if (slurm_tasks) {
        ::setenv("SLURM_PROCID", std::to_string(first_rank + rank).c_str(), 1);
        ::setenv("SLURM_LOCALID", std::to_string(rank).c_str(), 1);
      }
      ::unsetenv(kEnvStartMethod);
      ::unsetenv(kEnvForkserverFds);
      ::unsetenv(kEnvForkserverCpus);
      ::unsetenv(kEnvForkserverDevices);
      if (std::string_view device = field_of(devices, rank); !device.empty()) {
        ::setenv(kEnvDevice, std::string(device).c_str(), 1);
      }
      if (std::string_view field = field_of(cpus, rank); !field.empty()) {
        cpu_set_t set = parse_cpu_list(field);
        ::sched_setaffinity(0, sizeof set, &set);
      }
      // Wait until the zygote is gone and nodalrun has adopted us, then die with nodalrun.
      char byte;
      while (::read(release[0], &byte, 1) < 0 && errno == EINTR) {
      }
      ::close(release[0]);
      while (::getppid() == zygote) ::sched_yield();
      die_with_parent(launcher);
      return;
    }
    ::setpgid(pid, pid);  // also done by the child: whoever runs first wins the race
    send_control(control_fd, {ControlKind::forked, rank, static_cast<int>(pid), {}});
  }
  std::_Exit(0);  // no atexit handlers, no destructors: the children own the program now
}

std::mutex g_mutex;
std::optional<Context> g_context;
/// What control_endpoint() returns; set by init(), read by the fd broker from any thread.
std::atomic<int> g_control_fd{-1};
std::atomic<int> g_rank{0};

}  // namespace

Context init() {
  std::lock_guard lock(g_mutex);
  if (g_context) return *g_context;
  const auto started = std::chrono::steady_clock::now();

  if (getenv_or_empty(kEnvStartMethod) == "forkserver" && getenv_or_empty(kEnvRank).empty()) {
    fork_ranks_as_zygote();
  }

  Context ctx;
  ctx.world_size_ = env_int(kEnvWorldSize, 1);
  ctx.rank_ = env_int(kEnvRank, 0);
  ctx.local_rank_ = env_int(kEnvLocalRank, ctx.rank_);
  ctx.local_world_size_ = env_int(kEnvLocalWorldSize, ctx.world_size_);
  if (int device = env_int(kEnvDevice, -1); device >= 0) ctx.device_ = Device::cuda(device);
  if (ctx.world_size_ < 1 || ctx.rank_ >= ctx.world_size_ || ctx.local_rank_ >= ctx.local_world_size_) {
    throw UsageError(fmt::format("nodal::init: inconsistent environment: RANK={} WORLD_SIZE={} LOCAL_RANK={} "
                                 "LOCAL_WORLD_SIZE={}",
                                 ctx.rank_, ctx.world_size_, ctx.local_rank_, ctx.local_world_size_));
  }
  ctx.job_id_ = getenv_or_empty(kEnvJobId);
  ctx.launched_ = !ctx.job_id_.empty();
  if (!ctx.launched_) ctx.job_id_ = fmt::format("singleton-{}", ::getpid());

  if (int arena_fd = env_int(kEnvArenaFd, -1); arena_fd >= 0) {
    set_job_arena(Arena::attach(arena_fd));
    bind_wait_record(ctx.local_rank_);  // the node's table (rank == local_rank on one node)
  }

  int control_fd = env_int(kEnvControlFd, -1);
  if (control_fd >= 0) set_cloexec(control_fd, true);  // the rank's own children must not report
  // nodalrun knows its ranks by local rank (the same as rank on one node; it adds its node's first
  // rank where it names them).
  install_terminate_handler(control_fd, ctx.local_rank_);
  g_rank.store(ctx.local_rank_);
  g_control_fd.store(control_fd);

  g_context = ctx;
  note_step(fmt::format("nodal::init (rank {} of {}, arena {})", ctx.rank_, ctx.world_size_,
                        ctx.launched_ ? "attached" : "not made yet"),
            started);
  return ctx;
}

Arena& Context::arena() const { return detail::job_arena(); }

detail::ControlEndpoint detail::control_endpoint() noexcept { return {g_control_fd.load(), g_rank.load()}; }

}  // namespace nodal

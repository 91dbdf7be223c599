// nodalrun's core: start the ranks, watch them in one event loop, stop them on the first failure.
#pragma once

#include <nodal/arena.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fd_registry.hpp"
#include "gpu_assignment.hpp"
#include "job.hpp"
#include "options.hpp"
#include "placement.hpp"
#include "shm_guard.hpp"

namespace nodal::launcher {

/// Runs one job from start to the last reaped rank. Single-threaded by design: one epoll loop
/// over signalfd (SIGCHLD and the forwarded signals), the control socket, two timerfds
/// (--timeout, --grace) and every rank's stdout/stderr pipe, so failure detection costs one
/// wake-up and output lines are written whole, in order.
class Supervisor {
 public:
  Supervisor(Options options, std::string program_path);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  /// Starts the ranks, supervises them, prints the failure report (and writes --report).
  /// Returns nodalrun's exit code: 0, the first failing rank's code, 128+signal, 124 (timeout).
  /// Throws std::system_error when the job cannot be set up (no rank is left running then).
  int run();

 private:
  struct Stream;

  void set_up();
  std::vector<std::string> base_environment() const;
  void start_spawn();
  void start_forkserver();
  void open_rank_pipes(RankRecord& rank, int& out_write, int& err_write);
  void watch(int fd, std::uint64_t tag);
  void loop();
  bool finished() const;
  void on_signal();
  void on_control();
  void on_child_exits();
  void on_output(std::size_t stream_index);
  void on_rank_exit(RankRecord& rank, int status);
  void on_zygote_exit(int status);
  void record_failure(Failure failure);
  void stop_ranks();
  void signal_all(int sig);
  bool oom_kill_count_rose() const;
  int exit_code() const;

  Options options_;
  std::string program_;
  std::optional<GpuAssignment> gpus_;  ///< --gpus
  FdRegistry fd_registry_;
  std::string job_id_;
  Placement placement_;
  std::vector<RankRecord> ranks_;
  std::vector<Stream> streams_;
  std::optional<Failure> failure_;
  int interrupted_by_ = 0;
  int sigint_count_ = 0;
  bool stopping_ = false;
  std::optional<Clock::time_point> stop_signalled_;
  pid_t zygote_pid_ = -1;
  bool zygote_reaped_ = false;
  Clock::time_point started_{};
  long oom_kills_at_start_ = 0;
  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  int control_fd_ = -1;       ///< our end
  int rank_control_fd_ = -1;  ///< the ranks' end
  int timeout_fd_ = -1;
  int grace_fd_ = -1;
  std::unique_ptr<ShmGuard> shm_guard_;  ///< file_system strategy only; declared before the arena
  std::unique_ptr<Arena> arena_;
};

}  // namespace nodal::launcher

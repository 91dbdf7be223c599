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
#include "mps.hpp"
#include "multinode/node_agent.hpp"
#include "options.hpp"
#include "placement.hpp"
#include "pmi/mpi_wireup.hpp"
#include "report.hpp"
#include "shm_guard.hpp"
#include "stall_watch.hpp"

namespace nodal::launcher {

/// Which attempt of the job a Supervisor runs (restarts.hpp starts one per attempt).
struct Attempt {
  std::string job_id;  ///< the same for every attempt (NODAL_JOB_ID)
  int number = 0;      ///< 0 for the first start; NODAL_RESTART_COUNT
  /// When --timeout ends the whole job, across attempts (none without --timeout).
  std::optional<Clock::time_point> deadline;
};

/// Runs one attempt of a job from start to the last reaped rank. Single-threaded by design: one epoll loop
/// over signalfd (SIGCHLD and the forwarded signals), the control socket, two timerfds
/// (--timeout, --grace) and every rank's stdout/stderr pipe, so failure detection costs one
/// wake-up and output lines are written whole, in order.
class Supervisor {
 public:
  /// `agent`: this node's agent when the job spans nodes (it outlives the Supervisor), else null.
  Supervisor(Options options, std::string program_path, Attempt attempt, NodeAgent* agent = nullptr);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  /// Starts the ranks, supervises them, prints the failure report. Returns the attempt's exit
  /// code: 0, the first failing rank's code, 128+signal, 124 (timeout), 125 (stall).
  /// Throws std::system_error when the job cannot be set up (no rank is left running then).
  int run();
  /// What happened, once run() returned (for the --report of the whole job).
  JobSummary summary() const;
  const std::optional<Failure>& failure() const { return failure_; }
  int interrupted_by() const { return interrupted_by_; }
  Clock::time_point started() const { return started_; }

 private:
  struct Stream;

  void set_up();
  std::vector<std::string> base_environment() const;
  void start_spawn();
  void start_forkserver();
  void open_rank_pipes(RankRecord& rank, int& out_write, int& err_write);
  void watch(int fd, std::uint64_t tag);
  /// --verbose: one line saying a set-up step took so long.
  void note(std::string_view step, Clock::time_point since) const;
  void loop();
  bool finished() const;
  void on_signal();
  void on_control();
  void on_child_exits();
  void on_output(std::size_t stream_index);
  void on_rank_exit(RankRecord& rank, int status);
  void on_zygote_exit(int status);
  void on_mpi(std::size_t index);
  void record_mpi_failure(const MpiFailure& failure);
  void on_watch_tick();
  void on_node_event();
  void record_failure(Failure failure);
  void stop_ranks();
  void signal_all(int sig);
  bool oom_kill_count_rose() const;
  int exit_code() const;
  std::string arena_file() const;  ///< the file_system strategy's arena

  Options options_;
  NodeAgent* agent_ = nullptr;
  std::string program_;
  Attempt attempt_;
  Clock::time_point ended_{};
  std::optional<GpuAssignment> gpus_;  ///< --gpus
  std::unique_ptr<MpsDaemon> mps_;     ///< --mps: the job's MPS control daemon, stopped last
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
  int watch_fd_ = -1;  ///< the stall watch's tick (--stall-timeout, or a diagnosis under way)
  std::unique_ptr<StallWatch> stall_watch_;
  std::unique_ptr<MpiWireUp> mpi_;  ///< --mpi (spawn start method only)
  bool fail_after_diagnosis_ = false;  ///< the diagnosis under way is of a stall to fail the job for
  std::unique_ptr<ShmGuard> shm_guard_;  ///< file_system strategy only; declared before the arena
  std::unique_ptr<Arena> arena_;
};

}  // namespace nodal::launcher

// The state nodalrun keeps about its job's ranks, and how the job failed.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "output.hpp"

namespace nodal::launcher {

using Clock = std::chrono::steady_clock;

struct RankRecord {
  int rank = 0;
  pid_t pid = -1;  ///< -1 until started (forkserver: until the zygote reports the fork)
  Clock::time_point started{};
  Clock::time_point ended{};
  bool reaped = false;
  int wait_status = 0;
  long peak_rss_kib = 0;  ///< ru_maxrss of the reaped rank
  bool killed_after_grace = false;
  std::string exception_report;  ///< what the rank's terminate handler reported, if anything
  std::optional<cpu_set_t> cpuset;
  std::unique_ptr<LineTagger> out;
  std::unique_ptr<LineTagger> err;
};

/// mpi: the MPI wire-up says the job failed (MPI_Abort, an exit without MPI_Finalize, ...).
/// node: another node of a multi-node job failed first, or was lost (multinode/node_agent.hpp).
enum class FailureKind { exit, signal, exception, timeout, zygote, launch, stall, mpi, node };

/// nodalrun's exit code when --timeout ends the job.
inline constexpr int kTimeoutExitCode = 124;
/// nodalrun's exit code when --stall-timeout finds the job stalled (--stall-action fail).
inline constexpr int kStallExitCode = 125;

/// The first failure of the job by time: it decides the report and nodalrun's exit code.
struct Failure {
  FailureKind kind = FailureKind::exit;
  int rank = -1;  ///< -1 when no rank is to blame (timeout, zygote)
  pid_t pid = -1;
  Clock::time_point at{};
  int exit_code = 1;  ///< nodalrun's exit code for this failure
  int signal = 0;
  bool oom_killed = false;
  std::string detail;  ///< words for the report's first line
};

/// One start of the job (--max-restarts), as the report lists it.
struct AttemptRecord {
  int number = 0;                  ///< 0: the first start
  double started_s = 0;            ///< since nodalrun started the first attempt
  double ended_s = 0;
  int exit_code = 0;
  std::optional<Failure> failure;  ///< what ended it, when it failed
  double failed_s = 0;             ///< when it failed, since nodalrun started the first attempt
  int interrupted_by = 0;
};

}  // namespace nodal::launcher

// Hang diagnosis: nodalrun reads the job's wait table (runtime's detail/wait_table.hpp) to see a
// stall (--stall-timeout) and to print, for every rank, what it is doing: running, waiting in a
// call for some peers since some time, or exited; then the waiting threads' stacks, which they
// send themselves when asked (symbolised in the rank by Boost.Stacktrace). On demand too: SIGQUIT
// to nodalrun prints the same (the JVM's thread-dump signal).
#pragma once

#include <nodal/arena.hpp>
#include <nodal/detail/wait_table.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "job.hpp"

namespace nodal::launcher {

/// One line of the status table.
struct RankStatus {
  int rank = 0;  ///< the global rank
  int pid = -1;
  std::string state;  ///< "not started", "running", "waiting", "working", "exited"
  std::string text;   ///< the rest of the line, in words
  int waiting_threads = 0;  ///< the rank's threads blocked in a nodal call (each answers a stack request)
};

/// What nodalrun prints and puts in --report when a job stalls or is asked for its status.
struct StatusTable {
  std::string reason;          ///< "stall: no rank made progress for 5.0 s" / "status requested (SIGQUIT)"
  double after_start_s = 0;    ///< when the table was taken
  double stalled_for_s = 0;    ///< time since the last progress (stall tables)
  std::vector<RankStatus> rows;
  std::vector<std::pair<int, std::string>> stacks;  ///< (rank, "thread <tid> in <call>\n<frames>")
  double stacks_after_ms = 0;  ///< from the request to the last stack (or to giving up)
};

class StallWatch {
 public:
  /// `stall_timeout_s` 0: never a stall (the table is still there for SIGQUIT). The table names
  /// ranks by their global rank, `first_rank` + local rank (multi-node; 0 on one node).
  StallWatch(Arena& arena, double stall_timeout_s, int first_rank);

  /// Reads every rank's heartbeat: true once, when the job has stalled, i.e. no rank finished a
  /// nodal call or exited for the stall timeout while some rank waits in one. True again only
  /// after progress was seen in between.
  bool stalled(const std::vector<RankRecord>& ranks, Clock::time_point now);

  /// Takes the table, prints it on stderr at once and asks the waiting threads for their stacks.
  void begin_diagnosis(const std::vector<RankRecord>& ranks, Clock::time_point job_started, Clock::time_point now,
                       std::string reason);
  /// A waiting thread's stack (ControlKind::wait_stack); `rank` is the local rank.
  void on_stack(int rank, std::string text);
  bool diagnosing() const { return pending_.has_value(); }
  /// Once every asked thread answered or the wait for them ran out: prints the stacks and keeps
  /// the table (last()). Returns true then.
  bool finish_diagnosis(Clock::time_point now);
  /// The last finished table, for --report.
  const std::optional<StatusTable>& last() const { return last_; }

  /// The time from the last progress to now.
  double quiet_for_s(Clock::time_point now) const;

 private:
  StatusTable take_table(const std::vector<RankRecord>& ranks, Clock::time_point job_started, Clock::time_point now,
                         std::string reason) const;

  Arena& arena_;
  double stall_timeout_s_;
  int first_rank_;
  std::vector<std::uint64_t> heartbeats_;
  int exited_ = 0;
  Clock::time_point last_progress_{};
  bool reported_ = false;  ///< this quiet spell was already reported
  std::optional<StatusTable> pending_;
  Clock::time_point requested_at_{};
  int stacks_expected_ = 0;
  std::optional<StatusTable> last_;
};

/// The table as nodalrun prints it (lines prefixed "nodalrun: ").
std::string format_status_table(const StatusTable& table);
/// The stacks as nodalrun prints them.
std::string format_stacks(const StatusTable& table);

}  // namespace nodal::launcher

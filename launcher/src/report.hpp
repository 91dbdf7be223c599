// nodalrun's account of a job: the failure report on stderr and the --report JSON file.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "job.hpp"
#include "options.hpp"
#include "stall_watch.hpp"

namespace nodal::launcher {

struct JobSummary {
  const std::string& job_id;
  const Options& options;
  const std::vector<RankRecord>& ranks;
  const std::optional<Failure>& failure;
  int interrupted_by = 0;  ///< the signal nodalrun received and forwarded, 0 if none
  int exit_code = 0;
  Clock::time_point started{};
  Clock::time_point ended{};
  /// When nodalrun signalled the other ranks after the first failure (for the latency figure).
  std::optional<Clock::time_point> stop_signalled{};
  /// The last status table nodalrun printed (a stall, or SIGQUIT), if any.
  const StatusTable* wait_table = nullptr;
  /// Every start of the job, the last one included (--max-restarts); empty: only one start.
  std::vector<AttemptRecord> attempts{};
};

/// One failure report, human-readable: first failing rank, pid, exit code or signal, OOM kill,
/// the exception and stack it reported, its last stderr lines, what happened to the others.
std::string format_failure_report(const JobSummary& job);

/// The same facts as JSON, plus per-rank wall time and peak RSS. Throws std::system_error when
/// the file cannot be written.
void write_json_report(const JobSummary& job, const std::string& path);

}  // namespace nodal::launcher

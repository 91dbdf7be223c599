#include "restarts.hpp"

#include <nodal/detail/posix.hpp>

#include <unistd.h>

#include <random>

#include <fmt/format.h>

#include "report.hpp"
#include "supervisor.hpp"

namespace nodal::launcher {
namespace {

std::string make_job_id() {
  std::random_device random;
  return fmt::format("nodal-{}-{:08x}", ::getpid(), random());
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

/// Whether another attempt could end differently: not after success, an interruption, the job's
/// own --timeout, or a program the forkserver could not start.
bool worth_restarting(const Supervisor& attempt) {
  const std::optional<Failure>& failure = attempt.failure();
  if (!failure || attempt.interrupted_by() != 0) return false;
  return failure->kind != FailureKind::timeout && failure->kind != FailureKind::launch &&
         !(failure->kind == FailureKind::zygote && failure->exit_code == 2);
}

std::string describe_attempt(const AttemptRecord& a) {
  if (!a.failure) return a.interrupted_by ? "interrupted" : "succeeded";
  std::string who = a.failure->rank >= 0 ? fmt::format("rank {}: ", a.failure->rank) : std::string();
  return fmt::format("failed at {:.3f} s ({}{}), exit code {}", a.failed_s, who, a.failure->detail, a.exit_code);
}

}  // namespace

int run_job(const Options& options, const std::string& program) {
  const Clock::time_point start = Clock::now();
  Attempt attempt{make_job_id(), 0, std::nullopt};
  if (options.timeout_seconds > 0) {
    attempt.deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_seconds));
  }
  std::vector<AttemptRecord> attempts;
  for (;;) {
    Supervisor supervisor(options, program, attempt);
    const int code = supervisor.run();
    AttemptRecord record;
    record.number = attempt.number;
    record.started_s = seconds_between(start, supervisor.started());
    record.ended_s = seconds_between(start, Clock::now());
    record.exit_code = code;
    record.failure = supervisor.failure();
    if (record.failure) record.failed_s = seconds_between(start, record.failure->at);
    record.interrupted_by = supervisor.interrupted_by();
    attempts.push_back(record);

    const bool again = attempt.number < options.max_restarts && worth_restarting(supervisor);
    if (again) {
      detail::write_all(STDERR_FILENO, fmt::format("nodalrun: restarting the job (restart {} of {})\n",
                                                   attempt.number + 1, options.max_restarts));
    } else if (attempt.number > 0) {  // the whole story, once
      std::string text;
      for (const AttemptRecord& a : attempts) {
        text += fmt::format("nodalrun: attempt {} of at most {}: {}\n", a.number + 1, options.max_restarts + 1,
                            describe_attempt(a));
      }
      detail::write_all(STDERR_FILENO, text);
    }
    if (!again) {
      if (options.report_path) {
        JobSummary summary = supervisor.summary();
        summary.started = start;  // the whole job's wall time
        if (options.max_restarts > 0) summary.attempts = attempts;
        write_json_report(summary, *options.report_path);
      }
      return code;
    }
    ++attempt.number;
  }
}

}  // namespace nodal::launcher

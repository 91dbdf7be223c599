#include "restarts.hpp"

#include <nodal/detail/posix.hpp>

#include <unistd.h>

#include <random>

#include <fmt/format.h>

#include "report.hpp"
#include "multinode/node_launch.hpp"
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

std::string describe_attempt(const AttemptRecord& a, const Options& options) {
  if (!a.failure) return a.interrupted_by ? "interrupted" : "succeeded";
  std::string who = a.failure->rank >= 0 ? fmt::format("rank {}: ", options.global_rank(a.failure->rank)) : std::string();
  return fmt::format("failed at {:.3f} s ({}{}), exit code {}", a.failed_s, who, a.failure->detail, a.exit_code);
}

}  // namespace

int run_job(const Options& given, const std::string& program) {
  const Clock::time_point start = Clock::now();
  Options options = given;
  // Beyond one node: this nodalrun is its node's agent (multinode/node_agent.hpp).
  const std::optional<NodeLaunch> launch = detect_node_launch([](const char* name) { return std::getenv(name); });
  check_node_options(options, launch);
  std::unique_ptr<NodeAgent> agent;
  if (launch) {
    agent = std::make_unique<NodeAgent>(*launch, options);
    options.first_rank = agent->first_rank();
    options.world_size = agent->world_size();
    options.node_label = agent->label(agent->node_rank());
    options.mpi = MpiSupport::none;  // the agent is the MPI process; its ranks are not
  }
  Attempt attempt{make_job_id(), 0, std::nullopt};
  if (options.timeout_seconds > 0) {
    attempt.deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.timeout_seconds));
  }
  std::vector<AttemptRecord> attempts;
  for (;;) {
    Supervisor supervisor(options, program, attempt, agent.get());
    int code = 0;
    try {
      code = supervisor.run();
    } catch (const std::exception& e) {
      if (!agent) throw;
      // The other nodes must not wait for this one: end the job everywhere.
      detail::write_all(STDERR_FILENO, fmt::format("nodalrun: cannot run the job: {}\n", e.what()));
      agent->finish(1);
    }
    if (agent) agent->stop_serving();  // before the Supervisor unmaps the arena
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
                            describe_attempt(a, options));
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
      // Every node ends together: a clean end waits for the others; a failure ends them all.
      return agent ? agent->finish(code) : code;
    }
    ++attempt.number;
  }
}

}  // namespace nodal::launcher

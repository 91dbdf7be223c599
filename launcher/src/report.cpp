#include "report.hpp"

#include <nodal/detail/posix.hpp>

#include <sys/wait.h>

#include <cerrno>
#include <fstream>
#include <system_error>

#include <boost/json/src.hpp>  // Boost.JSON header-only, compiled into this one file
#include <fmt/format.h>

namespace nodal::launcher {
namespace {

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

int count_killed_after_grace(const std::vector<RankRecord>& ranks) {
  int killed = 0;
  for (const RankRecord& r : ranks) killed += r.killed_after_grace;
  return killed;
}

const char* kind_name(FailureKind kind) {
  switch (kind) {
    case FailureKind::exit: return "exit";
    case FailureKind::signal: return "signal";
    case FailureKind::exception: return "exception";
    case FailureKind::timeout: return "timeout";
    case FailureKind::zygote: return "forkserver";
    case FailureKind::launch: return "launch";
    case FailureKind::stall: return "stall";
    case FailureKind::mpi: return "mpi";
    case FailureKind::node: return "node";
  }
  return "unknown";
}

}  // namespace

std::string format_failure_report(const JobSummary& job) {
  std::string text;
  auto line = [&text](const std::string& s) { text += "nodalrun: " + s + "\n"; };
  if (job.interrupted_by != 0) {
    line(fmt::format("received {}, forwarded it to the ranks", detail::signal_name(job.interrupted_by)));
  }
  if (!job.failure) return text;
  const Failure& f = *job.failure;
  double after = seconds_between(job.started, f.at);
  if (f.rank >= 0) {
    const int rank = job.options.global_rank(f.rank);  // the job's rank (on one node the same)
    const std::string where = job.options.node_label.empty() ? std::string() : " on " + job.options.node_label;
    line(fmt::format("rank {}{} (pid {}) failed first, {:.3f} s after start: {}{}", rank, where, f.pid, after, f.detail,
                     f.oom_killed ? " -- killed by the OOM killer (memory cgroup oom_kill count rose)" : ""));
    const RankRecord& r = job.ranks[f.rank];
    if (!r.exception_report.empty()) {
      line(fmt::format("rank {} raised {}", rank, r.exception_report));
    }
    if (r.err && !r.err->last_lines().empty()) {
      line(fmt::format("last {} stderr lines of rank {}:", r.err->last_lines().size(), rank));
      for (const std::string& l : r.err->last_lines()) text += "    " + l + "\n";
    }
  } else {
    line(f.detail);
  }
  int others = 0;
  for (const RankRecord& r : job.ranks) others += r.pid > 0 && r.rank != f.rank;
  int killed = count_killed_after_grace(job.ranks);
  if (others > 0) {
    line(fmt::format("stopped {} {}rank(s): SIGTERM, then SIGKILL for {} after the {:g} s grace", others,
                     f.rank >= 0 ? "other " : "", killed, job.options.grace_seconds));
  }
  line(fmt::format("exit code {}", job.exit_code));
  return text;
}

void write_json_report(const JobSummary& job, const std::string& path) {
  namespace json = boost::json;
  json::object root;
  root["job_id"] = job.job_id;
  // Ranks are the job's (global) ranks; this node's are first_rank .. first_rank + local_world_size - 1.
  root["world_size"] = job.options.world_size.value_or(job.options.nprocs);
  root["local_world_size"] = job.options.nprocs;
  root["first_rank"] = job.options.first_rank;
  root["command"] = json::value_from(job.options.command);
  root["exit_code"] = job.exit_code;
  root["wall_time_s"] = seconds_between(job.started, job.ended);
  root["interrupted_by"] = job.interrupted_by ? json::value(detail::signal_name(job.interrupted_by)) : json::value();
  if (job.failure) {
    const Failure& f = *job.failure;
    json::object failure;
    failure["kind"] = kind_name(f.kind);
    failure["rank"] = job.options.global_rank(f.rank);
    failure["pid"] = f.pid;
    failure["exit_code"] = f.exit_code;
    failure["signal"] = f.signal ? json::value(detail::signal_name(f.signal)) : json::value();
    failure["oom_killed"] = f.oom_killed;
    failure["detail"] = f.detail;
    failure["after_s"] = seconds_between(job.started, f.at);
    if (job.stop_signalled) failure["others_signalled_after_ms"] = seconds_between(f.at, *job.stop_signalled) * 1e3;
    if (f.rank >= 0) {
      const RankRecord& r = job.ranks[f.rank];
      failure["exception"] = r.exception_report;
      json::array lines;
      if (r.err) {
        for (const std::string& l : r.err->last_lines()) lines.emplace_back(l);
      }
      failure["last_stderr"] = std::move(lines);
    }
    root["failure"] = std::move(failure);
  } else {
    root["failure"] = nullptr;
  }
  json::array ranks;
  for (const RankRecord& r : job.ranks) {
    json::object o;
    o["rank"] = job.options.global_rank(r.rank);
    o["local_rank"] = r.rank;
    o["pid"] = r.pid;
    o["started"] = r.pid > 0;
    o["exit_code"] = r.reaped && WIFEXITED(r.wait_status) ? json::value(WEXITSTATUS(r.wait_status)) : json::value();
    o["signal"] = r.reaped && WIFSIGNALED(r.wait_status) ? json::value(detail::signal_name(WTERMSIG(r.wait_status)))
                                                         : json::value();
    o["status"] = r.reaped ? detail::describe_wait_status(r.wait_status) : std::string("not started");
    o["wall_time_s"] = r.reaped ? seconds_between(r.started, r.ended) : 0.0;
    o["peak_rss_kib"] = r.peak_rss_kib;
    o["killed_after_grace"] = r.killed_after_grace;
    ranks.emplace_back(std::move(o));
  }
  root["ranks"] = std::move(ranks);
  json::array attempts;
  for (const AttemptRecord& a : job.attempts) {
    json::object o;
    o["attempt"] = a.number;
    o["started_s"] = a.started_s;
    o["ended_s"] = a.ended_s;
    o["exit_code"] = a.exit_code;
    o["kind"] = a.failure ? json::value(kind_name(a.failure->kind)) : json::value(a.interrupted_by ? "interrupted" : "success");
    o["rank"] = a.failure ? job.options.global_rank(a.failure->rank) : -1;
    o["cause"] = a.failure ? a.failure->detail : std::string();
    o["failed_s"] = a.failure ? json::value(a.failed_s) : json::value();
    attempts.emplace_back(std::move(o));
  }
  root["attempts"] = std::move(attempts);
  if (const StatusTable* table = job.wait_table) {
    json::object o;
    o["reason"] = table->reason;
    o["after_start_s"] = table->after_start_s;
    o["stalled_for_s"] = table->stalled_for_s;
    json::array rows;
    for (const RankStatus& row : table->rows) {
      rows.emplace_back(json::object{{"rank", row.rank}, {"pid", row.pid}, {"state", row.state}, {"text", row.text}});
    }
    o["ranks"] = std::move(rows);
    json::array stacks;
    for (const auto& [rank, stack] : table->stacks) stacks.emplace_back(json::object{{"rank", rank}, {"stack", stack}});
    o["stacks"] = std::move(stacks);
    o["stacks_after_ms"] = table->stacks_after_ms;
    root["wait_table"] = std::move(o);
  } else {
    root["wait_table"] = nullptr;
  }

  std::ofstream file(path, std::ios::trunc);
  if (!file) throw std::system_error(errno, std::generic_category(), fmt::format("open({})", path));
  file << json::serialize(root) << "\n";
  if (!file) throw std::system_error(errno, std::generic_category(), fmt::format("write({})", path));
}

}  // namespace nodal::launcher

#include "stall_watch.hpp"

#include <nodal/detail/posix.hpp>

#include <time.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

namespace nodal::launcher {
namespace {

/// How long a diagnosis waits for the stacks: a rank's first stack trace loads its debug
/// information (hundreds of milliseconds for a large program), and a waiting thread looks for
/// the request once per futex slice (20 ms).
constexpr auto kStackWait = std::chrono::seconds(3);

std::int64_t realtime_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// "12:00:01.234 (5.2 s ago)"
std::string describe_since(std::int64_t since_ns, std::int64_t now_ns) {
  time_t seconds = static_cast<time_t>(since_ns / 1'000'000'000);
  tm local{};
  ::localtime_r(&seconds, &local);
  return fmt::format("{:02}:{:02}:{:02}.{:03} ({:.1f} s ago)", local.tm_hour, local.tm_min, local.tm_sec,
                     (since_ns / 1'000'000) % 1000, static_cast<double>(now_ns - since_ns) * 1e-9);
}

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

StallWatch::StallWatch(Arena& arena, double stall_timeout_s, int first_rank)
    : arena_(arena), stall_timeout_s_(stall_timeout_s), first_rank_(first_rank) {}

double StallWatch::quiet_for_s(Clock::time_point now) const { return seconds_between(last_progress_, now); }

bool StallWatch::stalled(const std::vector<RankRecord>& ranks, Clock::time_point now) {
  int world_size = 0;
  const detail::RankWaits* table = detail::wait_table(arena_, &world_size);
  if (!table) return false;
  if (heartbeats_.empty()) {
    heartbeats_.assign(static_cast<std::size_t>(world_size), 0);
    last_progress_ = now;
  }
  bool progress = false;
  bool someone_waits = false;
  int exited = 0;
  for (int r = 0; r < world_size && r < static_cast<int>(ranks.size()); ++r) {
    exited += ranks[r].reaped;
    const std::uint64_t beat = table[r].calls.load(std::memory_order_acquire);
    progress |= beat != heartbeats_[r];
    heartbeats_[r] = beat;
    if (ranks[r].reaped) continue;
    for (const detail::WaitEntry& entry : table[r].entries) {
      someone_waits |= entry.state.load(std::memory_order_relaxed) == detail::WaitEntry::waiting;
    }
  }
  progress |= exited != exited_;
  exited_ = exited;
  if (progress) {
    last_progress_ = now;
    reported_ = false;
    return false;
  }
  if (stall_timeout_s_ <= 0 || reported_ || !someone_waits) return false;
  if (quiet_for_s(now) < stall_timeout_s_) return false;
  reported_ = true;
  return true;
}

StatusTable StallWatch::take_table(const std::vector<RankRecord>& ranks, Clock::time_point job_started,
                                   Clock::time_point now, std::string reason) const {
  StatusTable table;
  table.reason = std::move(reason);
  table.after_start_s = seconds_between(job_started, now);
  table.stalled_for_s = heartbeats_.empty() ? 0.0 : quiet_for_s(now);
  int world_size = 0;
  const detail::RankWaits* rows = detail::wait_table(arena_, &world_size);
  const std::int64_t now_ns = realtime_ns();
  for (const RankRecord& r : ranks) {
    RankStatus row{first_rank_ + r.rank, r.pid, {}, {}, 0};
    if (r.pid <= 0) {
      row.state = "not started";
    } else if (r.reaped) {
      row.state = "exited";
      std::string status = detail::describe_wait_status(r.wait_status);  // "exited with code 0", "killed by ..."
      if (status.rfind("exited ", 0) == 0) status.erase(0, 7);
      row.text = fmt::format("{}, {:.1f} s ago", status, seconds_between(r.ended, now));
    } else if (!rows || r.rank >= world_size) {
      row.state = "running";
    } else {
      detail::RankSnapshot snapshot = detail::read_rank_waits(rows[r.rank]);
      bool waiting = false;
      for (const detail::WaitSnapshot& w : snapshot.waits) {
        if (!row.text.empty()) row.text += "; ";
        if (w.state == detail::WaitEntry::waiting) {
          waiting = true;
          ++row.waiting_threads;
          row.text += fmt::format("in {} for {}, since {}", w.what, w.waiting_for, describe_since(w.since_ns, now_ns));
        } else {
          row.text += fmt::format("in {} (working; first waited at {})", w.what, describe_since(w.since_ns, now_ns));
        }
        if (snapshot.waits.size() > 1) row.text += fmt::format(" [thread {}]", w.tid);
      }
      if (snapshot.waits.empty()) {
        row.state = "running";
        row.text = fmt::format("in its own code ({} nodal calls made)", snapshot.calls);
      } else {
        row.state = waiting ? "waiting" : "working";
      }
    }
    table.rows.push_back(std::move(row));
  }
  return table;
}

void StallWatch::begin_diagnosis(const std::vector<RankRecord>& ranks, Clock::time_point job_started,
                                 Clock::time_point now, std::string reason) {
  if (pending_) return;  // one at a time: the stacks answer one request
  pending_ = take_table(ranks, job_started, now, std::move(reason));
  detail::write_all(STDERR_FILENO, format_status_table(*pending_));
  stacks_expected_ = 0;
  for (const RankStatus& row : pending_->rows) stacks_expected_ += row.waiting_threads;
  requested_at_ = now;
  if (stacks_expected_ > 0) arena_.control().stack_request.fetch_add(1, std::memory_order_acq_rel);
}

void StallWatch::on_stack(int rank, std::string text) {
  if (!pending_) return;  // late: the diagnosis already gave up on it
  pending_->stacks.emplace_back(first_rank_ + rank, std::move(text));
}

bool StallWatch::finish_diagnosis(Clock::time_point now) {
  if (!pending_) return false;
  const bool all = static_cast<int>(pending_->stacks.size()) >= stacks_expected_;
  if (!all && now - requested_at_ < kStackWait) return false;
  pending_->stacks_after_ms = seconds_between(requested_at_, now) * 1e3;
  std::sort(pending_->stacks.begin(), pending_->stacks.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  detail::write_all(STDERR_FILENO, format_stacks(*pending_));
  last_ = std::move(pending_);
  pending_.reset();
  return true;
}

std::string format_status_table(const StatusTable& table) {
  std::string text = fmt::format("nodalrun: {} ({:.3f} s after start)\n", table.reason, table.after_start_s);
  for (const RankStatus& row : table.rows) {
    text += fmt::format("nodalrun:   rank {:<4} pid {:<8} {:<11} {}\n", row.rank, row.pid, row.state, row.text);
  }
  return text;
}

std::string format_stacks(const StatusTable& table) {
  std::string text;
  int waiting = 0;
  for (const RankStatus& row : table.rows) waiting += row.state == "waiting";
  if (waiting == 0) return text;
  text += fmt::format("nodalrun: stacks of the waiting ranks ({} of their threads answered in {:.0f} ms):\n",
                      table.stacks.size(), table.stacks_after_ms);
  for (const auto& [rank, stack] : table.stacks) {
    std::size_t start = 0;
    while (start < stack.size()) {
      std::size_t end = stack.find('\n', start);
      if (end == std::string::npos) end = stack.size();
      text += fmt::format("[{}] {}\n", rank, std::string_view(stack).substr(start, end - start));
      start = end + 1;
    }
  }
  return text;
}

}  // namespace nodal::launcher

#include <nodal/arena.hpp>
#include <nodal/errors.hpp>
#include <nodal/detail/environment.hpp>
#include <nodal/detail/futex.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/storage.hpp>
#include <nodal/detail/wait.hpp>
#include <nodal/detail/wait_record.hpp>

#include <sched.h>
#include <unistd.h>

#include <cstdlib>

#include <fmt/format.h>

namespace nodal::detail {
namespace {

/// How long a waiter spins before sleeping on the futex when it has a core of its own: longer
/// than a cache-line hand-off (35-200 ns here) or a short imbalance between ranks, shorter than
/// what a futex round trip costs (~40 us wake-up on this VM), so a sleeping waiter is rare on a
/// hot path and an idle one costs no CPU after this.
constexpr auto kSpinTime = std::chrono::microseconds(50);
/// Oversubscribed: pauses before the first yield (DESIGN.md: 256 spins cost 3x, yield at once or
/// after <= 16), then yield for this long before sleeping.
constexpr std::uint32_t kOversubscribedSpins = 16;
constexpr auto kYieldTime = std::chrono::milliseconds(2);
/// Spins between two reads of the clock and the abort word (a few microseconds).
constexpr std::uint32_t kCheckEvery = 256;
/// Longest single futex sleep: the abort word is re-checked at least this often, so a failed
/// job wakes every waiter within about this long.
constexpr auto kSleepSlice = std::chrono::milliseconds(20);

}  // namespace

bool oversubscribed() noexcept {
  static const bool value = [] {
    // nodalrun's placement says (kEnvCrowded); a rank started some other way guesses.
    const std::string crowded = getenv_or_empty(kEnvCrowded);
    if (crowded == "0" || crowded == "1") return crowded == "1";
    int ranks = parse_int(getenv_or_empty(kEnvLocalWorldSize));
    cpu_set_t set;
    int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    // A rank bound to one core sees one CPU; then compare against the machine's cores.
    if (cpus == 1) cpus = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
    return ranks > cpus;
  }();
  return value;
}

void throw_peer_failure(const ArenaControl& control) {
  const std::string who = control.failed_rank >= 0 ? fmt::format("rank {}: ", control.failed_rank) : std::string();
  throw PeerFailure(fmt::format("the job has failed ({}{}); this rank cannot go on", who, control.failure));
}

void check_job_alive() {
  const ArenaControl& control = job_arena().control();
  if (control.abort.load(std::memory_order_acquire) != 0) throw_peer_failure(control);
}

bool job_failed() { return job_arena().control().abort.load(std::memory_order_acquire) != 0; }

void Waiter::check() const {
  check_job_alive();
  if (deadline_.at && Clock::now() >= *deadline_.at) {
    throw TimeoutError(fmt::format("{} timed out", what_));
  }
}

bool Waiter::spin() {
  ++rounds_;
  const bool crowded = yield_core_ || oversubscribed();
  if (!crowded || rounds_ <= kOversubscribedSpins) {
    cpu_relax();
  } else {
    ::sched_yield();
  }
  if (rounds_ % kCheckEvery != 0 && !(crowded && rounds_ > kOversubscribedSpins)) return true;
  check();
  // The clock starts at the first check, not the first spin: a wait that ends within a few
  // hundred spins (the common case on a hot path) never reads it.
  Clock::time_point now = Clock::now();
  if (started_ == Clock::time_point{}) started_ = now;
  return now - started_ < (crowded ? std::chrono::duration_cast<Clock::duration>(kYieldTime)
                                            : std::chrono::duration_cast<Clock::duration>(kSpinTime));
}

Waiter::~Waiter() {
  if (entry_) end_waiting(entry_);
}

void Waiter::sleep(WaitWord& word, std::uint32_t seen) {
  check();
  // Only a waiter that sleeps is worth a line in the wait table: the description costs far less
  // than the spinning before it, and nothing on the fast path.
  if (!entry_) {
    entry_ = begin_waiting(what_);
  } else {
    refresh_waiting(entry_, what_);
  }
  std::chrono::nanoseconds slice = kSleepSlice;
  if (deadline_.at) slice = std::min(slice, std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline_.at - Clock::now()));
  if (slice.count() <= 0) return;  // check() throws on the next round
  futex_wait(word.sequence, seen, slice);
}

}  // namespace nodal::detail

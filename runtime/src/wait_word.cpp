// WaitWord's waking and one plain sleep on it (wait.hpp), and the futex calls under them.
#include <nodal/detail/futex.hpp>
#include <nodal/detail/wait.hpp>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace nodal::detail {

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000), static_cast<long>(timeout.count() % 1'000'000'000)};
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

bool sleep_on(WaitWord& word, const std::function<bool()>& ready, std::chrono::nanoseconds timeout) {
  const std::uint32_t seen = word.sequence.load(std::memory_order_seq_cst);
  bool done = false;
  {
    SleeperMark mark(word);
    done = ready();
    if (!done) futex_wait(word.sequence, seen, timeout);
  }
  return done || ready();
}

void notify(WaitWord& word) noexcept {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (word.sleepers.load(std::memory_order_relaxed) == 0) return;
  word.sequence.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(word.sequence);
}

}  // namespace nodal::detail

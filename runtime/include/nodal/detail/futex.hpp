// The futex calls under WaitWord (wait.hpp): in nodal_core, so that nodalrun's node agent can
// wait on and notify the words it shares with the ranks. Internal.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace nodal::detail {

/// Sleeps while `word` == expected, at most `timeout` (a process-shared futex: not PRIVATE).
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::chrono::nanoseconds timeout);
/// Wakes every sleeper on `word`.
void futex_wake_all(std::atomic<std::uint32_t>& word);

}  // namespace nodal::detail

// `nodalrun --verbose` inside a rank: the launcher exports NODAL_VERBOSE=1, and the runtime's
// long set-up steps (attaching the arena in nodal::init, creating an NCCL communicator, starting
// a fork server) print one line each with their time on stderr. Internal.
#pragma once

#include <chrono>
#include <string_view>

namespace nodal::detail {

inline constexpr const char* kEnvVerbose = "NODAL_VERBOSE";

/// Whether NODAL_VERBOSE is set to something other than 0 (read once).
bool verbose() noexcept;

/// "nodal: rank R: <step> in <ms> ms" on stderr when verbose(); `since` is when the step began.
void note_step(std::string_view step, std::chrono::steady_clock::time_point since) noexcept;

}  // namespace nodal::detail

#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>

#include <fmt/format.h>

namespace nodal {

ProcessRaisedError::ProcessRaisedError(int rank, int pid, std::string child_report)
    : Error(fmt::format("process {} (rank {}) raised: {}", pid, rank, child_report)),
      rank_(rank),
      pid_(pid),
      child_report_(std::move(child_report)) {}

ProcessExitedError::ProcessExitedError(int rank, int pid, int exit_code, int signal)
    : Error(signal != 0
                ? fmt::format("process {} (rank {}) was killed by {}", pid, rank, detail::signal_name(signal))
                : fmt::format("process {} (rank {}) exited with code {}", pid, rank, exit_code)),
      rank_(rank),
      pid_(pid),
      exit_code_(exit_code),
      signal_(signal) {}

}  // namespace nodal

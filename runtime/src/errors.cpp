#include <nodal/errors.hpp>
#include <nodal/detail/posix.hpp>

#include <utility>

#include <fmt/format.h>

namespace nodal {
namespace {

std::string or_rank(std::string name, int rank) {
  return name.empty() ? fmt::format("rank {}", rank) : std::move(name);
}

}  // namespace

ProcessRaisedError::ProcessRaisedError(int rank, int pid, std::string child_report, std::string name)
    : Error(fmt::format("process {} ({}) raised: {}", pid, or_rank(name, rank), child_report)),
      rank_(rank),
      pid_(pid),
      name_(or_rank(std::move(name), rank)),
      child_report_(std::move(child_report)) {}

ProcessExitedError::ProcessExitedError(int rank, int pid, int exit_code, int signal, std::string name)
    : Error(signal != 0
                ? fmt::format("process {} ({}) was killed by {}", pid, or_rank(name, rank), detail::signal_name(signal))
                : fmt::format("process {} ({}) exited with code {}", pid, or_rank(name, rank), exit_code)),
      rank_(rank),
      pid_(pid),
      name_(or_rank(std::move(name), rank)),
      exit_code_(exit_code),
      signal_(signal) {}

}  // namespace nodal

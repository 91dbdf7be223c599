#include <nodal/detail/control.hpp>
#include <nodal/detail/environment.hpp>
#include <nodal/detail/posix.hpp>
#include <nodal/detail/verbose.hpp>

#include <unistd.h>

#include <fmt/format.h>

namespace nodal::detail {

bool verbose() noexcept {
  static const bool value = [] {
    const std::string text = getenv_or_empty(kEnvVerbose);
    return !text.empty() && text != "0";
  }();
  return value;
}

void note_step(std::string_view step, std::chrono::steady_clock::time_point since) noexcept {
  if (!verbose()) return;
  try {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
    write_all(STDERR_FILENO, fmt::format("nodal: rank {}: {} in {:.1f} ms\n", control_endpoint().rank, step, ms));
  } catch (...) {
    // A note must never break the step it times.
  }
}

}  // namespace nodal::detail

// Turning an exception into text a supervisor can print. Internal.
#pragma once

#include <cstddef>
#include <exception>
#include <string>

namespace nodal::detail {

/// "<demangled type>: <what()>" for an exception (what() only for std::exception).
std::string describe_exception(const std::exception_ptr& error);

/// The calling thread's stack trace, one frame a line (Boost.Stacktrace), leaving out this
/// function's frame and `skip` more of its callers.
std::string current_stack_trace(std::size_t skip = 0);

/// Installs a std::terminate handler that reports the uncaught exception (description and stack
/// trace, taken at the throw point since nothing has unwound yet) as a ControlKind::exception
/// message on control_fd (when >= 0) and on stderr, then exits with code 1.
void install_terminate_handler(int control_fd, int rank);

}  // namespace nodal::detail

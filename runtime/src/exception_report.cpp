#include <nodal/detail/control.hpp>
#include <nodal/detail/exception_report.hpp>
#include <nodal/detail/posix.hpp>

#include <cxxabi.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <sstream>

#include <boost/stacktrace.hpp>
#include <fmt/format.h>

namespace nodal::detail {
namespace {

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                                  &std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

int g_control_fd = -1;
int g_rank = 0;

[[noreturn]] void on_terminate() noexcept {
  std::string report;
  try {
    std::exception_ptr error = std::current_exception();
    std::string what = error ? describe_exception(error) : "std::terminate called without an exception";
    report = fmt::format("{}\n{}", what, current_stack_trace(/*skip=*/2));
  } catch (...) {
    report = "uncaught exception (describing it failed)";
  }
  // Under a supervisor the report travels whole through the control channel and stderr gets one
  // line; alone, stderr gets everything.
  bool reported = g_control_fd >= 0 &&
                  send_control(g_control_fd, {ControlKind::exception, g_rank, static_cast<int>(::getpid()), report});
  std::string_view shown = reported ? std::string_view(report).substr(0, report.find('\n')) : report;
  write_all(STDERR_FILENO, fmt::format("nodal: rank {} terminated by an uncaught exception: {}{}\n", g_rank, shown,
                                       reported ? " (stack trace sent to the supervisor)" : ""));
  std::_Exit(1);
}

}  // namespace

std::string describe_exception(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return fmt::format("{}: {}", demangle(typeid(e).name()), e.what());
  } catch (...) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    return type ? demangle(type->name()) : std::string("unknown exception");
  }
}

std::string current_stack_trace(std::size_t skip) {
  std::ostringstream out;
  out << boost::stacktrace::stacktrace(skip + 1, static_cast<std::size_t>(-1));
  return out.str();
}

void install_terminate_handler(int control_fd, int rank) {
  g_control_fd = control_fd;
  g_rank = rank;
  std::set_terminate(&on_terminate);
}

}  // namespace nodal::detail

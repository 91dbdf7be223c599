// nodalrun -n N [options] [--] PROGRAM [ARGS...]
#include <nodal/errors.hpp>

#include <unistd.h>

#include <exception>
#include <system_error>

#include <fmt/format.h>

#include "options.hpp"
#include "program_error.hpp"
#include "restarts.hpp"

namespace {

constexpr int kUsageExit = 2;

int fail(int code, const std::string& message) {
  fmt::print(stderr, "nodalrun: {}\n", message);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace nodal::launcher;
  try {
    std::optional<Options> options = parse_command_line(argc, argv);
    if (!options) return 0;
    std::string program = resolve_program(options->command.front());
    return run_job(*options, program);
  } catch (const ProgramError& e) {
    return fail(e.exit_code(), e.what());
  } catch (const nodal::UsageError& e) {
    return fail(kUsageExit, fmt::format("{} (see nodalrun --help)", e.what()));
  } catch (const std::exception& e) {
    return fail(1, fmt::format("cannot run the job: {}", e.what()));
  }
}
